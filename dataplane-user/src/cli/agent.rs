//! `ringside agent`: attach, collect, detect and serve until SIGINT/SIGTERM.
use super::CliError;
use crate::{
    agent::{self, AgentArgs, AgentSettings},
    config::ConfigFile,
};

/// Reads the config file (if any), merges the flags over it and runs the agent.
pub fn run(args: AgentArgs) -> Result<(), CliError> {
    let file = match &args.config {
        Some(path) => ConfigFile::load(path)?,
        None => ConfigFile::default(),
    };
    let settings = AgentSettings::resolve(&file, &args)?;
    // Before the agent binds or touches the kernel: name any missing capability and how to grant it.
    crate::privileges::check_agent()?;
    agent::run(settings)?;
    Ok(())
}
