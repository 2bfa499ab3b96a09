//! `cargo xtask demo`: see ringside work in one command.
use anyhow::{bail, Result};

pub fn run(_seconds: u64) -> Result<()> {
    bail!("the demo is not wired up yet")
}
