//! `ringside detach`: removes a leftover attachment (after the agent was killed with SIGKILL in
//! clsact mode). Local only: it talks to the kernel, not to an agent.
use std::path::PathBuf;

use super::CliError;
use crate::{config::DEFAULT_PIN_DIR, loader};

#[derive(Debug, Clone, clap::Args)]
pub struct DetachArgs {
    /// Interface to clean up.
    #[arg(long = "iface", value_name = "IF", required = true)]
    pub interfaces: Vec<String>,
    /// Pin directory the agent used.
    #[arg(long, value_name = "DIR", default_value = DEFAULT_PIN_DIR)]
    pub pin_dir: PathBuf,
    /// Also delete the clsact qdisc.
    #[arg(long)]
    pub remove_qdisc: bool,
}

pub fn run(args: DetachArgs) -> Result<(), CliError> {
    let DetachArgs { interfaces, pin_dir, remove_qdisc } = args;
    for iface in &interfaces {
        let r = loader::detach_leftover(iface, &pin_dir, remove_qdisc)
            .map_err(|source| CliError::Detach { iface: iface.clone(), source })?;
        if r.filters_removed.is_empty() && r.pins_removed.is_empty() && !r.qdisc_removed {
            println!("{iface}: nothing of ringside's was attached");
        } else {
            println!(
                "{iface}: removed flowmon from [{}], {} pins from {}{}",
                r.filters_removed.join(", "),
                r.pins_removed.len(),
                pin_dir.display(),
                if r.qdisc_removed { ", and the clsact qdisc" } else { "" }
            );
        }
    }
    Ok(())
}
