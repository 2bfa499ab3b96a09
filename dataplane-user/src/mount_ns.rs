//! Finding the host's bpffs when the agent was started with `ip netns exec NS ringside ...`.
//!
//! `ip netns exec` runs its command in a private mount namespace and remounts `/sys` there with a
//! sysfs of the target network namespace (so `/sys/class/net` lists its interfaces). The new
//! sysfs has an empty `/sys/fs/bpf`, not the host's bpffs, so pins would fail (or, if the agent
//! mounted a bpffs of its own, live in a private instance that `ringside detach` and a restarted
//! agent never see). Operators will start the agent that way, so instead of failing the agent
//! looks up its ancestors (`ip` execs the command, so the parent is usually the operator's shell
//! or `sudo`) for the nearest one in another mount namespace where the pin directory's parent is
//! bpffs, and joins that mount namespace with `setns`. Only the mount namespace changes: the
//! network namespace stays NS, which is what `nsenter --net=/run/netns/NS` gives.
//!
//! Joining a mount namespace needs CAP_SYS_ADMIN and CAP_SYS_CHROOT and a single-threaded
//! process, so this runs before the agent starts any thread; without them it explains what to do
//! instead.
use std::{
    fs,
    os::fd::AsFd,
    path::{Path, PathBuf},
};

/// How far up the process tree to look (ip -> sudo -> shell -> ...).
const MAX_ANCESTORS: usize = 8;

/// The mount namespace the agent joined.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Joined {
    pub pid: i32,
    pub comm: String,
}

/// Why the host's bpffs could not be reached from a private mount namespace.
#[derive(Debug, thiserror::Error)]
#[error(
    "{dir} is not on a bpf filesystem in this mount namespace, which is not the one of the process that started the agent (as after `ip netns exec`, which remounts /sys); {reason}. Start the agent with `nsenter --net=/run/netns/NS ringside agent ...` instead (it keeps the host's /sys/fs/bpf), or pass a --pin-dir on a bpffs mounted here"
)]
pub struct PrivateMountNs {
    pub dir: PathBuf,
    pub reason: String,
}

fn mnt_ns(pid: &str) -> Option<PathBuf> {
    fs::read_link(format!("/proc/{pid}/ns/mnt")).ok()
}

/// The parent pid and command name of `pid`, from `/proc/PID/stat` (`pid (comm) state ppid ...`;
/// `comm` may hold spaces and parentheses, so split at the last `)`).
fn parent_of(pid: i32) -> Option<(i32, String)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&stat)
}

fn parse_stat(stat: &str) -> Option<(i32, String)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = stat.get(open + 1..close)?.to_owned();
    let ppid = stat.get(close + 1..)?.split_whitespace().nth(1)?.parse().ok()?;
    Some((ppid, comm))
}

fn comm_of(pid: i32) -> String {
    fs::read_to_string(format!("/proc/{pid}/comm")).map(|c| c.trim().to_owned()).unwrap_or_default()
}

/// `dir` seen from process `pid`'s root (`/proc/PID/root/dir`).
fn through_root(pid: i32, dir: &Path) -> PathBuf {
    Path::new(&format!("/proc/{pid}/root")).join(dir.strip_prefix("/").unwrap_or(dir))
}

/// The processes whose mount namespace may hold the host's bpffs, nearest first: the agent's
/// ancestors (up to [`MAX_ANCESTORS`]), then pid 1 (when the agent was started in the background
/// and its parent is gone, it is reparented to pid 1 or a subreaper).
fn candidates() -> Vec<(i32, String)> {
    let mut out = Vec::new();
    let mut pid = std::process::id() as i32;
    for _ in 0..MAX_ANCESTORS {
        let Some((ppid, _)) = parent_of(pid) else { break };
        if ppid <= 1 {
            break;
        }
        pid = ppid;
        out.push((pid, comm_of(pid)));
    }
    out.push((1, comm_of(1)));
    out
}

/// If `dir` (the pin directory's parent) is not bpffs here but is in the mount namespace of an
/// ancestor, joins that namespace and returns which. `Ok(None)` when there is nothing to do: `dir`
/// is bpffs already, or no ancestor is in another mount namespace (then the caller's own bpffs
/// check reports the usual error).
pub fn join_bpffs_namespace(dir: &Path, is_bpffs: impl Fn(&Path) -> bool) -> Result<Option<Joined>, PrivateMountNs> {
    if is_bpffs(dir) || !dir.is_absolute() {
        return Ok(None);
    }
    let Some(own) = mnt_ns("self") else { return Ok(None) };
    let fail = |reason: String| PrivateMountNs { dir: dir.to_owned(), reason };
    let mut other_ns_seen = false;
    for (pid, comm) in candidates() {
        let Some(ns) = mnt_ns(&pid.to_string()) else { continue };
        if ns == own {
            continue;
        }
        other_ns_seen = true;
        if !is_bpffs(&through_root(pid, dir)) {
            continue;
        }
        let file = fs::File::open(format!("/proc/{pid}/ns/mnt")).map_err(|e| fail(format!("cannot open the mount namespace of pid {pid} ({comm}): {e}")))?;
        // setns(CLONE_NEWNS) also moves the root and working directory to that namespace's; keep
        // the working directory (relative paths of the command line) by its descriptor.
        let cwd = fs::File::open(".").ok();
        nix::sched::setns(file.as_fd(), nix::sched::CloneFlags::CLONE_NEWNS).map_err(|e| {
            let why = match e {
                nix::errno::Errno::EPERM => "joining it needs CAP_SYS_ADMIN and CAP_SYS_CHROOT".to_owned(),
                nix::errno::Errno::EINVAL => "the agent is already multi-threaded".to_owned(),
                e => e.to_string(),
            };
            fail(format!("pid {pid} ({comm}) sees the host's bpffs there, but joining its mount namespace failed: {why}"))
        })?;
        if let Some(cwd) = cwd {
            let _ = nix::unistd::fchdir(std::os::fd::AsRawFd::as_raw_fd(&cwd));
        }
        if !is_bpffs(dir) {
            return Err(fail(format!("joined the mount namespace of pid {pid} ({comm}), but {} is still not bpffs there", dir.display())));
        }
        return Ok(Some(Joined { pid, comm }));
    }
    if other_ns_seen {
        Err(fail("no ancestor process sees a bpffs there either".to_owned()))
    } else {
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_give_parent_and_command() {
        assert_eq!(parse_stat("4242 (bash) S 4100 4242 4242 34816 ..."), Some((4100, "bash".into())));
        // comm may hold spaces and parentheses.
        assert_eq!(parse_stat("17 (a (b) c) R 3 17 17 0"), Some((3, "a (b) c".into())));
        assert_eq!(parse_stat("garbage"), None);
        let (ppid, _) = parent_of(std::process::id() as i32).expect("own /proc/self/stat");
        assert_eq!(ppid, nix::unistd::getppid().as_raw());
    }

    #[test]
    fn paths_are_seen_through_the_ancestors_root() {
        assert_eq!(through_root(7, Path::new("/sys/fs/bpf")), PathBuf::from("/proc/7/root/sys/fs/bpf"));
    }

    #[test]
    fn nothing_to_do_when_already_bpffs_or_relative() {
        assert_eq!(join_bpffs_namespace(Path::new("/sys/fs/bpf"), |_| true).unwrap(), None);
        assert_eq!(join_bpffs_namespace(Path::new("pins"), |_| false).unwrap(), None);
    }
}
