//! Which device knobs each curve method honours, and why the others cannot
//! be: a curve a method cannot give exactly (stack distances) or in
//! miniature (sampling) is refused with the reason, never given wrong.

use crate::config::DeviceConfig;
use crate::replay::Arrival;
use crate::PolicyKind;

/// A knob that keeps a method from giving the device's curve.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Unsupported {
    /// One-pass exact curves exist for LRU and LIFO only.
    #[error(
        "cache.policy = {}: exact one-pass curves exist for LRU (stack distances) \
         and LIFO only",
        .0.name()
    )]
    NoExactCurve(PolicyKind),
    /// A set-associative cache is one cache per set, and the sets change with the size.
    #[error(
        "cache.ways = {0}: the exact curves are of a fully associative cache; with \
         sets, each set is its own cache and the number of sets changes with the size"
    )]
    SetAssociative(u32),
    /// With hits invisible the policy hears only misses.
    #[error(
        "cache.hits_visible = false: a hit does not move its page up the LRU stack, \
         so the cache is not the LRU that stack distances describe"
    )]
    HitsInvisible,
    /// Prefetches fill neighbours of a missed page.
    #[error(
        "prefetch.degree = {0}: a miss also fills pages p+1..p+N, which neither a \
         stack of demand accesses sees nor spatial sampling keeps (it keeps each \
         neighbour with probability R, independently of p)"
    )]
    Prefetch(u32),
    /// The write log takes writes and cleans on NAND time.
    #[error(
        "cache.write_log_bytes = {0}: the log takes writes out of the page cache \
         and frees its room as NAND programs finish, so its hits depend on time \
         and on the log's fill, which neither a stack nor a miniature keeps"
    )]
    WriteLog(u64),
    /// Open-loop arrivals make a re-access during a fill a (coalesced) miss.
    #[error(
        "arrival {0}: an open-loop access to a page whose fill is still in flight \
         is a coalesced miss, which depends on fill times (NAND queueing) that \
         neither a stack nor a miniature of R of the accesses keeps; use --arrival closed"
    )]
    OpenLoop(Arrival),
}

/// Knobs every method shares: hits do not depend on time or neighbours.
fn timeless(cfg: &DeviceConfig, arrival: Arrival) -> Result<(), Unsupported> {
    if cfg.prefetch.degree > 0 {
        return Err(Unsupported::Prefetch(cfg.prefetch.degree));
    }
    if cfg.cache.write_log_bytes > 0 {
        return Err(Unsupported::WriteLog(cfg.cache.write_log_bytes));
    }
    if !matches!(arrival, Arrival::Closed { .. }) {
        return Err(Unsupported::OpenLoop(arrival));
    }
    Ok(())
}

/// `Ok` when a one-pass exact curve gives `cfg`'s under `arrival`: LRU
/// (stack distances, hits visible) or LIFO (a hit changes nothing, so
/// visible or not), fully associative, no prefetch, no write log, closed
/// loop (every fill has completed when the next access arrives, so a page
/// is a hit exactly when it is resident). Writes change nothing: a write
/// miss allocates as a read miss does.
pub fn exact(cfg: &DeviceConfig, arrival: Arrival) -> Result<(), Unsupported> {
    match cfg.cache.policy {
        PolicyKind::Lru if !cfg.cache.hits_visible => return Err(Unsupported::HitsInvisible),
        PolicyKind::Lru | PolicyKind::Lifo => {}
        other => return Err(Unsupported::NoExactCurve(other)),
    }
    if cfg.cache.ways != 0 {
        return Err(Unsupported::SetAssociative(cfg.cache.ways));
    }
    timeless(cfg, arrival)
}

/// `Ok` when a miniature simulation of a spatial sample can stand for
/// `cfg`'s curve: no prefetch, no write log, closed loop. Any policy,
/// `hits_visible` either way; a set-associative cache keeps its ways and
/// has R of the sets (an approximation: sampled pages spread evenly over
/// the sets only on average).
pub fn miniature(cfg: &DeviceConfig, arrival: Arrival) -> Result<(), Unsupported> {
    timeless(cfg, arrival)
}
