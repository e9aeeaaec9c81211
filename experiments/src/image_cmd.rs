//! `cxlfs image build`: the test-guest image, made by
//! `qemu-configs/build-guest-image.sh` (cached by content hash there).

use clap::{Args, Subcommand};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};

/// `cxlfs image ...`
#[derive(Debug, Clone, Subcommand)]
pub enum ImageCommand {
    /// Build the guest image (or find it in the cache) and print its directory.
    Build(BuildArgs),
}

/// `cxlfs image build` arguments.
#[derive(Debug, Clone, Args)]
pub struct BuildArgs {
    /// Rebuild even if the image is already in the cache.
    #[arg(long)]
    force: bool,
}

/// Why `cxlfs image build` failed.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// The builder script is not where it should be.
    #[error("guest image builder not found at {0} (set CXLFS_REPO to the cxlfs checkout)")]
    ScriptMissing(PathBuf),
    /// The script could not be started.
    #[error("cannot run {path}: {source}")]
    Spawn {
        /// The script.
        path: PathBuf,
        /// The error from `exec`.
        source: std::io::Error,
    },
    /// The script exited unsuccessfully.
    #[error("{path} failed ({status}); its log is above")]
    Failed {
        /// The script.
        path: PathBuf,
        /// Its exit status.
        status: ExitStatus,
    },
    /// The script succeeded but its last line is not an image directory.
    #[error("{path} printed {printed:?} as its last line, which is not an image directory")]
    NotAnImage {
        /// The script.
        path: PathBuf,
        /// What it printed last.
        printed: String,
    },
    /// Writing the result failed.
    #[error("writing the image directory: {0}")]
    Output(#[from] std::io::Error),
}

/// The builder script: `$CXLFS_REPO/qemu-configs/build-guest-image.sh`, else
/// the one in the checkout this binary was built from.
pub fn builder_script() -> PathBuf {
    match std::env::var_os("CXLFS_REPO") {
        Some(repo) if !repo.is_empty() => {
            Path::new(&repo).join("qemu-configs/build-guest-image.sh")
        }
        _ => PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../qemu-configs/build-guest-image.sh"
        )),
    }
}

/// Runs the builder (its log goes straight to our stderr) and returns the
/// image directory it printed as its last line.
pub fn build(force: bool) -> Result<PathBuf, ImageError> {
    let path = builder_script();
    if !path.is_file() {
        return Err(ImageError::ScriptMissing(path));
    }
    let mut cmd = Command::new(&path);
    if force {
        cmd.arg("--force");
    }
    let out = cmd
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|source| ImageError::Spawn {
            path: path.clone(),
            source,
        })?;
    if !out.status.success() {
        return Err(ImageError::Failed {
            path,
            status: out.status,
        });
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let printed = stdout
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim()
        .to_string();
    let dir = PathBuf::from(&printed);
    if printed.is_empty() || !dir.join("vmlinuz").is_file() {
        return Err(ImageError::NotAnImage { path, printed });
    }
    Ok(dir)
}

/// Runs `cxlfs image ...`.
pub fn run(cmd: &ImageCommand) -> Result<(), ImageError> {
    match cmd {
        ImageCommand::Build(args) => {
            let dir = build(args.force)?;
            writeln!(std::io::stdout().lock(), "{}", dir.display())?;
            Ok(())
        }
    }
}
