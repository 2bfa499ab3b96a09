//! T0: `--transport` on this machine, end to end: the real RDMA device probe (with the `rdma`
//! feature) or its absence (without), the transport a mesh actually runs on, and an exact
//! allreduce over it.
//!
//! The expectation comes from an independent source, the kernel's list of RDMA devices
//! (`/sys/class/infiniband`): with none (the project's machines: no RDMA device, no Soft-RoCE),
//! `auto` must run on TCP and `rdma` must fail naming the cause; a probe that claimed a device
//! here, or a fallback that did not happen, fails these tests. On a host whose kernel lists a
//! device and whose probe opens it, `auto` and `rdma` must run on RDMA instead, and the same
//! exactness check covers the RDMA data path.

use ipu_firmware::job::run_mesh_ranks_in_process;
use ipu_firmware::mesh::probe;
use ipu_firmware::{CollectiveError, Communicator, CommunicatorConfig, MeshOptions, Plan, TcpOptions, TransportKind};
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(20);

/// RDMA devices the kernel knows (`/sys/class/infiniband/<name>`); empty when the directory is
/// missing, which is what a kernel without RDMA devices shows.
fn kernel_rdma_devices() -> Vec<String> {
    std::fs::read_dir("/sys/class/infiniband")
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default()
}

/// What this build on this machine should resolve `auto` to.
fn expected_auto() -> TransportKind {
    let kernel = kernel_rdma_devices();
    let probed = probe(None);
    if kernel.is_empty() {
        // The probe must agree with the kernel: no device means no device, and says why.
        match &probed {
            Err(CollectiveError::NoRdmaDevice { reason }) if cfg!(feature = "rdma") => assert!(!reason.is_empty()),
            Err(CollectiveError::RdmaNotBuilt) if cfg!(not(feature = "rdma")) => {}
            other => panic!("the kernel lists no RDMA device but the probe answered {other:?}"),
        }
        return TransportKind::Tcp;
    }
    match probed {
        Ok(device) => {
            assert!(kernel.contains(&device), "probe chose {device}, which the kernel does not list ({kernel:?})");
            TransportKind::Rdma
        }
        // A device whose port is down, or a build without the feature: TCP.
        Err(_) => TransportKind::Tcp,
    }
}

/// Rank r's input: small integers, so every sum is exact in f32 in any order.
fn input(rank: usize, n: usize) -> Vec<f32> {
    (0..n).map(|i| ((i * 7 + rank * 13) % 17) as f32 - 8.0).collect()
}

/// The transport a rank ran on, and its allreduce results.
type RankOutcome = (TransportKind, Vec<Vec<f32>>);

/// Runs `world` ranks on `transport`, two allreduces each (one small, one spanning many
/// chunks), and returns per rank the transport used and the results.
fn allreduce_on(transport: TransportKind, world: usize, n: usize) -> Vec<Result<RankOutcome, CollectiveError>> {
    let options = MeshOptions { transport, tcp: TcpOptions { channels: 2, timeout: TIMEOUT }, rdma_device: None };
    run_mesh_ranks_in_process(world, options, move |rank, t| {
        let used = t.kind();
        let plan = Plan { chunk_bytes: 64 << 10, channels: 2, ..Plan::default() };
        let mut c = Communicator::new(t, CommunicatorConfig { initial_plan: plan, timeout: TIMEOUT })?;
        let mut out = Vec::new();
        for len in [3, n] {
            let mut buf = input(rank, len);
            c.allreduce_f32(&mut buf)?;
            out.push(buf);
        }
        c.close();
        Ok((used, out))
    })
}

fn assert_exact(world: usize, n: usize, results: &[Vec<Vec<f32>>]) {
    for len in [3, n] {
        let inputs: Vec<Vec<f32>> = (0..world).map(|r| input(r, len)).collect();
        let want: Vec<f32> = (0..len).map(|i| inputs.iter().map(|x| x[i]).sum()).collect();
        for (rank, per_rank) in results.iter().enumerate() {
            let buf = &per_rank[usize::from(len == n)];
            assert_eq!(buf.len(), len);
            if let Some(i) = (0..len).find(|&i| buf[i] != want[i]) {
                panic!("rank {rank} element {i} of {len}: {} instead of {}", buf[i], want[i]);
            }
        }
    }
}

#[test]
fn auto_runs_on_what_this_machine_has_and_the_allreduce_is_exact() {
    let expect = expected_auto();
    let (world, n) = (3, 300_000);
    let results = allreduce_on(TransportKind::Auto, world, n);
    let mut bufs = Vec::new();
    for (rank, r) in results.into_iter().enumerate() {
        let (used, b) = r.unwrap_or_else(|e| panic!("rank {rank} failed on --transport auto: {e}"));
        assert_eq!(used, expect, "rank {rank} ran on {used}, expected {expect}");
        bufs.push(b);
    }
    assert_exact(world, n, &bufs);
}

#[test]
fn explicit_rdma_runs_on_rdma_or_fails_naming_the_cause() {
    let expect = expected_auto();
    let results = allreduce_on(TransportKind::Rdma, 2, 100_000);
    if expect == TransportKind::Rdma {
        let mut bufs = Vec::new();
        for r in results {
            let (used, b) = r.expect("a usable device: explicit rdma must work");
            assert_eq!(used, TransportKind::Rdma);
            bufs.push(b);
        }
        assert_exact(2, 100_000, &bufs);
        return;
    }
    for (rank, r) in results.into_iter().enumerate() {
        let e = match r {
            Ok((used, _)) => panic!("rank {rank} ran on {used} although no RDMA device is usable: explicit rdma must not fall back"),
            Err(e) => e,
        };
        let msg = e.to_string();
        if cfg!(feature = "rdma") {
            assert!(matches!(e, CollectiveError::NoRdmaDevice { .. }), "rank {rank}: {e:?}");
            assert!(msg.starts_with("no RDMA device ("), "{msg}");
        } else {
            assert!(matches!(e, CollectiveError::RdmaNotBuilt), "rank {rank}: {e:?}");
            assert!(msg.contains("--features rdma"), "{msg}");
        }
        assert!(msg.contains("--transport"), "the error must say what to do instead: {msg}");
    }
}
