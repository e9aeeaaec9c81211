//! Replay throughput benchmark (filled in later).
fn main() {}
