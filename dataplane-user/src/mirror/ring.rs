//! An `AF_PACKET` socket with a `TPACKET_V3` receive ring, bound to one interface.
//!
//! The kernel copies each frame (cut to the snap length by a one-instruction classic BPF filter)
//! into fixed-size blocks of a ring shared with user space by `mmap`; a block is handed over when
//! it is full or `retire_ms` after its first frame (Documentation/networking/packet_mmap.rst,
//! "TPACKET_V3"). Reading costs no system call per frame and no copy; the only syscall on the
//! path is a `poll` when no block is ready. A full ring drops frames in the kernel, counted in
//! `PACKET_STATISTICS` (`tp_drops`), which [`PacketRing::statistics`] adds up.
//!
//! Layouts: include/uapi/linux/if_packet.h (`tpacket_req3`, `tpacket_block_desc`,
//! `tpacket_hdr_v1`, `tpacket3_hdr`, `tpacket_stats_v3`). Defined here rather than taken from
//! `libc`, whose Linux module does not carry all of them on every target.
use std::{
    ffi::CString,
    io,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    ptr::NonNull,
    sync::atomic::{AtomicU32, Ordering},
    time::Duration,
};

const SOL_PACKET: libc::c_int = 263;
const PACKET_RX_RING: libc::c_int = 5;
const PACKET_STATISTICS: libc::c_int = 6;
const PACKET_VERSION: libc::c_int = 10;
const PACKET_IGNORE_OUTGOING: libc::c_int = 23;
const TPACKET_V3: libc::c_int = 2;
const TP_STATUS_KERNEL: u32 = 0;
const TP_STATUS_USER: u32 = 1;
const ETH_P_ALL: u16 = 0x0003;
/// Classic BPF `ret #k` (BPF_RET | BPF_K): accept the frame, keep its first `k` bytes.
const BPF_RET_K: u16 = 0x06;

#[repr(C)]
struct TpacketReq3 {
    tp_block_size: u32,
    tp_block_nr: u32,
    tp_frame_size: u32,
    tp_frame_nr: u32,
    tp_retire_blk_tov: u32,
    tp_sizeof_priv: u32,
    tp_feature_req_word: u32,
}

#[repr(C)]
#[derive(Default)]
struct TpacketStatsV3 {
    tp_packets: u32,
    tp_drops: u32,
    tp_freeze_q_cnt: u32,
}

#[repr(C)]
struct SockFilter {
    code: u16,
    jt: u8,
    jf: u8,
    k: u32,
}

#[repr(C)]
struct SockFprog {
    len: u16,
    filter: *const SockFilter,
}

// Offsets in a block: `tpacket_block_desc { u32 version; u32 offset_to_priv; tpacket_hdr_v1 }`,
// `tpacket_hdr_v1 { u32 block_status; u32 num_pkts; u32 offset_to_first_pkt; ... }`.
const BLOCK_STATUS_OFF: usize = 8;
const BLOCK_NUM_PKTS_OFF: usize = 12;
const BLOCK_FIRST_PKT_OFF: usize = 16;
// Offsets in a frame header: `tpacket3_hdr { u32 tp_next_offset; u32 tp_sec; u32 tp_nsec;
// u32 tp_snaplen; u32 tp_len; u32 tp_status; u16 tp_mac; u16 tp_net; ... }`.
const PKT_NEXT_OFF: usize = 0;
const PKT_SEC_OFF: usize = 4;
const PKT_NSEC_OFF: usize = 8;
const PKT_SNAPLEN_OFF: usize = 12;
const PKT_LEN_OFF: usize = 16;
const PKT_MAC_OFF: usize = 24;
/// Size of `tpacket3_hdr` (with its trailing padding): no frame starts closer to a block's end.
const PKT_HDR_LEN: usize = 48;

/// The ring's geometry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingGeometry {
    /// Bytes per block: a power of two, a multiple of the page size.
    pub block_size: u32,
    pub blocks: u32,
    /// Bytes of each frame kept (the rest is cut by the socket filter; `tp_len` still says how
    /// long the frame was).
    pub snap_len: u32,
    /// A block that is not full is handed over this long after its first frame.
    pub retire: Duration,
}

/// One frame in the ring: its captured bytes, its length on the wire and the socket's receive
/// timestamp (CLOCK_REALTIME, nanoseconds).
pub struct RingFrame<'a> {
    pub bytes: &'a [u8],
    pub wire_len: usize,
    pub realtime_ns: u64,
}

/// A bound packet socket and its mapped ring. Drop unmaps the ring and closes the socket.
pub struct PacketRing {
    fd: OwnedFd,
    map: NonNull<u8>,
    geometry: RingGeometry,
    /// The block to read next (blocks are handed over in order).
    next: u32,
    /// Frames that did not fit their block's bounds (a kernel/user layout mismatch: never seen).
    pub bad_frames: u64,
}

// SAFETY: the mapping is owned by this value and only touched through `&mut self`.
unsafe impl Send for PacketRing {}

/// Which step of opening the ring failed (for [`super::MirrorError`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RingStep {
    Socket,
    Version,
    IgnoreOutgoing,
    Filter,
    Ring,
    Mmap,
    Bind,
}

impl std::fmt::Display for RingStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RingStep::Socket => "socket(AF_PACKET, SOCK_RAW)",
            RingStep::Version => "setsockopt(PACKET_VERSION, TPACKET_V3)",
            RingStep::IgnoreOutgoing => "setsockopt(PACKET_IGNORE_OUTGOING)",
            RingStep::Filter => "setsockopt(SO_ATTACH_FILTER)",
            RingStep::Ring => "setsockopt(PACKET_RX_RING)",
            RingStep::Mmap => "mmap of the receive ring",
            RingStep::Bind => "bind to the interface",
        })
    }
}

fn setsockopt<T>(fd: &OwnedFd, level: libc::c_int, name: libc::c_int, value: &T) -> io::Result<()> {
    // SAFETY: `value` is a live `T` of the size passed.
    let rc = unsafe {
        libc::setsockopt(fd.as_raw_fd(), level, name, (value as *const T).cast(), std::mem::size_of::<T>() as libc::socklen_t)
    };
    if rc == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

/// The index of interface `name` in the calling thread's network namespace, if it exists.
pub fn ifindex(name: &str) -> Option<u32> {
    let c = CString::new(name).ok()?;
    // SAFETY: a NUL-terminated string.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    (i != 0).then_some(i)
}

impl PacketRing {
    /// Opens the socket, maps the ring and binds to `ifindex` (all frames, both directions as the
    /// interface receives them; frames the host itself sends out of it are ignored).
    pub fn open(ifindex: u32, geometry: RingGeometry) -> Result<PacketRing, (RingStep, io::Error)> {
        // Protocol 0: no frame is queued before the filter and the ring are in place; `bind`
        // below names the protocol (all) and the interface.
        // SAFETY: plain syscall; the fd is owned right away.
        let raw = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            return Err((RingStep::Socket, io::Error::last_os_error()));
        }
        // SAFETY: a fresh fd nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        setsockopt(&fd, SOL_PACKET, PACKET_VERSION, &TPACKET_V3).map_err(|e| (RingStep::Version, e))?;
        // Anything the agent's namespace transmits on the mirror port (IPv6 router solicitations,
        // say) is not mirrored traffic.
        setsockopt(&fd, SOL_PACKET, PACKET_IGNORE_OUTGOING, &1 as &libc::c_int).map_err(|e| (RingStep::IgnoreOutgoing, e))?;
        let ret = [SockFilter { code: BPF_RET_K, jt: 0, jf: 0, k: geometry.snap_len }];
        let prog = SockFprog { len: 1, filter: ret.as_ptr() };
        setsockopt(&fd, libc::SOL_SOCKET, libc::SO_ATTACH_FILTER, &prog).map_err(|e| (RingStep::Filter, e))?;
        let req = TpacketReq3 {
            tp_block_size: geometry.block_size,
            tp_block_nr: geometry.blocks,
            // With TPACKET_V3 frames are packed into blocks at their own size; the frame fields
            // only have to be consistent (block_size / frame_size frames per block).
            tp_frame_size: 2048,
            tp_frame_nr: geometry.block_size / 2048 * geometry.blocks,
            tp_retire_blk_tov: geometry.retire.as_millis().clamp(1, u32::MAX as u128) as u32,
            tp_sizeof_priv: 0,
            tp_feature_req_word: 0,
        };
        setsockopt(&fd, SOL_PACKET, PACKET_RX_RING, &req).map_err(|e| (RingStep::Ring, e))?;
        let len = geometry.block_size as usize * geometry.blocks as usize;
        // SAFETY: a shared mapping of the ring the kernel just allocated for this socket.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd.as_raw_fd(), 0) };
        if p == libc::MAP_FAILED {
            return Err((RingStep::Mmap, io::Error::last_os_error()));
        }
        let ring = PacketRing { fd, map: NonNull::new(p.cast()).expect("mmap never returns NULL on success"), geometry, next: 0, bad_frames: 0 };
        // SAFETY: sockaddr_ll is plain data; all-zero is valid.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = ETH_P_ALL.to_be();
        sll.sll_ifindex = ifindex as i32;
        // SAFETY: a valid sockaddr_ll of the size passed.
        let rc = unsafe {
            libc::bind(ring.fd.as_raw_fd(), (&sll as *const libc::sockaddr_ll).cast(), std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t)
        };
        if rc != 0 {
            return Err((RingStep::Bind, io::Error::last_os_error()));
        }
        Ok(ring)
    }

    fn block(&self, i: u32) -> *mut u8 {
        // SAFETY: i < blocks, so the offset stays inside the mapping.
        unsafe { self.map.as_ptr().add(i as usize * self.geometry.block_size as usize) }
    }

    fn status(&self, i: u32) -> &AtomicU32 {
        // SAFETY: block_status is an aligned u32 inside the mapping that the kernel and this
        // process both write; an atomic gives the acquire/release order the hand-over needs
        // (the kernel publishes a block with smp_wmb before setting TP_STATUS_USER).
        unsafe { &*(self.block(i).add(BLOCK_STATUS_OFF) as *const AtomicU32) }
    }

    fn read_u32(base: *const u8, off: usize) -> u32 {
        // SAFETY: callers pass offsets inside the current block.
        unsafe { base.add(off).cast::<u32>().read_unaligned() }
    }

    /// Waits up to `timeout` for a block to be handed over.
    pub fn wait(&self, timeout: Duration) -> io::Result<bool> {
        if self.status(self.next).load(Ordering::Acquire) & TP_STATUS_USER != 0 {
            return Ok(true);
        }
        let mut pfd = libc::pollfd { fd: self.fd.as_raw_fd(), events: libc::POLLIN | libc::POLLERR, revents: 0 };
        // SAFETY: one valid pollfd.
        let rc = unsafe { libc::poll(&mut pfd, 1, timeout.as_millis().min(i32::MAX as u128) as i32) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::Interrupted { Ok(false) } else { Err(e) };
        }
        Ok(self.status(self.next).load(Ordering::Acquire) & TP_STATUS_USER != 0)
    }

    /// Hands every frame of the next ready block to `each` and returns the block to the kernel;
    /// returns the number of frames, or `None` when no block is ready.
    pub fn next_block(&mut self, mut each: impl FnMut(RingFrame<'_>)) -> Option<usize> {
        let i = self.next;
        if self.status(i).load(Ordering::Acquire) & TP_STATUS_USER == 0 {
            return None;
        }
        let base = self.block(i);
        let size = self.geometry.block_size as usize;
        let n = Self::read_u32(base, BLOCK_NUM_PKTS_OFF) as usize;
        let mut off = Self::read_u32(base, BLOCK_FIRST_PKT_OFF) as usize;
        let mut seen = 0;
        for _ in 0..n {
            // The kernel wrote these offsets; check them anyway so a layout mismatch cannot read
            // outside the block.
            if off + PKT_HDR_LEN > size {
                self.bad_frames += 1;
                break;
            }
            // SAFETY: off + header < block size (checked above).
            let h = unsafe { base.add(off) };
            let snap = Self::read_u32(h, PKT_SNAPLEN_OFF) as usize;
            // SAFETY: as above; u16 field.
            let mac = unsafe { h.add(PKT_MAC_OFF).cast::<u16>().read_unaligned() } as usize;
            if off + mac + snap > size {
                self.bad_frames += 1;
                break;
            }
            // SAFETY: [off + mac, off + mac + snap) lies inside the block (checked), which the
            // kernel does not write while its status is TP_STATUS_USER.
            let bytes = unsafe { std::slice::from_raw_parts(h.add(mac), snap) };
            let ns = u64::from(Self::read_u32(h, PKT_SEC_OFF)) * 1_000_000_000 + u64::from(Self::read_u32(h, PKT_NSEC_OFF));
            each(RingFrame { bytes, wire_len: Self::read_u32(h, PKT_LEN_OFF) as usize, realtime_ns: ns });
            seen += 1;
            let step = Self::read_u32(h, PKT_NEXT_OFF) as usize;
            if step == 0 {
                break;
            }
            off += step;
        }
        self.status(i).store(TP_STATUS_KERNEL, Ordering::Release);
        self.next = (i + 1) % self.geometry.blocks;
        Some(seen)
    }

    /// Frames the socket received and frames it dropped (ring full) since the last call: the
    /// kernel resets both when they are read.
    pub fn statistics(&self) -> io::Result<(u64, u64)> {
        let mut s = TpacketStatsV3::default();
        let mut len = std::mem::size_of::<TpacketStatsV3>() as libc::socklen_t;
        // SAFETY: a TpacketStatsV3 of the size passed.
        let rc = unsafe { libc::getsockopt(self.fd.as_raw_fd(), SOL_PACKET, PACKET_STATISTICS, (&mut s as *mut TpacketStatsV3).cast(), &mut len) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok((u64::from(s.tp_packets), u64::from(s.tp_drops)))
    }
}

impl Drop for PacketRing {
    fn drop(&mut self) {
        let len = self.geometry.block_size as usize * self.geometry.blocks as usize;
        // SAFETY: the mapping made in `open`, unmapped once; the fd closes after (OwnedFd).
        unsafe { libc::munmap(self.map.as_ptr().cast(), len) };
    }
}
