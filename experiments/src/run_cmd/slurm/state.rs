//! The states of a job array's tasks as Slurm reports them: `sacct` where
//! accounting works (slurmdbd), else `scontrol show job` (which knows a
//! finished job for `MinJobAge`); and the tasks still queued (`squeue`).
//! The parsers are plain functions of the commands' text.

use anyhow::{bail, Context, Result};
use std::process::{Command, Stdio};

/// One array task: its run (the array index), `JOB_TASK`, state, exit code
/// and node.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub(in crate::run_cmd) struct TaskState {
    pub(in crate::run_cmd) run: u32,
    pub(in crate::run_cmd) job: String,
    pub(in crate::run_cmd) state: String,
    pub(in crate::run_cmd) exit_code: String,
    pub(in crate::run_cmd) node: String,
}

impl TaskState {
    /// The task ran and ended other than COMPLETED (failed, cancelled, timed
    /// out, killed for memory, its node failed, preempted, ...).
    pub(in crate::run_cmd) fn ended_badly(&self) -> bool {
        let ok_or_not_yet = matches!(
            self.state.as_str(),
            "COMPLETED" | "PENDING" | "RUNNING" | "REQUEUED" | "RESIZING" | "SUSPENDED"
        );
        // Cancelled before it got a node: it never ran.
        let never_ran = self.state == "CANCELLED" && self.node.is_empty();
        !ok_or_not_yet && !never_ran
    }
}

/// Array indices of `1-3,5,7-9%2` (brackets and the `%` limit allowed).
pub(super) fn task_ids(spec: &str) -> Vec<u32> {
    let spec = spec.trim().trim_start_matches('[').trim_end_matches(']');
    let spec = spec.split('%').next().unwrap_or("");
    let mut ids = Vec::new();
    for part in spec.split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.parse::<u32>(), b.parse::<u32>()) {
                    ids.extend(a..=b);
                }
            }
            None => ids.extend(part.parse::<u32>().ok()),
        }
    }
    ids
}

/// `sacct -n -P -X -o JobID,State,ExitCode,NodeList` of one array job.
pub(super) fn parse_sacct(text: &str) -> Vec<TaskState> {
    let mut out = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.trim().split('|').collect();
        if f.len() < 4 {
            continue;
        }
        let Some((array, tasks)) = f[0].split_once('_') else {
            continue;
        };
        if tasks.contains('.') {
            continue; // a step
        }
        // `CANCELLED by 0` → `CANCELLED`.
        let state = f[1].split_whitespace().next().unwrap_or("").to_string();
        let node = match f[3] {
            "None assigned" | "(null)" => "",
            n => n,
        };
        for run in task_ids(tasks) {
            out.push(TaskState {
                run,
                job: format!("{array}_{run}"),
                state: state.clone(),
                exit_code: f[2].to_string(),
                node: node.to_string(),
            });
        }
    }
    out
}

/// `scontrol show job -o ID`: a line of `Key=Value` per job record (an
/// array's pending tasks share one, `ArrayTaskId=2-3%1`).
pub(super) fn parse_scontrol(text: &str) -> Vec<TaskState> {
    let mut out = Vec::new();
    for line in text.lines() {
        let field = |key: &str| {
            line.split_whitespace()
                .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
                .unwrap_or("")
        };
        let (array, tasks) = (field("ArrayJobId"), field("ArrayTaskId"));
        if array.is_empty() || tasks.is_empty() {
            continue;
        }
        let node = match field("NodeList") {
            "(null)" => "",
            n => n,
        };
        for run in task_ids(tasks) {
            out.push(TaskState {
                run,
                job: format!("{array}_{run}"),
                state: field("JobState").to_string(),
                exit_code: field("ExitCode").to_string(),
                node: node.to_string(),
            });
        }
    }
    out
}

/// `squeue -h -o "%i %T"` of one job: the tasks still queued or running
/// (`JOB_TASK` or `JOB_[RANGE]`, state).
pub(super) fn parse_squeue(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            Some((f.next()?.to_string(), f.next()?.to_string()))
        })
        .collect()
}

/// Runs a Slurm command; its stdout, or its failure with stderr.
fn slurm(cmd: &str, args: &[&str]) -> Result<String> {
    let out = Command::new(cmd)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run {cmd} (is Slurm installed?)"))?;
    if !out.status.success() {
        bail!(
            "{cmd} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The tasks of job `id` still queued or running (none once it is done).
pub(super) fn queued(id: &str) -> Result<Vec<(String, String)>> {
    match slurm("squeue", &["-j", id, "-h", "-o", "%i %T"]) {
        Ok(text) => Ok(parse_squeue(&text)),
        // Gone from slurmctld altogether: done long ago.
        Err(e) if e.to_string().contains("Invalid job id") => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

/// The states of job `id`'s tasks and where they came from (`sacct` or
/// `scontrol`); none when neither knows the job.
pub(super) fn task_states(id: &str) -> (&'static str, Vec<TaskState>) {
    let sacct = slurm(
        "sacct",
        &[
            "-j",
            id,
            "-n",
            "-P",
            "-X",
            "-o",
            "JobID,State,ExitCode,NodeList",
        ],
    );
    if let Ok(text) = sacct {
        let states = parse_sacct(&text);
        if !states.is_empty() {
            return ("sacct", states);
        }
    }
    match slurm("scontrol", &["show", "job", "-o", id]) {
        Ok(text) => ("scontrol", parse_scontrol(&text)),
        Err(_) => ("none", Vec::new()),
    }
}

/// `scancel ID`.
pub(super) fn cancel(id: &str) -> Result<()> {
    slurm("scancel", &[id]).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn array_ranges_expand() {
        assert_eq!(task_ids("1-3,5,7-8%2"), [1, 2, 3, 5, 7, 8]);
        assert_eq!(task_ids("[2-3%1]"), [2, 3]);
        assert_eq!(task_ids("4"), [4]);
        assert!(task_ids("").is_empty());
        assert!(task_ids("x-y").is_empty());
    }

    #[test]
    fn sacct_tasks_pending_ranges_and_no_steps() {
        let text = "12_1|COMPLETED|0:0|vm\n12_2|CANCELLED by 0|0:15|vm\n\
                    12_2.batch|CANCELLED|0:15|vm\n12_[3-4%1]|PENDING|0:0|None assigned\n";
        let s = parse_sacct(text);
        let runs: Vec<(u32, &str, &str)> = s
            .iter()
            .map(|t| (t.run, t.state.as_str(), t.node.as_str()))
            .collect();
        assert_eq!(
            runs,
            [
                (1, "COMPLETED", "vm"),
                (2, "CANCELLED", "vm"),
                (3, "PENDING", ""),
                (4, "PENDING", "")
            ]
        );
        assert_eq!(s[1].job, "12_2");
        assert_eq!(s[1].exit_code, "0:15");
        assert!(s[1].ended_badly());
        assert!(!s[0].ended_badly() && !s[2].ended_badly());
    }

    #[test]
    fn scontrol_records_of_finished_and_pending_tasks() {
        // As `scontrol show job -o 1` printed it here (Slurm 22.05), cut.
        let text = "JobId=1 ArrayJobId=1 ArrayTaskId=3-4%1 ArrayTaskThrottle=1 JobName=j.sh \
                    JobState=PENDING Reason=JobArrayTaskLimit ExitCode=0:0 NodeList=(null)\n\
                    JobId=3 ArrayJobId=1 ArrayTaskId=2 JobName=j.sh JobState=FAILED \
                    Reason=NonZeroExitCode ExitCode=3:0 NodeList=vm BatchHost=vm\n\
                    JobId=2 ArrayJobId=1 ArrayTaskId=1 JobState=COMPLETED ExitCode=0:0 NodeList=vm\n";
        let s = parse_scontrol(text);
        let runs: Vec<(u32, &str, &str, &str)> = s
            .iter()
            .map(|t| {
                (
                    t.run,
                    t.state.as_str(),
                    t.exit_code.as_str(),
                    t.node.as_str(),
                )
            })
            .collect();
        assert_eq!(
            runs,
            [
                (3, "PENDING", "0:0", ""),
                (4, "PENDING", "0:0", ""),
                (2, "FAILED", "3:0", "vm"),
                (1, "COMPLETED", "0:0", "vm")
            ]
        );
        assert_eq!(s[2].job, "1_2");
        assert!(s[2].ended_badly());
        // A cancelled task that never got a node never ran.
        let never = parse_scontrol("ArrayJobId=5 ArrayTaskId=2 JobState=CANCELLED NodeList=(null)");
        assert!(!never[0].ended_badly());
        assert!(parse_scontrol("JobId=9 JobState=COMPLETED").is_empty());
    }

    #[test]
    fn squeue_lines() {
        let q = parse_squeue("12_[2-3%1] PENDING\n12_1 RUNNING\n\n");
        assert_eq!(
            q,
            [
                ("12_[2-3%1]".to_string(), "PENDING".to_string()),
                ("12_1".to_string(), "RUNNING".to_string())
            ]
        );
        assert!(parse_squeue("").is_empty());
    }
}
