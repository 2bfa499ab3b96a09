//! `ipuwire`: the provider's data path of an emulated IPU/DPU, a two-port bump in the wire.
//!
//! One TC classifier attached on the ingress of both of the IPU's ports (the host-facing port
//! and the fabric-facing port). Every frame that arrives on one port is handed to the other
//! port's transmit path with `bpf_redirect(ifindex, 0)`, unchanged: no Linux bridge, no routing,
//! no learning. The frame then passes the egress hook of the port it leaves by, so a flow
//! monitor on the fabric port's ingress and egress sees both directions of the host's traffic.
//!
//! Invariants (what the loader in dataplane-user, `ipuwire.rs`, and the tests rely on):
//! - The ports come from `IPU_PORTS` (an array of two ifindexes: `[host, fabric]`), written by
//!   the loader before it attaches the program. A frame is forwarded only when the port it
//!   arrived on is one of the two and both entries are set.
//! - Fail-closed: a frame that cannot be forwarded (map unset, the frame arrived on a third
//!   interface, `bpf_redirect` refused) is dropped with `TC_ACT_SHOT` and counted. A bump in the
//!   wire without working firmware passes nothing, and the IPU namespace has no address to
//!   deliver a frame to, so passing it up the IPU's stack would only hide the fault.
//! - Local delivery (managed collectives): a frame that arrives on the fabric port addressed to
//!   the fabric port's own MAC (`IPU_LOCAL_MAC`, written by the loader; 0 = none) is passed up
//!   the IPU's own stack (`TC_ACT_OK`) instead of being forwarded: that is the IPU's fabric
//!   address, where `ringside-ipu` services reach each other. Nothing else is delivered locally:
//!   a frame from the host port is always forwarded (the tenant never reaches its IPU's stack
//!   through the wire), and broadcasts (ARP) are forwarded as before (the IPUs' neighbours are
//!   static). Before this, such a frame was forwarded to the host, which dropped it (not its MAC).
//! - Every frame is counted exactly once in `IPU_STATS` (per-CPU, see the `stat` constants).
//! - Bounded work: three array lookups, one 6-byte load, one counter update and the helper call,
//!   no loop.
//!
//! The map names, array layout and counter indices are repeated in dataplane-user's
//! `ipuwire.rs` (the flow monitor's shared crate is left alone so the flow monitor's object does
//! not change); the T1 test there checks both sides against each other on the real object.
#![no_std]
#![no_main]

use aya_ebpf::{
    bindings::{TC_ACT_OK, TC_ACT_REDIRECT, TC_ACT_SHOT},
    helpers::bpf_redirect,
    macros::{classifier, map},
    maps::{Array, PerCpuArray},
    programs::TcContext,
};

/// Index of the host-facing port's ifindex in `IPU_PORTS`.
const PORT_HOST: u32 = 0;
/// Index of the fabric-facing port's ifindex in `IPU_PORTS`.
const PORT_FABRIC: u32 = 1;

/// Indexes into `IPU_STATS`.
mod stat {
    /// Arrived on the host port, handed to the fabric port.
    pub const TO_FABRIC: u32 = 0;
    /// Arrived on the fabric port, handed to the host port.
    pub const TO_HOST: u32 = 1;
    /// Dropped: `IPU_PORTS` not set (loader not done, or gone).
    pub const UNCONFIGURED: u32 = 2;
    /// Dropped: arrived on an interface that is neither port.
    pub const FOREIGN_PORT: u32 = 3;
    /// Dropped: `bpf_redirect` refused.
    pub const REDIRECT_FAILED: u32 = 4;
    /// Arrived on the fabric port for the fabric port's own MAC: passed to the IPU's stack.
    pub const TO_LOCAL: u32 = 5;
    pub const COUNT: u32 = 6;
}

/// `[host ifindex, fabric ifindex]`; 0 means unset.
#[map(name = "IPU_PORTS")]
static IPU_PORTS: Array<u32> = Array::with_max_entries(2, 0);

/// The fabric port's MAC, bytes 0..6 of a little-endian u64 (`u64::from_le_bytes([m0, .., m5,
/// 0, 0])`); 0 = no local delivery.
#[map(name = "IPU_LOCAL_MAC")]
static IPU_LOCAL_MAC: Array<u64> = Array::with_max_entries(1, 0);

/// Frame counters, one copy per CPU (see `stat`).
#[map(name = "IPU_STATS")]
static IPU_STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(stat::COUNT, 0);

#[inline(always)]
fn count(index: u32) {
    // BH is disabled around TC programs, so a plain add on this CPU's slot is not interleaved.
    if let Some(p) = IPU_STATS.get_ptr_mut(index) {
        unsafe { *p += 1 };
    }
}

/// The forwarder. The verdict is `TC_ACT_REDIRECT` for a forwarded frame and `TC_ACT_SHOT` for
/// every other one (see the module docs for why it fails closed).
#[classifier]
pub fn ipuwire(ctx: TcContext) -> i32 {
    let host = IPU_PORTS.get(PORT_HOST).copied().unwrap_or(0);
    let fabric = IPU_PORTS.get(PORT_FABRIC).copied().unwrap_or(0);
    if host == 0 || fabric == 0 {
        count(stat::UNCONFIGURED);
        return TC_ACT_SHOT as i32;
    }
    // On ingress `ifindex` is the device the frame arrived on.
    let arrived = unsafe { (*ctx.skb.skb).ifindex };
    let (to, counter) = if arrived == host {
        (fabric, stat::TO_FABRIC)
    } else if arrived == fabric {
        let local = IPU_LOCAL_MAC.get(0).copied().unwrap_or(0);
        if local != 0 {
            // The destination MAC is the frame's first 6 bytes; a frame too short to hold one
            // is not for us and is forwarded as before.
            if let Ok(dst) = ctx.load::<[u8; 6]>(0) {
                let dst = u64::from_le_bytes([dst[0], dst[1], dst[2], dst[3], dst[4], dst[5], 0, 0]);
                if dst == local {
                    count(stat::TO_LOCAL);
                    return TC_ACT_OK as i32;
                }
            }
        }
        (host, stat::TO_HOST)
    } else {
        count(stat::FOREIGN_PORT);
        return TC_ACT_SHOT as i32;
    };
    // Flags 0: to the target's egress (its TC egress hook and qdisc run, then the veth peer).
    let verdict = unsafe { bpf_redirect(to, 0) } as i32;
    if verdict == TC_ACT_REDIRECT as i32 {
        count(counter);
        verdict
    } else {
        count(stat::REDIRECT_FAILED);
        TC_ACT_SHOT as i32
    }
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}
