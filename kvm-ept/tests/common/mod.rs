//! What the residency plane's integration tests share.

/// A test that cannot run here: a failure under `CI=true`, a SKIPPED line
/// otherwise.
pub fn skip_or_fail(why: &str) {
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{why}; CI=true, so this test may not be skipped (run it as root with /dev/fuse available)");
    }
    eprintln!("SKIPPED: {why}");
}

/// Whether `/dev/fuse` can be opened (else [`skip_or_fail`] has said so).
pub fn fuse_usable() -> bool {
    if let Err(e) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
    {
        skip_or_fail(&format!("cannot open /dev/fuse ({e})"));
        return false;
    }
    true
}
