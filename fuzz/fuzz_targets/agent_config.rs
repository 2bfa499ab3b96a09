//! The agent's config file (`dataplane_user::config::ConfigFile::parse`: TOML through serde, then
//! `validate` and the line/key lookup of its errors), and what the agent makes of an accepted
//! file (`AgentSettings::resolve`, the kernel's `CONFIG` entry and `MATCH_PREFIXES` keys).
//!
//! Input: the file's text (input that is not UTF-8 is skipped: `load` refuses it before parsing).
//!
//! Checked (module docs of `config.rs`):
//! - every refusal is `Invalid` with a line inside the file (0 only for a key the file does not
//!   set), and parsing is deterministic;
//! - a file that passes validation resolves with no flags, and its `[match]` fits the kernel:
//!   at most `MAX_PORT_RANGES` ranges, at most `MAX_PREFIXES` distinct prefix keys, each with
//!   its prefix length at most 128 and no host bits set.
#![no_main]

use std::path::Path;

use dataplane_common::{MAX_PORT_RANGES, MAX_PREFIXES};
use dataplane_user::config::{ConfigError, ConfigFile};
use dataplane_user::{AgentArgs, AgentSettings};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let path = Path::new("ringside.toml");
    let file = match ConfigFile::parse(text, path) {
        Ok(file) => file,
        Err(ConfigError::Invalid { line, key, message, .. }) => {
            let lines = text.matches('\n').count() + 1;
            assert!(line <= lines, "line {line} of a {lines}-line file (key `{key}`: {message})");
            match ConfigFile::parse(text, path) {
                Err(ConfigError::Invalid { line: l2, key: k2, .. }) => assert_eq!((line, &key), (l2, &k2)),
                other => panic!("parsed twice, refused once: {other:?}"),
            }
            return;
        }
        Err(other) => panic!("a refusal without line and key: {other}"),
    };
    // Debug, not PartialEq: a float threshold may be NaN (TOML has `nan`).
    let again = ConfigFile::parse(text, path).unwrap_or_else(|e| panic!("accepted once, refused once: {e}"));
    assert_eq!(format!("{again:?}"), format!("{file:?}"));
    let settings = AgentSettings::resolve(&file, &AgentArgs::default()).unwrap_or_else(|e| panic!("a valid file does not resolve: {e}"));
    let kernel = settings.matching.kernel_config(settings.burst_gap).unwrap_or_else(|e| panic!("a valid file does not fit the kernel: {e}"));
    assert!(kernel.n_port_ranges as usize <= MAX_PORT_RANGES);
    let keys = settings.matching.prefix_keys();
    assert_eq!(kernel.n_prefixes as usize, keys.len());
    assert!(keys.len() <= MAX_PREFIXES as usize);
    for k in keys.iter().chain(settings.mirror.iter().flat_map(|m| m.local_prefixes.iter())) {
        assert!(k.prefix_len <= 128, "{k:?}");
        for (i, byte) in k.addr.iter().enumerate() {
            let bits_before = i as u32 * 8;
            let host_mask = if bits_before >= k.prefix_len { 0xff } else if k.prefix_len - bits_before < 8 { 0xffu8 >> (k.prefix_len - bits_before) } else { 0 };
            assert_eq!(byte & host_mask, 0, "host bits set in {k:?}");
        }
    }
});
