//! The agent process's own resource use, read from `/proc/self` at scrape time: the values behind
//! the standard `process_*` metrics that Prometheus client libraries and the node exporter's
//! process collector expose (names and help in `metrics.rs`, like every other metric).
//!
//! Sources (proc(5)):
//! - `/proc/self/stat`: `utime` (field 14) and `stime` (15) in clock ticks, `starttime` (22) in
//!   ticks since boot, `vsize` (23) in bytes, `rss` (24) in pages. Field 2, `comm`, is in
//!   parentheses and may itself hold spaces and `)`, so fields are counted after the *last* `)`.
//! - `/proc/stat`: `btime`, the boot time in Unix seconds (to turn `starttime` into Unix time).
//! - `/proc/self/fd`: one entry per open descriptor.
//! - `/proc/self/limits`: the soft limit of `Max open files`.
//!
//! Parsing is pure (`parse_*` over the files' text) so that it is tested on captured contents;
//! [`ProcessSample::read`] is the only function that touches the file system.
use std::path::Path;

/// What could not be read or parsed; the scrape then goes without the process metrics.
#[derive(Debug, thiserror::Error)]
pub enum ProcReadError {
    #[error("cannot read {path}: {source}; is /proc mounted?")]
    Read { path: &'static str, source: std::io::Error },
    #[error("{path} has no field {field} (text: {text:?}); this kernel's proc(5) format is not supported")]
    MissingField { path: &'static str, field: &'static str, text: String },
}

/// The fields of `/proc/self/stat` the metrics need, in the file's own units.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcStat {
    pub utime_ticks: u64,
    pub stime_ticks: u64,
    pub start_ticks_since_boot: u64,
    pub vsize_bytes: u64,
    pub rss_pages: u64,
}

/// One reading of the process's resource use, in base units.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ProcessSample {
    /// User plus system CPU time, seconds.
    pub cpu_seconds: f64,
    pub resident_bytes: u64,
    pub virtual_bytes: u64,
    /// Unix time the process started, seconds.
    pub start_time_seconds: f64,
    pub open_fds: u64,
    /// Soft limit on open descriptors; `None` when unlimited.
    pub max_fds: Option<u64>,
}

const STAT: &str = "/proc/self/stat";
const SYSTEM_STAT: &str = "/proc/stat";
const LIMITS: &str = "/proc/self/limits";
const FD_DIR: &str = "/proc/self/fd";

/// Parses `/proc/PID/stat`.
pub fn parse_stat(text: &str) -> Result<ProcStat, ProcReadError> {
    let missing = |field| ProcReadError::MissingField { path: STAT, field, text: text.chars().take(200).collect() };
    // Fields after `comm`: the first is field 3 (state), so field N is at index N - 3.
    let rest = text.rsplit_once(')').ok_or_else(|| missing("comm"))?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize, name: &'static str| -> Result<u64, ProcReadError> {
        fields.get(n - 3).and_then(|f| f.parse().ok()).ok_or_else(|| missing(name))
    };
    Ok(ProcStat {
        utime_ticks: field(14, "utime")?,
        stime_ticks: field(15, "stime")?,
        start_ticks_since_boot: field(22, "starttime")?,
        vsize_bytes: field(23, "vsize")?,
        rss_pages: field(24, "rss")?,
    })
}

/// The boot time (`btime`, Unix seconds) from `/proc/stat`.
pub fn parse_boot_time(text: &str) -> Result<u64, ProcReadError> {
    text.lines()
        .find_map(|l| l.strip_prefix("btime ").and_then(|v| v.trim().parse().ok()))
        .ok_or_else(|| ProcReadError::MissingField { path: SYSTEM_STAT, field: "btime", text: String::new() })
}

/// The soft limit of `Max open files` from `/proc/PID/limits`; `Ok(None)` when `unlimited`.
pub fn parse_max_open_files(text: &str) -> Result<Option<u64>, ProcReadError> {
    let missing = || ProcReadError::MissingField { path: LIMITS, field: "Max open files", text: text.chars().take(200).collect() };
    let line = text.lines().find_map(|l| l.strip_prefix("Max open files")).ok_or_else(missing)?;
    match line.split_whitespace().next() {
        Some("unlimited") => Ok(None),
        Some(v) => v.parse().map(Some).map_err(|_| missing()),
        None => Err(missing()),
    }
}

impl ProcessSample {
    /// Combines the parsed files; `ticks_per_second` is `sysconf(_SC_CLK_TCK)`, `page_size`
    /// `sysconf(_SC_PAGESIZE)`.
    pub fn from_parts(stat: ProcStat, boot_time: u64, open_fds: u64, max_fds: Option<u64>, ticks_per_second: u64, page_size: u64) -> Self {
        let tps = ticks_per_second.max(1) as f64;
        ProcessSample {
            cpu_seconds: (stat.utime_ticks + stat.stime_ticks) as f64 / tps,
            resident_bytes: stat.rss_pages * page_size,
            virtual_bytes: stat.vsize_bytes,
            start_time_seconds: boot_time as f64 + stat.start_ticks_since_boot as f64 / tps,
            open_fds,
            max_fds,
        }
    }

    /// Reads the running process's values from `/proc`.
    pub fn read() -> Result<ProcessSample, ProcReadError> {
        let read = |path: &'static str| std::fs::read_to_string(path).map_err(|source| ProcReadError::Read { path, source });
        let stat = parse_stat(&read(STAT)?)?;
        let boot = parse_boot_time(&read(SYSTEM_STAT)?)?;
        let max_fds = parse_max_open_files(&read(LIMITS)?)?;
        let open_fds = count_entries(Path::new(FD_DIR)).map_err(|source| ProcReadError::Read { path: FD_DIR, source })?;
        // SAFETY: sysconf only reads a configuration value.
        let (tps, page) = unsafe { (libc::sysconf(libc::_SC_CLK_TCK), libc::sysconf(libc::_SC_PAGESIZE)) };
        Ok(ProcessSample::from_parts(stat, boot, open_fds, max_fds, tps.max(1) as u64, page.max(1) as u64))
    }
}

/// Entries of a directory. Listing `/proc/self/fd` opens one descriptor itself, which is counted,
/// as in client_golang and the Python client.
fn count_entries(dir: &Path) -> std::io::Result<u64> {
    let mut n = 0;
    for entry in std::fs::read_dir(dir)? {
        entry?;
        n += 1;
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A real `/proc/PID/stat` line (a process named with a space and a parenthesis).
    const STAT_TEXT: &str = "13522 (ring side) x) S 13518 13518 9252 0 -1 4194304 100 0 0 0 250 130 0 0 20 0 1 0 2232067 3133440 418 18446744073709551615 94239953256448 94239953276329 140725943704128 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0 94239953292336 94239953293952 94241004666880 140725943708371 140725943708391 140725943708391 140725943709675 0\n";

    const LIMITS_TEXT: &str = "Limit                     Soft Limit           Hard Limit           Units     \n\
Max cpu time              unlimited            unlimited            seconds   \n\
Max open files            20000                524288               files     \n\
Max locked memory         8388608              8388608              bytes     \n";

    #[test]
    fn stat_fields_are_counted_after_the_last_parenthesis() {
        let s = parse_stat(STAT_TEXT).unwrap();
        assert_eq!(
            s,
            ProcStat { utime_ticks: 250, stime_ticks: 130, start_ticks_since_boot: 2_232_067, vsize_bytes: 3_133_440, rss_pages: 418 }
        );
    }

    #[test]
    fn truncated_stat_names_the_missing_field() {
        let err = parse_stat("1 (x) S 0 0 0 0 -1 0 0 0 0 0 5").unwrap_err().to_string();
        assert!(err.contains("stime"), "{err}");
        assert!(parse_stat("no parenthesis here").unwrap_err().to_string().contains("comm"));
    }

    #[test]
    fn boot_time_and_fd_limit() {
        assert_eq!(parse_boot_time("cpu  1 2 3\nintr 5\nbtime 1795456037\nprocesses 9\n").unwrap(), 1_795_456_037);
        assert!(parse_boot_time("cpu 1\n").is_err());
        assert_eq!(parse_max_open_files(LIMITS_TEXT).unwrap(), Some(20_000));
        let unlimited = LIMITS_TEXT.replace("20000   ", "unlimited");
        assert_eq!(parse_max_open_files(&unlimited).unwrap(), None);
        assert!(parse_max_open_files("Limit Soft\n").unwrap_err().to_string().contains("Max open files"));
    }

    #[test]
    fn units_are_converted_to_seconds_and_bytes() {
        let s = ProcessSample::from_parts(parse_stat(STAT_TEXT).unwrap(), 1_795_456_037, 12, Some(20_000), 100, 4096);
        assert_eq!(s.cpu_seconds, 3.8);
        assert_eq!(s.resident_bytes, 418 * 4096);
        assert_eq!(s.virtual_bytes, 3_133_440);
        assert_eq!(s.start_time_seconds, 1_795_456_037.0 + 22_320.67);
        assert_eq!((s.open_fds, s.max_fds), (12, Some(20_000)));
    }

    /// The live reading of this test process is consistent with what the test knows about itself.
    #[test]
    fn reads_this_process() {
        let s = ProcessSample::read().unwrap();
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
        assert!(s.start_time_seconds > 1.0e9 && s.start_time_seconds <= now + 1.0, "{s:?}");
        assert!(s.resident_bytes > 0 && s.virtual_bytes >= s.resident_bytes, "{s:?}");
        // stdin, stdout, stderr and the directory listing itself at least.
        assert!(s.open_fds >= 3, "{s:?}");
        assert!(s.max_fds.is_none_or(|m| m >= s.open_fds), "{s:?}");
    }
}
