//! The agent in one IPU namespace of an [`IpuStar`], on the IPU's fabric port (t2_ipu, t2_managed).
use std::{path::PathBuf, process::Child, time::Duration};

use dataplane_user::cli;
use ringside_client::{ClientError, EventsResponse, FlowsResponse, OperatorClient};
use testbed::{IpuStar, IPU_FABRIC_PORT};

use super::wait_for;

const POLL: Duration = Duration::from_millis(200);

/// The agent in IPU `ipu`, API on 127.0.0.1:`port` inside that namespace (unreachable from the
/// tenant's). On drop: SIGTERM with a bounded wait (then SIGKILL), and its pins, config and state
/// directory removed, so a failed test leaves nothing behind.
pub struct IpuAgent {
    child: Option<Child>,
    pub ns: testbed::NetnsHandle,
    pub port: u16,
    pin_dir: PathBuf,
    config: PathBuf,
    state_dir: PathBuf,
}

impl IpuAgent {
    /// Starts the agent with config `body` (after its `state_dir` line) and waits until it is
    /// ready. `test` and `tag` name its pins and files (`ringside-<test>-<pid>-<tag>`): unique per
    /// live agent.
    pub fn start(star: &IpuStar, ipu: usize, test: &str, tag: &str, port: u16, body: &str) -> IpuAgent {
        let id = format!("{test}-{}-{tag}", std::process::id());
        let pin_dir = PathBuf::from(format!("/sys/fs/bpf/ringside-{id}"));
        let state_dir = std::env::temp_dir().join(format!("ringside-{id}-state"));
        let config = std::env::temp_dir().join(format!("ringside-{id}.toml"));
        let _ = std::fs::remove_dir_all(&state_dir);
        std::fs::write(&config, format!("state_dir = \"{}\"\n{body}", state_dir.display())).unwrap();
        let ns = star.ipu(ipu).unwrap().handle();
        let mut cmd = ns.command(env!("CARGO_BIN_EXE_ringside"));
        cmd.args(["agent", "--listen", &format!("127.0.0.1:{port}"), "--iface", IPU_FABRIC_PORT, "--config"])
            .arg(&config)
            .arg("--pin-dir")
            .arg(&pin_dir)
            .env("RUST_LOG", std::env::var("RINGSIDE_AGENT_LOG").unwrap_or_else(|_| "info".into()));
        let child = cmd.spawn().expect("spawning the ringside binary");
        let agent = IpuAgent { child: Some(child), ns, port, pin_dir, config, state_dir };
        wait_for(Duration::from_secs(15), POLL, &format!("the agent in IPU {ipu} to become ready"), || {
            agent.client(|c| c.status()).ok().filter(|s| s.ready)
        });
        agent
    }

    /// The API's base URL, valid inside the IPU's namespace.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Runs `f` with an operator client, inside the IPU's namespace.
    pub fn client<T: Send>(&self, f: impl FnOnce(&OperatorClient) -> Result<T, ClientError> + Send) -> Result<T, ClientError> {
        let url = self.url();
        let token = cli::resolve_token(None, &self.state_dir).unwrap_or_default();
        self.ns.try_run(|| f(&OperatorClient::new(&url, &token)?)).expect("entering the IPU namespace")
    }

    pub fn flows(&self) -> FlowsResponse {
        self.client(|c| c.flows(100)).expect("GET /v1/flows")
    }

    pub fn events(&self) -> EventsResponse {
        self.client(|c| c.events(true, 1000)).expect("GET /v1/events")
    }
}

impl Drop for IpuAgent {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            super::stop_child(&mut child, Duration::from_secs(10));
        }
        for name in dataplane_user::loader::PINNED_MAPS {
            let _ = std::fs::remove_file(self.pin_dir.join(name));
        }
        let _ = std::fs::remove_dir(&self.pin_dir);
        let _ = std::fs::remove_file(&self.config);
        let _ = std::fs::remove_dir_all(&self.state_dir);
    }
}
