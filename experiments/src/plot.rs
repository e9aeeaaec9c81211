//! Figures of a results directory, each as a PNG and an SVG beside it
//! (`plotters`, bitmap and SVG backends): the plots drawn when a spec names
//! none, their file names, the figure of each plot and writing it. What a
//! figure shows comes from `plot_data.rs`; its words, units and ticks from
//! `plot_axis.rs`; its axes as drawn from `plot_scale.rs`; the drawing
//! itself, one function generic over the backend, from `plot_draw.rs`.
//!
//! Text is drawn with plotters' `ab_glyph` renderer from a TrueType file
//! read at run time (DejaVu Sans from Debian's `fonts-dejavu-core`, which
//! `make demo` / `make test` install; `$CXLFS_PLOT_FONT` names another), so
//! no fontconfig or freetype library is needed.

use crate::distributions::{self, Distribution};
use crate::plot_data::{
    distribution_figure, distribution_name, line_figure, read_phase_series, read_series,
    short_name, timeseries_fields, timeseries_figure, timeseries_run, value_text, Figure,
};
use crate::plot_draw::draw;
use crate::plot_spec::{PlotKind, PlotSpec};
use crate::results::ResultsFile;
use plotters::prelude::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Where the plot font is looked for (first found wins).
pub const FONT_PATHS: [&str; 3] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
];

/// Why plotting failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PlotError {
    /// No usable font file.
    #[error("no font for plot text: install Debian's fonts-dejavu-core (apt-get install fonts-dejavu-core) or set CXLFS_PLOT_FONT to a .ttf file ({0})")]
    Font(String),
    /// plotters failed to draw or to write the PNG.
    #[error("drawing {path}: {message}")]
    Draw {
        /// The PNG.
        path: String,
        /// What plotters said.
        message: String,
    },
}

/// Loads and registers the font once per process.
fn ensure_font() -> Result<(), PlotError> {
    static FONT: OnceLock<Result<(), PlotError>> = OnceLock::new();
    FONT.get_or_init(|| {
        let candidates: Vec<PathBuf> = std::env::var_os("CXLFS_PLOT_FONT")
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
            .into_iter()
            .chain(FONT_PATHS.iter().map(PathBuf::from))
            .collect();
        let mut tried = Vec::new();
        for p in candidates {
            match std::fs::read(&p) {
                Ok(bytes) => {
                    // Registered fonts live for the whole process: leak one copy.
                    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                    return plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
                        .map_err(|_| {
                            PlotError::Font(format!("{} is not a usable font", p.display()))
                        });
                }
                Err(e) => tried.push(format!("{}: {e}", p.display())),
            }
        }
        Err(PlotError::Font(tried.join("; ")))
    })
    .clone()
}

/// Pixel size of every figure (PNG and SVG).
pub const SIZE: (u32, u32) = (960, 600);

/// Figures of interest, in this order, for the default plots.
const DEFAULT_YS: [&str; 8] = [
    "read_bw_bytes_per_sec",
    "write_bw_bytes_per_sec",
    "read_clat_p99_ns",
    "write_clat_p99_ns",
    "device_hit_rate",
    "device_misses",
    "device_hits",
    "daemon.pool_traps",
];

/// The plots drawn when a spec names none: each figure of interest that is
/// not all zero (the main fio and device figures, DAX traps, every
/// `out.*` output) against each swept key, from the aggregate rows; and a
/// histogram and a CDF of each distribution the runs collected.
pub fn default_plots(res: &ResultsFile, dists: &[Distribution]) -> Vec<PlotSpec> {
    let ok = || {
        res.rows
            .iter()
            .filter(|r| r.get("status").and_then(Value::as_str) == Some("ok"))
    };
    let has_all = ok().any(|r| r.get("vm").and_then(Value::as_str) == Some("all"));
    let mut ys: Vec<String> = DEFAULT_YS.iter().map(|s| s.to_string()).collect();
    ys.extend(
        res.columns
            .iter()
            .filter(|c| c.starts_with("out."))
            .cloned(),
    );
    let mut out = Vec::new();
    for x in &res.param_columns {
        for y in &ys {
            let nonzero = ok().any(|r| r.get(y).and_then(Value::as_f64).is_some_and(|v| v != 0.0));
            if nonzero && y != x {
                out.push(PlotSpec {
                    x: x.clone(),
                    y: y.clone(),
                    vm: has_all.then(|| "all".to_string()),
                    ..PlotSpec::default()
                });
            }
        }
    }
    let mut names: Vec<&str> = dists.iter().map(|d| d.name.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    for name in names {
        for kind in [PlotKind::Histogram, PlotKind::Cdf] {
            out.push(PlotSpec {
                kind,
                distribution: Some(name.to_string()),
                ..PlotSpec::default()
            });
        }
    }
    out
}

/// A file-name-safe version of a column name.
fn slug(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The PNG file name of a plot (the SVG: the same with `.svg`). A
/// time series names its run: `timeseries-traps-run001.png`.
pub fn plot_file(p: &PlotSpec, dists: &[Distribution], run: Option<u32>) -> String {
    if let Some(f) = &p.file {
        return if f.ends_with(".png") {
            f.clone()
        } else {
            format!("{f}.png")
        };
    }
    match p.kind {
        PlotKind::Line => format!("{}-vs-{}.png", slug(&p.y), slug(&p.x)),
        PlotKind::Histogram | PlotKind::Cdf => {
            let kind = if p.kind == PlotKind::Cdf {
                "cdf"
            } else {
                "histogram"
            };
            let name = distribution_name(dists, p).unwrap_or_default();
            format!("{kind}-{}.png", slug(&name))
        }
        PlotKind::Timeseries => format!(
            "timeseries-{}-run{:03}.png",
            slug(&timeseries_fields(p).join("+")),
            run.unwrap_or(0)
        ),
    }
}

/// Draws every plot into `dir` (the spec's, else [`default_plots`]);
/// returns the PNGs written (each has an SVG beside it). A plot with no
/// data (every run failed, say) is skipped.
pub fn render_all(
    res: &ResultsFile,
    plots: &[PlotSpec],
    dir: &Path,
) -> Result<Vec<PathBuf>, PlotError> {
    let dists = distributions::read(dir).unwrap_or_else(|e| {
        eprintln!("cxlfs plot: {e}: histograms left out");
        Vec::new()
    });
    let plots = if plots.is_empty() {
        default_plots(res, &dists)
    } else {
        plots.to_vec()
    };
    let mut written = Vec::new();
    for p in &plots {
        if let Some((file, fig)) = figure(res, &dists, dir, p) {
            let path = dir.join(file);
            write_figure(&fig, &path)?;
            written.push(path);
        }
    }
    Ok(written)
}

/// The figure of one plot and its file name; `None` if there is nothing to
/// draw.
pub fn figure(
    res: &ResultsFile,
    dists: &[Distribution],
    dir: &Path,
    p: &PlotSpec,
) -> Option<(String, Figure)> {
    match p.kind {
        PlotKind::Line => line_figure(res, p).map(|f| (plot_file(p, dists, None), f)),
        PlotKind::Histogram | PlotKind::Cdf => {
            distribution_figure(dists, p, &res.experiment).map(|f| (plot_file(p, dists, None), f))
        }
        PlotKind::Timeseries => {
            let run = timeseries_run(res, p)?;
            let text = match &p.source {
                Some(file) => {
                    read_phase_series(dir, run, p.vm.as_deref()?, p.phase.as_deref()?, file)?
                }
                None => read_series(dir, run)?,
            };
            let title = p
                .title
                .clone()
                .unwrap_or_else(|| timeseries_title(res, p, run));
            timeseries_figure(&text, p, &title).map(|f| (plot_file(p, dists, Some(run)), f))
        }
    }
}

/// "EXPERIMENT: file pages faulted in per VM, run 3 (CXL share: 50 %)".
fn timeseries_title(res: &ResultsFile, p: &PlotSpec, run: u32) -> String {
    let fields = timeseries_fields(p);
    let what = match fields.as_slice() {
        [f] => crate::plot_axis::axis_info(f).name,
        _ => "metrics".to_string(),
    };
    let row = res
        .rows
        .iter()
        .find(|r| r.get("run").and_then(Value::as_u64) == Some(u64::from(run)));
    let params: Vec<String> = row
        .map(|r| {
            res.param_columns
                .iter()
                .filter_map(|c| {
                    let v = r.get(c)?;
                    Some(format!("{}: {}", short_name(c), value_text(c, v)))
                })
                .collect()
        })
        .unwrap_or_default();
    let mut t = format!("{}: {what} over time, run {run}", res.experiment);
    if !params.is_empty() {
        t.push_str(&format!(" ({})", params.join(", ")));
    }
    t
}

/// Writes `fig` as the PNG `png` and as the SVG beside it.
pub fn write_figure(fig: &Figure, png: &Path) -> Result<(), PlotError> {
    ensure_font()?;
    let err = |path: &Path| {
        let path = path.display().to_string();
        move |message: String| PlotError::Draw { path, message }
    };
    {
        let root = BitMapBackend::new(png, SIZE).into_drawing_area();
        draw(&root, fig).map_err(err(png))?;
        root.present().map_err(|e| err(png)(e.to_string()))?;
    }
    let svg = png.with_extension("svg");
    let root = SVGBackend::new(&svg, SIZE).into_drawing_area();
    draw(&root, fig).map_err(err(&svg))?;
    root.present().map_err(|e| err(&svg)(e.to_string()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    /// A sweep of the CXL ratio with 3 repeats, 2 phases, 2 VMs and the
    /// aggregate; a policy column; an output column.
    fn results() -> ResultsFile {
        let mut res = ResultsFile::new(
            "virtiofs-cxl-ratio",
            vec![
                "daemon.cxl_ratio".into(),
                "daemon.device.cache.policy".into(),
            ],
        );
        let mut rows = Vec::new();
        let mut run = 0;
        for ratio in [0, 5, 10, 20, 30, 50, 80, 100] {
            for policy in ["lru", "s3fifo"] {
                for repeat in 0..3 {
                    run += 1;
                    for (k, phase) in ["first-touch", "second-touch"].iter().enumerate() {
                        for vm in ["vm0", "vm1", "all"] {
                            let wobble = f64::from(repeat) * 0.04 - 0.04;
                            let base = if k == 0 { 9e8 } else { 2.2e9 };
                            let bw = base / (1.0 + f64::from(ratio) / 12.0) * (1.0 + wobble);
                            let bw = if vm == "all" { bw } else { bw / 2.0 };
                            rows.push(
                                json!({"run": run, "repeat": repeat, "status": "ok", "vm": vm,
                                       "phase": phase, "daemon.cxl_ratio": ratio,
                                       "daemon.device.cache.policy": policy,
                                       "read_bw_bytes_per_sec": bw,
                                       "read_clat_p99_ns": 4e9 / bw * 1e3,
                                       "daemon.pool_traps": ratio * 300 + repeat * 40,
                                       "out.hit_share": 1.0 - f64::from(ratio) / 150.0
                                           - if policy == "lru" { 0.0 } else { 0.05 }})
                                .as_object()
                                .unwrap()
                                .clone(),
                            );
                        }
                    }
                }
            }
        }
        rows.push(
            json!({"run": 99, "status": "failed", "vm": "all", "daemon.cxl_ratio": 5})
                .as_object()
                .unwrap()
                .clone(),
        );
        res.push(rows);
        res
    }

    /// Per-load latency of a pointer chase: DRAM ~100 ns, CXL bimodal
    /// (device-cache hits ~1 µs, misses ~55 µs).
    fn distributions() -> Vec<Distribution> {
        let mut out = Vec::new();
        let buckets = |centers: &[(f64, u64)]| -> Vec<(f64, f64, u64)> {
            // Log-spaced buckets, 8 per decade, from 10 ns to 1 ms.
            let edges: Vec<f64> = (0..=40)
                .map(|i| 10f64 * 10f64.powf(f64::from(i) / 8.0))
                .collect();
            edges
                .windows(2)
                .filter_map(|w| {
                    let mid = (w[0] * w[1]).sqrt();
                    let n: f64 = centers
                        .iter()
                        .map(|(c, n)| *n as f64 * (-((mid / c).ln()).powi(2) / 0.08).exp())
                        .sum();
                    (n >= 1.0).then_some((w[0].round(), w[1].round(), n as u64))
                })
                .collect()
        };
        for repeat in 0..2 {
            for (numa, centers) in [
                ("dram", vec![(95.0, 9000)]),
                ("cxl", vec![(900.0, 5000), (55_000.0, 4000)]),
            ] {
                out.push(Distribution {
                    run: repeat + 1,
                    point: 0,
                    repeat,
                    phase: "chase".into(),
                    vm: "vm0".into(),
                    params: [("phase.numa".to_string(), json!(numa))].into(),
                    name: "latency".into(),
                    unit: "ns".into(),
                    buckets: buckets(&centers),
                });
            }
        }
        out
    }

    /// A metrics series of 2 VMs: file pages faulted in over 30 s.
    fn series() -> String {
        let mut s = String::new();
        for seq in 0..31u64 {
            let t = 1_700_000_000_000 + seq * 1000;
            let t_s = seq as f64;
            let vm0 = (4096.0 * (1.0 - (-t_s / 6.0).exp())) as u64;
            let vm1 = (3000.0 * (1.0 - (-(t_s - 8.0).max(0.0) / 5.0).exp())) as u64;
            let dev = ((vm0 + vm1) as f64 * 0.6) as u64;
            for (vm, traps) in [("vm0", vm0), ("vm1", vm1), ("all", vm0 + vm1)] {
                s.push_str(&format!(
                    "{{\"ts_unix_ms\":{t},\"seq\":{seq},\"final\":false,\"vm\":\"{vm}\",\"traps\":{traps},\"resident_cxl_pages\":{dev},\"dax_maps\":{},\"policy\":\"lru\"}}\n",
                    traps / 512
                ));
            }
        }
        s
    }

    fn is_png(path: &Path) -> bool {
        let b = std::fs::read(path).unwrap();
        b.len() > 1000 && b.starts_with(b"\x89PNG\r\n\x1a\n")
    }

    fn is_svg(path: &Path) -> bool {
        let t = std::fs::read_to_string(path).unwrap();
        t.contains("<svg") && t.contains("</svg>") && t.contains("<text")
    }

    fn write_dir(dir: &Path) -> ResultsFile {
        let res = results();
        distributions::append(dir, &distributions()).unwrap();
        let run_dir = dir.join("runs").join("001");
        std::fs::create_dir_all(&run_dir).unwrap();
        std::fs::write(run_dir.join("metrics.jsonl"), series()).unwrap();
        res
    }

    fn spec_plots() -> Vec<PlotSpec> {
        let toml = r#"
[[plots]]
x = "daemon.cxl_ratio"
y = "read_bw_bytes_per_sec"
series = ["phase"]
vm = "all"
filter = { "daemon.device.cache.policy" = "lru" }
file = "bw-vs-ratio.png"

[[plots]]
x = "daemon.device.cache.policy"
y = "out.hit_share"
series = ["phase"]
vm = "all"
filter = { "daemon.cxl_ratio" = 50 }
file = "hit-share-vs-policy"

[[plots]]
x = "daemon.cxl_ratio"
y = "read_clat_p99_ns"
series = ["vm", "daemon.device.cache.policy"]
phase = "second-touch"
log_y = false
file = "p99-per-vm.png"

[[plots]]
kind = "histogram"
distribution = "latency"
y_label = "Share of loads (%)"
title = "Pointer chase: per-load latency, DRAM vs CXL node"

[[plots]]
kind = "cdf"
y_label = "Loads at or below (%)"

[[plots]]
kind = "timeseries"
fields = ["traps"]
y_label = "File pages faulted in"
title = "virtiofs on CXL: file pages faulted in per VM over time"

[[plots]]
kind = "timeseries"
run = 1
fields = ["traps", "resident_cxl_pages"]
file = "ts-two-fields.png"
"#;
        #[derive(serde::Deserialize)]
        struct S {
            plots: Vec<PlotSpec>,
        }
        toml::from_str::<S>(toml).unwrap().plots
    }

    #[test]
    fn draws_spec_and_default_plots_as_png_and_svg() {
        let tmp = tempfile::tempdir().unwrap();
        // CXLFS_KEEP_PLOTS=DIR keeps the figures to look at.
        let keep = std::env::var_os("CXLFS_KEEP_PLOTS").map(PathBuf::from);
        let dir = keep.unwrap_or_else(|| tmp.path().to_path_buf());
        std::fs::create_dir_all(&dir).unwrap();
        let _ = std::fs::remove_file(dir.join(distributions::FILE));
        let res = write_dir(&dir);
        let files = render_all(&res, &spec_plots(), &dir).unwrap();
        let names: Vec<String> = files
            .iter()
            .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            [
                "bw-vs-ratio.png",
                "hit-share-vs-policy.png",
                "p99-per-vm.png",
                "histogram-latency.png",
                "cdf-latency.png",
                "timeseries-traps-run001.png",
                "ts-two-fields.png"
            ]
        );
        for f in &files {
            assert!(is_png(f), "{}", f.display());
            assert!(is_svg(&f.with_extension("svg")), "{}", f.display());
        }
        let svg = std::fs::read_to_string(dir.join("bw-vs-ratio.svg")).unwrap();
        assert!(svg.contains("Read bandwidth (MB/s)"));
        assert!(svg.contains("File pages on the CXL-SSD (%)"));
        assert!(svg.contains("phase: first-touch"));
        // Defaults: each figure against each swept key, plus the
        // distributions' histogram and CDF.
        let defaults = default_plots(&res, &distributions());
        let ys: Vec<(&str, &str)> = defaults
            .iter()
            .map(|p| (p.x.as_str(), p.y.as_str()))
            .collect();
        assert!(ys.contains(&("daemon.cxl_ratio", "read_bw_bytes_per_sec")));
        assert!(ys.contains(&("daemon.device.cache.policy", "daemon.pool_traps")));
        assert!(ys.contains(&("daemon.cxl_ratio", "out.hit_share")));
        assert!(!ys.iter().any(|(_, y)| *y == "write_bw_bytes_per_sec"));
        assert_eq!(
            defaults.iter().filter(|p| p.kind != PlotKind::Line).count(),
            2
        );
        let sub = dir.join("defaults");
        std::fs::create_dir_all(&sub).unwrap();
        let _ = std::fs::remove_file(sub.join(distributions::FILE));
        distributions::append(&sub, &distributions()).unwrap();
        let files = render_all(&res, &[], &sub).unwrap();
        assert_eq!(files.len(), defaults.len());
        for f in &files {
            assert!(is_png(f), "{}", f.display());
        }
        // Nothing to draw: no file, no error.
        let none = PlotSpec {
            x: "daemon.cxl_ratio".into(),
            y: "no_such_column".into(),
            ..PlotSpec::default()
        };
        let ts = PlotSpec {
            kind: PlotKind::Timeseries,
            run: Some(7),
            ..PlotSpec::default()
        };
        assert!(render_all(&res, &[none, ts], tmp.path())
            .unwrap()
            .is_empty());
    }

    #[test]
    fn sizes_on_an_automatic_log_axis() {
        let mut res = ResultsFile::new("bandwidth-vs-wss", vec!["fio.size".into()]);
        let mut rows = Vec::new();
        for (i, mib) in [4u64, 8, 16, 32, 64].iter().enumerate() {
            for repeat in 0..3u32 {
                let bw = if *mib <= 16 {
                    2.4e9
                } else {
                    2.4e9 * 16.0 / *mib as f64
                };
                let bw = bw * (1.0 + 0.03 * (f64::from(repeat) - 1.0));
                rows.push(
                    json!({"run": i * 3 + repeat as usize + 1, "status": "ok", "vm": "all",
                           "phase": "measure", "fio.size": format!("{mib}MiB"),
                           "read_bw_bytes_per_sec": bw})
                    .as_object()
                    .unwrap()
                    .clone(),
                );
            }
        }
        res.push(rows);
        let p = PlotSpec {
            x: "fio.size".into(),
            y: "read_bw_bytes_per_sec".into(),
            file: Some("bw-vs-wss.png".into()),
            ..PlotSpec::default()
        };
        let (_, fig) = figure(&res, &[], Path::new("."), &p).unwrap();
        assert!(fig.x.log, "a doubling sweep goes on a log axis");
        assert_eq!(fig.x.label, "Working set (MiB)");
        let tmp = tempfile::tempdir().unwrap();
        let dir = std::env::var_os("CXLFS_KEEP_PLOTS")
            .map_or_else(|| tmp.path().to_path_buf(), PathBuf::from);
        std::fs::create_dir_all(&dir).unwrap();
        let files = render_all(&res, &[p], &dir).unwrap();
        let svg = std::fs::read_to_string(files[0].with_extension("svg")).unwrap();
        for tick in ["4", "16", "64", "2.5k"] {
            assert!(svg.contains(&format!(">\n{tick}\n</text>")), "{tick}");
        }
    }
}
