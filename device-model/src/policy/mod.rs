//! Eviction policies (libCacheSim-style interface), operating on slot ids of
//! one set at a time.
//!
//! A policy sees only the slots the cache hands it: every resident, unpinned
//! slot is *tracked* by exactly one policy list; pinned slots are removed from
//! its view ([`EvictionPolicy::on_remove`]) and come back as fresh insertions
//! when unpinned. Per-slot state (list links, a few bits) lives in the
//! cache's [`Frame`] of the slot, which the cache passes to every call, so
//! that a miss touches one record per slot; per-set state lives in flat
//! arrays over sets, so nothing allocates on the access path; [`Policy`]
//! dispatches statically over the concrete policies.
//!
//! The cache calls, for one access:
//! * hit: [`EvictionPolicy::on_hit`] (only when hits are visible);
//! * miss: [`EvictionPolicy::evict`] if the set has no free slot, then
//!   [`EvictionPolicy::on_insert`].
//!
//! Ghost queues (S3-FIFO's G, 2Q's A1out) are a service of the cache rather
//! than of each policy: a policy declares how many ghosts per set it wants
//! ([`EvictionPolicy::ghost_capacity`]) and marks which victims to remember
//! ([`Victim::remember`]); the cache keeps, per set, a FIFO of remembered
//! pages of that capacity (the oldest is pushed out when a new one comes
//! into a full FIFO), and tells [`EvictionPolicy::on_insert`] whether the
//! incoming page was in it. Found there, the page *leaves* the FIFO, so the
//! entries behind it stay longer: libCacheSim's ghost, a `FIFO` cache of
//! object ids from which a hit removes the id. The look-up and the removal
//! happen before the eviction that makes room (which may push a new ghost),
//! as in libCacheSim. The data structure (a ring per set, a ghost hit
//! leaving a tombstone) is in `policy/ghost.rs`.
//!
//! Most policies keep their queues as intrusive lists through the frames
//! (`policy/list.rs`); S3-FIFO, whose S and M are only pushed and popped
//! but for explicit removals, keeps them as rings of slot ids
//! (`policy/ring.rs`), so that its victims can be prefetched ahead.
//!
//! Against libCacheSim (object-count mode, every object of size 1) on a
//! one-set cache, FIFO, LRU, CLOCK, S3-FIFO and 2Q give the same hit/miss
//! sequence with matched parameters (`device-model/tests/libcachesim_golden.rs`,
//! `device-model/bench/libcachesim-compare.py`). Where the parameters make
//! libCacheSim's queues degenerate (an S3-FIFO small queue below 2 objects, a
//! 2Q A1in of 0: libCacheSim then caches nothing), the queues here keep at
//! least one way instead.

mod clock;
pub(crate) mod ghost;
mod lfru;
mod list;
mod ordered;
mod ring;
mod s3fifo;
mod twoq;

pub use clock::Clock;
pub use lfru::Lfru;
pub use ordered::{Fifo, Lifo, Lru, Ordered};
pub use s3fifo::S3Fifo;
pub use twoq::TwoQ;

pub use crate::slot::{Frame, SlotId};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// A slot chosen by [`EvictionPolicy::evict`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Victim {
    /// The slot to free (already unlinked from the policy).
    pub slot: SlotId,
    /// Put its page into the set's ghost FIFO.
    pub remember: bool,
}

impl Victim {
    /// A victim that leaves no ghost.
    #[inline]
    pub fn plain(slot: SlotId) -> Self {
        Victim {
            slot,
            remember: false,
        }
    }

    /// A victim whose page is remembered as a ghost.
    #[inline]
    pub fn with_ghost(slot: SlotId) -> Self {
        Victim {
            slot,
            remember: true,
        }
    }
}

/// The interface between the cache and an eviction policy. `set` is always
/// the set that owns `slot`.
pub trait EvictionPolicy {
    /// Which policy this is.
    fn kind(&self) -> PolicyKind;

    /// Ghost FIFO entries per set this policy wants (0: no ghosts).
    fn ghost_capacity(&self) -> u32 {
        0
    }

    /// `slot` now holds `page` and enters the policy's view. `from_ghost`:
    /// the page was in the set's ghost FIFO when the miss happened (always
    /// false for unpinned slots and when switching policies).
    fn on_insert(
        &mut self,
        frames: &mut [Frame],
        set: u32,
        slot: SlotId,
        page: u64,
        from_ghost: bool,
    );

    /// A (visible) hit on the tracked `slot`.
    fn on_hit(&mut self, frames: &mut [Frame], set: u32, slot: SlotId);

    /// The tracked `slot` leaves the policy's view without being chosen as a
    /// victim (explicit eviction, pin).
    fn on_remove(&mut self, frames: &mut [Frame], set: u32, slot: SlotId);

    /// Chooses a victim in `set` and unlinks it (`None`: the policy tracks
    /// no slot of `set`).
    fn evict(&mut self, frames: &mut [Frame], set: u32) -> Option<Victim>;

    /// Number of slots of `set` the policy tracks.
    fn tracked(&self, set: u32) -> u32;

    /// A cheap guess at the next two victims of `set` (first victim first),
    /// used only to prefetch their metadata: the cache prefetches the first
    /// one's page-table entry (reading its frame) and the second one's
    /// frame. It may be wrong or empty, and may name slots further ahead
    /// (S3-FIFO, whose queues are rings). Must read only state that a
    /// recent eviction already brought into the CPU cache (the back of a
    /// list and its neighbour, a ring's next entries).
    fn upcoming_victims(&self, _frames: &[Frame], _set: u32) -> [Option<SlotId>; 2] {
        [None, None]
    }

    /// A hint that a miss in `set` is coming: start loading the policy's
    /// per-set state that it will touch (in a set-associative cache each
    /// miss lands in another set, so nothing of it is in the CPU cache).
    fn prefetch_set(&self, _set: u32) {}

    /// Whether a hit may relink the slot, touching its list neighbours'
    /// frames too (worth prefetching them).
    fn relinks_on_hit(&self) -> bool {
        false
    }

    /// After a slot's insertion or a hit on it, how many more hits in a
    /// row on it, with no other call between, bring it to a state that a
    /// further hit leaves unchanged, or changed in a way no later decision
    /// can tell (a counter past every value it is compared with): after
    /// `Some(n)` such hits, more hits on that slot change no victim, ghost
    /// or placement ever after. `None`: hits may
    /// matter for ever (a cycle). Lets a miniature leave out the repeats
    /// of a run of accesses to one page (`mrc::repeats`). The default
    /// claims nothing.
    fn settling_hits(&self) -> Option<u32> {
        None
    }

    /// Whether a hit on the tracked `slot` of `set` now would leave the
    /// policy's state as it is, or change it in a way no later decision
    /// can tell (as [`EvictionPolicy::settling_hits`] counts): the state a
    /// run's repeats reach, read off the slot instead of counted. Lets a
    /// miniature skip such a hit (`mrc::minisim`). The default claims
    /// nothing.
    fn hit_settled(&self, _frames: &[Frame], _set: u32, _slot: SlotId) -> bool {
        false
    }

    /// Empties `set`, appending its slots to `out` in eviction order (first
    /// victim first), by evicting until nothing is left: exact, but it
    /// destroys the policy's state for that set. Used when switching policies.
    fn drain_set(&mut self, frames: &mut [Frame], set: u32, out: &mut Vec<SlotId>) {
        while let Some(v) = self.evict(frames, set) {
            out.push(v.slot);
        }
    }
}

/// `ratio` of `ways`, rounded down, clamped to `min..=ways`.
pub(crate) fn share(ways: u32, ratio: f64, min: u32) -> u32 {
    let raw = (f64::from(ways) * ratio).floor();
    let raw = if raw.is_finite() && raw > 0.0 {
        raw.min(f64::from(ways)) as u32
    } else {
        0
    };
    raw.max(min).min(ways)
}

/// The one registration site of the eviction policies. Each entry names a
/// policy's variant and type, its config name (and any other spellings the
/// command line accepts), and how to build it; from this table come
/// [`PolicyKind`] (names, parsing, serde), [`Policy`] (static dispatch: a
/// `match`, no virtual calls on the access path) and [`Policy::new`].
macro_rules! policies {
    ($(
        $(#[$doc:meta])*
        $variant:ident($ty:ty) = $name:literal $(| $alias:literal)*,
            new: $ctor:expr;
    )*) => {
        /// The eviction policies of the DRAM cache.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
        pub enum PolicyKind {
            $($(#[$doc])* #[serde(rename = $name)] $variant,)*
        }

        impl PolicyKind {
            /// Every policy, in the order tables list them.
            pub const ALL: [PolicyKind; [$(stringify!($variant)),*].len()] =
                [$(PolicyKind::$variant),*];

            /// The name used in configs and on the command line.
            pub fn name(self) -> &'static str {
                match self {
                    $(PolicyKind::$variant => $name,)*
                }
            }

            /// Other spellings the command line accepts (normalized: lower
            /// case, no `-` or `_`).
            pub fn aliases(self) -> &'static [&'static str] {
                match self {
                    $(PolicyKind::$variant => &[$($alias),*],)*
                }
            }
        }

        /// One of the concrete policies.
        #[derive(Debug, Clone)]
        pub enum Policy {
            $(#[doc = concat!("See [`", stringify!($ty), "`].")] $variant($ty),)*
        }

        impl Policy {
            /// An empty policy of `kind` for a cache of `sets` sets of `ways`
            /// slots (slot ids `0 .. sets * ways`).
            pub fn new(kind: PolicyKind, params: &PolicyParams, sets: u32, ways: u32) -> Self {
                match kind {
                    $(PolicyKind::$variant => {
                        let build: fn(u32, u32, &PolicyParams) -> $ty = $ctor;
                        Policy::$variant(build(sets, ways, params))
                    })*
                }
            }
        }

        impl EvictionPolicy for Policy {
            #[inline]
            fn kind(&self) -> PolicyKind {
                match self { $(Policy::$variant(p) => p.kind(),)* }
            }
            #[inline]
            fn ghost_capacity(&self) -> u32 {
                match self { $(Policy::$variant(p) => p.ghost_capacity(),)* }
            }
            #[inline]
            fn on_insert(
                &mut self,
                frames: &mut [Frame],
                set: u32,
                slot: SlotId,
                page: u64,
                from_ghost: bool,
            ) {
                match self {
                    $(Policy::$variant(p) => p.on_insert(frames, set, slot, page, from_ghost),)*
                }
            }
            // Always inlined: every visible hit dispatches here, from
            // Cache::record_hit, itself inlined into three callers.
            #[inline(always)]
            fn on_hit(&mut self, frames: &mut [Frame], set: u32, slot: SlotId) {
                match self { $(Policy::$variant(p) => p.on_hit(frames, set, slot),)* }
            }
            #[inline]
            fn on_remove(&mut self, frames: &mut [Frame], set: u32, slot: SlotId) {
                match self { $(Policy::$variant(p) => p.on_remove(frames, set, slot),)* }
            }
            #[inline]
            fn evict(&mut self, frames: &mut [Frame], set: u32) -> Option<Victim> {
                match self { $(Policy::$variant(p) => p.evict(frames, set),)* }
            }
            #[inline]
            fn tracked(&self, set: u32) -> u32 {
                match self { $(Policy::$variant(p) => p.tracked(set),)* }
            }
            fn drain_set(&mut self, frames: &mut [Frame], set: u32, out: &mut Vec<SlotId>) {
                match self { $(Policy::$variant(p) => p.drain_set(frames, set, out),)* }
            }
            #[inline]
            fn upcoming_victims(&self, frames: &[Frame], set: u32) -> [Option<SlotId>; 2] {
                match self { $(Policy::$variant(p) => p.upcoming_victims(frames, set),)* }
            }
            #[inline]
            fn prefetch_set(&self, set: u32) {
                match self { $(Policy::$variant(p) => p.prefetch_set(set),)* }
            }
            #[inline]
            fn relinks_on_hit(&self) -> bool {
                match self { $(Policy::$variant(p) => p.relinks_on_hit(),)* }
            }
            fn settling_hits(&self) -> Option<u32> {
                match self { $(Policy::$variant(p) => p.settling_hits(),)* }
            }
            #[inline]
            fn hit_settled(&self, frames: &[Frame], set: u32, slot: SlotId) -> bool {
                match self { $(Policy::$variant(p) => p.hit_settled(frames, set, slot),)* }
            }
        }
    };
}

policies! {
    /// First in, first out.
    Fifo(Fifo) = "fifo", new: |sets, ways, _| Fifo::new(sets, ways);
    /// Last in, first out (Cylon's surprise winner on strided scans).
    Lifo(Lifo) = "lifo", new: |sets, ways, _| Lifo::new(sets, ways);
    /// Least recently used.
    Lru(Lru) = "lru", new: |sets, ways, _| Lru::new(sets, ways);
    /// CLOCK (second chance).
    Clock(Clock) = "clock", new: |sets, ways, _| Clock::new(sets, ways);
    /// S3-FIFO: small FIFO (10 %), main FIFO, ghost FIFO (90 %), as libCacheSim's.
    S3Fifo(S3Fifo) = "s3fifo", new: S3Fifo::new;
    /// 2Q: A1in FIFO (25 %), A1out ghost (50 %), Am LRU, as libCacheSim's.
    TwoQ(TwoQ) = "2q" | "twoq", new: TwoQ::new;
    /// Least frequently recently used: LRU privileged + LFU unprivileged partition.
    Lfru(Lfru) = "lfru", new: Lfru::new;
}

/// A small xorshift generator for the policies' randomized tests:
/// `rand(n)` is in `0..n`.
#[cfg(test)]
pub(crate) fn test_rng(mut seed: u64) -> impl FnMut(u64) -> u64 {
    move |n| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn share_rounds_down_and_clamps() {
        assert_eq!(share(4, 0.10, 1), 1);
        assert_eq!(share(100, 0.10, 1), 10);
        assert_eq!(share(8, 0.25, 1), 2);
        assert_eq!(share(8, 0.0, 0), 0);
        assert_eq!(share(8, 1.0, 0), 8);
        assert_eq!(share(8, f64::NAN, 1), 1);
        assert_eq!(share(0, 0.5, 1), 0);
    }

    /// A hit the policy calls settled (`hit_settled`) changes no later
    /// decision: at every step of a random run of inserts, hits and
    /// evictions on one set, for each tracked slot it calls settled, the
    /// set's whole eviction order (drained) is the same with one more hit
    /// on that slot as without. Each of CLOCK, S3-FIFO and LFRU calls some
    /// slots settled and some not.
    #[test]
    fn a_hit_called_settled_changes_no_eviction_order() {
        let drained = |p: &Policy, f: &[Frame]| {
            let (mut p, mut f, mut out) = (p.clone(), f.to_vec(), Vec::new());
            p.drain_set(&mut f, 0, &mut out);
            out
        };
        let mut params = PolicyParams::default();
        for (kind, threshold, ratio) in [
            (PolicyKind::Clock, 1, 0.5),
            (PolicyKind::S3Fifo, 1, 0.5),
            (PolicyKind::S3Fifo, 5, 0.5),
            (PolicyKind::Lfru, 2, 0.5),
            (PolicyKind::Lfru, 9, 0.25),
        ] {
            params.s3fifo_move_to_main_threshold = threshold;
            params.lfru_promote_threshold = threshold;
            params.lfru_privileged_ratio = ratio;
            let ways = 8u32;
            let mut p = Policy::new(kind, &params, 1, ways);
            let f = &mut vec![Frame::free(crate::slot::NIL); ways as usize][..];
            let mut tracked: Vec<SlotId> = Vec::new();
            let mut rng = test_rng(41);
            let (mut settled, mut unsettled) = (0, 0);
            for step in 0..3_000 {
                for &slot in &tracked {
                    if !p.hit_settled(f, 0, slot) {
                        unsettled += 1;
                        continue;
                    }
                    settled += 1;
                    let mut q = p.clone();
                    let mut g = f.to_vec();
                    q.on_hit(&mut g, 0, slot);
                    assert_eq!(
                        drained(&q, &g),
                        drained(&p, f),
                        "{kind} step {step} slot {slot}"
                    );
                }
                let free = (0..ways).find(|s| !tracked.contains(s));
                match (rng(4), free) {
                    (0, Some(slot)) => {
                        p.on_insert(f, 0, slot, u64::from(slot), rng(3) == 0);
                        tracked.push(slot);
                    }
                    (1, _) | (_, None) if !tracked.is_empty() && rng(3) == 0 => {
                        if let Some(v) = p.evict(f, 0) {
                            tracked.retain(|&s| s != v.slot);
                        }
                    }
                    _ if !tracked.is_empty() => {
                        let slot = tracked[rng(tracked.len() as u64) as usize];
                        p.on_hit(f, 0, slot);
                    }
                    _ => {}
                }
            }
            assert!(
                settled > 100 && unsettled > 100,
                "{kind}: {settled} / {unsettled}"
            );
        }
    }

    /// Every policy, driven directly: a full set always yields a victim,
    /// victims are tracked slots, and draining returns every tracked slot.
    #[test]
    fn every_policy_evicts_tracked_slots_only() {
        let params = PolicyParams::default();
        for kind in PolicyKind::ALL {
            let (sets, ways) = (3u32, 5u32);
            let mut p = Policy::new(kind, &params, sets, ways);
            let f = &mut vec![Frame::free(crate::slot::NIL); (sets * ways) as usize][..];
            assert_eq!(p.kind(), kind);
            for set in 0..sets {
                for w in 0..ways {
                    let slot = set * ways + w;
                    p.on_insert(f, set, slot, u64::from(slot), w == 3);
                    if w % 2 == 0 {
                        p.on_hit(f, set, slot);
                        p.on_hit(f, set, slot);
                    }
                }
                assert_eq!(p.tracked(set), ways);
            }
            p.on_remove(f, 1, 7);
            assert_eq!(p.tracked(1), ways - 1);
            let v = p.evict(f, 2).unwrap();
            assert!((10..15).contains(&v.slot), "{kind}: {v:?}");
            let mut out = Vec::new();
            p.drain_set(f, 1, &mut out);
            out.sort_unstable();
            assert_eq!(out, vec![5, 6, 8, 9], "{kind}");
            assert_eq!(p.tracked(1), 0);
            assert_eq!(p.evict(f, 1), None);
        }
    }
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for PolicyKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let norm = s.trim().to_ascii_lowercase().replace(['-', '_'], "");
        let Some(kind) = PolicyKind::ALL
            .into_iter()
            .find(|k| k.name() == norm || k.aliases().contains(&norm.as_str()))
        else {
            let names: Vec<_> = PolicyKind::ALL.iter().map(|p| p.name()).collect();
            return Err(format!(
                "unknown policy `{s}` (known: {})",
                names.join(", ")
            ));
        };
        Ok(kind)
    }
}

/// Tuning knobs of the policies that have any. Ratios are of a set's ways
/// (of the whole cache when fully associative), rounded down as libCacheSim
/// does; names and defaults follow libCacheSim's parameters where it has
/// the policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyParams {
    /// S3-FIFO: share of each set's ways for the small FIFO S
    /// (libCacheSim `small-size-ratio`, 0.10); M gets the rest.
    pub s3fifo_small_ratio: f64,
    /// S3-FIFO: ghost FIFO G entries as a share of each set's ways
    /// (libCacheSim `ghost-size-ratio`, 0.90; at most 4).
    #[serde(default = "default_s3fifo_ghost_ratio")]
    pub s3fifo_ghost_ratio: f64,
    /// S3-FIFO: hits while in S needed to move to M instead of being evicted
    /// when S's tail comes up (libCacheSim `move-to-main-threshold`, 2; at
    /// most 127).
    pub s3fifo_move_to_main_threshold: u8,
    /// 2Q: share of capacity for the A1in FIFO, Kin (libCacheSim
    /// `Ain-size-ratio`, 0.25).
    pub twoq_kin_ratio: f64,
    /// 2Q: ghost A1out entries as a share of capacity, Kout (libCacheSim
    /// `Aout-size-ratio`, 0.50).
    pub twoq_kout_ratio: f64,
    /// LFRU: share of capacity for the privileged (LRU) partition.
    pub lfru_privileged_ratio: f64,
    /// LFRU: hits in the unprivileged partition needed for promotion.
    pub lfru_promote_threshold: u8,
}

fn default_s3fifo_ghost_ratio() -> f64 {
    0.90
}

impl Default for PolicyParams {
    fn default() -> Self {
        PolicyParams {
            s3fifo_small_ratio: 0.10,
            s3fifo_ghost_ratio: default_s3fifo_ghost_ratio(),
            s3fifo_move_to_main_threshold: 2,
            twoq_kin_ratio: 0.25,
            twoq_kout_ratio: 0.50,
            lfru_privileged_ratio: 0.50,
            lfru_promote_threshold: 2,
        }
    }
}
