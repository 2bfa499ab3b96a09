//! `ringside check-config FILE`: reads and validates a config file through the same code as
//! `ringside agent --config FILE` (`ConfigFile::load`, which also validates the `[detect]` and
//! `[policy]` values, then `AgentSettings::resolve` and the kernel `CONFIG` it would write), and
//! prints OK with a summary of the resolved settings. Needs no root and touches no kernel state,
//! so it fits a CI job or an `ExecStartPre=`.
use std::path::PathBuf;

use super::CliError;
use crate::{
    agent::{AgentArgs, AgentSettings, OperatorTokens},
    config::ConfigFile,
};

/// Check a config file.
#[derive(Debug, Clone, clap::Args)]
pub struct CheckConfigArgs {
    /// The config file (what `ringside agent --config` would read).
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
}

/// Validates `args.file`; prints the summary on success.
pub fn run(args: CheckConfigArgs) -> Result<(), CliError> {
    print!("{}", check(&args)?);
    Ok(())
}

/// The agent's validation of `args.file`, and the summary printed on success.
pub fn check(args: &CheckConfigArgs) -> Result<String, CliError> {
    let file = ConfigFile::load(&args.file)?;
    let settings = AgentSettings::resolve(&file, &AgentArgs { config: Some(args.file.clone()), ..AgentArgs::default() })?;
    let kernel = settings.matching.kernel_config(settings.burst_gap)?;
    Ok(summary(&args.file, &settings, kernel.n_prefixes))
}

fn summary(path: &std::path::Path, s: &AgentSettings, kernel_prefixes: u32) -> String {
    let ports = |v: &[crate::config::PortSpec]| {
        if v.is_empty() {
            "-".to_owned()
        } else {
            v.iter().map(|p| if p.lo == p.hi { p.lo.to_string() } else { format!("{}-{}", p.lo, p.hi) }).collect::<Vec<_>>().join(",")
        }
    };
    let interfaces = if s.interfaces.is_empty() { "none (pass --iface IF)".to_owned() } else { s.interfaces.join(", ") };
    let prefixes = if s.matching.prefixes.is_empty() { "any address".to_owned() } else { format!("{kernel_prefixes} prefix(es)") };
    let jobs = s.jobs.names();
    let jobs = if jobs.is_empty() { "none (one job `default` holds every matched flow)".to_owned() } else { jobs.join(", ") };
    let tokens = match &s.operator_tokens {
        OperatorTokens::File(p) => format!("from {}", p.display()),
        OperatorTokens::Generated { state_dir } => format!("generated in {}/{}", state_dir.display(), crate::auth::OPERATOR_TOKEN_FILE),
    };
    let detect = if s.detect.enabled { format!("on, window {} ms", s.detect.window.as_millis()) } else { "off".to_owned() };
    let rdma = match &s.detect.rdma {
        Some(root) => format!("read under {} every window", root.display()),
        None => "off".to_owned(),
    };
    let mirror = match &s.mirror {
        Some(m) => format!(
            "read from {} ({} local prefix(es), at most {} flows, ring {} x {} KiB)",
            m.interface,
            m.local_prefixes.len(),
            m.max_flows,
            m.ring_blocks,
            m.ring_block_kib
        ),
        None => "off".to_owned(),
    };
    format!(
        "OK {}\n  interfaces: {interfaces}\n  listen: {}\n  attach: {}, pins in {}\n  state dir: {}\n  match: tcp ports {}, udp ports {} (RoCEv2 always), {prefixes}\n  jobs: {jobs}\n  detection: {detect}\n  rdma port counters: {rdma}\n  mirrored frames: {mirror}\n  operator tokens: {tokens}\n",
        path.display(),
        s.listen,
        if s.persist { format!("{} (persistent)", s.attach) } else { s.attach.to_string() },
        s.pin_dir.display(),
        s.detect.state_dir.display(),
        ports(&s.matching.tcp_ports),
        ports(&s.matching.udp_ports),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_text(name: &str, text: &str) -> Result<String, String> {
        let dir = crate::events::tests::tempdir(name);
        let path = dir.join("ringside.toml");
        std::fs::write(&path, text).unwrap();
        let r = check(&CheckConfigArgs { file: path }).map_err(|e| e.to_string());
        let _ = std::fs::remove_dir_all(&dir);
        r
    }

    #[test]
    fn valid_file_prints_a_summary() {
        let out = check_text(
            "check-ok",
            "interfaces = [\"eth0\"]\n[match]\ntcp_ports = [\"29500-29510\"]\nprefixes = [\"10.77.0.0/24\"]\n[[job]]\nname = \"train\"\nmembers = [\"10.77.0.0/24\"]\n",
        )
        .unwrap();
        assert!(out.starts_with("OK ") && out.contains("interfaces: eth0") && out.contains("tcp ports 29500-29510"), "{out}");
        assert!(out.contains("1 prefix(es)") && out.contains("jobs: train") && out.contains("listen: 127.0.0.1:9464"), "{out}");
        assert!(out.contains("rdma port counters: read under /sys/class/infiniband every window"), "{out}");
        assert!(out.contains("mirrored frames: off"), "{out}");
        let mirrored = check_text("check-mirror", "[mirror]\ninterface = \"mir0\"\nlocal_prefixes = [\"10.77.0.1/32\"]\n").unwrap();
        assert!(mirrored.contains("mirrored frames: read from mir0 (1 local prefix(es), at most 16384 flows, ring 16 x 256 KiB)"), "{mirrored}");
        let example = check(&CheckConfigArgs { file: concat!(env!("CARGO_MANIFEST_DIR"), "/ringside.example.toml").into() }).unwrap();
        assert!(example.starts_with("OK "), "{example}");
    }

    #[test]
    fn invalid_file_names_line_and_key() {
        let e = check_text("check-bad", "listen = \"127.0.0.1:1\"\n\n[detect.gray]\ngoodput_open_ratio = 1.5\n").unwrap_err();
        assert!(e.contains("line 4") && e.contains("detect.gray.goodput_open_ratio"), "{e}");
        let e = check(&CheckConfigArgs { file: "/nonexistent/ringside.toml".into() }).unwrap_err().to_string();
        assert!(e.contains("/nonexistent/ringside.toml"), "{e}");
    }
}
