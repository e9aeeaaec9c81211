//! The tools one experiment uses, found before its first run: `cxlfsd`
//! (and whether it writes a metrics series), this `cxlfs`, the guest image,
//! QEMU (the patched one built for DAX) and `qemu-configs/run-vm.sh`.

use super::args::RunArgs;
use crate::spec::ImageSpec;
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The checkout holding `qemu-configs/`: `$CXLFS_REPO`, else the one this
/// binary was built from.
pub(super) fn repo_root() -> PathBuf {
    match std::env::var_os("CXLFS_REPO") {
        Some(r) if !r.is_empty() => PathBuf::from(r),
        _ => PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/..")),
    }
}

/// Runs a command and returns its trimmed stdout (empty on any failure).
pub(super) fn output_of(cmd: &mut Command) -> String {
    cmd.stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// The tools one experiment uses.
#[derive(Debug, Clone)]
pub(super) struct Tools {
    pub(super) cxlfsd: PathBuf,
    /// This `cxlfs` binary (`cxlfs ctl memory-fd` boots memory-mode guests).
    pub(super) cxlfs: PathBuf,
    /// The spec's directory (job files are relative to it).
    pub(super) spec_dir: PathBuf,
    /// `cxlfsd --help` lists `--metrics-file`.
    pub(super) metrics_file: bool,
    pub(super) image: PathBuf,
    pub(super) qemu: String,
    pub(super) run_vm: PathBuf,
    /// The stock `virtiofsd`, where a run uses it (`daemon.backend`).
    pub(super) virtiofsd: Option<PathBuf>,
}

/// What the runs of an experiment need beyond `cxlfsd` and the image.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Needs {
    /// The patched QEMU (a DAX window or accessed bits).
    pub(super) patched_qemu: bool,
    /// The stock `virtiofsd`.
    pub(super) virtiofsd: bool,
}

impl Needs {
    /// What `plans` need.
    pub(super) fn of<'a>(plans: impl IntoIterator<Item = &'a crate::spec::RunPlan>) -> Self {
        plans.into_iter().fold(Needs::default(), |n, p| Needs {
            patched_qemu: n.patched_qemu || p.spec.daemon.needs_patched_qemu(),
            virtiofsd: n.virtiofsd || p.spec.daemon.backend == crate::spec::Backend::Virtiofsd,
        })
    }
}

/// `$VIRTIOFSD`, else the one `qemu-configs/install-virtiofsd.sh` installs
/// (built once from crates.io) and prints.
fn find_virtiofsd() -> Result<PathBuf> {
    if let Some(p) = file_from_env("VIRTIOFSD") {
        return p;
    }
    path_printed_by(&repo_root().join("qemu-configs/install-virtiofsd.sh"))
}

/// The file environment variable `var` names (`None`: unset or empty; an
/// error: no such file).
fn file_from_env(var: &str) -> Option<Result<PathBuf>> {
    let p = PathBuf::from(std::env::var_os(var).filter(|p| !p.is_empty())?);
    Some(if p.is_file() {
        Ok(p)
    } else {
        Err(anyhow::anyhow!("{var}={}: no such file", p.display()))
    })
}

/// Runs `script` (its log on this stderr) and returns the file named by
/// the last line it printed.
fn path_printed_by(script: &Path) -> Result<PathBuf> {
    let out = Command::new(script)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("cannot run {}", script.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().unwrap_or("").trim();
    if !out.status.success() || last.is_empty() || !Path::new(last).is_file() {
        bail!(
            "{} failed ({}); its log is above",
            script.display(),
            out.status
        );
    }
    Ok(PathBuf::from(last))
}

fn find_cxlfsd(given: Option<&Path>) -> Result<PathBuf> {
    if let Some(p) = given {
        return if p.is_file() {
            Ok(p.to_path_buf())
        } else {
            bail!("--cxlfsd {}: no such file", p.display())
        };
    }
    if let Some(p) = file_from_env("CXLFSD") {
        return p;
    }
    if let Some(sibling) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(|d| d.join("cxlfsd")))
        .filter(|p| p.is_file())
    {
        return Ok(sibling);
    }
    let on_path = output_of(Command::new("sh").args(["-c", "command -v cxlfsd"]));
    if !on_path.is_empty() {
        return Ok(PathBuf::from(on_path));
    }
    bail!("cxlfsd not found: build it (cargo build --release -p cxlfsd) or pass --cxlfsd / set CXLFSD")
}

fn build_qemu() -> Result<String> {
    let script = repo_root().join("qemu-configs/build-qemu.sh");
    eprintln!(
        "cxlfs run: DAX needs the patched QEMU: {}",
        script.display()
    );
    Ok(path_printed_by(&script)?.display().to_string())
}

/// Finds the tools: the given paths first, then the environment, then the
/// defaults (the image built or cached, the patched QEMU built and
/// `virtiofsd` installed when `needs` says so).
pub(super) fn resolve_tools(args: &RunArgs, needs: Needs, image: &ImageSpec) -> Result<Tools> {
    let cxlfsd = find_cxlfsd(args.cxlfsd.as_deref())?;
    let help = output_of(Command::new(&cxlfsd).arg("--help"));
    if help.is_empty() {
        bail!("{} --help failed: is it a cxlfsd binary?", cxlfsd.display());
    }
    let image = match &args.image {
        Some(d) if d.join("vmlinuz").is_file() => d.clone(),
        Some(d) => bail!("--image {}: no vmlinuz there", d.display()),
        None => crate::image_cmd::build_with(&crate::image_cmd::ImageOptions {
            packages: image.packages.clone(),
            kernel: image.kernel.clone(),
            force: false,
        })?,
    };
    let qemu = match (
        &args.qemu,
        std::env::var("QEMU").ok().filter(|q| !q.is_empty()),
    ) {
        (Some(q), _) => q.display().to_string(),
        (None, Some(q)) => q,
        (None, None) if needs.patched_qemu => build_qemu()?,
        (None, None) => "qemu-system-x86_64".to_string(),
    };
    let run_vm = repo_root().join("qemu-configs/run-vm.sh");
    if !run_vm.is_file() {
        bail!(
            "{} not found (set CXLFS_REPO to the cxlfs checkout)",
            run_vm.display()
        );
    }
    Ok(Tools {
        cxlfsd,
        cxlfs: std::env::current_exe().context("finding this cxlfs binary")?,
        spec_dir: args
            .spec
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default(),
        metrics_file: help.contains("--metrics-file"),
        image,
        qemu,
        run_vm,
        virtiofsd: if needs.virtiofsd {
            Some(find_virtiofsd()?)
        } else {
            None
        },
    })
}
