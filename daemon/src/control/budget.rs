//! Per-VM prefetch budgets: a token bucket of bytes per VM, refilled at
//! `prefetch_budget_bytes` per second up to that much, so one guest cannot
//! keep the shared cache churning with prefetch hints.

use super::Controller;
use crate::sync::lock;
use std::collections::HashMap;
use std::time::Instant;

/// One VM's bucket.
#[derive(Debug, Clone, Copy)]
pub(super) struct Bucket {
    bytes: u64,
    at: Instant,
}

/// The buckets of the VMs that prefetched.
pub(super) type Budgets = HashMap<String, Bucket>;

impl Controller {
    /// Bytes VM `vm` may prefetch now.
    pub(super) fn prefetch_budget(&self, vm: &str) -> u64 {
        let cap = self.opts.prefetch_budget_bytes;
        let mut b = lock(&self.budgets);
        let bucket = b.entry(vm.to_string()).or_insert(Bucket {
            bytes: cap,
            at: Instant::now(),
        });
        refill(bucket, cap);
        bucket.bytes
    }

    /// Takes `bytes` from VM `vm`'s bucket.
    pub(super) fn spend_prefetch_budget(&self, vm: &str, bytes: u64) {
        if let Some(bucket) = lock(&self.budgets).get_mut(vm) {
            bucket.bytes = bucket.bytes.saturating_sub(bytes);
        }
    }
}

fn refill(bucket: &mut Bucket, cap: u64) {
    let now = Instant::now();
    let elapsed = now.duration_since(bucket.at);
    let add = u128::from(cap).saturating_mul(elapsed.as_nanos()) / 1_000_000_000;
    let add = u64::try_from(add).unwrap_or(u64::MAX);
    if add > 0 {
        bucket.bytes = bucket.bytes.saturating_add(add).min(cap);
        bucket.at = now;
    }
}
