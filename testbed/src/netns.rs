//! [`Netns`]: an RAII network namespace, and what tells a leftover namespace from one in use
//! ([`creator_pid`], [`list_rig_namespaces`]; [`crate::clean()`] removes the leftovers).
//!
//! Naming invariant: every namespace the testbed creates is called `rs-<pid>-<rig>-<label>`, where
//! `<pid>` is the creating process and `<rig>` a per-process counter. Parallel runs therefore never
//! collide, and [`crate::clean()`] can tell a leftover (creator dead) from a rig in use.
//!
//! Entering a namespace is done with `setns(CLONE_NEWNET)` only. We deliberately do not use
//! `ip netns exec`: it also unshares the mount namespace and remounts /sys, which hides
//! /sys/fs/bpf (where the ringside agent pins its maps). [`Netns::command_with_sysfs`] is the
//! one exception, for writing per-interface sysfs files (RPS masks) that only a sysfs mounted
//! inside the namespace shows.

use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::cmd;
use crate::error::{Error, Result};

/// Prefix of every namespace the testbed creates.
pub const NETNS_PREFIX: &str = "rs-";
/// Where `ip netns` keeps its bind mounts.
pub const NETNS_RUN_DIR: &str = "/run/netns";

static RIG_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A fresh `rs-<pid>-<counter>` prefix, unique within this machine while this process lives.
pub fn unique_prefix() -> String {
    let n = RIG_COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{NETNS_PREFIX}{}-{n}", std::process::id())
}

/// A named network namespace that is deleted when dropped.
#[derive(Debug)]
pub struct Netns {
    handle: NetnsHandle,
}

/// A non-owning reference to a namespace by name (used by fault guards, which may outlive a borrow
/// of the rig). Entering a namespace that is already gone fails cleanly.
#[derive(Debug, Clone)]
pub struct NetnsHandle {
    name: String,
    path: PathBuf,
}

impl Netns {
    /// Creates `rs-<pid>-<counter>-<label>`.
    pub fn new(label: &str) -> Result<Netns> {
        Netns::create(format!("{}-{label}", unique_prefix()))
    }

    /// Creates a namespace with exactly this name (`ip netns add`). Prefer [`Netns::new`].
    pub fn create(name: String) -> Result<Netns> {
        cmd::require_root()?;
        if name.is_empty() || name.contains('/') || name.len() > 200 {
            return Err(Error::InvalidArgument { field: "netns name", reason: format!("{name:?}") });
        }
        cmd::ip(&["netns", "add", &name])?;
        let path = Path::new(NETNS_RUN_DIR).join(&name);
        Ok(Netns { handle: NetnsHandle { name, path } })
    }

    pub fn name(&self) -> &str {
        &self.handle.name
    }

    /// `/run/netns/<name>`, usable with `nsenter --net=<path>`.
    pub fn path(&self) -> &Path {
        &self.handle.path
    }

    /// A non-owning handle (clonable, 'static).
    pub fn handle(&self) -> NetnsHandle {
        self.handle.clone()
    }

    /// A `Command` for `program` that runs inside this namespace (network namespace only; the
    /// mount namespace, and therefore /sys/fs/bpf, stays the caller's).
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        self.handle.command(program)
    }

    /// Like [`Netns::command`], but the child also gets a private mount namespace with a sysfs
    /// mounted for this network namespace, so `/sys/class/net` lists this namespace's interfaces.
    /// Use only for sysfs writes; it hides the caller's /sys/fs/bpf from the child.
    pub fn command_with_sysfs(&self, program: impl AsRef<OsStr>) -> Command {
        self.handle.command_with_sysfs(program)
    }

    /// Runs `f` on a fresh thread that has entered this namespace; sockets `f` opens live here.
    /// Threads `f` spawns inherit the namespace.
    ///
    /// # Panics
    /// If the namespace cannot be entered (it was deleted behind our back); use [`Netns::try_run`]
    /// to get an error instead.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        match self.try_run(f) {
            Ok(v) => v,
            Err(e) => panic!("{e}"),
        }
    }

    /// [`Netns::run`] returning an error if the namespace cannot be entered.
    pub fn try_run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> Result<T> {
        self.handle.try_run(f)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if let Err(e) = cmd::ip(&["netns", "delete", &self.handle.name]) {
            tracing::warn!(netns = %self.handle.name, error = %e, "could not delete network namespace");
        }
    }
}

impl NetnsHandle {
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn open(&self) -> Result<File> {
        File::open(&self.path).map_err(|source| Error::Setns { netns: self.name.clone(), source })
    }

    /// See [`Netns::command`].
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        self.command_inner(program, false)
    }

    /// See [`Netns::command_with_sysfs`].
    pub fn command_with_sysfs(&self, program: impl AsRef<OsStr>) -> Command {
        self.command_inner(program, true)
    }

    fn command_inner(&self, program: impl AsRef<OsStr>, with_sysfs: bool) -> Command {
        let mut cmd = Command::new(program);
        // Open the namespace now (in the parent) and move the fd into the hook; an open failure
        // is reported by spawn() itself. The fd is O_CLOEXEC so the program never inherits it.
        let ns = File::open(&self.path);
        let hook = move || -> std::io::Result<()> {
            let fd = match &ns {
                Ok(f) => f.as_raw_fd(),
                Err(e) => return Err(std::io::Error::from_raw_os_error(e.raw_os_error().unwrap_or(libc::ENOENT))),
            };
            // SAFETY: only async-signal-safe syscalls between fork and exec.
            unsafe {
                if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if with_sysfs {
                    // What `ip netns exec` does: a private mount namespace with this netns's sysfs.
                    if libc::unshare(libc::CLONE_NEWNS) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    if libc::mount(std::ptr::null(), c"/".as_ptr(), std::ptr::null(), libc::MS_SLAVE | libc::MS_REC, std::ptr::null()) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    libc::umount2(c"/sys".as_ptr(), libc::MNT_DETACH);
                    if libc::mount(c"sysfs".as_ptr(), c"/sys".as_ptr(), c"sysfs".as_ptr(), 0, std::ptr::null()) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
            }
            Ok(())
        };
        // SAFETY: the hook only calls setns/unshare/mount, which are async-signal-safe.
        unsafe {
            cmd.pre_exec(hook);
        }
        cmd
    }

    /// See [`Netns::try_run`].
    pub fn try_run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> Result<T> {
        let ns = self.open()?;
        std::thread::scope(|s| {
            let worker = std::thread::Builder::new()
                .name(format!("netns-{}", self.name))
                .spawn_scoped(s, move || -> Result<T> {
                    // setns on a thread changes only this thread's network namespace.
                    nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET).map_err(|errno| Error::Setns {
                        netns: self.name.clone(),
                        source: std::io::Error::from(errno),
                    })?;
                    drop(ns);
                    Ok(f())
                })
                .map_err(|source| Error::Spawn { command: "thread".into(), source })?;
            match worker.join() {
                Ok(r) => r,
                Err(panic) => std::panic::resume_unwind(panic),
            }
        })
    }

    /// Writes a `/proc/sys/...` value as seen from inside this namespace (net.* sysctls are per
    /// namespace and resolved against the writing thread's namespace).
    pub fn sysctl_write(&self, key: &str, value: &str) -> Result<()> {
        let path = PathBuf::from("/proc/sys").join(key.replace('.', "/"));
        self.try_run(|| std::fs::write(&path, value).map_err(|e| Error::file(&path, e)))?
    }

    /// Reads a `/proc/sys/...` value as seen from inside this namespace.
    pub fn sysctl_read(&self, key: &str) -> Result<String> {
        let path = PathBuf::from("/proc/sys").join(key.replace('.', "/"));
        self.try_run(|| std::fs::read_to_string(&path).map(|s| s.trim().to_string()).map_err(|e| Error::file(&path, e)))?
    }
}

/// Parses the creating pid out of `rs-<pid>-...`.
pub fn creator_pid(name: &str) -> Option<i32> {
    name.strip_prefix(NETNS_PREFIX)?.split('-').next()?.parse().ok()
}

pub(crate) fn pid_alive(pid: i32) -> bool {
    if pid <= 0 {
        return false;
    }
    match nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None) {
        Ok(()) => true,
        Err(nix::errno::Errno::EPERM) => true,
        Err(_) => false,
    }
}

/// Processes whose network namespace is `name` (`ip netns pids`), without this process; empty
/// when the namespace or `ip` is gone.
pub fn pids_in(name: &str) -> Vec<i32> {
    let Ok(out) = std::process::Command::new("ip").args(["netns", "pids", name]).output() else { return Vec::new() };
    let me = std::process::id() as i32;
    String::from_utf8_lossy(&out.stdout).split_whitespace().filter_map(|p| p.parse().ok()).filter(|&p| p != me).collect()
}

/// Names of all namespaces under /run/netns starting with `rs-`.
pub fn list_rig_namespaces() -> Result<Vec<String>> {
    let dir = match std::fs::read_dir(NETNS_RUN_DIR) {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::file(NETNS_RUN_DIR, e)),
    };
    let mut names: Vec<String> = dir
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with(NETNS_PREFIX))
        .collect();
    names.sort();
    Ok(names)
}
