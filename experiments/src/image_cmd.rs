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
    /// Extra Debian packages, comma separated (every file of each, plus the
    /// shared libraries their ELF files need; not their other dependencies),
    /// e.g. redis-server,redis-tools,stress-ng. Each set is its own cached image.
    #[arg(long, value_delimiter = ',', value_name = "PKG,...")]
    packages: Vec<String>,
    /// Kernel: default (Debian 12's 6.1), backports (bookworm-backports' 6.12,
    /// for weighted interleave) or a kernel package name.
    #[arg(long, value_name = "default|backports|PKG")]
    kernel: Option<String>,
}

impl BuildArgs {
    /// The library-level options these flags ask for.
    pub fn options(&self) -> ImageOptions {
        ImageOptions {
            packages: self.packages.clone(),
            kernel: self.kernel.clone(),
            force: self.force,
        }
    }
}

/// What goes into a guest image beyond the fixed contents (busybox, fio,
/// numactl, the probes); `Default` is the standard image.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImageOptions {
    /// Extra Debian packages (any order: the builder sorts them); empty =
    /// the builder's default (`$CXLFS_EXTRA_PKGS`, normally none).
    pub packages: Vec<String>,
    /// `default`, `backports` or a kernel package; `None` = the builder's
    /// default (`$CXLFS_KERNEL_PKG`, else Debian 12's kernel).
    pub kernel: Option<String>,
    /// Rebuild even if cached.
    pub force: bool,
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
    /// A package or kernel name the builder would not take.
    #[error("not a Debian package name: {0:?}")]
    BadName(String),
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

/// A Debian package name (policy 5.6.1: lower case, digits, `+ - .`, at
/// least two characters, starting alphanumeric).
fn is_package_name(s: &str) -> bool {
    let mut chars = s.chars();
    s.len() >= 2
        && chars
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "+-.".contains(c))
}

/// The builder's arguments for `opts` (names checked: a comma or space in
/// one would split it into others).
pub fn builder_args(opts: &ImageOptions) -> Result<Vec<String>, ImageError> {
    let mut args = Vec::new();
    if opts.force {
        args.push("--force".to_string());
    }
    if let Some(bad) = opts.packages.iter().find(|p| !is_package_name(p)) {
        return Err(ImageError::BadName(bad.clone()));
    }
    if !opts.packages.is_empty() {
        args.push("--packages".to_string());
        args.push(opts.packages.join(","));
    }
    if let Some(k) = &opts.kernel {
        if !is_package_name(k) {
            return Err(ImageError::BadName(k.clone()));
        }
        args.push("--kernel".to_string());
        args.push(k.clone());
    }
    Ok(args)
}

/// Runs the builder (its log goes straight to our stderr) and returns the
/// image directory it printed as its last line: the image with exactly
/// these extra packages and kernel (cached by the builder under its own key).
pub fn build_with(opts: &ImageOptions) -> Result<PathBuf, ImageError> {
    let path = builder_script();
    if !path.is_file() {
        return Err(ImageError::ScriptMissing(path));
    }
    let out = Command::new(&path)
        .args(builder_args(opts)?)
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
            let dir = build_with(&args.options())?;
            writeln!(std::io::stdout().lock(), "{}", dir.display())?;
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(subcommand)]
        cmd: ImageCommand,
    }

    fn parse(args: &[&str]) -> ImageOptions {
        let cli = Cli::try_parse_from(std::iter::once("image").chain(args.iter().copied()))
            .unwrap_or_else(|e| panic!("{args:?}: {e}"));
        match cli.cmd {
            ImageCommand::Build(b) => b.options(),
        }
    }

    #[test]
    fn flags_become_builder_arguments() {
        let opts = parse(&[
            "build",
            "--packages",
            "redis-server,redis-tools",
            "--packages",
            "stress-ng",
            "--kernel",
            "backports",
        ]);
        assert_eq!(
            opts,
            ImageOptions {
                packages: vec![
                    "redis-server".into(),
                    "redis-tools".into(),
                    "stress-ng".into()
                ],
                kernel: Some("backports".into()),
                force: false,
            }
        );
        assert_eq!(
            builder_args(&opts).unwrap_or_default(),
            [
                "--packages",
                "redis-server,redis-tools,stress-ng",
                "--kernel",
                "backports"
            ]
        );
        let plain = parse(&["build", "--force"]);
        assert_eq!(
            plain,
            ImageOptions {
                force: true,
                ..ImageOptions::default()
            }
        );
        assert_eq!(builder_args(&plain).unwrap_or_default(), ["--force"]);
        assert!(builder_args(&ImageOptions::default()).is_ok_and(|a| a.is_empty()));
    }

    #[test]
    fn names_that_would_split_are_refused() {
        for bad in ["a b", "x", "Redis", "-rf", "a,b", ""] {
            let opts = ImageOptions {
                packages: vec![bad.into()],
                ..ImageOptions::default()
            };
            assert!(
                matches!(builder_args(&opts), Err(ImageError::BadName(n)) if n == bad),
                "{bad:?}"
            );
        }
        let kernel = ImageOptions {
            kernel: Some("linux image".into()),
            ..ImageOptions::default()
        };
        assert!(matches!(builder_args(&kernel), Err(ImageError::BadName(_))));
        let ok = ImageOptions {
            packages: vec!["libstdc++6".into(), "g++-12".into()],
            kernel: Some("linux-image-6.12.48+deb12-amd64".into()),
            force: false,
        };
        assert!(builder_args(&ok).is_ok());
    }
}
