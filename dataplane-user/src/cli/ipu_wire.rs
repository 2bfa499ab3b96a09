//! `ringside ipu-wire`: runs the emulated IPU's forwarder ([`crate::ipuwire`]) between two ports
//! of the current network namespace until SIGINT/SIGTERM, logging its counters, then detaches and
//! prints the final counters as one JSON line on stdout.
use std::time::Duration;

use super::CliError;
use crate::ipuwire::IpuWire;

#[derive(Debug, Clone, clap::Args)]
pub struct IpuWireArgs {
    /// The port cabled to the host (the tenant side).
    #[arg(long, value_name = "IF")]
    pub host_port: String,
    /// The port cabled to the fabric (switch side); attach the agent here.
    #[arg(long, value_name = "IF")]
    pub fabric_port: String,
    /// Log the counters every SECS seconds (0: only at exit).
    #[arg(long, value_name = "SECS", default_value_t = 10)]
    pub stats_every: u64,
}

pub fn run(args: IpuWireArgs) -> Result<(), CliError> {
    let wire = IpuWire::attach(&args.host_port, &args.fabric_port)?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(CliError::Runtime)?;
    rt.block_on(async {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate()).map_err(CliError::Runtime)?;
        let mut int = signal(SignalKind::interrupt()).map_err(CliError::Runtime)?;
        let every = Duration::from_secs(args.stats_every.max(1));
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        loop {
            tokio::select! {
                _ = term.recv() => { tracing::info!("SIGTERM: detaching"); break; }
                _ = int.recv() => { tracing::info!("SIGINT: detaching"); break; }
                _ = tick.tick(), if args.stats_every > 0 => {
                    let s = wire.stats()?;
                    tracing::info!(to_fabric = s.to_fabric, to_host = s.to_host, unconfigured = s.unconfigured, foreign_port = s.foreign_port, redirect_failed = s.redirect_failed, "ipuwire counters");
                }
            }
        }
        Ok::<(), CliError>(())
    })?;
    let stats = wire.stats()?;
    drop(wire);
    println!("{}", serde_json::to_string(&stats)?);
    Ok(())
}
