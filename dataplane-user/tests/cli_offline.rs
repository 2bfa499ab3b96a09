//! T0: the `ringside` subcommands that need no agent and no root, run as the real binary:
//! `check-config` (exit status, summary, the error's line and key), `--log-format json` (every
//! stderr line is a JSON object), `completions` and `man`.
use std::{
    path::PathBuf,
    process::{Command, Output},
};

fn ringside(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ringside"))
        .args(args)
        .env_remove("RINGSIDE_LOG_FORMAT")
        .env_remove("RUST_LOG")
        .output()
        .expect("running the ringside binary")
}

/// A scratch directory named after this process and `tag`, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("ringside-cli-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    fn file(&self, name: &str, text: &str) -> String {
        let p = self.0.join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn check_config_exit_status_summary_and_error() {
    let s = Scratch::new("check");
    let good = s.file("good.toml", "interfaces = [\"eth0\"]\n[match]\nudp_ports = [\"5000-5010\"]\n");
    let out = ringside(&["check-config", &good]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.starts_with(&format!("OK {good}")) && stdout.contains("udp ports 5000-5010"), "{stdout}");

    let bad = s.file("bad.toml", "interfaces = [\"eth0\"]\n\n[policy]\nhint_ttl_ms = 1000\n");
    let out = ringside(&["check-config", &bad]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(out.stdout.is_empty(), "nothing on stdout for an invalid file");
    assert!(stderr.contains(&bad) && stderr.contains("line 4") && stderr.contains("`policy.hint_ttl_ms`"), "{stderr}");

    let out = ringside(&["check-config", "/nonexistent/ringside.toml"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/ringside.toml"));
}

#[test]
fn json_logs_are_one_object_per_line() {
    let s = Scratch::new("json");
    let bad = s.file("bad.toml", "max_peers = 0\n");
    for args in [vec!["--log-format", "json", "check-config", &bad], vec!["check-config", &bad, "--log-format=json"]] {
        let out = ringside(&args);
        assert_eq!(out.status.code(), Some(1));
        let stderr = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<&str> = stderr.lines().collect();
        assert!(!lines.is_empty(), "no log record for the error");
        for l in &lines {
            let v: serde_json::Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"));
            assert!(v["timestamp"].is_string() && v["level"].is_string(), "{l}");
        }
        let last: serde_json::Value = serde_json::from_str(lines.last().unwrap()).unwrap();
        assert_eq!(last["level"], "ERROR");
        assert!(last["error"].as_str().unwrap().contains("`max_peers`"), "{last}");
    }
    // The environment variable does the same; a bad value is refused by name.
    let out = Command::new(env!("CARGO_BIN_EXE_ringside")).args(["check-config", &bad]).env("RINGSIDE_LOG_FORMAT", "json").output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).lines().all(|l| serde_json::from_str::<serde_json::Value>(l).is_ok()));
    let out = ringside(&["--log-format", "xml", "check-config", &bad]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("possible values: text, json"));
}

#[test]
fn completions_and_man_pages_cover_every_subcommand() {
    let subcommands = ["agent", "flows", "status", "events", "jobs", "detach", "check-config", "completions", "man"];
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let out = ringside(&["completions", shell]);
        assert!(out.status.success(), "{shell}");
        let script = String::from_utf8_lossy(&out.stdout);
        for sub in subcommands {
            assert!(script.contains(sub), "{shell} completion lacks `{sub}`");
        }
        assert!(script.contains("log-format"), "{shell} completion lacks --log-format");
    }
    assert!(!ringside(&["completions", "tcsh"]).status.success());

    let s = Scratch::new("man");
    let dir = s.0.join("man1");
    let out = ringside(&["man", "--out-dir", dir.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for page in ["ringside.1", "ringside-agent.1", "ringside-check-config.1", "ringside-jobs-register.1"] {
        let text = std::fs::read_to_string(dir.join(page)).unwrap_or_else(|e| panic!("{page}: {e}"));
        assert!(text.contains(".TH ") && text.contains(".SH NAME"), "{page} is not a man page");
    }
    let agent = std::fs::read_to_string(dir.join("ringside-agent.1")).unwrap();
    assert!(agent.contains("pin\\-dir"), "ringside-agent.1 does not document --pin-dir");
    let out = ringside(&["man"]);
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains(".TH ringside 1"));
}
