//! `ringside completions SHELL`: a completion script generated from the clap definition (so it
//! always matches `--help`), printed on stdout for the packager or the user to install.
use clap_complete::Shell;

use super::CliError;

/// Print a shell completion script on stdout.
#[derive(Debug, Clone, clap::Args)]
pub struct CompletionsArgs {
    /// The shell: bash, zsh, fish, elvish or powershell.
    #[arg(value_enum)]
    pub shell: Shell,
}

/// Writes the script for `args.shell` and the command `cmd` to stdout.
pub fn run(args: CompletionsArgs, mut cmd: clap::Command) -> Result<(), CliError> {
    let mut out = Vec::new();
    write(args.shell, &mut cmd, &mut out);
    std::io::Write::write_all(&mut std::io::stdout().lock(), &out)
        .map_err(|source| CliError::Write { path: "stdout".into(), source })
}

/// The completion script for `shell`.
pub fn write(shell: Shell, cmd: &mut clap::Command, out: &mut Vec<u8>) {
    let name = cmd.get_name().to_owned();
    clap_complete::generate(shell, cmd, name, out);
}
