//! T1: the IPU forwarder (`ipuwire`) in the kernel, run with `BPF_PROG_TEST_RUN` on a crafted
//! frame. Each test loads its own instance (maps are per load), writes `IPU_PORTS` and checks
//! the verdict, that the frame is unchanged, and that exactly the counter named for the outcome
//! moved ([`WireStats`] read through the agent's own `wire_stats`, so the indices repeated on
//! the user side are checked against the program).
//!
//! A test-run skb belongs to loopback (ifindex 1), so loopback plays one of the IPU's ports; the
//! other is an ifindex nothing has (`bpf_redirect` checks only its flags when called, and a test
//! run never performs the redirect).
//!
//! Needs root and an agent built with both objects (`cargo xtask build`); without either it
//! fails saying so.
use aya::{maps::Array, programs::SchedClassifier, Ebpf};
use dataplane_user::ipuwire::{self, WireStats};
use ringside_test_support::{
    frames,
    testrun::{self, SkbContext, LOOPBACK_IFINDEX},
};

/// include/uapi/linux/pkt_cls.h
const TC_ACT_OK: u32 = 0;
const TC_ACT_SHOT: u32 = 2;
const TC_ACT_REDIRECT: u32 = 7;
const ELSEWHERE: u32 = 999_999;

fn load() -> Ebpf {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        panic!("T1 tests load eBPF programs and run BPF_PROG_TEST_RUN, which needs root: run them with `cargo xtask test`");
    }
    let object = dataplane_user::object::ipuwire_object()
        .unwrap_or_else(|e| panic!("{e} (for T1: set RINGSIDE_EBPF_OBJECT to the built flowmon object; ipuwire is read from beside it)"));
    let mut ebpf = Ebpf::load(object).expect("loading ipuwire");
    let prog: &mut SchedClassifier = ebpf.program_mut(ipuwire::PROGRAM).expect("program ipuwire").try_into().unwrap();
    prog.load().expect("the verifier accepts ipuwire");
    ebpf
}

fn set_ports(ebpf: &mut Ebpf, host: u32, fabric: u32) {
    let mut ports: Array<_, u32> = Array::try_from(ebpf.map_mut(ipuwire::PORTS_MAP).expect("map IPU_PORTS")).unwrap();
    ports.set(0, host, 0).unwrap();
    ports.set(1, fabric, 0).unwrap();
}

/// Sets the fabric port's own MAC (as the loader does from /sys/class/net/FABRIC/address).
fn set_local_mac(ebpf: &mut Ebpf, mac: [u8; 6]) {
    let mut local: Array<_, u64> = Array::try_from(ebpf.map_mut(ipuwire::LOCAL_MAC_MAP).expect("map IPU_LOCAL_MAC")).unwrap();
    local.set(0, ipuwire::mac_to_u64(mac), 0).unwrap();
}

/// Runs one frame on "ingress of loopback" and returns the verdict, checking the frame is unchanged.
fn run(ebpf: &Ebpf) -> u32 {
    let frame = frames::tcp4([10, 77, 0, 1], [10, 77, 0, 2], 40000, 29500, 1, 0, 0x18, 0, b"payload");
    let prog: &SchedClassifier = ebpf.program(ipuwire::PROGRAM).unwrap().try_into().unwrap();
    let out = testrun::run(prog, &frame, Some(&SkbContext { ingress_ifindex: LOOPBACK_IFINDEX, ..Default::default() }), 1)
        .expect("BPF_PROG_TEST_RUN");
    assert_eq!(out.data_out, frame, "the forwarder changed the frame");
    out.return_value
}

#[test]
#[ignore = "needs root (T1): run with cargo xtask test"]
fn unset_ports_drop_and_count_unconfigured() {
    let ebpf = load();
    assert_eq!(run(&ebpf), TC_ACT_SHOT, "an IPU without its port map must drop (fail closed)");
    assert_eq!(ipuwire::wire_stats(&ebpf).unwrap(), WireStats { unconfigured: 1, ..Default::default() });
}

#[test]
#[ignore = "needs root (T1): run with cargo xtask test"]
fn host_port_frame_goes_to_the_fabric() {
    let mut ebpf = load();
    set_ports(&mut ebpf, LOOPBACK_IFINDEX, ELSEWHERE);
    assert_eq!(run(&ebpf), TC_ACT_REDIRECT);
    assert_eq!(ipuwire::wire_stats(&ebpf).unwrap(), WireStats { to_fabric: 1, ..Default::default() });
}

#[test]
#[ignore = "needs root (T1): run with cargo xtask test"]
fn fabric_port_frame_goes_to_the_host() {
    let mut ebpf = load();
    set_ports(&mut ebpf, ELSEWHERE, LOOPBACK_IFINDEX);
    assert_eq!(run(&ebpf), TC_ACT_REDIRECT);
    assert_eq!(ipuwire::wire_stats(&ebpf).unwrap(), WireStats { to_host: 1, ..Default::default() });
}

#[test]
#[ignore = "needs root (T1): run with cargo xtask test"]
fn a_third_interface_is_dropped_and_counted() {
    let mut ebpf = load();
    set_ports(&mut ebpf, ELSEWHERE, ELSEWHERE + 1);
    assert_eq!(run(&ebpf), TC_ACT_SHOT);
    assert_eq!(ipuwire::wire_stats(&ebpf).unwrap(), WireStats { foreign_port: 1, ..Default::default() });
}

#[test]
#[ignore = "needs root (T1): run with cargo xtask test"]
fn fabric_frame_for_the_ipus_own_mac_is_delivered_locally() {
    let mut ebpf = load();
    set_ports(&mut ebpf, ELSEWHERE, LOOPBACK_IFINDEX);
    // tcp4's frames are addressed to MAC_B.
    set_local_mac(&mut ebpf, frames::MAC_B);
    assert_eq!(run(&ebpf), TC_ACT_OK, "a frame for the IPU's fabric MAC goes up the IPU's stack");
    assert_eq!(ipuwire::wire_stats(&ebpf).unwrap(), WireStats { to_local: 1, ..Default::default() });
    // Another MAC is forwarded to the host as before.
    set_local_mac(&mut ebpf, frames::MAC_A);
    assert_eq!(run(&ebpf), TC_ACT_REDIRECT);
    assert_eq!(ipuwire::wire_stats(&ebpf).unwrap(), WireStats { to_local: 1, to_host: 1, ..Default::default() });
}

#[test]
#[ignore = "needs root (T1): run with cargo xtask test"]
fn host_frame_for_the_ipus_own_mac_is_still_forwarded() {
    // The tenant never reaches its IPU's stack through the wire: only the fabric side delivers.
    let mut ebpf = load();
    set_ports(&mut ebpf, LOOPBACK_IFINDEX, ELSEWHERE);
    set_local_mac(&mut ebpf, frames::MAC_B);
    assert_eq!(run(&ebpf), TC_ACT_REDIRECT);
    assert_eq!(ipuwire::wire_stats(&ebpf).unwrap(), WireStats { to_fabric: 1, ..Default::default() });
}
