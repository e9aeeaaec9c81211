//! The soak (`tests/src/soak/`): `SOAK_VMS` guests (default 4) on one
//! `cxlfsd` for `SOAK_MINUTES` (default 2, the short form `make test`
//! runs; `make soak` runs 60), every fault injected on a schedule; fails on
//! any loss, unexpected error, leak beyond its bound, stuck guest or guest
//! kernel problem, and prints the table either way.
#![allow(clippy::unwrap_used)]

use cxlfs_e2e::exclusive;
use cxlfs_e2e::soak::{run_soak, SoakConfig};

#[test]
fn many_guests_and_faults_lose_nothing_and_leak_nothing() {
    let _serial = exclusive();
    let cfg = SoakConfig::from_env();
    let report = run_soak(&cfg);
    eprintln!("{report}");
    if let Ok(path) = std::env::var("SOAK_REPORT") {
        std::fs::write(&path, report.to_string()).unwrap();
    }
    let problems = report.problems();
    assert!(problems.is_empty(), "soak failed:\n{}", problems.join("\n"));
    for (vm, g) in &report.guests {
        assert!(g.laps.len() >= 3, "{vm}: only {} laps", g.laps.len());
    }
    assert!(report.files_checked > 0, "no file was checked");
    assert!(!report.faults.is_empty(), "no fault was injected");
}
