//! Loading, attaching and pinning the flow monitor, and undoing exactly that.
//!
//! Order of operations (`Attachment::attach`): preflight checks (capabilities, BTF, interfaces,
//! bpffs) that fail with an instruction before anything is changed → load the object → write
//! `CONFIG` and `MATCH_PREFIXES` → pin the maps → add clsact where missing → attach ingress and
//! egress on every interface. Any failure undoes what was done so far (the `Drop` of
//! [`Attachment`] runs the same teardown as a clean exit).
//!
//! What survives a SIGKILL of the agent:
//! - `clsact` mode: the two `tc` filters named `flowmon` per interface (they keep the program
//!   loaded and keep counting — the program always returns `TC_ACT_PIPE`, so traffic is unaffected),
//!   the clsact qdisc if the agent added it, and the map pins. `ringside detach --iface IF`
//!   removes the filters and the pins; `--remove-qdisc` also deletes the clsact qdisc.
//! - `tcx` mode: the kernel detaches TCX links when their last fd closes, so only the pins remain.
//!
//! The classifier's debug log (`config_flags::DEBUG_LOG` in the request's config, off by default):
//! the loader takes the `AYA_LOGS` ring buffer into an [`aya_log::EbpfLogger`] between loading the
//! object and loading the program, and a thread drains it into `tracing` (target
//! [`EBPF_LOG_TARGET`]) until teardown. The logger must live at least until the program is loaded:
//! dropping it closes the map's fd and the load fails ("fd N is not pointing to valid bpf_map").
use std::{
    fs, io,
    os::unix::ffi::OsStrExt,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread,
    time::Duration,
};

use aya::{
    maps::{lpm_trie::Key, Array, LpmTrie, MapData, MapError},
    pin::PinError,
    programs::{
        links::LinkOrder,
        tc::{self, NlOptions, SchedClassifierLinkId, TcAttachOptions, TcError},
        ProgramError, SchedClassifier, TcAttachType,
    },
    Ebpf, EbpfError, EbpfLoader,
};
use aya_log::EbpfLogger;
use dataplane_common::{config_flags, maps, programs, PrefixKey, PrefixValue};

use crate::{config::AttachMode, mount_ns, object, privileges};

/// An interface the classifier is attached to.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AttachedInterface {
    pub name: String,
    pub ifindex: u32,
    /// `clsact` or `tcx`.
    pub mode: String,
    /// Whether the agent added the clsact qdisc (and so removes it on exit).
    pub qdisc_added: bool,
}

/// Maps pinned under the pin directory.
pub const PINNED_MAPS: [&str; 6] = [maps::FLOWS, maps::FLOW_STATE, maps::CONFIG, maps::MATCH_PREFIXES, maps::EVENTS, maps::STATS];

/// `statfs` magic of bpffs (include/uapi/linux/magic.h).
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// Errors setting up or tearing down the data plane.
#[derive(Debug, thiserror::Error)]
pub enum LoaderError {
    #[error(transparent)]
    Privileges(#[from] privileges::PrivilegeError),
    #[error("the kernel exposes no BTF (/sys/kernel/btf/vmlinux is missing); use a kernel built with CONFIG_DEBUG_INFO_BTF=y")]
    NoBtf,
    #[error("interface `{name}` does not exist in this network namespace; list interfaces with `ip link` and pass one with --iface")]
    UnknownInterface { name: String },
    #[error("no interface given; pass at least one with --iface IF (or `interfaces = [...]` in the config)")]
    NoInterface,
    #[error("{dir} is not on a bpf filesystem, so maps cannot be pinned under {pin_dir}; mount it with `mount -t bpf bpf /sys/fs/bpf` or choose another --pin-dir (under `ip netns exec`, which remounts /sys, the agent looks for the host's bpffs in its parent's mount namespace; if its parent is gone, start it with `nsenter --net=/run/netns/NS ringside agent ...`)")]
    BpffsNotMounted { dir: PathBuf, pin_dir: PathBuf },
    #[error(transparent)]
    PrivateMountNs(#[from] mount_ns::PrivateMountNs),
    #[error("pins already exist in {dir} (another agent is running, or one was killed); stop it, or remove them with `ringside detach --iface IF --pin-dir {dir}`, or use another --pin-dir")]
    PinsExist { dir: PathBuf },
    #[error("cannot create or clean the pin directory {dir}: {source}")]
    PinDir { dir: PathBuf, source: io::Error },
    #[error(transparent)]
    MissingObject(#[from] object::MissingObject),
    #[error("the kernel rejected the eBPF object: {0}; run with RUST_LOG=debug and check `dmesg`")]
    Load(#[source] EbpfError),
    #[error("the eBPF object has no {what} `{name}`; rebuild it with `cargo xtask build`")]
    MissingItem { what: &'static str, name: &'static str },
    #[error("the kernel rejected program `{name}`: {source}; the verifier log is in the error chain (RUST_LOG=debug)")]
    Program { name: &'static str, source: ProgramError },
    #[error("cannot add the clsact qdisc to `{iface}`: {source}; check `tc qdisc show dev {iface}`")]
    Qdisc { iface: String, source: TcError },
    #[error("cannot attach flowmon to {direction} of `{iface}`: {source}; check `tc filter show dev {iface} {direction}`")]
    Attach { iface: String, direction: &'static str, source: ProgramError },
    #[error("cannot write map `{name}`: {source}")]
    Map { name: &'static str, source: MapError },
    #[error("cannot pin map `{name}` at {path}: {source}")]
    Pin { name: &'static str, path: PathBuf, source: PinError },
    #[error("cannot detach flowmon from `{iface}`: {source}")]
    Detach { iface: String, source: TcError },
    #[error("cannot delete the clsact qdisc of `{iface}`: {source}")]
    QdiscDelete { iface: String, source: io::Error },
    #[error("cannot start the eBPF debug log: {0}; turn it off (ebpf_debug_log = false, no --ebpf-debug-log) or rebuild the object with `cargo xtask build`")]
    EbpfLog(#[source] aya_log::Error),
    #[error("cannot start the eBPF debug log thread: {0}")]
    EbpfLogThread(#[source] io::Error),
}

/// Checks that the process may load and attach programs: CAP_BPF, CAP_NET_ADMIN and CAP_PERFMON,
/// or root (see [`privileges`], which names what is missing and how to grant it).
pub fn check_privileges() -> Result<(), LoaderError> {
    Ok(privileges::check_agent()?)
}

pub fn check_btf() -> Result<(), LoaderError> {
    if Path::new("/sys/kernel/btf/vmlinux").exists() {
        Ok(())
    } else {
        Err(LoaderError::NoBtf)
    }
}

/// Lifts RLIMIT_MEMLOCK to unlimited. Kernels before 5.11 charge BPF maps to it, and the usual
/// default (64 KiB to 8 MiB) is short of the per-CPU `FLOWS` map alone; 5.11+ charge the memory
/// cgroup instead. aya does not raise it itself. Best effort: a refusal is logged and the load then reports what the kernel said.
pub fn raise_memlock() {
    let unlimited = libc::rlimit { rlim_cur: libc::RLIM_INFINITY, rlim_max: libc::RLIM_INFINITY };
    // SAFETY: setrlimit only reads the struct passed by reference.
    if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &unlimited) } != 0 {
        tracing::debug!("cannot raise RLIMIT_MEMLOCK: {} (only kernels before 5.11 need it)", io::Error::last_os_error());
    }
}

/// Index of an interface in the current network namespace.
pub fn ifindex(name: &str) -> Result<u32, LoaderError> {
    nix::net::if_::if_nametoindex(name).map_err(|_| LoaderError::UnknownInterface { name: name.to_owned() })
}

fn pin_parent(pin_dir: &Path) -> &Path {
    pin_dir.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("/"))
}

fn is_bpffs(dir: &Path) -> bool {
    nix::sys::statfs::statfs(dir).is_ok_and(|st| st.filesystem_type().0 as i64 == BPF_FS_MAGIC)
}

/// Checks that the pin directory's parent is on bpffs.
pub fn check_bpffs(pin_dir: &Path) -> Result<(), LoaderError> {
    let parent = pin_parent(pin_dir);
    if is_bpffs(parent) {
        Ok(())
    } else {
        Err(LoaderError::BpffsNotMounted { dir: parent.to_owned(), pin_dir: pin_dir.to_owned() })
    }
}

/// [`check_bpffs`], after joining the mount namespace of the process that started the agent when
/// `ip netns exec` hid the host's bpffs (see [`mount_ns`]). Call it before starting any thread.
pub fn find_bpffs(pin_dir: &Path) -> Result<(), LoaderError> {
    if let Some(joined) = mount_ns::join_bpffs_namespace(pin_parent(pin_dir), is_bpffs)? {
        tracing::info!(
            "{} is not bpffs in the mount namespace the agent was started in (`ip netns exec` remounts /sys); joined the mount namespace of pid {} ({}), where it is: pins are on the host's bpffs, the network namespace is unchanged",
            pin_parent(pin_dir).display(),
            joined.pid,
            joined.comm,
        );
    }
    check_bpffs(pin_dir)
}

/// Where and how to attach.
#[derive(Debug, Clone)]
pub struct AttachRequest {
    pub interfaces: Vec<String>,
    pub mode: AttachMode,
    pub pin_dir: PathBuf,
    pub keep_pins: bool,
    pub config: dataplane_common::Config,
    pub prefixes: Vec<PrefixKey>,
    /// Capacity of `FLOWS` and `FLOW_STATE`, set at load time (config `kernel_max_flows`).
    pub kernel_max_flows: u32,
}

/// The loaded object, attached to interfaces, with pinned maps. Dropping it detaches.
pub struct Attachment {
    ebpf: Option<Ebpf>,
    /// The classifier's debug log, drained into `tracing`; `None` when it is off.
    ebpf_log: Option<EbpfLogDrain>,
    links: Vec<(String, &'static str, SchedClassifierLinkId)>,
    interfaces: Vec<AttachedInterface>,
    pins: Vec<PathBuf>,
    pin_dir: PathBuf,
    created_pin_dir: bool,
    keep_pins: bool,
    torn_down: bool,
}

impl Attachment {
    /// Runs the preflight checks and attaches. On error, everything done so far is undone.
    pub fn attach(req: &AttachRequest) -> Result<Attachment, LoaderError> {
        check_privileges()?;
        check_btf()?;
        raise_memlock();
        if req.interfaces.is_empty() {
            return Err(LoaderError::NoInterface);
        }
        let ifindexes: Vec<u32> = req.interfaces.iter().map(|i| ifindex(i)).collect::<Result<_, _>>()?;
        find_bpffs(&req.pin_dir)?;
        let bytes = object::flowmon_object()?;

        let mut a = Attachment {
            ebpf: None,
            ebpf_log: None,
            links: Vec::new(),
            interfaces: Vec::new(),
            pins: Vec::new(),
            pin_dir: req.pin_dir.clone(),
            created_pin_dir: false,
            keep_pins: req.keep_pins,
            torn_down: false,
        };
        a.prepare_pin_dir()?;
        let ebpf = EbpfLoader::new()
            .map_max_entries(maps::FLOWS, req.kernel_max_flows)
            .map_max_entries(maps::FLOW_STATE, req.kernel_max_flows)
            .load(bytes)
            .map_err(LoaderError::Load)?;
        let ebpf = a.ebpf.insert(ebpf);
        write_config(ebpf, &req.config, &req.prefixes)?;
        if req.config.flags & config_flags::DEBUG_LOG != 0 {
            // Before the program load, and kept until teardown (see the module docs).
            let logger = EbpfLogger::init_with_logger(ebpf, EbpfLogBridge).map_err(LoaderError::EbpfLog)?;
            a.ebpf_log = Some(EbpfLogDrain::spawn(logger).map_err(LoaderError::EbpfLogThread)?);
            tracing::info!(
                target: EBPF_LOG_TARGET,
                per_cpu_per_sec = dataplane_common::DEBUG_LOG_PER_SEC,
                "eBPF debug log on: records at debug level, shown with RUST_LOG=info,{EBPF_LOG_TARGET}=debug"
            );
        }
        for name in PINNED_MAPS {
            let map = ebpf.map(name).ok_or(LoaderError::MissingItem { what: "map", name })?;
            let path = req.pin_dir.join(name);
            map.pin(&path).map_err(|source| LoaderError::Pin { name, path: path.clone(), source })?;
            a.pins.push(path);
        }
        let prog: &mut SchedClassifier = ebpf
            .program_mut(programs::FLOWMON)
            .ok_or(LoaderError::MissingItem { what: "program", name: programs::FLOWMON })?
            .try_into()
            .map_err(|source| LoaderError::Program { name: programs::FLOWMON, source })?;
        prog.load().map_err(|source| LoaderError::Program { name: programs::FLOWMON, source })?;
        for (iface, ifindex) in req.interfaces.iter().zip(ifindexes) {
            let mut qdisc_added = false;
            if req.mode == AttachMode::Clsact {
                match tc::qdisc_add_clsact(iface) {
                    Ok(()) => qdisc_added = true,
                    Err(TcError::NetlinkError(e)) if e.raw_os_error() == Some(libc::EEXIST) => {}
                    Err(source) => return Err(LoaderError::Qdisc { iface: iface.clone(), source }),
                }
            }
            // Recorded before attaching so a failed attach still removes the qdisc we added.
            a.interfaces.push(AttachedInterface { name: iface.clone(), ifindex, mode: req.mode.to_string(), qdisc_added });
            for (dir, direction) in [(TcAttachType::Ingress, "ingress"), (TcAttachType::Egress, "egress")] {
                let options = match req.mode {
                    AttachMode::Clsact => TcAttachOptions::Netlink(NlOptions::default()),
                    AttachMode::Tcx => TcAttachOptions::TcxOrder(LinkOrder::default()),
                };
                let id = prog
                    .attach_with_options(iface, dir, options)
                    .map_err(|source| LoaderError::Attach { iface: iface.clone(), direction, source })?;
                a.links.push((iface.clone(), direction, id));
            }
            tracing::info!(interface = %iface, ifindex, mode = %req.mode, qdisc_added, "flowmon attached");
        }
        Ok(a)
    }

    fn prepare_pin_dir(&mut self) -> Result<(), LoaderError> {
        let dir = &self.pin_dir;
        let err = |source| LoaderError::PinDir { dir: dir.clone(), source };
        match fs::read_dir(dir) {
            Ok(mut entries) => {
                if entries.next().is_some() {
                    return Err(LoaderError::PinsExist { dir: dir.clone() });
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                fs::create_dir(dir).map_err(err)?;
                self.created_pin_dir = true;
            }
            Err(e) => return Err(err(e)),
        }
        Ok(())
    }

    pub fn interfaces(&self) -> &[AttachedInterface] {
        &self.interfaces
    }

    pub fn pin_dir(&self) -> &Path {
        &self.pin_dir
    }

    /// Takes a map out of the object for the collector (the program keeps its own reference).
    pub fn take_map(&mut self, name: &'static str) -> Result<aya::maps::Map, LoaderError> {
        self.ebpf
            .as_mut()
            .and_then(|e| e.take_map(name))
            .ok_or(LoaderError::MissingItem { what: "map", name })
    }

    /// Detaches, removes the qdiscs the agent added, and removes the pins (unless `keep_pins`).
    /// Returns what could not be undone, for the log; never panics.
    pub fn teardown(&mut self) -> Vec<String> {
        if self.torn_down {
            return Vec::new();
        }
        self.torn_down = true;
        let mut problems = Vec::new();
        // Stops the drain thread after a last flush.
        self.ebpf_log = None;
        if let Some(mut ebpf) = self.ebpf.take() {
            if let Some(prog) = ebpf.program_mut(programs::FLOWMON) {
                if let Ok(prog) = <&mut SchedClassifier>::try_from(prog) {
                    for (iface, direction, id) in self.links.drain(..) {
                        if let Err(e) = prog.detach(id) {
                            problems.push(format!("detach flowmon from {direction} of {iface}: {e}"));
                        }
                    }
                }
            }
            drop(ebpf);
        }
        for i in &self.interfaces {
            if i.qdisc_added {
                if let Err(e) = delete_clsact(i.ifindex) {
                    problems.push(format!("delete clsact qdisc of {}: {e}", i.name));
                }
            }
        }
        if !self.keep_pins {
            for p in self.pins.drain(..) {
                // NotFound: somebody (`ringside detach`) already removed it, which is fine.
                if let Err(e) = fs::remove_file(&p).or_else(ignore_not_found) {
                    problems.push(format!("remove pin {}: {e}", p.display()));
                }
            }
            if self.created_pin_dir {
                if let Err(e) = fs::remove_dir(&self.pin_dir).or_else(ignore_not_found) {
                    problems.push(format!("remove pin directory {}: {e}", self.pin_dir.display()));
                }
            }
        }
        problems
    }
}

fn ignore_not_found(e: io::Error) -> io::Result<()> {
    if e.kind() == io::ErrorKind::NotFound {
        Ok(())
    } else {
        Err(e)
    }
}

impl Drop for Attachment {
    fn drop(&mut self) {
        for p in self.teardown() {
            tracing::warn!("teardown: {p}");
        }
    }
}

/// `tracing` target of the records the classifier logs (`config_flags::DEBUG_LOG`).
pub const EBPF_LOG_TARGET: &str = "ringside::ebpf";

/// A `log::Log` that forwards aya-log records into `tracing` under [`EBPF_LOG_TARGET`], keeping
/// their level; the record's own target (the eBPF program's module, `flowmon`) becomes the field
/// `program`.
#[derive(Debug, Clone, Copy, Default)]
pub struct EbpfLogBridge;

impl log::Log for EbpfLogBridge {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        let program = record.target();
        let message = record.args();
        match record.level() {
            log::Level::Error => tracing::error!(target: EBPF_LOG_TARGET, program, "{message}"),
            log::Level::Warn => tracing::warn!(target: EBPF_LOG_TARGET, program, "{message}"),
            log::Level::Info => tracing::info!(target: EBPF_LOG_TARGET, program, "{message}"),
            log::Level::Debug => tracing::debug!(target: EBPF_LOG_TARGET, program, "{message}"),
            log::Level::Trace => tracing::trace!(target: EBPF_LOG_TARGET, program, "{message}"),
        }
    }

    fn flush(&self) {}
}

/// How often the drain thread empties the log ring buffer. The kernel writes at most
/// `DEBUG_LOG_PER_SEC` records per second per CPU, so the 128 KiB ring never fills in between.
const EBPF_LOG_DRAIN_EVERY: Duration = Duration::from_millis(100);

/// A thread that owns the [`EbpfLogger`] (and so the `AYA_LOGS` map fd) and drains it until
/// dropped; dropping stops it after a last flush.
struct EbpfLogDrain {
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<()>>,
}

impl EbpfLogDrain {
    fn spawn(mut logger: EbpfLogger<EbpfLogBridge>) -> io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = thread::Builder::new().name("ringside-ebpf-log".into()).spawn(move || {
            // aya-log panics on a record it cannot parse (an object from another build): stop
            // draining then, with a warning, rather than take the agent down.
            let drained = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| loop {
                logger.flush();
                if stopped.load(Ordering::Relaxed) {
                    break;
                }
                thread::sleep(EBPF_LOG_DRAIN_EVERY);
            }));
            if drained.is_err() {
                tracing::warn!(target: EBPF_LOG_TARGET, "unreadable eBPF log record: the debug log stops here");
            }
        })?;
        Ok(EbpfLogDrain { stop, thread: Some(thread) })
    }
}

impl Drop for EbpfLogDrain {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn map<'a>(name: &'static str, ebpf: &'a mut Ebpf) -> Result<&'a mut aya::maps::Map, LoaderError> {
    ebpf.map_mut(name).ok_or(LoaderError::MissingItem { what: "map", name })
}

fn write_config(ebpf: &mut Ebpf, cfg: &dataplane_common::Config, prefixes: &[PrefixKey]) -> Result<(), LoaderError> {
    {
        let mut prefixes_map: LpmTrie<&mut MapData, [u8; 16], PrefixValue> =
            LpmTrie::try_from(map(maps::MATCH_PREFIXES, ebpf)?).map_err(|source| LoaderError::Map { name: maps::MATCH_PREFIXES, source })?;
        for p in prefixes {
            prefixes_map
                .insert(&Key::new(p.prefix_len, p.addr), 1, 0)
                .map_err(|source| LoaderError::Map { name: maps::MATCH_PREFIXES, source })?;
        }
    }
    let mut config: Array<&mut MapData, dataplane_common::Config> =
        Array::try_from(map(maps::CONFIG, ebpf)?).map_err(|source| LoaderError::Map { name: maps::CONFIG, source })?;
    config.set(0, cfg, 0).map_err(|source| LoaderError::Map { name: maps::CONFIG, source })
}

/// What `ringside detach` did.
#[derive(Debug, Default)]
pub struct DetachReport {
    pub filters_removed: Vec<String>,
    pub pins_removed: Vec<PathBuf>,
    pub qdisc_removed: bool,
}

/// Removes a leftover `flowmon` attachment (a SIGKILLed agent in clsact mode): the `tc` filters on
/// ingress and egress of `iface`, the pins in `pin_dir`, and with `remove_qdisc` the clsact qdisc
/// itself (which also deletes any other filter on it: only when nothing else uses it).
pub fn detach_leftover(iface: &str, pin_dir: &Path, remove_qdisc: bool) -> Result<DetachReport, LoaderError> {
    privileges::check_detach()?;
    let idx = ifindex(iface)?;
    // Under `ip netns exec`, the pins are on the host's bpffs, not in the private /sys.
    mount_ns::join_bpffs_namespace(pin_parent(pin_dir), is_bpffs)?;
    let mut report = DetachReport::default();
    for (dir, name) in [(TcAttachType::Ingress, "ingress"), (TcAttachType::Egress, "egress")] {
        match tc::qdisc_detach_program(iface, dir, programs::FLOWMON) {
            Ok(()) => report.filters_removed.push(name.to_owned()),
            Err(TcError::IoError(e)) if e.kind() == io::ErrorKind::NotFound => {}
            // No clsact qdisc at all: nothing attached there.
            Err(TcError::NetlinkError(e)) if matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::ENOENT)) => {}
            Err(source) => return Err(LoaderError::Detach { iface: iface.to_owned(), source }),
        }
    }
    for name in PINNED_MAPS {
        let p = pin_dir.join(name);
        match fs::remove_file(&p) {
            Ok(()) => report.pins_removed.push(p),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(source) => return Err(LoaderError::PinDir { dir: pin_dir.to_owned(), source }),
        }
    }
    if !report.pins_removed.is_empty() {
        // Only if empty: never remove somebody else's pins.
        let _ = fs::remove_dir(pin_dir);
    }
    if remove_qdisc {
        match delete_clsact(idx) {
            Ok(()) => report.qdisc_removed = true,
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::EINVAL)) => {}
            Err(source) => return Err(LoaderError::QdiscDelete { iface: iface.to_owned(), source }),
        }
    }
    Ok(report)
}

/// Netlink `RTM_DELQDISC` for the clsact qdisc of `ifindex` (aya only adds qdiscs).
pub fn delete_clsact(ifindex: u32) -> io::Result<()> {
    let msg = del_clsact_message(ifindex, 1);
    // SAFETY: plain socket syscalls on an fd we own; buffers outlive the calls.
    unsafe {
        let fd = libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, libc::NETLINK_ROUTE);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // Owned so it is closed on every return path.
        let fd = <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd);
        let raw = std::os::fd::AsRawFd::as_raw_fd(&fd);
        let mut addr: libc::sockaddr_nl = std::mem::zeroed();
        addr.nl_family = libc::AF_NETLINK as u16;
        let sent = libc::sendto(
            raw,
            msg.as_ptr().cast(),
            msg.len(),
            0,
            (&addr as *const libc::sockaddr_nl).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as u32,
        );
        if sent < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut buf = [0u8; 4096];
        let n = libc::recv(raw, buf.as_mut_ptr().cast(), buf.len(), 0);
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        parse_ack(&buf[..n as usize])
    }
}

/// nlmsghdr + tcmsg + TCA_KIND "clsact" (linux/rtnetlink.h, linux/pkt_sched.h).
fn del_clsact_message(ifindex: u32, seq: u32) -> Vec<u8> {
    const RTM_DELQDISC: u16 = 37;
    const TCA_KIND: u16 = 1;
    const TC_H_CLSACT: u32 = 0xffff_fff1;
    const CLSACT_HANDLE: u32 = 0xffff_0000;
    let kind = b"clsact\0";
    let attr_len = 4 + kind.len();
    let attr_padded = (attr_len + 3) & !3;
    let total = 16 + 20 + attr_padded;
    let mut m = Vec::with_capacity(total);
    m.extend_from_slice(&(total as u32).to_ne_bytes());
    m.extend_from_slice(&RTM_DELQDISC.to_ne_bytes());
    m.extend_from_slice(&((libc::NLM_F_REQUEST | libc::NLM_F_ACK) as u16).to_ne_bytes());
    m.extend_from_slice(&seq.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes());
    // tcmsg: family, pad, pad, ifindex, handle, parent, info
    m.extend_from_slice(&[libc::AF_UNSPEC as u8, 0, 0, 0]);
    m.extend_from_slice(&(ifindex as i32).to_ne_bytes());
    m.extend_from_slice(&CLSACT_HANDLE.to_ne_bytes());
    m.extend_from_slice(&TC_H_CLSACT.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes());
    m.extend_from_slice(&(attr_len as u16).to_ne_bytes());
    m.extend_from_slice(&TCA_KIND.to_ne_bytes());
    m.extend_from_slice(kind);
    m.resize(total, 0);
    m
}

fn parse_ack(b: &[u8]) -> io::Result<()> {
    if b.len() < 20 {
        return Err(io::Error::other("short netlink reply"));
    }
    let ty = u16::from_ne_bytes([b[4], b[5]]);
    if ty != libc::NLMSG_ERROR as u16 {
        return Err(io::Error::other(format!("unexpected netlink reply type {ty}")));
    }
    let err = i32::from_ne_bytes([b[16], b[17], b[18], b[19]]);
    if err == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(-err))
    }
}

/// Lists pins present in a pin directory (for `ringside status` hints and tests).
pub fn existing_pins(pin_dir: &Path) -> Vec<String> {
    fs::read_dir(pin_dir)
        .map(|d| d.filter_map(|e| e.ok()).map(|e| String::from_utf8_lossy(e.file_name().as_bytes()).into_owned()).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_interface_is_named() {
        let e = ifindex("nope-ringside0").unwrap_err().to_string();
        assert!(e.contains("`nope-ringside0`") && e.contains("ip link"), "{e}");
    }

    #[test]
    fn bpffs_check_names_the_mount_command() {
        let e = check_bpffs(Path::new("/tmp/ringside-pins")).unwrap_err().to_string();
        assert!(e.contains("/tmp") && e.contains("mount -t bpf bpf /sys/fs/bpf"), "{e}");
    }

    #[test]
    fn delqdisc_message_layout() {
        let m = del_clsact_message(7, 9);
        assert_eq!(m.len(), 16 + 20 + 12);
        assert_eq!(u32::from_ne_bytes(m[0..4].try_into().unwrap()) as usize, m.len());
        assert_eq!(u16::from_ne_bytes([m[4], m[5]]), 37);
        assert_eq!(i32::from_ne_bytes(m[20..24].try_into().unwrap()), 7);
        assert_eq!(u32::from_ne_bytes(m[28..32].try_into().unwrap()), 0xffff_fff1);
        assert_eq!(&m[40..47], b"clsact\0");
        let mut ack = vec![0u8; 36];
        ack[4..6].copy_from_slice(&(libc::NLMSG_ERROR as u16).to_ne_bytes());
        assert!(parse_ack(&ack).is_ok());
        ack[16..20].copy_from_slice(&(-libc::ENOENT).to_ne_bytes());
        assert_eq!(parse_ack(&ack).unwrap_err().raw_os_error(), Some(libc::ENOENT));
    }
}
