//! The job-array script `cxlfs run --slurm` submits: `#SBATCH` lines (the
//! array of run numbers, its limit, the output files in `DIR/slurm/`, the
//! chosen partition, time, CPUs, memory and extra options), then one
//! command: this `cxlfs` running the task's run with `--only-run
//! $SLURM_ARRAY_TASK_ID`.

use super::super::args::SlurmOpts;
use std::fmt::Write as _;
use std::path::Path;

/// One submission's script.
pub(super) struct JobScript<'a> {
    /// `cxlfs-` + the experiment's name.
    pub(super) name: &'a str,
    /// The runs (array indices) to run.
    pub(super) runs: &'a [u32],
    /// The results directory (absolute).
    pub(super) out_dir: &'a Path,
    pub(super) opts: &'a SlurmOpts,
    /// Variables the task exports (`CXLFS_REPO`).
    pub(super) env: &'a [(String, String)],
    /// The task's command without `--only-run N`.
    pub(super) command: &'a [String],
}

impl JobScript<'_> {
    /// The script's text.
    pub(super) fn text(&self) -> String {
        let mut s = String::from("#!/bin/bash\n");
        s.push_str(
            "# cxlfs run --slurm: one array task per run of the sweep (task id = run number).\n",
        );
        let mut sbatch = |opt: String| {
            let _ = writeln!(s, "#SBATCH {opt}");
        };
        sbatch(format!("--job-name=cxlfs-{}", self.name));
        let limit = self.opts.array_limit.map(|k| format!("%{k}"));
        sbatch(format!(
            "--array={}{}",
            array_ranges(self.runs),
            limit.unwrap_or_default()
        ));
        let log = self.out_dir.join("slurm/%A_%a.out");
        sbatch(format!("--output={}", log.display()));
        let o = self.opts;
        for (flag, v) in [
            ("partition", o.partition.clone()),
            ("time", o.time.clone()),
            ("cpus-per-task", o.cpus_per_task.map(|n| n.to_string())),
            ("mem", o.mem.clone()),
        ] {
            if let Some(v) = v {
                sbatch(format!("--{flag}={v}"));
            }
        }
        for a in &o.sbatch_args {
            sbatch(a.clone());
        }
        s.push_str("set -e\n");
        for (k, v) in self.env {
            let _ = writeln!(s, "export {k}={}", quote(v));
        }
        let cmd: Vec<String> = self.command.iter().map(|a| quote(a)).collect();
        let _ = writeln!(
            s,
            "exec {} --only-run \"$SLURM_ARRAY_TASK_ID\"",
            cmd.join(" ")
        );
        s
    }
}

/// `1-3,5,7-8` for runs 1, 2, 3, 5, 7, 8 (sorted, duplicates dropped).
pub(super) fn array_ranges(runs: &[u32]) -> String {
    let mut runs = runs.to_vec();
    runs.sort_unstable();
    runs.dedup();
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < runs.len() {
        let mut j = i;
        while j + 1 < runs.len() && runs[j + 1] == runs[j] + 1 {
            j += 1;
        }
        parts.push(if i == j {
            runs[i].to_string()
        } else {
            format!("{}-{}", runs[i], runs[j])
        });
        i = j + 1;
    }
    parts.join(",")
}

/// `s` as one shell word: bare when it has only safe characters, else in
/// single quotes.
pub(super) fn quote(s: &str) -> String {
    let safe = |c: char| c.is_ascii_alphanumeric() || "/._-=:,+@%".contains(c);
    if !s.is_empty() && s.chars().all(safe) {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn ranges_of_runs() {
        assert_eq!(array_ranges(&[1, 2, 3, 5, 7, 8]), "1-3,5,7-8");
        assert_eq!(array_ranges(&[4]), "4");
        assert_eq!(array_ranges(&[3, 1, 2, 2]), "1-3");
        assert_eq!(array_ranges(&[]), "");
    }

    #[test]
    fn words_are_quoted_for_the_shell() {
        assert_eq!(quote("/usr/bin/cxlfs"), "/usr/bin/cxlfs");
        assert_eq!(quote("vms.count=2"), "vms.count=2");
        assert_eq!(quote("sweep.x=[0, 100]"), "'sweep.x=[0, 100]'");
        assert_eq!(quote("it's"), "'it'\\''s'");
        assert_eq!(quote(""), "''");
        assert_eq!(quote("$HOME"), "'$HOME'");
    }

    #[test]
    fn script_has_the_array_options_and_the_task_command() {
        let opts = SlurmOpts {
            partition: Some("gpu".into()),
            time: Some("30:00".into()),
            cpus_per_task: Some(2),
            mem: None,
            array_limit: Some(1),
            sbatch_args: vec!["--account=lab".into()],
            ..SlurmOpts::default()
        };
        let command: Vec<String> = [
            "/bin/cxlfs",
            "run",
            "/s/demo.toml",
            "--out",
            "/r",
            "--set",
            "a=[1, 2]",
        ]
        .map(String::from)
        .to_vec();
        let env = [("CXLFS_REPO".to_string(), "/src/cxlfs".to_string())];
        let text = JobScript {
            name: "demo",
            runs: &[2, 3, 5],
            out_dir: Path::new("/r"),
            opts: &opts,
            env: &env,
            command: &command,
        }
        .text();
        let expected = "#!/bin/bash\n\
            # cxlfs run --slurm: one array task per run of the sweep (task id = run number).\n\
            #SBATCH --job-name=cxlfs-demo\n\
            #SBATCH --array=2-3,5%1\n\
            #SBATCH --output=/r/slurm/%A_%a.out\n\
            #SBATCH --partition=gpu\n\
            #SBATCH --time=30:00\n\
            #SBATCH --cpus-per-task=2\n\
            #SBATCH --account=lab\n\
            set -e\n\
            export CXLFS_REPO=/src/cxlfs\n\
            exec /bin/cxlfs run /s/demo.toml --out /r --set 'a=[1, 2]' --only-run \"$SLURM_ARRAY_TASK_ID\"\n";
        assert_eq!(text, expected);
    }
}
