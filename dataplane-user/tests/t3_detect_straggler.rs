//! T3 scenario (not run by `cargo xtask test`): a compute straggler must be reported as a straggler
//! naming its host, never as a network fault.
//!
//! KNOWN GAP (issue 4): from the switch vantage, no straggler verdict is raised within 30 s (the
//! fabric is not blamed either). In a ring allreduce every other rank sends its first chunk on time
//! and then stalls behind the straggler, so their communication phases split in two and the
//! detector's per-step phase matching does not line the ranks up. Run it by hand:
//! `RINGSIDE_EBPF_OBJECT=... RINGSIDE_RANK_BIN=... cargo test -p dataplane-user --test t3_detect_straggler -- --ignored`
mod detect_rig;

use std::{net::IpAddr, time::{Duration, Instant}};

use detect_rig::*;
use dataplane_user::{detect::VerdictKind, events::Event};
use testbed::{Star, StarConfig};

#[test]
#[ignore = "T3, known gap (issue 4): no straggler verdict yet from the switch vantage; needs root"]
fn compute_straggler_is_a_straggler_not_a_network_fault() {
    let rank_bin = preconditions();
    let star = Star::new(StarConfig { hosts: HOSTS, offloads: false, ..Default::default() }).unwrap();
    let agent = Agent::start(&star, "straggler", 9472);
    let target = 3usize;
    let addr: IpAddr = star.hosts[target].addr.into();
    let started = Instant::now();
    let _job = testbed::spawn_job(&star, &job(rank_bin, Some((target, 60)))).expect("starting the emulated job");
    let mut network_seen = Vec::new();
    let found = wait_for(Duration::from_secs(30), "a straggler event naming the slow rank's host", || {
        let r = agent.events(&star);
        network_seen.extend(r.events.iter().filter(|e| e.kind.is_network_fault()).map(|e| e.id));
        if !network_seen.is_empty() {
            panic!("a compute straggler was reported as a network fault:{}", summary(&r));
        }
        r.events.iter().find(|e| e.kind == VerdictKind::Straggler && names_peer(e, addr)).cloned()
    });
    eprintln!("straggler on {addr} detected {:.1} s after the job started", started.elapsed().as_secs_f64());
    // Keep watching a little: the fabric must not be blamed.
    std::thread::sleep(Duration::from_secs(5));
    let r = agent.events(&star);
    eprintln!("events:{}", summary(&r));
    assert!(found.kind == VerdictKind::Straggler);
    let network: Vec<&Event> = r.events.iter().filter(|e| e.kind.is_network_fault()).collect();
    assert!(network.is_empty(), "a compute straggler was reported as a network fault: {network:?}");
    let wrong: Vec<&Event> = r.events.iter().filter(|e| e.kind == VerdictKind::Straggler && !names_peer(e, addr)).collect();
    assert!(wrong.is_empty(), "stragglers named on other hosts: {wrong:?}");
}
