//! Host tuning that keeps a 2-vCPU rig from reordering packets: RPS on every link and a raised
//! `net.core.netdev_max_backlog` (see docs in TOOLCHAIN.md: without them a healthy TCP collective
//! shows thousands of spurious retransmissions per minute).
//!
//! `netdev_max_backlog` is machine-wide, so raising it is reference counted twice: within this
//! process (a [`BacklogGuard`] per rig) and across processes through a small state file under
//! /run (guarded by `flock`), which records the original value and the pids holding it raised.
//! The last holder restores the original; [`crate::clean`] restores it if every holder died.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::Mutex;

use crate::error::{Error, Result};
use crate::netns::{pid_alive, NetnsHandle};

/// The value rigs raise `net.core.netdev_max_backlog` to (kernel default 1000).
pub const RAISED_NETDEV_MAX_BACKLOG: u64 = 16384;
const BACKLOG_SYSCTL: &str = "/proc/sys/net/core/netdev_max_backlog";
const STATE_DIR: &str = "/run/ringside-testbed";
const STATE_FILE: &str = "/run/ringside-testbed/netdev_max_backlog";

/// An RPS mask that covers every configured CPU, in the kernel's comma-separated 32-bit groups.
pub fn all_cpus_mask() -> String {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) }.max(1) as usize;
    cpu_mask(n)
}

/// Mask for CPUs 0..n, e.g. `3` for 2 CPUs, `ffffffff,ffffffff` for 64.
pub fn cpu_mask(n: usize) -> String {
    cpu_set_mask(0..n)
}

/// Mask for the given CPUs, in the kernel's comma-separated 32-bit groups (highest group first),
/// e.g. `2` for CPU 1 alone, `1,00000000` for CPU 32. No CPU gives `0`.
pub fn cpu_set_mask(cpus: impl IntoIterator<Item = usize>) -> String {
    let mut words: Vec<u32> = vec![0];
    for c in cpus {
        if words.len() <= c / 32 {
            words.resize(c / 32 + 1, 0);
        }
        words[c / 32] |= 1 << (c % 32);
    }
    let mut parts = Vec::with_capacity(words.len());
    for w in words.iter().rev() {
        parts.push(if parts.is_empty() { format!("{w:x}") } else { format!("{w:08x}") });
    }
    parts.join(",")
}

/// Spreads receive processing of `ifaces` (inside `ns`) over all CPUs with RPS.
pub fn enable_rps(ns: &NetnsHandle, ifaces: &[&str]) -> Result<()> {
    set_rps(ns, ifaces, &all_cpus_mask())
}

/// Sets the RPS mask (see [`cpu_set_mask`]) of every receive queue of `ifaces` inside `ns`: the
/// CPUs that process what those interfaces receive.
pub fn set_rps(ns: &NetnsHandle, ifaces: &[&str], mask: &str) -> Result<()> {
    let mut script = String::from("set -e\n");
    for i in ifaces {
        script.push_str(&format!("for q in /sys/class/net/{i}/queues/rx-*/rps_cpus; do echo {mask} > \"$q\"; done\n"));
    }
    let mut cmd = ns.command_with_sysfs("sh");
    cmd.args(["-c", &script]);
    crate::cmd::run(crate::cmd::Tool::Sh, &mut cmd, None)?;
    Ok(())
}

/// Turns the segmentation offloads (TSO and GSO) of `iface` inside `ns` on or off, and GRO too
/// unless `gro` is `None`. With TSO/GSO on, a veth carries 64 KiB super-packets that a bridge
/// forwards as they are; a device with them off segments what it transmits into MTU-sized
/// frames, each processed on its own by every later hop (softirq time on the machine's CPUs).
pub fn set_offloads(ns: &NetnsHandle, iface: &str, segmentation: bool, gro: Option<bool>) -> Result<()> {
    let onoff = |b: bool| if b { "on" } else { "off" };
    let mut c = ns.command("ethtool");
    c.args(["-K", iface, "tso", onoff(segmentation), "gso", onoff(segmentation)]);
    if let Some(gro) = gro {
        c.args(["gro", onoff(gro)]);
    }
    crate::cmd::run(crate::cmd::Tool::Ethtool, &mut c, None)?;
    Ok(())
}

/// Reads the RPS mask of `iface`'s first receive queue inside `ns`.
pub fn read_rps(ns: &NetnsHandle, iface: &str) -> Result<String> {
    let mut cmd = ns.command_with_sysfs("cat");
    cmd.arg(format!("/sys/class/net/{iface}/queues/rx-0/rps_cpus"));
    Ok(crate::cmd::run(crate::cmd::Tool::Sh, &mut cmd, None)?.trim().to_string())
}

static HOLDERS_IN_PROCESS: Mutex<usize> = Mutex::new(0);

/// Holds `net.core.netdev_max_backlog` raised while alive.
#[derive(Debug)]
pub struct BacklogGuard {
    _private: (),
}

impl BacklogGuard {
    pub fn acquire() -> Result<BacklogGuard> {
        let mut n = HOLDERS_IN_PROCESS.lock().unwrap_or_else(|p| p.into_inner());
        if *n == 0 {
            with_state(|state| {
                state.holders.retain(|&p| pid_alive(p));
                if state.holders.is_empty() {
                    let current = read_backlog()?;
                    state.original = Some(current);
                    if current < RAISED_NETDEV_MAX_BACKLOG {
                        write_backlog(RAISED_NETDEV_MAX_BACKLOG)?;
                    }
                }
                let me = std::process::id() as i32;
                if !state.holders.contains(&me) {
                    state.holders.push(me);
                }
                Ok(())
            })?;
        }
        *n += 1;
        Ok(BacklogGuard { _private: () })
    }
}

impl Drop for BacklogGuard {
    fn drop(&mut self) {
        let mut n = HOLDERS_IN_PROCESS.lock().unwrap_or_else(|p| p.into_inner());
        *n = n.saturating_sub(1);
        if *n > 0 {
            return;
        }
        let me = std::process::id() as i32;
        let r = with_state(|state| {
            state.holders.retain(|&p| p != me && pid_alive(p));
            if state.holders.is_empty() {
                if let Some(orig) = state.original.take() {
                    write_backlog(orig)?;
                }
            }
            Ok(())
        });
        if let Err(e) = r {
            tracing::warn!(error = %e, "could not restore net.core.netdev_max_backlog");
        }
    }
}

/// Restores the original backlog if the state file says it is raised but no holder is alive.
pub(crate) fn restore_stale_backlog() -> Result<Option<u64>> {
    if !Path::new(STATE_FILE).exists() {
        return Ok(None);
    }
    // Our own live rigs count as holders: `clean` must not pull the rug from under them.
    with_state(|state| {
        state.holders.retain(|&p| pid_alive(p));
        if state.holders.is_empty() {
            if let Some(orig) = state.original.take() {
                write_backlog(orig)?;
                return Ok(Some(orig));
            }
        }
        Ok(None)
    })
}

pub fn read_backlog() -> Result<u64> {
    let s = std::fs::read_to_string(BACKLOG_SYSCTL).map_err(|e| Error::file(BACKLOG_SYSCTL, e))?;
    s.trim().parse().map_err(|_| Error::BadOutput { command: BACKLOG_SYSCTL.into(), detail: s })
}

fn write_backlog(v: u64) -> Result<()> {
    std::fs::write(BACKLOG_SYSCTL, v.to_string()).map_err(|e| Error::file(BACKLOG_SYSCTL, e))
}

#[derive(Debug, Default, PartialEq)]
struct BacklogState {
    original: Option<u64>,
    holders: Vec<i32>,
}

impl BacklogState {
    fn parse(s: &str) -> BacklogState {
        let mut st = BacklogState::default();
        for line in s.lines() {
            if let Some(v) = line.strip_prefix("original=") {
                st.original = v.trim().parse().ok();
            } else if let Some(v) = line.strip_prefix("holders=") {
                st.holders = v.split(',').filter_map(|p| p.trim().parse().ok()).collect();
            }
        }
        st
    }

    fn render(&self) -> String {
        match self.original {
            None => String::new(),
            Some(o) => {
                let h: Vec<String> = self.holders.iter().map(|p| p.to_string()).collect();
                format!("original={o}\nholders={}\n", h.join(","))
            }
        }
    }
}

/// Runs `f` on the cross-process state under an exclusive `flock`, then writes it back.
fn with_state<T>(f: impl FnOnce(&mut BacklogState) -> Result<T>) -> Result<T> {
    std::fs::create_dir_all(STATE_DIR).map_err(|e| Error::file(STATE_DIR, e))?;
    let mut file: File = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(STATE_FILE)
        .map_err(|e| Error::file(STATE_FILE, e))?;
    // SAFETY: flock on an fd we own; the lock is released when `file` is closed.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(Error::file(STATE_FILE, std::io::Error::last_os_error()));
    }
    let mut text = String::new();
    file.read_to_string(&mut text).map_err(|e| Error::file(STATE_FILE, e))?;
    let mut state = BacklogState::parse(&text);
    let out = f(&mut state);
    if state.holders.is_empty() && out.is_ok() {
        state.original = None;
    }
    let rendered = state.render();
    file.set_len(0).map_err(|e| Error::file(STATE_FILE, e))?;
    file.seek(SeekFrom::Start(0)).map_err(|e| Error::file(STATE_FILE, e))?;
    file.write_all(rendered.as_bytes()).map_err(|e| Error::file(STATE_FILE, e))?;
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks() {
        assert_eq!(cpu_mask(1), "1");
        assert_eq!(cpu_mask(2), "3");
        assert_eq!(cpu_mask(32), "ffffffff");
        assert_eq!(cpu_mask(33), "1,ffffffff");
        assert_eq!(cpu_mask(64), "ffffffff,ffffffff");
        assert_eq!(cpu_set_mask([1]), "2");
        assert_eq!(cpu_set_mask(1..4), "e");
        assert_eq!(cpu_set_mask([32]), "1,00000000");
        assert_eq!(cpu_set_mask([]), "0");
    }

    #[test]
    fn state_round_trip() {
        let s = BacklogState { original: Some(1000), holders: vec![12, 34] };
        assert_eq!(BacklogState::parse(&s.render()), s);
        assert_eq!(BacklogState::parse(""), BacklogState::default());
    }
}
