//! PNG plots of a results directory (`plotters`, bitmap backend).
//!
//! Text is drawn with plotters' `ab_glyph` renderer from a TrueType file
//! read at run time (DejaVu Sans from Debian's `fonts-dejavu-core`, which
//! `make demo` / `make test` install; `$CXLFS_PLOT_FONT` names another), so
//! no fontconfig or freetype library is needed.

use crate::results::{cell_text, ResultsFile, Row};
use crate::spec::PlotSpec;
use plotters::prelude::*;
use serde_json::Value;
use std::collections::BTreeMap;
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

/// The plots drawn when a spec names none: each main figure that is not all
/// zero, against each swept key.
pub fn default_plots(res: &ResultsFile) -> Vec<PlotSpec> {
    let ys = [
        "read_bw_bytes_per_sec",
        "write_bw_bytes_per_sec",
        "read_clat_p99_ns",
        "device_misses",
        "device_hits",
    ];
    let mut out = Vec::new();
    for x in &res.param_columns {
        for y in ys {
            let nonzero = res.rows.iter().any(|r| {
                r.get("status").and_then(Value::as_str) == Some("ok")
                    && r.get(y).and_then(Value::as_f64).is_some_and(|v| v != 0.0)
            });
            if nonzero {
                out.push(PlotSpec {
                    x: x.clone(),
                    y: y.to_string(),
                    series: None,
                    vm: None,
                    title: None,
                    log_x: false,
                    file: None,
                });
            }
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

/// The PNG file name of a plot.
pub fn plot_file(p: &PlotSpec) -> String {
    p.file
        .clone()
        .unwrap_or_else(|| format!("{}-vs-{}.png", slug(&p.y), slug(&p.x)))
}

/// One line of a plot: x → the y of every repeat.
type Series = BTreeMap<String, Vec<(f64, f64)>>;

/// Draws every plot into `dir`; returns the files written. A plot with no
/// data (every run failed, say) is skipped.
pub fn render_all(
    res: &ResultsFile,
    plots: &[PlotSpec],
    dir: &Path,
) -> Result<Vec<PathBuf>, PlotError> {
    let plots = if plots.is_empty() {
        default_plots(res)
    } else {
        plots.to_vec()
    };
    let mut written = Vec::new();
    for p in &plots {
        let path = dir.join(plot_file(p));
        if render(res, p, &path)? {
            written.push(path);
        }
    }
    Ok(written)
}

/// Draws one plot; `false` if there was nothing to draw.
pub fn render(res: &ResultsFile, p: &PlotSpec, path: &Path) -> Result<bool, PlotError> {
    let ok: Vec<&Row> = res
        .rows
        .iter()
        .filter(|r| r.get("status").and_then(Value::as_str) == Some("ok"))
        .filter(|r| r.get(&p.y).and_then(Value::as_f64).is_some())
        .filter(|r| r.get(&p.x).is_some_and(|v| !v.is_null()))
        .filter(|r| {
            p.vm.as_ref().map_or(true, |vm| {
                r.get("vm").and_then(Value::as_str) == Some(vm.as_str())
            })
        })
        .collect();
    if ok.is_empty() {
        return Ok(false);
    }
    ensure_font()?;
    // Numeric x when every value is a number, else categories in first-seen order.
    let numeric = ok
        .iter()
        .all(|r| r.get(&p.x).and_then(Value::as_f64).is_some());
    let mut categories: Vec<String> = Vec::new();
    let log_x = p.log_x && numeric && ok.iter().all(|r| r[&p.x].as_f64().is_some_and(|x| x > 0.0));
    let x_of = |r: &Row, cats: &mut Vec<String>| -> f64 {
        if numeric {
            let x = r[&p.x].as_f64().unwrap_or(0.0);
            if log_x {
                x.log2()
            } else {
                x
            }
        } else {
            let t = cell_text(&r[&p.x]);
            match cats.iter().position(|c| *c == t) {
                Some(i) => i as f64,
                None => {
                    cats.push(t);
                    (cats.len() - 1) as f64
                }
            }
        }
    };
    let series_cols = p
        .series
        .clone()
        .unwrap_or_else(|| vec!["vm".to_string(), "phase".to_string()]);
    let mut series: Series = BTreeMap::new();
    for r in &ok {
        let name = series_cols
            .iter()
            .filter_map(|c| r.get(c).map(cell_text))
            .filter(|t| !t.is_empty())
            .collect::<Vec<_>>()
            .join(" ");
        let x = x_of(r, &mut categories);
        let y = r[&p.y].as_f64().unwrap_or(0.0);
        series.entry(name).or_default().push((x, y));
    }
    let xs = series.values().flatten().map(|(x, _)| *x);
    let (mut x0, mut x1) = xs.fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(x), b.max(x)));
    let ymax = series
        .values()
        .flatten()
        .map(|(_, y)| *y)
        .fold(0.0_f64, f64::max);
    if x1 - x0 < 1e-9 {
        x0 -= 0.5;
        x1 += 0.5;
    } else {
        let pad = (x1 - x0) * 0.04;
        x0 -= pad;
        x1 += pad;
    }
    let y1 = if ymax > 0.0 { ymax * 1.1 } else { 1.0 };
    let draw_err = |e: String| PlotError::Draw {
        path: path.display().to_string(),
        message: e,
    };
    let title = p
        .title
        .clone()
        .unwrap_or_else(|| format!("{}: {} vs {}", res.experiment, p.y, p.x));
    let root = BitMapBackend::new(path, (960, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| draw_err(e.to_string()))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(&title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(90)
        .build_cartesian_2d(x0..x1, 0.0..y1)
        .map_err(|e| draw_err(e.to_string()))?;
    let cats = categories.clone();
    let x_label = move |v: &f64| -> String {
        if !numeric {
            let i = v.round();
            if (v - i).abs() < 0.01 && i >= 0.0 {
                return cats.get(i as usize).cloned().unwrap_or_default();
            }
            return String::new();
        }
        let x = if log_x { v.exp2() } else { *v };
        if x.abs() >= 1e6 || (x != 0.0 && x.abs() < 0.01) {
            format!("{x:.2e}")
        } else {
            format!("{}", (x * 100.0).round() / 100.0)
        }
    };
    let x_desc = if log_x {
        format!("{} (log2 scale)", p.x)
    } else {
        p.x.clone()
    };
    let mut mesh = chart.configure_mesh();
    mesh.x_desc(x_desc)
        .y_desc(p.y.as_str())
        .x_label_formatter(&x_label)
        .y_label_formatter(&|v: &f64| {
            if v.abs() >= 1e6 {
                format!("{:.3e}", v)
            } else {
                format!("{v}")
            }
        });
    if !numeric {
        mesh.x_labels(categories.len().max(2) * 4);
    }
    mesh.draw().map_err(|e| draw_err(e.to_string()))?;
    for (i, (name, pts)) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        // The line joins the mean over repeats at each x; every repeat is a dot.
        let mut by_x: BTreeMap<i64, (f64, f64, u32)> = BTreeMap::new();
        for (x, y) in pts {
            let e = by_x.entry((x * 1e6).round() as i64).or_insert((*x, 0.0, 0));
            e.1 += y;
            e.2 += 1;
        }
        let line: Vec<(f64, f64)> = by_x
            .values()
            .map(|(x, s, n)| (*x, s / f64::from(*n)))
            .collect();
        chart
            .draw_series(LineSeries::new(line, color.stroke_width(2)))
            .map_err(|e| draw_err(e.to_string()))?
            .label(if name.is_empty() {
                "all"
            } else {
                name.as_str()
            })
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart
            .draw_series(
                pts.iter()
                    .map(|(x, y)| Circle::new((*x, *y), 3, color.filled())),
            )
            .map_err(|e| draw_err(e.to_string()))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(|e| draw_err(e.to_string()))?;
    root.present().map_err(|e| draw_err(e.to_string()))?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn results() -> ResultsFile {
        let mut res = ResultsFile::new(
            "t",
            vec![
                "daemon.cxl_ratio".into(),
                "daemon.device.cache.policy".into(),
            ],
        );
        let mut rows = Vec::new();
        for (i, ratio) in [0, 50, 100].iter().enumerate() {
            for vm in ["vm0", "vm1", "all"] {
                for policy in ["lru", "fifo"] {
                    rows.push(
                        json!({"run": i + 1, "status": "ok", "vm": vm, "phase": "p",
                               "daemon.cxl_ratio": ratio, "daemon.device.cache.policy": policy,
                               "read_bw_bytes_per_sec": 1e8 - f64::from(*ratio) * 1e6,
                               "device_misses": ratio * 10})
                        .as_object()
                        .unwrap()
                        .clone(),
                    );
                }
            }
        }
        rows.push(
            json!({"run": 9, "status": "failed", "vm": "all", "daemon.cxl_ratio": 5})
                .as_object()
                .unwrap()
                .clone(),
        );
        res.push(rows);
        res
    }

    fn is_png(path: &Path) -> bool {
        let b = std::fs::read(path).unwrap();
        b.len() > 1000 && b.starts_with(b"\x89PNG\r\n\x1a\n")
    }

    #[test]
    fn draws_default_plots_as_png() {
        let dir = tempfile::tempdir().unwrap();
        let res = results();
        if let Some(keep) = std::env::var_os("CXLFS_KEEP_PLOTS") {
            render_all(&res, &[], Path::new(&keep)).unwrap();
        }
        let files = render_all(&res, &[], dir.path()).unwrap();
        // 2 swept keys x (read bw, device misses).
        assert_eq!(files.len(), 4, "{files:?}");
        for f in &files {
            assert!(is_png(f), "{}", f.display());
        }
        assert!(dir
            .path()
            .join("read_bw_bytes_per_sec-vs-daemon_cxl_ratio.png")
            .is_file());
        // Categorical x, explicit series, log x.
        let p = PlotSpec {
            x: "daemon.device.cache.policy".into(),
            y: "device_misses".into(),
            series: Some(vec!["vm".into()]),
            vm: Some("vm0".into()),
            title: Some("misses".into()),
            log_x: true,
            file: Some("m.png".into()),
        };
        assert!(render(&res, &p, &dir.path().join("m.png")).unwrap());
        assert!(is_png(&dir.path().join("m.png")));
        // Nothing to draw: no file, no error.
        let p = PlotSpec {
            y: "no_such_column".into(),
            file: None,
            ..p
        };
        assert!(!render(&res, &p, &dir.path().join("none.png")).unwrap());
        assert!(!dir.path().join("none.png").exists());
    }
}
