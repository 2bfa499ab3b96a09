//! Running a loaded TC classifier on a crafted frame with `BPF_PROG_TEST_RUN`.
//!
//! Used by the T1 tests (`dataplane-user/tests/t1_flowmon.rs`) and by the benchmark
//! (`dataplane-user/examples/bench_ebpf.rs`).
//! aya 0.14 exposes the command as [`aya::programs::TestRun::test_run`]; this module adds what the
//! callers need on top: an `__sk_buff` context (so a run can look like ingress or egress, or like a
//! GSO super-packet), an output buffer sized for the frame, and typed errors.
//!
//! Kernel behaviour this relies on (net/bpf/test_run.c, `bpf_prog_test_run_skb`):
//! - the frame must be at least `ETH_HLEN` (14) bytes, else `EINVAL`;
//! - the skb is linear, its device is loopback (ifindex 1) unless `ifindex` names another one, and
//!   `ingress_ifindex` becomes `skb->skb_iif`;
//! - the program runs `repeat` times on the same skb, on the calling thread's CPU, and `duration`
//!   is the mean time per run in ns (`bpf_test_timer`), loop overhead included.
use std::time::Duration;

use aya::programs::{ProgramError, SchedClassifier, TestRun, TestRunOptions};

/// Size of `struct __sk_buff` in the kernel UAPI (include/uapi/linux/bpf.h, up to `hwtstamp`).
pub const SK_BUFF_SIZE: usize = 192;
const OFF_MARK: usize = 8;
const OFF_INGRESS_IFINDEX: usize = 36;
const OFF_IFINDEX: usize = 40;
const OFF_GSO_SEGS: usize = 164;
const OFF_GSO_SIZE: usize = 176;

/// The `__sk_buff` fields `BPF_PROG_TEST_RUN` lets a caller set that matter to the monitor. All
/// other bytes of the context must be zero or the kernel answers `EINVAL`
/// (`convert___skb_to_skb`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SkbContext {
    /// `skb->skb_iif`. Equal to the device's ifindex (1, loopback, by default) makes the monitor
    /// read the packet as ingress; 0 as a locally generated egress packet.
    pub ingress_ifindex: u32,
    /// Device to run on; 0 or 1 keep loopback.
    pub ifindex: u32,
    pub mark: u32,
    /// `skb_shinfo(skb)->gso_segs`: how many wire packets the skb stands for (0 = not GSO).
    pub gso_segs: u32,
    pub gso_size: u32,
}

/// Loopback's ifindex: the device test-run skbs belong to by default.
pub const LOOPBACK_IFINDEX: u32 = 1;

impl SkbContext {
    /// A context that the monitor reads as ingress on loopback.
    pub fn ingress() -> Self {
        Self { ingress_ifindex: LOOPBACK_IFINDEX, ..Self::default() }
    }

    /// A context that the monitor reads as egress on loopback (locally generated packet).
    pub fn egress() -> Self {
        Self::default()
    }

    /// The context as the kernel's `struct __sk_buff` bytes.
    pub fn to_bytes(&self) -> [u8; SK_BUFF_SIZE] {
        let mut b = [0u8; SK_BUFF_SIZE];
        let mut put = |off: usize, v: u32| b[off..off + 4].copy_from_slice(&v.to_ne_bytes());
        put(OFF_MARK, self.mark);
        put(OFF_INGRESS_IFINDEX, self.ingress_ifindex);
        put(OFF_IFINDEX, self.ifindex);
        put(OFF_GSO_SEGS, self.gso_segs);
        put(OFF_GSO_SIZE, self.gso_size);
        b
    }
}

/// What one `BPF_PROG_TEST_RUN` returned.
#[derive(Debug, Clone)]
pub struct RunOutcome {
    /// The program's return value (the TC verdict).
    pub return_value: u32,
    /// Mean time per run as measured by the kernel.
    pub duration: Duration,
    /// The packet after the program ran.
    pub data_out: Vec<u8>,
}

#[derive(Debug, thiserror::Error)]
pub enum TestRunError {
    #[error("BPF_PROG_TEST_RUN needs a frame of at least 14 bytes (an Ethernet header); got {len}")]
    FrameTooShort { len: usize },
    #[error("BPF_PROG_TEST_RUN failed on a {len}-byte frame (repeat {repeat}): {source}; run as root on a kernel with BPF_PROG_TEST_RUN for sched_cls (4.12+)")]
    Syscall {
        len: usize,
        repeat: u32,
        #[source]
        source: ProgramError,
    },
}

/// Runs `prog` on `frame` `repeat` times (at least once).
pub fn run(
    prog: &SchedClassifier,
    frame: &[u8],
    ctx: Option<&SkbContext>,
    repeat: u32,
) -> Result<RunOutcome, TestRunError> {
    if frame.len() < 14 {
        return Err(TestRunError::FrameTooShort { len: frame.len() });
    }
    let ctx_bytes = ctx.map(SkbContext::to_bytes);
    // Room for the frame plus anything a program could push; the monitor never grows a packet.
    let mut out = vec![0u8; frame.len() + 256];
    let opts = TestRunOptions {
        data_in: Some(frame),
        data_out: Some(&mut out),
        ctx_in: ctx_bytes.as_ref().map(|b| &b[..]),
        repeat: repeat.max(1),
        ..TestRunOptions::new()
    };
    let result = prog.test_run(opts).map_err(|source| TestRunError::Syscall {
        len: frame.len(),
        repeat,
        source,
    })?;
    out.truncate(result.data_size_out as usize);
    Ok(RunOutcome { return_value: result.return_value, duration: result.duration, data_out: out })
}

/// Pins the calling thread to one CPU. Test runs execute on the caller's CPU, so pinning decides
/// which CPU's copy of the per-CPU map `STATS` a run counts in: a test stays on one CPU to find
/// its outcome counts in one place, or moves between CPUs on purpose to check that the shared flow
/// entry (`FLOWS`: counters and tracking state) sees packets handled by another CPU.
pub fn pin_current_thread(cpu: usize) -> std::io::Result<()> {
    // SAFETY: cpu_set_t is plain data; CPU_ZERO/CPU_SET only write inside it; pid 0 = this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_ZERO(&mut set);
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// A copy of every slot of `FLOWS` (a `BPF_F_MMAPABLE` array), read through one `mmap` as the
/// agent reads it. Read by index it is one bpf() syscall per slot, 16,384 for the default size:
/// fine on the host, slow enough under QEMU's TCG on a busy machine to matter to the T1 kernel
/// matrix's guest timeout.
pub fn flow_slots(flows: &aya::maps::MapData) -> std::io::Result<Vec<dataplane_common::FlowSlot>> {
    use std::os::fd::{AsFd as _, AsRawFd as _};
    let n = flows.info().map_err(std::io::Error::other)?.max_entries() as usize;
    let len = n * std::mem::size_of::<dataplane_common::FlowSlot>();
    // SAFETY: a fresh read-only shared mapping of an mmapable array's values (offset 0, the
    // array's size); unmapped below after the copy.
    let p = unsafe {
        libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, flows.fd().as_fd().as_raw_fd(), 0)
    };
    if p == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `n` slots at a page-aligned address inside the mapping; FlowSlot is FromBytes (any
    // bytes are a valid value); the copy is made before the unmap.
    let v = unsafe { std::slice::from_raw_parts(p.cast::<dataplane_common::FlowSlot>(), n) }.to_vec();
    // SAFETY: the mapping made above, unmapped once.
    unsafe { libc::munmap(p, len) };
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sk_buff_context_layout() {
        let ctx = SkbContext { ingress_ifindex: 7, ifindex: 9, mark: 3, gso_segs: 4, gso_size: 1448 };
        let b = ctx.to_bytes();
        let at = |off: usize| u32::from_ne_bytes(b[off..off + 4].try_into().unwrap());
        assert_eq!(at(8), 3);
        assert_eq!(at(36), 7);
        assert_eq!(at(40), 9);
        assert_eq!(at(164), 4);
        assert_eq!(at(176), 1448);
        // Everything else zero: the kernel rejects non-zero bytes in fields it does not accept.
        let nonzero = b.iter().filter(|&&x| x != 0).count();
        assert_eq!(nonzero, 6, "1448 = 0x05a8 takes two bytes");
    }
}
