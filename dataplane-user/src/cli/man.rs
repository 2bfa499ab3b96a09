//! `ringside man [--out-dir DIR]`: roff man pages generated from the clap definition (section 1):
//! `ringside.1` and one page per subcommand (`ringside-agent.1`, `ringside-jobs-register.1`, ...),
//! so they never drift from `--help`.
use std::path::{Path, PathBuf};

use super::CliError;

/// Write the man pages.
#[derive(Debug, Clone, clap::Args)]
pub struct ManArgs {
    /// Directory to write every page into (created if missing); without it, ringside.1 goes to
    /// stdout.
    #[arg(long, value_name = "DIR")]
    pub out_dir: Option<PathBuf>,
}

/// Writes the pages of `cmd` as `args` says.
pub fn run(args: ManArgs, cmd: clap::Command) -> Result<(), CliError> {
    match &args.out_dir {
        Some(dir) => {
            let pages = write_all(cmd, dir)?;
            for p in pages {
                println!("{}", p.display());
            }
            Ok(())
        }
        None => {
            let mut out = Vec::new();
            clap_mangen::Man::new(cmd).render(&mut out).map_err(|source| CliError::Write { path: "stdout".into(), source })?;
            std::io::Write::write_all(&mut std::io::stdout().lock(), &out).map_err(|source| CliError::Write { path: "stdout".into(), source })
        }
    }
}

/// Writes `ringside.1` and a page per (non-hidden) subcommand into `dir`; returns their paths,
/// sorted.
pub fn write_all(cmd: clap::Command, dir: &Path) -> Result<Vec<PathBuf>, CliError> {
    std::fs::create_dir_all(dir).map_err(|source| CliError::Write { path: dir.to_owned(), source })?;
    clap_mangen::generate_to(cmd, dir).map_err(|source| CliError::Write { path: dir.to_owned(), source })?;
    let mut pages: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|source| CliError::Write { path: dir.to_owned(), source })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "1") && p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("ringside")))
        .collect();
    pages.sort();
    Ok(pages)
}
