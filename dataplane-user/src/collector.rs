//! The collector: every poll interval, read the kernel maps into a [`PollSnapshot`], fold it into
//! the shared [`FlowTable`](crate::flow_table::FlowTable), and delete the flows it forgot.
//!
//! This is the only code that reads maps. It runs on its own thread so a slow syscall never
//! delays an HTTP response, and it holds the state's write lock only for the pure `apply`.
//! The data path is never blocked: map reads are lookups, and `EVENTS` is drained without waiting.
use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread,
    time::{Duration, Instant},
};

use aya::maps::{Map, MapData, MapError, PerCpuArray, PerCpuHashMap, RingBuf};
use dataplane_common::{maps, Event, FlowKey, FlowStats, MAX_FLOWS};
use zerocopy::FromBytes as _;

use crate::{
    flow_table::{PollSnapshot, STATS_COUNT},
    state::SharedState,
};

/// Errors reading the maps.
#[derive(Debug, thiserror::Error)]
pub enum CollectError {
    #[error("map `{name}` has an unexpected type or layout: {source}; the agent and the eBPF object are from different builds, rebuild with `cargo xtask build`")]
    MapType { name: &'static str, source: MapError },
    #[error("reading map `{name}` failed: {source}")]
    Read { name: &'static str, source: MapError },
}

/// The maps the collector reads, taken out of the loaded object.
pub struct KernelMaps {
    flows: PerCpuHashMap<MapData, FlowKey, FlowStats>,
    /// A duplicate of `FLOWS`' fd for `BPF_MAP_LOOKUP_BATCH`, and the possible-CPU count that
    /// sizes per-CPU values; `None` after batch lookup failed once (then the map is walked).
    batch: Option<(std::os::fd::OwnedFd, usize)>,
    stats: PerCpuArray<MapData, u64>,
    events: RingBuf<MapData>,
}

impl KernelMaps {
    pub fn new(flows: Map, stats: Map, events: Map) -> Result<Self, CollectError> {
        use std::os::fd::AsFd as _;
        let batch = match &flows {
            Map::PerCpuLruHashMap(m) | Map::PerCpuHashMap(m) => m.fd().as_fd().try_clone_to_owned().ok(),
            _ => None,
        }
        .zip(aya::util::nr_cpus().ok());
        Ok(KernelMaps {
            batch,
            flows: PerCpuHashMap::try_from(flows).map_err(|source| CollectError::MapType { name: maps::FLOWS, source })?,
            stats: PerCpuArray::try_from(stats).map_err(|source| CollectError::MapType { name: maps::STATS, source })?,
            events: RingBuf::try_from(events).map_err(|source| CollectError::MapType { name: maps::EVENTS, source })?,
        })
    }

    /// Reads everything into a snapshot.
    ///
    /// `FLOWS` is walked key by key (aya 0.14 has no `BPF_MAP_LOOKUP_BATCH` wrapper): one
    /// get-next-key and one lookup per flow. The walk is bounded to twice the map's capacity
    /// because a key deleted mid-walk makes the kernel restart from the first key.
    pub fn snapshot(&mut self) -> Result<PollSnapshot, CollectError> {
        let mono_ns = crate::clock::monotonic_ns();
        let mut flows: HashMap<FlowKey, Vec<FlowStats>> = HashMap::new();
        let batched = match &self.batch {
            Some((fd, ncpus)) => match lookup_batch(std::os::fd::AsRawFd::as_raw_fd(fd), *ncpus) {
                Ok(v) => Some(v),
                Err(e) => {
                    tracing::info!("BPF_MAP_LOOKUP_BATCH on FLOWS failed ({e}); walking the map key by key instead");
                    None
                }
            },
            None => None,
        };
        match batched {
            Some(v) => flows.extend(v),
            None => {
                self.batch = None;
                for item in self.flows.iter().take(2 * MAX_FLOWS as usize) {
                    let (k, v) = item.map_err(|source| CollectError::Read { name: maps::FLOWS, source })?;
                    flows.insert(k, v.to_vec());
                }
            }
        }
        let mut stats = [0u64; STATS_COUNT];
        for (i, slot) in stats.iter_mut().enumerate() {
            let per_cpu = self.stats.get(&(i as u32), 0).map_err(|source| CollectError::Read { name: maps::STATS, source })?;
            *slot = per_cpu.iter().copied().fold(0u64, u64::wrapping_add);
        }
        let mut events = Vec::new();
        while let Some(item) = self.events.next() {
            if let Some(ev) = decode_event(&item) {
                events.push(ev);
            }
        }
        Ok(PollSnapshot { mono_ns, flows: flows.into_iter().collect(), stats, events })
    }

    /// Deletes forgotten flows from `FLOWS` (a flow already gone is fine).
    pub fn forget(&mut self, keys: &[FlowKey]) -> usize {
        keys.iter().filter(|k| self.flows.remove(k).is_ok()).count()
    }
}

/// Reads a per-CPU hash of `FlowKey → FlowStats` with `BPF_MAP_LOOKUP_BATCH` (kernel ≥ 5.6):
/// about one syscall per 1024 flows instead of two per flow. The kernel lays out per-CPU values
/// as `ncpus` consecutive values rounded up to 8 bytes (FlowStats is 176 bytes, already aligned).
fn lookup_batch(map_fd: i32, ncpus: usize) -> std::io::Result<Vec<(FlowKey, Vec<FlowStats>)>> {
    const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
    const CHUNK: usize = 1024;
    #[repr(C)]
    #[derive(Default)]
    struct BatchAttr {
        in_batch: u64,
        out_batch: u64,
        keys: u64,
        values: u64,
        count: u32,
        map_fd: u32,
        elem_flags: u64,
        flags: u64,
    }
    const _: () = assert!(std::mem::size_of::<FlowStats>() % 8 == 0);
    let mut out = Vec::new();
    let mut keys = vec![FlowKey::default(); CHUNK];
    let mut values = vec![FlowStats::default(); CHUNK * ncpus];
    // The hash-map batch token is a u32 bucket index; 8 bytes leave room for any key type.
    let mut token_in = [0u64; 1];
    let mut token_out = [0u64; 1];
    let mut first = true;
    // Bounded: the map holds at most MAX_FLOWS entries, so this many chunks always suffice.
    for _ in 0..(2 * MAX_FLOWS as usize / CHUNK + 2) {
        let mut attr = BatchAttr {
            in_batch: if first { 0 } else { token_in.as_ptr() as u64 },
            out_batch: token_out.as_mut_ptr() as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: CHUNK as u32,
            map_fd: map_fd as u32,
            ..Default::default()
        };
        // SAFETY: attr points at buffers sized for `count` keys and `count * ncpus` values, which
        // live until the call returns; the kernel writes at most that much. Whatever bytes it
        // writes are valid keys and values: FlowKey and FlowStats are `FromBytes` (derived).
        let rc = unsafe {
            libc::syscall(libc::SYS_bpf, BPF_MAP_LOOKUP_BATCH, &mut attr as *mut BatchAttr, std::mem::size_of::<BatchAttr>() as u32)
        };
        let err = (rc < 0).then(std::io::Error::last_os_error);
        let n = attr.count as usize;
        for i in 0..n.min(CHUNK) {
            out.push((keys[i], values[i * ncpus..(i + 1) * ncpus].to_vec()));
        }
        match err {
            None => {}
            // ENOENT: no more entries (the last chunk may still carry some).
            Some(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(out),
            Some(e) => return Err(e),
        }
        token_in = token_out;
        first = false;
    }
    Err(std::io::Error::other("FLOWS batch walk did not end"))
}

/// Decodes one ring-buffer record; records shorter than an `Event` are ignored. A copy, so any
/// alignment of the record is fine; `Event: FromBytes` makes every byte pattern a valid value.
pub fn decode_event(bytes: &[u8]) -> Option<Event> {
    Event::read_from_prefix(bytes).ok().map(|(event, _rest)| event)
}

/// Runs the poll loop on a thread until `stop` is set. Returns the thread's handle.
pub fn spawn(mut maps: KernelMaps, state: SharedState, interval: Duration, stop: Arc<AtomicBool>) -> thread::JoinHandle<()> {
    thread::Builder::new()
        .name("ringside-collector".into())
        .spawn(move || {
            let mut next = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                let started = Instant::now();
                match maps.snapshot() {
                    Ok(snap) => {
                        let forget = {
                            let mut s = state.write().unwrap_or_else(|p| p.into_inner());
                            s.table.apply(&snap)
                        };
                        let deleted = if forget.is_empty() { 0 } else { maps.forget(&forget) };
                        let took = started.elapsed();
                        let mut s = state.write().unwrap_or_else(|p| p.into_inner());
                        s.record_poll(took);
                        if s.polls == 1 {
                            tracing::info!(flows = snap.flows.len(), took_us = took.as_micros() as u64, "first poll done");
                        }
                        if !forget.is_empty() {
                            tracing::debug!(forgotten = forget.len(), deleted, "flows forgotten");
                        }
                    }
                    Err(e) => {
                        tracing::warn!("poll failed: {e}");
                        state.write().unwrap_or_else(|p| p.into_inner()).record_poll_error(e.to_string());
                    }
                }
                next += interval;
                let now = Instant::now();
                if next < now {
                    // Overran: skip missed ticks rather than bursting to catch up.
                    next = now + interval;
                }
                // Sleep in small steps so a stop request is seen within 50 ms.
                while !stop.load(Ordering::Relaxed) {
                    let now = Instant::now();
                    if now >= next {
                        break;
                    }
                    thread::sleep((next - now).min(Duration::from_millis(50)));
                }
            }
        })
        .expect("spawning the collector thread")
}

#[cfg(test)]
mod tests {
    use super::*;
    use dataplane_common::{event_kind, BurstState};

    #[test]
    fn decodes_events() {
        let ev = Event { kind: event_kind::BURST_END, burst: BurstState { start_ns: 1, last_ns: 2, bytes: 3, packets: 4 }, ..Default::default() };
        let mut bytes = vec![0u8; 1];
        bytes.extend_from_slice(zerocopy::IntoBytes::as_bytes(&ev));
        assert_eq!(decode_event(&bytes[1..]), Some(ev), "unaligned input");
        assert_eq!(decode_event(&bytes[1..50]), None);
    }
}
