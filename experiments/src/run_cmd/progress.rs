//! The progress of a sweep on stderr: runs done and left with an ETA on a
//! terminal, a plain line per run start and end otherwise.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;

/// Runs done and left with an ETA on a terminal; plain lines otherwise.
pub(super) enum Progress {
    Bar(ProgressBar),
    Plain,
}

impl Progress {
    /// A bar over `len` runs unless `disabled` or stderr is no terminal.
    pub(super) fn new(len: u64, disabled: bool) -> Self {
        if disabled || !std::io::stderr().is_terminal() {
            return Progress::Plain;
        }
        let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
        if let Ok(style) = ProgressStyle::with_template(
            "{elapsed_precise} [{bar:30}] {pos}/{len} runs, ETA {eta} {msg}",
        ) {
            bar.set_style(style.progress_chars("=> "));
        }
        Progress::Bar(bar)
    }

    /// Run `run` of `total` (`label`) begins.
    pub(super) fn start(&self, run: u32, total: usize, label: &str) {
        match self {
            Progress::Bar(b) => b.set_message(label.to_string()),
            Progress::Plain => eprintln!("cxlfs run: run {run}/{total} [{label}] ..."),
        }
    }

    /// A run ended: `line` says how.
    pub(super) fn done(&self, line: String) {
        match self {
            Progress::Bar(b) => {
                b.println(line);
                b.inc(1);
            }
            Progress::Plain => eprintln!("cxlfs run: {line}"),
        }
    }

    /// The sweep ended: the bar goes.
    pub(super) fn finish(&self) {
        if let Progress::Bar(b) = self {
            b.finish_and_clear();
        }
    }
}
