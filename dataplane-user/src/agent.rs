//! `ringside agent`: resolve settings (file, then flags), attach, collect, serve, and detach on
//! SIGINT/SIGTERM.
use std::{
    net::SocketAddr,
    path::PathBuf,
    sync::{atomic::AtomicBool, Arc, Mutex},
    time::Duration,
};

use crate::{
    api,
    auth::{self, TokenFileError},
    analysis::{self, Analysis, DetectSettings},
    clock,
    collector::{self, CollectError, Collector, KernelMaps},
    config::{self, AttachMode, ConfigError, ConfigFile, MatchSettings, MirrorFile},
    flow_table::TableSettings,
    hint_board::HintBoard,
    jobs::{JobCatalog, JobSet, SharedCatalog, TokenHash},
    loader::{AttachRequest, Attachment, LoaderError},
    mirror::{self, FlowMatch, MirrorError, MirrorSettings},
    view::{AgentView, AttachInfo},
};
use dataplane_common::maps;

/// Attach the flow monitor to interfaces and serve what it sees.
///
/// Examples:
///   ringside agent --iface eth0
///   ringside agent --iface eth0 --iface eth1 --config /etc/ringside.toml --listen 0.0.0.0:9464
///   RUST_LOG=debug ringside agent --iface ens5 --pin-dir /sys/fs/bpf/ringside-test --poll-interval-ms 50
///
/// Stop it with Ctrl-C or SIGTERM: it detaches, removes the clsact qdisc it added and its pins;
/// with --persist it leaves all of that counting for the next agent (`ringside detach` removes it).
#[derive(Debug, Clone, Default, clap::Args)]
#[command(verbatim_doc_comment)]
pub struct AgentArgs {
    /// Interface to attach to (ingress and egress); repeat for several.
    #[arg(long = "iface", value_name = "IF")]
    pub interfaces: Vec<String>,
    /// TOML config file (see ringside.example.toml); flags override it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// HTTP listen address [default: 127.0.0.1:9464].
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// bpffs directory for the map pins; unique per agent [default: /sys/fs/bpf/ringside].
    #[arg(long, value_name = "DIR")]
    pub pin_dir: Option<PathBuf>,
    /// Keep the map pins after a clean exit (the program is detached).
    #[arg(long)]
    pub keep_pins: bool,
    /// Persistent mode: on exit (SIGTERM, or killed) leave the program attached and the maps
    /// pinned, so packets are counted while no agent runs; the next agent takes over and every
    /// counter continues. `ringside detach --iface IF` removes it all.
    #[arg(long)]
    pub persist: bool,
    /// Map-poll interval in milliseconds [default: 100].
    #[arg(long, value_name = "MS")]
    pub poll_interval_ms: Option<u64>,
    /// Forget flows idle for this many seconds [default: 60].
    #[arg(long, value_name = "SECS")]
    pub flow_idle_timeout_secs: Option<u64>,
    /// Idle gap that ends a burst, in microseconds [default: 1000].
    #[arg(long, value_name = "US")]
    pub burst_gap_us: Option<u64>,
    /// How to attach: clsact (tc filter) or tcx (bpf link) [default: clsact].
    #[arg(long, value_enum)]
    pub attach: Option<AttachMode>,
    /// Directory for state that survives a restart (open events, registered jobs, the generated
    /// operator token) [default: /var/lib/ringside].
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Debug records from the eBPF classifier, rate-limited in the kernel; shown with
    /// RUST_LOG=info,ringside::ebpf=debug [default: off].
    #[arg(long)]
    pub ebpf_debug_log: bool,
    /// Also read frames mirrored to this interface (RoCE the host kernel never sees; a switch or
    /// DPU mirrors it there); overrides `[mirror] interface`.
    #[arg(long, value_name = "IF")]
    pub mirror_iface: Option<String>,
}

/// Fully resolved agent settings.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentSettings {
    pub interfaces: Vec<String>,
    pub listen: SocketAddr,
    pub pin_dir: PathBuf,
    pub keep_pins: bool,
    /// `persist` / `--persist`: leave the data path attached on exit (see [`AgentArgs::persist`]).
    pub persist: bool,
    pub attach: AttachMode,
    pub poll_interval: Duration,
    pub burst_gap: Duration,
    pub table: TableSettings,
    pub matching: MatchSettings,
    pub detect: DetectSettings,
    /// The config file's `[[job]]`s (the job catalog onboards them at start).
    pub jobs: JobSet,
    /// Where the API's operator tokens come from.
    pub operator_tokens: OperatorTokens,
    /// `ebpf_debug_log` / `--ebpf-debug-log`: sets `config_flags::DEBUG_LOG` in the kernel config.
    pub ebpf_debug_log: bool,
    /// `kernel_max_flows`: capacity of the kernel map `FLOWS`.
    pub kernel_max_flows: u32,
    /// `kernel_event_ring_kib`, in bytes: size of the kernel's event ring `EVENTS`.
    pub kernel_event_ring_bytes: u32,
    /// `[mirror]` / `--mirror-iface`: the mirrored-frame ingest, if any.
    pub mirror: Option<MirrorSettings>,
}

/// Where the operator tokens come from: an API setting, resolved from `[api] operator_tokens_file`
/// and `state_dir` / `--state-dir`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OperatorTokens {
    /// `[api] operator_tokens_file`: one token per line, managed by the operator.
    File(PathBuf),
    /// `<state_dir>/operator.token`, generated if missing (the CLI reads it from there).
    Generated { state_dir: PathBuf },
}

impl AgentSettings {
    /// Defaults, overridden by the file, overridden by flags.
    pub fn resolve(file: &ConfigFile, args: &AgentArgs) -> Result<Self, ConfigError> {
        let nonzero = |v: Option<u64>, key: &'static str| match v {
            Some(0) => Err(ConfigError::Setting { key, message: "must be greater than 0".into() }),
            _ => Ok(()),
        };
        nonzero(args.poll_interval_ms, "--poll-interval-ms")?;
        nonzero(args.flow_idle_timeout_secs, "--flow-idle-timeout-secs")?;
        nonzero(args.burst_gap_us, "--burst-gap-us")?;
        let state_dir = args.state_dir.clone().or_else(|| file.state_dir.clone()).unwrap_or_else(|| config::DEFAULT_STATE_DIR.into());
        let mut interfaces = file.interfaces.clone().unwrap_or_default();
        for i in &args.interfaces {
            if !interfaces.contains(i) {
                interfaces.push(i.clone());
            }
        }
        Ok(AgentSettings {
            interfaces,
            listen: args.listen.or(file.listen).unwrap_or_else(|| config::DEFAULT_LISTEN.parse().expect("valid default")),
            pin_dir: args.pin_dir.clone().or_else(|| file.pin_dir.clone()).unwrap_or_else(|| config::DEFAULT_PIN_DIR.into()),
            keep_pins: args.keep_pins || file.keep_pins.unwrap_or(false),
            persist: args.persist || file.persist.unwrap_or(false),
            attach: args.attach.or(file.attach).unwrap_or_default(),
            poll_interval: Duration::from_millis(args.poll_interval_ms.or(file.poll_interval_ms).unwrap_or(config::DEFAULT_POLL_INTERVAL_MS)),
            burst_gap: Duration::from_micros(args.burst_gap_us.or(file.burst_gap_us).unwrap_or(config::DEFAULT_BURST_GAP_US)),
            table: TableSettings {
                idle_timeout: Duration::from_secs(
                    args.flow_idle_timeout_secs.or(file.flow_idle_timeout_secs).unwrap_or(config::DEFAULT_FLOW_IDLE_TIMEOUT_SECS),
                ),
                max_flows: file.max_flows.unwrap_or(file.kernel_max_flows.map_or(config::DEFAULT_MAX_FLOWS, |n| n as usize)),
                max_peers: file.max_peers.unwrap_or(config::DEFAULT_MAX_PEERS),
                burst_history: file.burst_history.unwrap_or(config::DEFAULT_BURST_HISTORY),
                ewma_tau: Duration::from_millis(file.ewma_tau_ms.unwrap_or(config::DEFAULT_EWMA_TAU_MS)),
            },
            matching: MatchSettings::from_file(file.match_.as_ref()),
            detect: {
                let mut d = DetectSettings::from_file(file);
                d.state_dir = state_dir.clone();
                d
            },
            jobs: JobSet::from_config(file.jobs.as_deref()),
            operator_tokens: match file.api.as_ref().and_then(|a| a.operator_tokens_file.clone()) {
                Some(path) => OperatorTokens::File(path),
                None => OperatorTokens::Generated { state_dir },
            },
            ebpf_debug_log: args.ebpf_debug_log || file.ebpf_debug_log.unwrap_or(false),
            kernel_max_flows: file.kernel_max_flows.unwrap_or(config::DEFAULT_MAX_FLOWS as u32),
            kernel_event_ring_bytes: file.kernel_event_ring_kib.unwrap_or(config::DEFAULT_KERNEL_EVENT_RING_KIB) * 1024,
            mirror: match (&args.mirror_iface, file.mirror.as_ref()) {
                (Some(i), f) => {
                    crate::bounds::interface_name(i).map_err(|message| ConfigError::Setting { key: "--mirror-iface", message })?;
                    let with_iface = MirrorFile { interface: Some(i.clone()), ..f.cloned().unwrap_or_default() };
                    with_iface.settings()
                }
                (None, Some(f)) => f.settings(),
                (None, None) => None,
            },
        })
    }
}

/// Errors of `ringside agent`.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Loader(#[from] LoaderError),
    #[error(transparent)]
    Collect(#[from] CollectError),
    #[error(transparent)]
    Tokens(#[from] TokenFileError),
    #[error(transparent)]
    Mirror(#[from] MirrorError),
    #[error("cannot listen on {addr}: address already in use; stop whatever uses it (`ss -ltnp | grep {port}`) or pass another --listen")]
    ListenInUse { addr: SocketAddr, port: u16 },
    #[error("cannot listen on {addr}: {source}; pass another --listen")]
    Listen { addr: SocketAddr, source: std::io::Error },
    #[error("cannot start the async runtime or signal handlers: {0}")]
    Runtime(std::io::Error),
    #[error("the HTTP server failed: {0}")]
    Serve(std::io::Error),
}

/// Runs the agent until SIGINT/SIGTERM. Blocking.
pub fn run(settings: AgentSettings) -> Result<(), AgentError> {
    let mut kernel_config = settings.matching.kernel_config(settings.burst_gap)?;
    if settings.ebpf_debug_log {
        kernel_config.flags |= dataplane_common::config_flags::DEBUG_LOG;
    }
    // Bind before touching the kernel, so a port clash changes nothing.
    let listener = std::net::TcpListener::bind(settings.listen).map_err(|source| {
        if source.kind() == std::io::ErrorKind::AddrInUse {
            AgentError::ListenInUse { addr: settings.listen, port: settings.listen.port() }
        } else {
            AgentError::Listen { addr: settings.listen, source }
        }
    })?;
    listener.set_nonblocking(true).map_err(|source| AgentError::Listen { addr: settings.listen, source })?;
    let local = listener.local_addr().map_err(|source| AgentError::Listen { addr: settings.listen, source })?;
    // Tokens before the kernel too: a bad tokens file changes nothing.
    let operators = operator_tokens(&settings)?;

    let mut attachment = Attachment::attach(&AttachRequest {
        interfaces: settings.interfaces.clone(),
        mode: settings.attach,
        pin_dir: settings.pin_dir.clone(),
        keep_pins: settings.keep_pins,
        persist: settings.persist,
        config: kernel_config,
        prefixes: settings.matching.prefix_keys(),
        kernel_max_flows: settings.kernel_max_flows,
        event_ring_bytes: settings.kernel_event_ring_bytes,
    })?;
    let kernel_maps = KernelMaps::new(
        attachment.take_map(maps::FLOWS)?,
        attachment.take_map(maps::STATS)?,
        attachment.take_map(maps::EVENTS)?,
        attachment.hash_seed(),
    )?;

    let stop = Arc::new(AtomicBool::new(false));
    // The mirror after the kernel: a failure here drops `attachment`, which detaches.
    let mirror = match &settings.mirror {
        Some(m) => {
            let matching = FlowMatch::new(kernel_config, settings.matching.prefix_keys());
            Some(mirror::start(m, matching, &settings.interfaces, stop.clone())?)
        }
        None => None,
    };
    let (mirror_feed, mirror_thread) = mirror.unzip();

    // The pipeline: collector -> (window queue) -> analysis -> hint board and snapshots <- API.
    let mut attach = AttachInfo::attached(attachment.interfaces().to_vec(), attachment.pin_dir().to_owned(), settings.poll_interval);
    if let Some(feed) = &mirror_feed {
        // Mirrored flows carry the mirror port's index: label them with its name.
        attach.ifnames.insert(feed.ifindex(), feed.interface().to_owned());
    }
    let hints = HintBoard::default();
    let mut catalog = JobCatalog::new(operators, settings.matching.prefix_keys())
        .with_config_jobs(&settings.jobs)
        .with_state_dir(settings.detect.state_dir.clone());
    catalog.onboard_config_jobs(&hints, clock::unix_ms());
    // Jobs registered in a previous run, after the config jobs (whose names win) and before serving.
    catalog.restore(clock::unix_ms(), attach.live_pin_dir(), &hints);
    if attachment.reused() {
        // The pinned trie may hold prefixes of jobs that no longer exist, or of a [match] list
        // that changed: drop those, and only those (clearing it would stop counting the traffic
        // of registered jobs until they register again).
        prune_match_prefixes(attachment.pin_dir(), &catalog);
    }
    let catalog: SharedCatalog = Arc::new(Mutex::new(catalog));
    let (mut collector, snapshots) = Collector::new(settings.table.clone());
    if attachment.reused() {
        collector.adopt_kernel_flows();
    }
    let (detection, events) =
        Analysis::new(settings.detect.clone(), analysis::prepare(&settings.detect), catalog.clone(), hints.clone(), attach.ifnames.clone());
    // With detection off no window is cut and the analysis stage never runs: its snapshot stays
    // the carried-over event log.
    let windows = settings.detect.enabled.then(|| collector.feed_windows(settings.detect.window));
    if !settings.detect.enabled {
        tracing::info!("detection is off ([detect] enabled = false): no verdicts, and the RDMA port counters ([rdma]) are not read");
    }
    let view = AgentView::new(attach, snapshots, events, catalog, hints).with_mirror(mirror_feed.clone());

    let collector = collector::spawn(kernel_maps, collector, settings.poll_interval, stop.clone(), mirror_feed);
    let detector = windows.map(|rx| analysis::spawn(detection, rx, stop.clone()));
    tracing::info!(listen = %local, interfaces = ?settings.interfaces, pin_dir = %settings.pin_dir.display(), "ringside agent running");

    let served = serve(listener, view);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = collector.join();
    if let Some(m) = mirror_thread {
        let _ = m.join();
    }
    if let Some(d) = detector {
        let _ = d.join();
    }
    let problems = attachment.teardown();
    for p in &problems {
        tracing::warn!("teardown: {p}");
    }
    if problems.is_empty() && !settings.persist {
        tracing::info!("detached cleanly");
    }
    served
}

/// Removes from the pinned `MATCH_PREFIXES` the prefixes that neither the config nor a registered
/// job needs. A failure is logged: stale prefixes only widen what is counted.
fn prune_match_prefixes(pin_dir: &std::path::Path, catalog: &JobCatalog) {
    let result = crate::match_map::keys(pin_dir).and_then(|keys| {
        let unneeded = catalog.unneeded(&keys);
        crate::match_map::remove(pin_dir, &unneeded).map(|()| unneeded.len())
    });
    match result {
        Ok(0) => {}
        Ok(n) => tracing::info!(removed = n, "removed pinned match prefixes that no config and no registered job needs"),
        Err(e) => tracing::warn!("cannot prune the pinned match prefixes: {e}"),
    }
}

/// The operator tokens: from `[api] operator_tokens_file`, or the generated
/// `<state_dir>/operator.token`.
fn operator_tokens(settings: &AgentSettings) -> Result<Vec<TokenHash>, TokenFileError> {
    match &settings.operator_tokens {
        OperatorTokens::File(path) => {
            let tokens = auth::load_operator_tokens(path)?;
            tracing::info!(file = %path.display(), tokens = tokens.len(), "operator tokens loaded");
            Ok(tokens)
        }
        OperatorTokens::Generated { state_dir } => {
            let (path, hash) = auth::ensure_operator_token(state_dir)?;
            tracing::info!(
                file = %path.display(),
                "operator token in {} (the CLI reads it from there; set [api] operator_tokens_file to manage tokens yourself)",
                path.display()
            );
            Ok(vec![hash])
        }
    }
}

fn serve(listener: std::net::TcpListener, state: AgentView) -> Result<(), AgentError> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().map_err(AgentError::Runtime)?;
    rt.block_on(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate()).map_err(AgentError::Runtime)?;
        let mut int = signal(SignalKind::interrupt()).map_err(AgentError::Runtime)?;
        let listener = tokio::net::TcpListener::from_std(listener).map_err(AgentError::Runtime)?;
        let shutdown = async move {
            tokio::select! {
                _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
                _ = int.recv() => tracing::info!("SIGINT: shutting down"),
            }
        };
        api::server::serve(listener, api::router(state), api::server::Limits::default(), shutdown).await.map_err(AgentError::Serve)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn flags_override_file_and_defaults_fill_in() {
        let file = ConfigFile::parse(
            "interfaces = [\"eth0\"]\nlisten = \"127.0.0.1:1000\"\npoll_interval_ms = 250\nmax_flows = 10\n[match]\ntcp_ports = [80]\n",
            Path::new("t.toml"),
        )
        .unwrap();
        let args = AgentArgs {
            interfaces: vec!["eth1".into(), "eth0".into()],
            listen: Some("127.0.0.1:2000".parse().unwrap()),
            pin_dir: Some("/sys/fs/bpf/x".into()),
            ..Default::default()
        };
        let s = AgentSettings::resolve(&file, &args).unwrap();
        assert_eq!(s.interfaces, vec!["eth0", "eth1"]);
        assert_eq!(s.listen, "127.0.0.1:2000".parse().unwrap());
        assert_eq!(s.pin_dir, PathBuf::from("/sys/fs/bpf/x"));
        assert_eq!(s.poll_interval, Duration::from_millis(250));
        assert_eq!(s.table.max_flows, 10);
        assert_eq!(s.table.idle_timeout, Duration::from_secs(60));
        assert_eq!(s.burst_gap, Duration::from_millis(1));
        assert_eq!(s.attach, AttachMode::Clsact);
        assert_eq!(s.matching.tcp_ports.len(), 1);

        let d = AgentSettings::resolve(&ConfigFile::default(), &AgentArgs::default()).unwrap();
        assert_eq!(d.listen, config::DEFAULT_LISTEN.parse().unwrap());
        assert_eq!(d.pin_dir, PathBuf::from(config::DEFAULT_PIN_DIR));
        assert_eq!(d.poll_interval, Duration::from_millis(100));
        assert!(!d.ebpf_debug_log, "the eBPF debug log is off by default");
        assert!(!d.persist, "the default exit cleans up everything");
        let persist_file = ConfigFile::parse("persist = true\n", Path::new("t.toml")).unwrap();
        assert!(AgentSettings::resolve(&persist_file, &AgentArgs::default()).unwrap().persist);
        assert!(AgentSettings::resolve(&ConfigFile::default(), &AgentArgs { persist: true, ..Default::default() }).unwrap().persist);
        let on = AgentArgs { ebpf_debug_log: true, ..Default::default() };
        assert!(AgentSettings::resolve(&ConfigFile::default(), &on).unwrap().ebpf_debug_log);
        let file_on = ConfigFile::parse("ebpf_debug_log = true\n", Path::new("t.toml")).unwrap();
        assert!(AgentSettings::resolve(&file_on, &AgentArgs::default()).unwrap().ebpf_debug_log);

        assert_eq!(d.mirror, None, "no mirror unless asked for");
        let mirror_file = ConfigFile::parse("[mirror]\ninterface = \"mir0\"\nmax_flows = 7\n", Path::new("t.toml")).unwrap();
        let m = AgentSettings::resolve(&mirror_file, &AgentArgs::default()).unwrap().mirror.unwrap();
        assert_eq!((m.interface.as_str(), m.max_flows), ("mir0", 7));
        // --mirror-iface names the interface and keeps the file's other [mirror] keys.
        let flag = AgentArgs { mirror_iface: Some("span1".into()), ..Default::default() };
        let m = AgentSettings::resolve(&mirror_file, &flag).unwrap().mirror.unwrap();
        assert_eq!((m.interface.as_str(), m.max_flows), ("span1", 7));
        let m = AgentSettings::resolve(&ConfigFile::default(), &flag).unwrap().mirror.unwrap();
        assert_eq!(m, crate::mirror::MirrorSettings::new("span1".into()));
        let bad_flag = AgentArgs { mirror_iface: Some("a/b".into()), ..Default::default() };
        assert!(AgentSettings::resolve(&ConfigFile::default(), &bad_flag).unwrap_err().to_string().contains("--mirror-iface"));

        let bad = AgentArgs { poll_interval_ms: Some(0), ..Default::default() };
        assert!(AgentSettings::resolve(&ConfigFile::default(), &bad).unwrap_err().to_string().contains("--poll-interval-ms"));
    }

    #[test]
    fn listen_in_use_is_named() {
        let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = held.local_addr().unwrap();
        let mut s = AgentSettings::resolve(&ConfigFile::default(), &AgentArgs::default()).unwrap();
        s.listen = addr;
        let e = run(s).unwrap_err().to_string();
        assert!(e.contains(&addr.to_string()) && e.contains("--listen"), "{e}");
    }
}
