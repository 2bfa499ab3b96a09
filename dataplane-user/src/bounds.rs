//! Range checks shared by the config sections (`[detect.*]`, `[policy]`, the agent's own keys):
//! each returns the message an operator sees (the caller adds the key and line).
//!
//! A leaf module (it imports nothing from the crate), so `config` and the detector and policy
//! configs it parses can all use it without an import circle between them.
use std::path::Path;

/// An optional integer that must not be 0.
pub fn nonzero(v: Option<u64>) -> Result<(), String> {
    match v {
        Some(0) => Err("must be greater than 0".to_owned()),
        _ => Ok(()),
    }
}

/// At least `min`.
pub fn at_least(v: u64, min: u64) -> Result<(), String> {
    if v < min {
        Err(format!("{v} is too small: must be at least {min}"))
    } else {
        Ok(())
    }
}

/// A finite number in `(lo, hi]` (`lo` excluded; `hi` included).
pub fn in_range(v: f64, lo: f64, hi: f64) -> Result<(), String> {
    if v.is_finite() && v > lo && v <= hi {
        Ok(())
    } else {
        Err(format!("{v} is out of range: must be greater than {lo} and at most {hi}"))
    }
}

/// A finite number strictly between `lo` and `hi`.
pub fn between(v: f64, lo: f64, hi: f64) -> Result<(), String> {
    if v.is_finite() && v > lo && v < hi {
        Ok(())
    } else {
        Err(format!("{v} is out of range: must be greater than {lo} and below {hi}"))
    }
}

/// A finite number in `[lo, hi)`.
pub fn in_range_from(v: f64, lo: f64, hi: f64) -> Result<(), String> {
    if v.is_finite() && v >= lo && v < hi {
        Ok(())
    } else {
        Err(format!("{v} is out of range: must be at least {lo} and below {hi}"))
    }
}

/// A finite number > 0.
pub fn positive(v: f64) -> Result<(), String> {
    in_range(v, 0.0, f64::MAX)
}

/// A finite number ≥ `min`.
pub fn at_least_f64(v: f64, min: f64) -> Result<(), String> {
    if v.is_finite() && v >= min {
        Ok(())
    } else {
        Err(format!("{v} is out of range: must be a number of at least {min}"))
    }
}

/// `low` strictly below `high`, for thresholds that must be ordered. The message names both
/// keys in backticks: the file may set either (see [`super::ConfigFile::parse`]).
pub fn below<T: PartialOrd + std::fmt::Display>(low_key: &str, low: T, high_key: &str, high: T) -> Result<(), String> {
    if low < high {
        Ok(())
    } else {
        Err(format!("`{low_key}` ({low}) must be below `{high_key}` ({high})"))
    }
}

/// `low` at most `high` (both named, as in [`below`]).
pub fn at_most<T: PartialOrd + std::fmt::Display>(low_key: &str, low: T, high_key: &str, high: T) -> Result<(), String> {
    if low <= high {
        Ok(())
    } else {
        Err(format!("`{low_key}` ({low}) must be at most `{high_key}` ({high})"))
    }
}

/// A path that is not empty.
pub fn non_empty_path(p: &Path) -> Result<(), String> {
    if p.as_os_str().is_empty() {
        Err("must not be empty: give a path".to_owned())
    } else {
        Ok(())
    }
}

/// A Linux interface name: 1-15 bytes (IFNAMSIZ), no `/`, whitespace or `:` (see
/// `dev_valid_name` in net/core/dev.c).
pub fn interface_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("an interface name must not be empty; list interfaces with `ip link`".to_owned());
    }
    if name.len() > 15 || name == "." || name == ".." || name.chars().any(|c| c == '/' || c == ':' || c.is_whitespace()) {
        return Err(format!("`{name}` is not a valid interface name (at most 15 bytes, no `/`, `:` or spaces); list interfaces with `ip link`"));
    }
    Ok(())
}
