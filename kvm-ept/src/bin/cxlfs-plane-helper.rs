//! A stand-alone pool plane helper (see `residency::split`): what a split
//! plane runs when its owner has no executable of its own to re-run (tests,
//! benches). `cxlfsd` re-runs itself instead.

fn main() {
    residency::helper_main_if_requested();
    eprintln!(
        "cxlfs-plane-helper is started by a split pool plane ({} names its descriptors)",
        residency::split::HELPER_ENV
    );
    std::process::exit(2);
}
