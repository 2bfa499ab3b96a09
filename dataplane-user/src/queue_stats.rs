//! Egress queue and carrier counters of the agent's own interfaces: packets each interface's root
//! qdisc sent and dropped, and how often its carrier went down, read with one `RTM_GETQDISC` dump
//! and an `RTM_GETLINK` per attached interface (a dump of all links beyond 16) per detection
//! window in the agent's network namespace.
//!
//! Why: the monitor's TC egress hook sees a packet *before* the interface's queue, so loss it
//! infers on an egress flow (retransmissions) can be this queue or anything behind it. The queue's
//! own drop counter says which: packets this interface threw away because its link could not
//! carry them (a port that negotiated down, a rate-capped or congested uplink). At a host's end
//! of the wire (an IPU/DPU port, a host NIC) that is the difference between "my cable" and "the
//! peer at the other end", which the flows alone cannot tell when one connection crosses both
//! (`detect::congestion`, the queue-drop condition). Real NICs count the same (`tc -s qdisc`:
//! `dropped`), whatever the qdisc (mq, fq_codel, tbf, ...).
//!
//! The carrier is the same kind of first-hand fact about the link: the kernel counts every time
//! an interface lost its link (`IFLA_CARRIER_DOWN_COUNT`, `/sys/class/net/IF/carrier_down_count`:
//! the far end's port went down, the cable was pulled, the PHY retrained). A flapping cable
//! stalls every connection across it, which from this end looks like every peer losing and
//! falling silent at once; the counter names the cable (`detect`, the link-flap condition).
//!
//! The root qdisc's statistics cover its children (mq sums its per-queue qdiscs when dumped), so
//! the root is read alone. An interface with `noqueue` (veth's default) has no queue and never
//! drops there; its counters stay 0. The kernel's basic counters are 32-bit: deltas are taken
//! modulo 2^32, and a growth of 2^31 or more is a counter that went backwards (a qdisc replaced),
//! not traffic ([`deltas`]).
use std::{
    collections::{BTreeMap, HashMap},
    io,
};

use netlink_packet_core::{NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_DUMP, NLM_F_REQUEST};
use netlink_packet_route::{
    link::{LinkAttribute, LinkMessage},
    tc::{TcAttribute, TcHandle, TcMessage, TcStats2},
    RouteNetlinkMessage,
};
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};

/// An interface's root qdisc's cumulative counters and its carrier-down count, as the kernel
/// keeps them (32-bit, wrapping).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueCounters {
    pub packets: u32,
    pub drops: u32,
    pub overlimits: u32,
    /// Times the interface's carrier went down since it was created (0 on a kernel without
    /// `IFLA_CARRIER_DOWN_COUNT`, before 4.16).
    pub carrier_downs: u32,
}

/// What one interface's queue did between two reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct QueueDelta {
    /// Packets the queue sent (handed to the device).
    pub packets: u64,
    /// Packets it dropped (queue full, rate limit, AQM).
    pub drops: u64,
    /// Times a shaping qdisc held a packet back because its rate was exhausted (`tc -s qdisc`:
    /// `overlimits`; a `tbf`, `htb`: the link is the bottleneck of what it is offered, even
    /// when nothing is dropped). 0 for queues that do not shape.
    #[serde(default)]
    pub overlimits: u64,
    /// Times the interface's carrier went down (the link was lost: the far end's port down, a
    /// cable pulled, a PHY retraining). 0 on a healthy link.
    #[serde(default)]
    pub carrier_downs: u64,
}

impl QueueDelta {
    /// Dropped share of what the queue was offered; `None` when it was offered nothing.
    pub fn drop_ratio(&self) -> Option<f64> {
        let offered = self.packets + self.drops;
        (offered > 0).then(|| self.drops as f64 / offered as f64)
    }

    /// Throttles per packet sent (above 1 when the shaper held packets back more than once
    /// each); `None` when it sent nothing.
    pub fn throttle_ratio(&self) -> Option<f64> {
        (self.packets > 0).then(|| self.overlimits as f64 / self.packets as f64)
    }
}

/// The root qdisc's counters of one `RTM_NEWQDISC` message, if it is a root qdisc with them.
fn root_counters(m: &TcMessage) -> Option<(u32, QueueCounters)> {
    if m.header.parent != TcHandle::ROOT || m.header.index <= 0 {
        return None;
    }
    let mut c: Option<QueueCounters> = None;
    for a in &m.attributes {
        match a {
            TcAttribute::Stats2(s) => {
                let mut q = c.unwrap_or_default();
                for s in s {
                    match s {
                        TcStats2::Basic(b) => q.packets = b.packets,
                        TcStats2::Queue(x) => {
                            q.drops = x.drops;
                            q.overlimits = x.overlimits;
                        }
                        _ => {}
                    }
                }
                c = Some(q);
            }
            // The old `TCA_STATS` block, for a kernel (or qdisc) without `TCA_STATS2`.
            TcAttribute::Stats(s) if c.is_none() => {
                c = Some(QueueCounters { packets: s.packets, drops: s.drops, overlimits: s.overlimits, carrier_downs: 0 })
            }
            _ => {}
        }
    }
    Some((m.header.index as u32, c?))
}

/// The carrier-down count of one `RTM_NEWLINK` message, if it has one.
fn carrier_downs(m: &LinkMessage) -> Option<(u32, u32)> {
    m.attributes.iter().find_map(|a| match a {
        LinkAttribute::CarrierDownCount(n) => Some((m.header.index, *n)),
        _ => None,
    })
}

/// Attached interfaces up to which their links are asked for one by one; above, one dump of all
/// links is cheaper (`examples/bench_ifcounters.rs`: a link asked for alone costs about 15 µs,
/// one in a dump about 11 µs, and a dump of a namespace of 1,024 veths 14 ms).
const LINK_GETS_MAX: usize = 16;

/// Dumps every root qdisc of the calling thread's network namespace and reads the links of the
/// interfaces in `attached` (one `RTM_GETLINK` each for up to [`LINK_GETS_MAX`] of them, else a
/// dump of all links: a link message is large, and a DPU's namespace holds a representor per VF,
/// most of them not attached): ifindex → counters. An interface without a root qdisc in the dump
/// has queue counters of 0; an attached interface that is gone is left out.
pub fn read_interface_counters(attached: impl IntoIterator<Item = u32>) -> io::Result<BTreeMap<u32, QueueCounters>> {
    let mut socket = Socket::new(NETLINK_ROUTE)?;
    // The analysis thread must not wait on the kernel forever: a reply that does not come within
    // a second is a failed read (the window then has no queue counters).
    let timeout = libc::timeval { tv_sec: 1, tv_usec: 0 };
    // SAFETY: a valid socket and a `timeval` of the size passed.
    let rc = unsafe {
        libc::setsockopt(
            std::os::fd::AsRawFd::as_raw_fd(&socket),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            std::ptr::addr_of!(timeout).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    socket.bind_auto()?;
    socket.connect(&SocketAddr::new(0, 0))?;
    let mut out: BTreeMap<u32, QueueCounters> = BTreeMap::new();
    request(&socket, 1, RouteNetlinkMessage::GetQueueDiscipline(TcMessage::default()), true, "RTM_GETQDISC", |m| {
        if let RouteNetlinkMessage::NewQueueDiscipline(m) = m {
            if let Some((ifindex, c)) = root_counters(&m) {
                out.insert(ifindex, c);
            }
        }
    })?;
    let attached: Vec<u32> = attached.into_iter().collect();
    let mut carrier = |m: RouteNetlinkMessage| {
        if let RouteNetlinkMessage::NewLink(m) = m {
            if let Some((ifindex, n)) = carrier_downs(&m) {
                if attached.contains(&ifindex) {
                    out.entry(ifindex).or_default().carrier_downs = n;
                }
            }
        }
    };
    if attached.len() > LINK_GETS_MAX {
        request(&socket, 2, RouteNetlinkMessage::GetLink(LinkMessage::default()), true, "RTM_GETLINK", &mut carrier)?;
    } else {
        for (seq, &ifindex) in (2..).zip(&attached) {
            let mut link = LinkMessage::default();
            link.header.index = ifindex;
            request(&socket, seq, RouteNetlinkMessage::GetLink(link), false, "RTM_GETLINK", &mut carrier)?;
        }
    }
    Ok(out)
}

/// Sends `req` (sequence number `seq`) and hands every message of the reply to `each`: with
/// `dump`, a dump request, until the kernel's `NLMSG_DONE`; without, a request for one object,
/// whose reply is one message (none when the object is gone: `ENODEV`).
fn request(socket: &Socket, seq: u32, req: RouteNetlinkMessage, dump: bool, what: &str, mut each: impl FnMut(RouteNetlinkMessage)) -> io::Result<()> {
    let mut req = NetlinkMessage::new(NetlinkHeader::default(), NetlinkPayload::from(req));
    req.header.flags = if dump { NLM_F_DUMP | NLM_F_REQUEST } else { NLM_F_REQUEST };
    req.header.sequence_number = seq;
    req.finalize();
    let mut buf = vec![0; req.buffer_len()];
    req.serialize(&mut buf);
    socket.send(&buf, 0)?;

    let mut rx = vec![0u8; 64 * 1024];
    // Bounded: a dump of a namespace's qdiscs is a handful of datagrams, a single object one; a kernel that
    // never sends NLMSG_DONE would otherwise hold the analysis thread.
    for _ in 0..10_000 {
        let n = socket.recv(&mut &mut rx[..], 0)?;
        let mut off = 0;
        while off < n {
            let msg: NetlinkMessage<RouteNetlinkMessage> = NetlinkMessage::deserialize(&rx[off..n])
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{what} reply: {e}")))?;
            let len = msg.header.length as usize;
            match msg.payload {
                NetlinkPayload::Done(_) => return Ok(()),
                NetlinkPayload::Error(e) if !dump && e.code.is_some_and(|c| -c.get() == libc::ENODEV) => return Ok(()),
                NetlinkPayload::Error(e) => {
                    return Err(e.code.map_or_else(|| io::Error::other("netlink error"), |c| io::Error::from_raw_os_error(-c.get())))
                }
                NetlinkPayload::InnerMessage(m) => {
                    each(m);
                    if !dump {
                        return Ok(());
                    }
                }
                _ => {}
            }
            if len == 0 {
                break;
            }
            off += len;
        }
    }
    Err(io::Error::other(format!("{what} dump did not end")))
}

/// What `/metrics` shows of the attached interfaces' queues: growth since the agent first read
/// each one (so a qdisc replaced or a counter wrapped never makes a series go backwards).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct QueueSnapshot {
    /// Attached interface name → packets sent and dropped by its root qdisc.
    pub interfaces: BTreeMap<String, QueueDelta>,
    pub reads: u64,
    pub errors: u64,
}

/// Reads the root queues once per window, turns their counters into deltas of the attached
/// interfaces, and keeps their totals for `/metrics` (the pattern of `RdmaPortReader`).
#[derive(Debug, Default)]
pub struct QueueReader {
    last: BTreeMap<u32, QueueCounters>,
    snapshot: QueueSnapshot,
    failing: bool,
}

impl QueueReader {
    /// What `/metrics` shows.
    pub fn snapshot(&self) -> &QueueSnapshot {
        &self.snapshot
    }

    /// The growth since the previous call of each interface in `names` (index → name: the
    /// attached ones), by name. Empty on the first call and after a failed read: a delta needs
    /// two good reads. An interface that appeared since (or whose root qdisc was replaced,
    /// resetting its counters below the last read) starts from this read.
    pub fn poll(&mut self, names: &HashMap<u32, String>) -> BTreeMap<String, QueueDelta> {
        self.snapshot.reads += 1;
        match read_interface_counters(names.keys().copied()) {
            Ok(now) => {
                self.failing = false;
                self.account(now, names)
            }
            Err(e) => {
                self.snapshot.errors += 1;
                if !self.failing {
                    tracing::warn!("reading the interfaces' queue and carrier counters (RTM_GETQDISC, RTM_GETLINK) failed: {e}; queue drops, throttles and carrier losses are not judged until it works again");
                }
                self.failing = true;
                self.last.clear();
                BTreeMap::new()
            }
        }
    }
}

impl QueueReader {
    /// One good read `now`: the attached interfaces' growth since the last one, added to the
    /// totals.
    fn account(&mut self, now: BTreeMap<u32, QueueCounters>, names: &HashMap<u32, String>) -> BTreeMap<String, QueueDelta> {
        let d: BTreeMap<String, QueueDelta> =
            deltas(&self.last, &now).into_iter().filter_map(|(i, d)| Some((names.get(&i)?.clone(), d))).collect();
        self.last = now;
        for (n, d) in &d {
            let t = self.snapshot.interfaces.entry(n.clone()).or_default();
            t.packets += d.packets;
            t.drops += d.drops;
            t.overlimits += d.overlimits;
            t.carrier_downs += d.carrier_downs;
        }
        d
    }
}

/// Growth of each interface's counters from `prev` to `now` (interfaces in both only).
///
/// Each counter's growth is taken modulo 2^32 (the kernel's counters wrap). A growth of 2^31 or
/// more is a counter that went *backwards*: the qdisc was replaced (a `tbf` added or removed
/// starts from zero), so the queue's counters count nothing for this read; a real wrap shows as a
/// small growth, and 2^31 packets in one window is beyond any link. The carrier-down count is the
/// link's, not the qdisc's: it is judged on its own, so a cable that went down in the window a
/// qdisc was replaced still shows (and a count that went backwards, an interface re-created under
/// the same index, counts nothing). An interface with nothing to count is left out.
pub fn deltas(prev: &BTreeMap<u32, QueueCounters>, now: &BTreeMap<u32, QueueCounters>) -> BTreeMap<u32, QueueDelta> {
    const BACKWARDS: u32 = 1 << 31;
    let grew = |now: u32, before: u32| Some(now.wrapping_sub(before)).filter(|&g| g < BACKWARDS);
    now.iter()
        .filter_map(|(i, c)| {
            let p = prev.get(i)?;
            let queue = match (grew(c.packets, p.packets), grew(c.drops, p.drops), grew(c.overlimits, p.overlimits)) {
                (Some(packets), Some(drops), Some(overlimits)) => Some((packets, drops, overlimits)),
                _ => None,
            };
            let carrier = grew(c.carrier_downs, p.carrier_downs);
            if queue.is_none() && carrier.is_none_or(|n| n == 0) {
                return None;
            }
            let (packets, drops, overlimits) = queue.unwrap_or_default();
            Some((
                *i,
                QueueDelta {
                    packets: u64::from(packets),
                    drops: u64::from(drops),
                    overlimits: u64::from(overlimits),
                    carrier_downs: u64::from(carrier.unwrap_or(0)),
                },
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use netlink_packet_route::tc::{TcStatsBasic, TcStatsQueue};

    fn qdisc(index: i32, parent: TcHandle, packets: u32, drops: u32) -> TcMessage {
        // Both types are `#[non_exhaustive]`: built field by field.
        let mut basic = TcStatsBasic::default();
        basic.packets = packets;
        let mut queue = TcStatsQueue::default();
        queue.drops = drops;
        let mut m = TcMessage::default();
        m.header.index = index;
        m.header.parent = parent;
        m.attributes = vec![
            TcAttribute::Kind("tbf".into()),
            TcAttribute::Stats2(vec![TcStats2::Basic(basic), TcStats2::Queue(queue)]),
        ];
        m
    }

    #[test]
    fn only_root_qdiscs_count() {
        assert_eq!(root_counters(&qdisc(3, TcHandle::ROOT, 10, 2)), Some((3, QueueCounters { packets: 10, drops: 2, overlimits: 0, carrier_downs: 0 })));
        assert_eq!(root_counters(&qdisc(3, TcHandle { major: 1, minor: 1 }, 10, 2)), None);
        assert_eq!(root_counters(&qdisc(0, TcHandle::ROOT, 10, 2)), None);
        let mut bare = qdisc(4, TcHandle::ROOT, 0, 0);
        bare.attributes.truncate(1);
        assert_eq!(root_counters(&bare), None, "no statistics, nothing to say");
    }

    #[test]
    fn reads_report_and_sum_the_attached_interfaces_only() {
        let names = HashMap::from([(2, "fabric".to_owned())]);
        let read = |p, d| BTreeMap::from([(2, QueueCounters { packets: p, drops: d, overlimits: 0, carrier_downs: 0 }), (3, QueueCounters { packets: 5 * p, drops: 5 * d, overlimits: 0, carrier_downs: 0 })]);
        let mut r = QueueReader::default();
        assert!(r.account(read(0, 0), &names).is_empty(), "the first read is the reference");
        let fabric = |p, d| BTreeMap::from([("fabric".to_owned(), QueueDelta { packets: p, drops: d, overlimits: 0, carrier_downs: 0 })]);
        assert_eq!(r.account(read(10, 1), &names), fabric(10, 1));
        assert_eq!(r.account(read(20, 2), &names), fabric(10, 1));
        assert_eq!(r.snapshot().interfaces, fabric(20, 2), "interface 3 is not attached");
    }

    /// A poll of this process's namespace counts its read.
    #[test]
    fn a_poll_counts_its_read() {
        let mut r = QueueReader::default();
        r.poll(&HashMap::new());
        assert_eq!((r.snapshot().reads, r.snapshot().errors), (1, 0));
    }

    #[test]
    fn deltas_wrap_and_skip_replaced_or_new_queues() {
        let prev = BTreeMap::from([
            (1, QueueCounters { packets: u32::MAX - 5, drops: 7, overlimits: 0, carrier_downs: 0 }),
            (2, QueueCounters { packets: 1000, drops: 50, overlimits: 0, carrier_downs: 0 }),
            (4, QueueCounters { packets: 207_000, drops: 0, overlimits: 0, carrier_downs: 0 }),
        ]);
        let now = BTreeMap::from([
            (1, QueueCounters { packets: 4, drops: 9, overlimits: 0, carrier_downs: 0 }),
            (2, QueueCounters { packets: 10, drops: 0, overlimits: 0, carrier_downs: 0 }),
            (3, QueueCounters { packets: 5, drops: 5, overlimits: 0, carrier_downs: 0 }),
            (4, QueueCounters { packets: 0, drops: 0, overlimits: 0, carrier_downs: 0 }),
        ]);
        let d = deltas(&prev, &now);
        assert_eq!(d.get(&1), Some(&QueueDelta { packets: 10, drops: 2, overlimits: 0, carrier_downs: 0 }), "the 32-bit counter wrapped");
        assert_eq!(d.get(&2), None, "replaced: both counters went backwards");
        assert_eq!(d.get(&3), None, "new: no previous read");
        assert_eq!(d.get(&4), None, "a tbf replaced by noqueue: packets went backwards, drops stayed 0");
        assert_eq!(QueueDelta { packets: 90, drops: 10, overlimits: 0, carrier_downs: 0 }.drop_ratio(), Some(0.1));
        assert_eq!(QueueDelta::default().drop_ratio(), None);
    }

    #[test]
    fn carrier_downs_grow_with_the_queue_counters_and_alone() {
        let c = |packets, carrier_downs| QueueCounters { packets, drops: 0, overlimits: 0, carrier_downs };
        let d = deltas(&BTreeMap::from([(1, c(100, 3)), (2, c(100, 0))]), &BTreeMap::from([(1, c(100, 5)), (2, c(150, 0))]));
        assert_eq!(d[&1], QueueDelta { carrier_downs: 2, ..Default::default() }, "a queue-less link that went down twice");
        assert_eq!(d[&2], QueueDelta { packets: 50, ..Default::default() });
        // A qdisc replaced in the window the cable went down: the queue counts nothing, the
        // carrier still does; a carrier count that went backwards counts nothing either.
        let d = deltas(&BTreeMap::from([(1, c(1000, 3)), (2, c(1000, 3)), (3, c(1000, 7))]), &BTreeMap::from([(1, c(10, 4)), (2, c(10, 3)), (3, c(1200, 0))]));
        assert_eq!(d.get(&1), Some(&QueueDelta { carrier_downs: 1, ..Default::default() }), "replaced queue, carrier lost once");
        assert_eq!(d.get(&2), None, "replaced queue, carrier kept: nothing to count");
        assert_eq!(d.get(&3), Some(&QueueDelta { packets: 200, ..Default::default() }), "a carrier count that went backwards");
        let mut m = LinkMessage::default();
        m.header.index = 7;
        assert_eq!(carrier_downs(&m), None, "a kernel without IFLA_CARRIER_DOWN_COUNT");
        m.attributes = vec![LinkAttribute::CarrierChanges(9), LinkAttribute::CarrierDownCount(4)];
        assert_eq!(carrier_downs(&m), Some((7, 4)));
    }

    /// The reads work in this process's namespace without privileges: loopback (index 1, in
    /// every namespace) is listed once asked for, whether or not it has a root qdisc, both one by
    /// one and in the dump of more than `LINK_GETS_MAX` indexes; an index that names no interface
    /// is left out, not an error.
    #[test]
    fn a_read_of_this_namespace_succeeds() {
        let read = read_interface_counters([1, 999_999]).expect("RTM_GETQDISC and RTM_GETLINK need no privileges");
        assert!(read.contains_key(&1), "loopback missing from {read:?}");
        assert!(!read.contains_key(&999_999), "{read:?}");
        let many: Vec<u32> = (1..=LINK_GETS_MAX as u32 + 1).chain([999_999]).collect();
        let read = read_interface_counters(many).expect("the dump of all links");
        assert!(read.contains_key(&1) && !read.contains_key(&999_999), "{read:?}");
    }
}
