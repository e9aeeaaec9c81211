//! `cxlfs plot DIR`: re-draws the figures of a results directory, with the
//! plots its saved spec names (`provenance.json`), else the default ones.

use crate::plot;
use crate::results::{ResultsDirArgs, ResultsFile};
use crate::spec::PlotSpec;
use anyhow::{Context, Result};
use serde_json::Value;
use std::fs;
use std::io::Write;
use std::path::Path;

/// Handles `cxlfs plot DIR`.
pub fn run(args: &ResultsDirArgs) -> Result<()> {
    let res = ResultsFile::read(&args.dir)?;
    let plots = spec_plots(&args.dir)?;
    let files = plot::render_all(&res, &plots, &args.dir)?;
    let mut o = std::io::stdout().lock();
    for f in &files {
        writeln!(o, "{}", f.display())?;
    }
    if files.is_empty() {
        eprintln!("cxlfs plot: nothing to plot (no successful runs, or no swept key)");
    }
    Ok(())
}

/// The plots named by the spec saved in `provenance.json` (none: defaults).
fn spec_plots(dir: &Path) -> Result<Vec<PlotSpec>> {
    let path = dir.join("provenance.json");
    let Ok(text) = fs::read_to_string(&path) else {
        return Ok(Vec::new());
    };
    let v: Value = serde_json::from_str(&text).with_context(|| format!("{}", path.display()))?;
    Ok(v.get("spec")
        .and_then(|s| s.get("plots"))
        .cloned()
        .map(serde_json::from_value)
        .transpose()
        .with_context(|| format!("{}: spec.plots", path.display()))?
        .unwrap_or_default())
}
