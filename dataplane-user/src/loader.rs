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
    maps::{lpm_trie::Key, Array, LpmTrie, MapData, MapError, MapInfo},
    pin::PinError,
    programs::{
        links::{FdLink, LinkError, LinkOrder, PinnedLink},
        tc::{self, NlOptions, SchedClassifierLink, SchedClassifierLinkId, TcAttachOptions, TcError, TcHandle},
        ProgramError, SchedClassifier, TcAttachType,
    },
    Ebpf, EbpfError, EbpfLoader,
};
use aya_log::EbpfLogger;
use dataplane_common::{config_flags, maps, programs, PrefixKey, PrefixValue, LAYOUT_VERSION};

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
pub const PINNED_MAPS: [&str; 5] = [maps::FLOWS, maps::CONFIG, maps::MATCH_PREFIXES, maps::EVENTS, maps::STATS];

/// Maps earlier versions pinned and this one no longer has (`FLOW_STATE` was merged into `FLOWS`):
/// `detach` removes them too, so a pin directory left by an older agent can still be emptied.
const RETIRED_PINS: [&str; 1] = ["FLOW_STATE"];

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
    #[error("{dir} holds entries that are not a ringside agent's pins; pass another --pin-dir (each agent needs its own), or remove them if they are stale")]
    PinsExist { dir: PathBuf },
    #[error("another ringside agent is running with the pin directory {dir}; stop it, or pass another --pin-dir")]
    PinDirBusy { dir: PathBuf },
    #[error("the pins in {dir} have another layout than this agent ({}); nothing was changed. They come from another ringside version, another kernel_max_flows or another attach mode, and cannot be reused. To start afresh (all counters restart from zero): `ringside detach --iface IF --pin-dir {dir}` for every interface it monitored, then start the agent again (see \"Restarts and upgrades\" in docs/operator-guide.md)", .mismatches.join("; "))]
    IncompatiblePins { dir: PathBuf, mismatches: Vec<String> },
    #[error("cannot read the pinned map {path}: {source}")]
    OpenPin { path: PathBuf, source: MapError },
    #[error("cannot open or pin the TCX link {path}: {source}; remove the attachment with `ringside detach`")]
    LinkPin { path: PathBuf, source: LinkError },
    #[error("the agent's eBPF object cannot be parsed: {0}; rebuild it with `cargo xtask build`")]
    ObjectParse(#[source] Box<aya_obj::ParseError>),
    #[error("`{iface}` already has a tc filter at priority {prio} on {direction} that is not flowmon's; check `tc filter show dev {iface} {direction}`, or use --attach tcx", prio = TC_PRIORITY)]
    TcPriorityTaken { iface: String, direction: &'static str },
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
/// default (64 KiB to 8 MiB) is short of the `FLOWS` map alone (312 bytes × `kernel_max_flows`); 5.11+ charge the memory
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

/// tc priority of flowmon's filters in clsact mode. Fixed (not left to the kernel) so that a
/// restarted agent can name its predecessor's filter and swap the program inside it (see
/// [`Attachment::attach`]). 49152 is what the kernel gives the first filter on an empty hook,
/// i.e. what agents got before the priority was fixed, on a clean interface.
pub const TC_PRIORITY: u16 = 49152;
/// tc handle of flowmon's filters in clsact mode (at [`TC_PRIORITY`]).
pub const TC_HANDLE: TcHandle = TcHandle::new(0, 1);

/// Marker directory `qdisc-added:IFNAME` in the pin directory: the agent added IFNAME's clsact
/// qdisc, so whoever removes the attachment (a successor's clean exit, `ringside detach`) removes
/// the qdisc too. Directories because bpffs holds no regular files. bpffs refuses names with a
/// `.` (EPERM), hence `:` as separator, and a `.` in an interface name (`eth0.100`) is written as
/// `:`, which interface names cannot contain (see [`pin_name_of`]).
const QDISC_MARKER: &str = "qdisc-added:";
/// Marker directory `attach-mode:clsact` or `attach-mode:tcx`: how the programs are attached, so a
/// successor in the other mode refuses instead of attaching a second copy (two copies would
/// count every packet twice: the program returns `TC_ACT_PIPE`).
const MODE_MARKER: &str = "attach-mode:";
/// Pinned TCX links in persistent mode: `link:IFNAME:ingress` and `link:IFNAME:egress`.
const LINK_PIN: &str = "link:";

/// An interface name as it may appear in a bpffs name (no `.`).
fn pin_name_of(iface: &str) -> String {
    iface.replace('.', ":")
}

fn link_pin_name(iface: &str, direction: &str) -> String {
    format!("{LINK_PIN}{}:{direction}", pin_name_of(iface))
}

fn qdisc_marker_name(iface: &str) -> String {
    format!("{QDISC_MARKER}{}", pin_name_of(iface))
}

/// Where and how to attach.
#[derive(Debug, Clone)]
pub struct AttachRequest {
    pub interfaces: Vec<String>,
    pub mode: AttachMode,
    pub pin_dir: PathBuf,
    /// Keep the map pins after a clean exit (the program is detached).
    pub keep_pins: bool,
    /// Persistent mode: on exit leave the program attached (and in tcx mode its links pinned)
    /// and the maps pinned, so packets are counted while no agent runs; the next agent takes over.
    pub persist: bool,
    pub config: dataplane_common::Config,
    pub prefixes: Vec<PrefixKey>,
    /// Capacity of `FLOWS`, set at load time (config `kernel_max_flows`).
    pub kernel_max_flows: u32,
    /// Size of `EVENTS` in bytes, set at load time (config `kernel_event_ring_kib`).
    pub event_ring_bytes: u32,
}

/// The loaded object, attached to interfaces, with pinned maps. Dropping it detaches (or, in
/// persistent mode, leaves everything in place).
pub struct Attachment {
    ebpf: Option<Ebpf>,
    /// The classifier's debug log, drained into `tracing`; `None` when it is off.
    ebpf_log: Option<EbpfLogDrain>,
    links: Vec<(String, &'static str, SchedClassifierLinkId)>,
    /// TCX links pinned in persistent mode (taken out of the program, so not in `links`).
    pinned_links: Vec<PinnedLink>,
    /// Pins of TCX links under the pin directory (created here or found from a predecessor).
    link_pins: Vec<PathBuf>,
    interfaces: Vec<AttachedInterface>,
    pins: Vec<PathBuf>,
    /// Marker directories this attachment stands for (see [`QDISC_MARKER`], [`MODE_MARKER`]).
    markers: Vec<PathBuf>,
    pin_dir: PathBuf,
    created_pin_dir: bool,
    keep_pins: bool,
    /// Teardown leaves programs attached and pins in place: persistent mode, and any failure
    /// while taking over from a predecessor (whose attachment then keeps counting as it was).
    leave_in_place: bool,
    /// The maps (and filters or links) of a predecessor were taken over.
    reused: bool,
    /// `Config::hash_seed` of the maps (kept from the pinned `CONFIG` when they were reused).
    hash_seed: u32,
    /// `flock` on the pin directory: one agent per pin directory. Released on exit or kill.
    lock: Option<std::os::fd::OwnedFd>,
    torn_down: bool,
}

impl Attachment {
    /// Runs the preflight checks and attaches. On error, everything done so far is undone; when
    /// a predecessor's pins were found, a failure leaves its attachment exactly as it was.
    ///
    /// Restart without loss: if the pin directory holds the maps of a previous agent (persistent
    /// mode, or one that was killed), their layout is checked against this agent's object
    /// ([`check_layout`]), the object is loaded onto the pinned maps
    /// (`EbpfLoader::map_pin_path`: counters continue), `CONFIG` is rewritten, and the program is
    /// swapped in place: in clsact mode the filter at [`TC_PRIORITY`]/[`TC_HANDLE`] is changed
    /// without `NLM_F_EXCL`, which cls_bpf applies atomically (`cls_bpf_change` replaces the
    /// program of the existing filter under RCU); in tcx mode the pinned link is updated
    /// (`BPF_LINK_UPDATE`). Every packet is counted by exactly one of the two programs.
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
            pinned_links: Vec::new(),
            link_pins: Vec::new(),
            interfaces: Vec::new(),
            pins: Vec::new(),
            markers: Vec::new(),
            pin_dir: req.pin_dir.clone(),
            created_pin_dir: false,
            keep_pins: req.keep_pins,
            leave_in_place: false,
            reused: false,
            hash_seed: 0,
            lock: None,
            torn_down: false,
        };
        if a.prepare_pin_dir()? {
            // Nothing is changed before this check passes.
            check_layout(bytes, req)?;
            a.reused = true;
            a.leave_in_place = true;
            tracing::info!(pin_dir = %req.pin_dir.display(), "taking over the pinned maps and attachment of a previous agent: counters continue");
        }
        let mut loader = EbpfLoader::new();
        loader.map_max_entries(maps::FLOWS, req.kernel_max_flows);
        loader.map_max_entries(maps::EVENTS, req.event_ring_bytes);
        // aya opens the pin when it exists and otherwise creates the map and pins it there.
        for name in PINNED_MAPS {
            loader.map_pin_path(name, req.pin_dir.join(name));
        }
        let loaded = loader.load(bytes);
        if !a.reused {
            // Whatever aya pinned before a failure is ours to remove.
            a.pins = PINNED_MAPS.iter().map(|n| req.pin_dir.join(n)).collect();
        }
        let ebpf = a.ebpf.insert(loaded.map_err(LoaderError::Load)?);
        a.pins = PINNED_MAPS.iter().map(|n| req.pin_dir.join(n)).collect();
        a.hash_seed = write_config(ebpf, &req.config, req.kernel_max_flows, &req.prefixes)?;
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
        let prog: &mut SchedClassifier = ebpf
            .program_mut(programs::FLOWMON)
            .ok_or(LoaderError::MissingItem { what: "program", name: programs::FLOWMON })?
            .try_into()
            .map_err(|source| LoaderError::Program { name: programs::FLOWMON, source })?;
        prog.load().map_err(|source| LoaderError::Program { name: programs::FLOWMON, source })?;
        let mode_marker = req.pin_dir.join(format!("{MODE_MARKER}{}", req.mode));
        make_marker(&mode_marker).map_err(|source| LoaderError::PinDir { dir: req.pin_dir.clone(), source })?;
        a.markers.push(mode_marker);
        for (iface, ifindex) in req.interfaces.iter().zip(ifindexes) {
            let mut qdisc_added = false;
            if req.mode == AttachMode::Clsact {
                let marker = req.pin_dir.join(qdisc_marker_name(iface));
                match tc::qdisc_add_clsact(iface) {
                    Ok(()) => qdisc_added = true,
                    // A predecessor's marker says it added the qdisc: it is ours to remove now.
                    Err(TcError::NetlinkError(e)) if e.raw_os_error() == Some(libc::EEXIST) => qdisc_added = marker.is_dir(),
                    Err(source) => return Err(LoaderError::Qdisc { iface: iface.clone(), source }),
                }
                if qdisc_added {
                    make_marker(&marker).map_err(|source| LoaderError::PinDir { dir: req.pin_dir.clone(), source })?;
                    a.markers.push(marker);
                }
            }
            // Recorded before attaching so a failed attach still removes the qdisc we added.
            a.interfaces.push(AttachedInterface { name: iface.clone(), ifindex, mode: req.mode.to_string(), qdisc_added });
            for (dir, direction) in [(TcAttachType::Ingress, "ingress"), (TcAttachType::Egress, "egress")] {
                let attach_err = |source| LoaderError::Attach { iface: iface.clone(), direction, source };
                let (id, took_over) = match req.mode {
                    AttachMode::Clsact => {
                        let options = NlOptions { priority: TC_PRIORITY, handle: TC_HANDLE, ..Default::default() };
                        let replaced = if a.reused {
                            let link = SchedClassifierLink::attached(iface, dir, TC_PRIORITY, TC_HANDLE, None)
                                .map_err(|e| attach_err(ProgramError::TcError(TcError::IoError(e))))?;
                            match prog.attach_to_link(link) {
                                Ok(id) => Some(id),
                                // No predecessor filter on this hook (a new interface, or it was
                                // removed by hand): attach afresh.
                                Err(ProgramError::TcError(TcError::NetlinkError(e))) if e.raw_os_error() == Some(libc::ENOENT) => None,
                                Err(source) => return Err(attach_err(source)),
                            }
                        } else {
                            None
                        };
                        match replaced {
                            Some(id) => (id, true),
                            None => (prog.attach_with_options(iface, dir, TcAttachOptions::Netlink(options)).map_err(|source| {
                                match &source {
                                    ProgramError::TcError(TcError::NetlinkError(e)) if e.raw_os_error() == Some(libc::EEXIST) => {
                                        LoaderError::TcPriorityTaken { iface: iface.clone(), direction }
                                    }
                                    _ => attach_err(source),
                                }
                            })?, false),
                        }
                    }
                    AttachMode::Tcx => {
                        let pin = req.pin_dir.join(link_pin_name(iface, direction));
                        let pinned = if a.reused {
                            match PinnedLink::from_pin(&pin) {
                                Ok(p) => Some(p),
                                Err(LinkError::SyscallError(e)) if e.io_error.kind() == io::ErrorKind::NotFound => None,
                                Err(source) => return Err(LoaderError::LinkPin { path: pin, source }),
                            }
                        } else {
                            None
                        };
                        match pinned {
                            Some(p) => {
                                a.link_pins.push(pin.clone());
                                let link = SchedClassifierLink::try_from(FdLink::from(p))
                                    .map_err(|source| LoaderError::LinkPin { path: pin.clone(), source })?;
                                (prog.attach_to_link(link).map_err(attach_err)?, true)
                            }
                            None => (
                                prog.attach_with_options(iface, dir, TcAttachOptions::TcxOrder(LinkOrder::default())).map_err(attach_err)?,
                                false,
                            ),
                        }
                    }
                };
                if req.persist && req.mode == AttachMode::Tcx && !took_over {
                    // The kernel detaches a TCX link when its last fd closes: pinned, it outlives
                    // the agent.
                    let pin = req.pin_dir.join(link_pin_name(iface, direction));
                    let link = prog.take_link(id).map_err(attach_err)?;
                    let fd_link = FdLink::try_from(link).map_err(|source| LoaderError::LinkPin { path: pin.clone(), source })?;
                    let pinned = fd_link.pin(&pin).map_err(|source| LoaderError::Pin { name: "tcx link", path: pin.clone(), source })?;
                    a.link_pins.push(pin);
                    a.pinned_links.push(pinned);
                } else {
                    a.links.push((iface.clone(), direction, id));
                }
                if took_over {
                    tracing::info!(interface = %iface, direction, mode = %req.mode, "program replaced in place");
                }
            }
            tracing::info!(interface = %iface, ifindex, mode = %req.mode, qdisc_added, persist = req.persist, "flowmon attached");
        }
        a.leave_in_place = req.persist;
        Ok(a)
    }

    /// Creates the pin directory if missing and locks it; returns whether it holds a previous
    /// agent's map pins (all of them: a partial set is refused).
    fn prepare_pin_dir(&mut self) -> Result<bool, LoaderError> {
        let dir = self.pin_dir.clone();
        let err = |source| LoaderError::PinDir { dir: dir.clone(), source };
        match fs::metadata(&dir) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                fs::create_dir(&dir).map_err(err)?;
                self.created_pin_dir = true;
            }
            Err(e) => return Err(err(e)),
        }
        self.lock = Some(lock_pin_dir(&dir)?);
        let names: Vec<String> = existing_pins(&dir);
        let present: Vec<&str> = PINNED_MAPS.iter().copied().filter(|m| names.iter().any(|n| n == m)).collect();
        if present.is_empty() {
            let foreign: Vec<&String> = names.iter().filter(|n| !is_ringside_entry(n)).collect();
            if !foreign.is_empty() {
                return Err(LoaderError::PinsExist { dir: dir.clone() });
            }
            // Markers without maps: leftovers of an interrupted detach; they describe nothing.
            for n in &names {
                let _ = fs::remove_dir(dir.join(n));
            }
            return Ok(false);
        }
        if present.len() < PINNED_MAPS.len() {
            let missing: Vec<&str> = PINNED_MAPS.iter().copied().filter(|m| !present.contains(m)).collect();
            return Err(LoaderError::IncompatiblePins { dir: dir.clone(), mismatches: vec![format!("pins {} are missing", missing.join(", "))] });
        }
        Ok(true)
    }

    pub fn interfaces(&self) -> &[AttachedInterface] {
        &self.interfaces
    }

    pub fn pin_dir(&self) -> &Path {
        &self.pin_dir
    }

    /// Whether a previous agent's maps were taken over (their counters continue).
    /// The seed `FLOWS`' slots are hashed with (see `dataplane_common::flow_hash`).
    pub fn hash_seed(&self) -> u32 {
        self.hash_seed
    }

    pub fn reused(&self) -> bool {
        self.reused
    }

    /// Takes a map out of the object for the collector (the program keeps its own reference).
    pub fn take_map(&mut self, name: &'static str) -> Result<aya::maps::Map, LoaderError> {
        self.ebpf
            .as_mut()
            .and_then(|e| e.take_map(name))
            .ok_or(LoaderError::MissingItem { what: "map", name })
    }

    /// Detaches, removes the qdiscs the agent added, and removes the pins (unless `keep_pins`);
    /// in persistent mode it leaves all of that in place for the next agent. Returns what could
    /// not be undone, for the log; never panics.
    pub fn teardown(&mut self) -> Vec<String> {
        if self.torn_down {
            return Vec::new();
        }
        self.torn_down = true;
        let mut problems = Vec::new();
        // Stops the drain thread after a last flush.
        self.ebpf_log = None;
        if self.leave_in_place {
            if let Some(mut ebpf) = self.ebpf.take() {
                if let Some(Ok(prog)) = ebpf.program_mut(programs::FLOWMON).map(<&mut SchedClassifier>::try_from) {
                    for (_, _, id) in self.links.drain(..) {
                        // An owned link detaches when dropped: forgetting it leaves the filter (or
                        // the pinned link) attached. Nothing else is leaked: a netlink filter is a
                        // few integers; a TCX link's fd closes at exit and its pin holds it.
                        if let Ok(link) = prog.take_link(id) {
                            std::mem::forget(link);
                        }
                    }
                }
                drop(ebpf);
            }
            // Closing a pinned link's fd leaves the link attached (the pin holds it).
            self.pinned_links.clear();
            self.lock = None;
            tracing::info!(pin_dir = %self.pin_dir.display(), "left attached with the maps pinned (persistent mode): packets are counted until the next agent takes over; `ringside detach` removes it all");
            return problems;
        }
        // A pinned TCX link lives as long as its pin: unpin first, then close.
        for p in self.link_pins.drain(..) {
            if let Err(e) = fs::remove_file(&p).or_else(ignore_not_found) {
                problems.push(format!("remove link pin {}: {e}", p.display()));
            }
        }
        self.pinned_links.clear();
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
        // Nothing is attached any more: the markers describe nothing.
        for m in self.markers.drain(..) {
            if let Err(e) = fs::remove_dir(&m).or_else(ignore_not_found) {
                problems.push(format!("remove marker {}: {e}", m.display()));
            }
        }
        if !self.keep_pins {
            for p in self.pins.drain(..) {
                // NotFound: somebody (`ringside detach`) already removed it, which is fine.
                if let Err(e) = fs::remove_file(&p).or_else(ignore_not_found) {
                    problems.push(format!("remove pin {}: {e}", p.display()));
                }
            }
            if self.created_pin_dir || self.reused {
                if let Err(e) = fs::remove_dir(&self.pin_dir).or_else(ignore_not_found) {
                    problems.push(format!("remove pin directory {}: {e}", self.pin_dir.display()));
                }
            }
        }
        self.lock = None;
        problems
    }
}

/// Whether a pin-directory entry is one ringside makes (map pins, link pins, markers).
fn is_ringside_entry(name: &str) -> bool {
    PINNED_MAPS.contains(&name) || name.starts_with(QDISC_MARKER) || name.starts_with(MODE_MARKER) || name.starts_with(LINK_PIN)
}

fn make_marker(path: &Path) -> io::Result<()> {
    match fs::create_dir(path) {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        r => r,
    }
}

/// Takes an exclusive `flock` on the pin directory, so two agents never drive the same pins (the
/// second would swap the first one's program out from under it). The kernel drops it when the
/// process exits or is killed.
fn lock_pin_dir(dir: &Path) -> Result<std::os::fd::OwnedFd, LoaderError> {
    use std::os::fd::{AsRawFd, OwnedFd};
    let file = fs::File::open(dir).map_err(|source| LoaderError::PinDir { dir: dir.to_owned(), source })?;
    // SAFETY: flock on an fd we own.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let e = io::Error::last_os_error();
        return Err(if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
            LoaderError::PinDirBusy { dir: dir.to_owned() }
        } else {
            LoaderError::PinDir { dir: dir.to_owned(), source: e }
        });
    }
    Ok(OwnedFd::from(file))
}

/// Compares the maps pinned in `req.pin_dir` with what this agent's object declares: the layout
/// version in the pinned `CONFIG` (see [`LAYOUT_VERSION`]), and each map's type, key size, value
/// size and capacity as the kernel reports them (so a change in any map is caught here without
/// this code knowing the structs), and the attach mode. Reads only.
pub fn check_layout(bytes: &[u8], req: &AttachRequest) -> Result<(), LoaderError> {
    let dir = &req.pin_dir;
    let obj = aya_obj::Object::parse(bytes).map_err(|e| LoaderError::ObjectParse(Box::new(e)))?;
    let mut mismatches = Vec::new();
    let mut config_readable = false;
    for name in PINNED_MAPS {
        let path = dir.join(name);
        let info = MapInfo::from_pin(&path).map_err(|source| LoaderError::OpenPin { path: path.clone(), source })?;
        let want = obj.maps.get(name).ok_or(LoaderError::MissingItem { what: "map", name })?;
        let want_entries = match name {
            maps::FLOWS => req.kernel_max_flows,
            maps::EVENTS => req.event_ring_bytes,
            _ => want.max_entries(),
        };
        let found_type = info.map_type().map(|t| t as u32).unwrap_or(u32::MAX);
        let found = (found_type, info.key_size(), info.value_size(), info.max_entries());
        let expected = (want.map_type(), want.key_size(), want.value_size(), want_entries);
        if found != expected {
            mismatches.push(format!(
                "{name}: type {} key {} B value {} B entries {} (this agent: type {} key {} B value {} B entries {})",
                found.0, found.1, found.2, found.3, expected.0, expected.1, expected.2, expected.3
            ));
        } else if name == maps::CONFIG {
            config_readable = true;
        }
    }
    if config_readable {
        let path = dir.join(maps::CONFIG);
        let data = MapData::from_pin(&path).map_err(|source| LoaderError::OpenPin { path: path.clone(), source })?;
        let config: Array<MapData, dataplane_common::Config> =
            Array::try_from(aya::maps::Map::Array(data)).map_err(|source| LoaderError::Map { name: maps::CONFIG, source })?;
        let version = config.get(&0, 0).map_err(|source| LoaderError::Map { name: maps::CONFIG, source })?.layout_version;
        if version != LAYOUT_VERSION {
            mismatches.push(format!("layout version {version} (this agent: {LAYOUT_VERSION})"));
        }
    }
    for entry in existing_pins(dir) {
        if let Some(mode) = entry.strip_prefix(MODE_MARKER) {
            if mode != req.mode.to_string() {
                mismatches.push(format!("attached in {mode} mode (this agent: {})", req.mode));
            }
        }
    }
    if mismatches.is_empty() {
        Ok(())
    } else {
        Err(LoaderError::IncompatiblePins { dir: dir.clone(), mismatches })
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

/// Writes `CONFIG` (with `FLOWS`' slot mask for `slots`) and the prefixes; returns the hash seed:
/// the one already in a `CONFIG` of this layout (reused pins: the flows in `FLOWS` were placed
/// with it), else a fresh random one. Public for the T1 test that checks the agent's eviction
/// against the program with the seed this picks (`dataplane-user/tests/t1_flowmon.rs`).
pub fn write_config(ebpf: &mut Ebpf, cfg: &dataplane_common::Config, slots: u32, prefixes: &[PrefixKey]) -> Result<u32, LoaderError> {
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
    let old = config.get(&0, 0).map_err(|source| LoaderError::Map { name: maps::CONFIG, source })?;
    let seed = if old.layout_version == LAYOUT_VERSION { old.hash_seed } else { random_seed() };
    let cfg = dataplane_common::Config { flow_slot_mask: slots - 1, hash_seed: seed, ..*cfg };
    config.set(0, cfg, 0).map_err(|source| LoaderError::Map { name: maps::CONFIG, source })?;
    Ok(seed)
}

/// A random `u32` from the kernel (getrandom(2)); the process's randomised hasher as a fallback.
fn random_seed() -> u32 {
    let mut b = [0u8; 4];
    // SAFETY: writes at most 4 bytes into `b`.
    if unsafe { libc::getrandom(b.as_mut_ptr().cast(), 4, 0) } == 4 {
        return u32::from_ne_bytes(b);
    }
    use std::hash::{BuildHasher, Hasher};
    std::collections::hash_map::RandomState::new().build_hasher().finish() as u32
}

/// What `ringside detach` did.
#[derive(Debug, Default)]
pub struct DetachReport {
    pub filters_removed: Vec<String>,
    /// Map pins and TCX link pins removed.
    pub pins_removed: Vec<PathBuf>,
    pub qdisc_removed: bool,
}

/// Removes what an agent left attached to `iface`: after a persistent-mode exit, or a SIGKILL.
/// That is flowmon's `tc` filters on ingress and egress, its pinned TCX links, the clsact qdisc if
/// the agent added it (its marker says so) or `remove_qdisc` asks for it (which also deletes any
/// other filter on it: only when nothing else uses it), and the map pins and markers in
/// `pin_dir`. Refuses while an agent holds the pin directory.
pub fn detach_leftover(iface: &str, pin_dir: &Path, remove_qdisc: bool) -> Result<DetachReport, LoaderError> {
    privileges::check_detach()?;
    let idx = ifindex(iface)?;
    // Under `ip netns exec`, the pins are on the host's bpffs, not in the private /sys.
    mount_ns::join_bpffs_namespace(pin_parent(pin_dir), is_bpffs)?;
    // Held until the end: no agent starts on these pins half-way through.
    let _lock = if pin_dir.is_dir() { Some(lock_pin_dir(pin_dir)?) } else { None };
    let mut report = DetachReport::default();
    for (dir, name) in [(TcAttachType::Ingress, "ingress"), (TcAttachType::Egress, "egress")] {
        // Unpinning a TCX link drops the kernel's last reference: it detaches.
        let link = pin_dir.join(link_pin_name(iface, name));
        match fs::remove_file(&link) {
            Ok(()) => {
                report.pins_removed.push(link);
                report.filters_removed.push(format!("{name} (tcx link)"));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(source) => return Err(LoaderError::PinDir { dir: pin_dir.to_owned(), source }),
        }
        match tc::qdisc_detach_program(iface, dir, programs::FLOWMON) {
            Ok(()) => report.filters_removed.push(name.to_owned()),
            Err(TcError::IoError(e)) if e.kind() == io::ErrorKind::NotFound => {}
            // No clsact qdisc at all: nothing attached there.
            Err(TcError::NetlinkError(e)) if matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::ENOENT)) => {}
            Err(source) => return Err(LoaderError::Detach { iface: iface.to_owned(), source }),
        }
    }
    let marker = pin_dir.join(qdisc_marker_name(iface));
    let agent_added_qdisc = marker.is_dir();
    if remove_qdisc || agent_added_qdisc {
        match delete_clsact(idx) {
            Ok(()) => report.qdisc_removed = true,
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::EINVAL)) => {}
            Err(source) => return Err(LoaderError::QdiscDelete { iface: iface.to_owned(), source }),
        }
        let _ = fs::remove_dir(&marker);
    }
    for name in PINNED_MAPS.iter().chain(&RETIRED_PINS) {
        let p = pin_dir.join(name);
        match fs::remove_file(&p) {
            Ok(()) => report.pins_removed.push(p),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(source) => return Err(LoaderError::PinDir { dir: pin_dir.to_owned(), source }),
        }
    }
    // The mode marker goes with the maps; markers and links of interfaces not named here stay
    // (so does the directory then: detach those interfaces too).
    for entry in existing_pins(pin_dir) {
        if entry.starts_with(MODE_MARKER) {
            let _ = fs::remove_dir(pin_dir.join(entry));
        }
    }
    // Only if empty: never remove somebody else's pins.
    let _ = fs::remove_dir(pin_dir);
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
    fn pin_names_avoid_dots_and_are_recognised() {
        // bpffs refuses names with a dot (EPERM): a VLAN interface must still get its pins.
        assert_eq!(link_pin_name("eth0.100", "ingress"), "link:eth0:100:ingress");
        assert_eq!(qdisc_marker_name("eth0.100"), "qdisc-added:eth0:100");
        assert!(!link_pin_name("a.b", "egress").contains('.') && !qdisc_marker_name("a.b").contains('.'));
        for name in [link_pin_name("eth0", "egress"), qdisc_marker_name("eth0"), format!("{MODE_MARKER}tcx"), maps::FLOWS.to_owned()] {
            assert!(is_ringside_entry(&name), "{name}");
        }
        assert!(!is_ringside_entry("my_other_map"));
    }

    #[test]
    fn incompatible_pins_name_the_dir_the_differences_and_the_migration() {
        let e = LoaderError::IncompatiblePins {
            dir: "/sys/fs/bpf/ringside".into(),
            mismatches: vec!["layout version 0 (this agent: 1)".into(), "FLOWS: entries 4096".into()],
        }
        .to_string();
        for want in ["/sys/fs/bpf/ringside", "layout version 0 (this agent: 1); FLOWS: entries 4096", "ringside detach --iface IF --pin-dir /sys/fs/bpf/ringside", "nothing was changed"] {
            assert!(e.contains(want), "{want}: {e}");
        }
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
