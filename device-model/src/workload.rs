//! Synthetic workload generators.
//!
//! A [`WorkloadSpec`] describes a stream of accesses over a working set of
//! `wss_bytes` starting at `base_addr`; [`WorkloadSpec::generate`] turns it
//! into a [`Workload`], an iterator of [`Access`]es with `time_ns = 0` (the
//! replay driver assigns arrival times). Generation is pure and
//! deterministic: the same spec (seed included) gives the same sequence.
//!
//! Kinds ([`WorkloadKind`], parsed from strings):
//!
//! * `seq` — addresses `0, s, 2s, …` (`s` = access size), wrapping at the
//!   working set. One pass visits every `s`-sized slot once.
//! * `stride:STEP` (`STEP` accepts units: `stride:4KiB`) — a *lap* visits
//!   `o, o+STEP, o+2·STEP, …` while the access fits in the working set; lap
//!   `k` starts at offset `o = (k mod STEP/s)·s`, so after `STEP/s` laps every
//!   slot has been visited (when `STEP` is a multiple of `s`). One pass is one
//!   lap. With `STEP` = 1 KiB and `s` = 64 B, a cold lap touches each 4 KiB
//!   page four times in a row: one miss and three hits (Cylon's stride test).
//! * `uniform` — a page (4 KiB, or the access size rounded up to pages if
//!   larger) drawn uniformly from the working set, then an `s`-aligned
//!   offset drawn uniformly within it. One pass = as many accesses as pages.
//! * `zipf:THETA` (`THETA` ≥ 0; 0 is uniform) — the page's popularity rank is
//!   drawn from a Zipf distribution over the pages, then mapped to a page by
//!   a seeded bijective [`Permutation`] so that hot pages are scattered over
//!   the working set rather than packed at its start; offset as for
//!   `uniform`.
//! * `pointer-chase` — a dependent walk that visits every `s`-sized slot
//!   exactly once per pass, in a permuted order (the same cycle each pass),
//!   computed on the fly by [`Permutation`] in O(1) memory. Replay it with
//!   closed-loop arrival to model dependent loads.
//!
//! Each access is independently a write with probability `write_ratio`, drawn
//! from its own random stream so that the addresses do not depend on the
//! write ratio.

use crate::device::Op;
use crate::trace::Access;
use crate::units::parse_size;
use crate::PAGE_SIZE;
use rand::{RngCore, SeedableRng};
use rand_distr::{Distribution, Zipf};
use rand_pcg::Pcg64Mcg;
use serde::{Serialize, Serializer};
use std::fmt;
use std::str::FromStr;

/// The shape of a synthetic workload.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum WorkloadKind {
    /// Sequential scan.
    Seq,
    /// Strided scan with a step in bytes.
    Stride {
        /// Distance between consecutive accesses, in bytes.
        step: u64,
    },
    /// Uniformly random pages.
    Uniform,
    /// Zipf-distributed page popularity, hot pages scattered.
    Zipf {
        /// Skew exponent (0 = uniform, 0.99 = the YCSB default).
        theta: f64,
    },
    /// A random cycle over every slot.
    PointerChase,
}

impl WorkloadKind {
    /// The kinds by name, for help texts.
    pub const NAMES: &'static str = "seq, stride:STEP, uniform, zipf:THETA, pointer-chase";
}

impl fmt::Display for WorkloadKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WorkloadKind::Seq => f.write_str("seq"),
            WorkloadKind::Stride { step } => write!(f, "stride:{step}"),
            WorkloadKind::Uniform => f.write_str("uniform"),
            WorkloadKind::Zipf { theta } => write!(f, "zipf:{theta}"),
            WorkloadKind::PointerChase => f.write_str("pointer-chase"),
        }
    }
}

impl Serialize for WorkloadKind {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Why a workload kind string could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseWorkloadKindError {
    /// A name that is not a known kind.
    #[error(
        "unknown workload `{0}` (known: seq, stride:STEP, uniform, zipf:THETA, pointer-chase)"
    )]
    Unknown(String),
    /// `stride` without a step, or a step that is not a size.
    #[error("bad stride step in `{input}`: {reason}")]
    BadStride {
        /// The whole kind string.
        input: String,
        /// What was wrong.
        reason: String,
    },
    /// `zipf` without theta, or a theta that is not a number ≥ 0.
    #[error("bad zipf theta in `{input}`: expected a number >= 0, e.g. zipf:0.99")]
    BadTheta {
        /// The whole kind string.
        input: String,
    },
}

impl FromStr for WorkloadKind {
    type Err = ParseWorkloadKindError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let text = s.trim();
        let (name, arg) = match text.split_once(':') {
            Some((n, a)) => (n.trim(), Some(a.trim())),
            None => (text, None),
        };
        let name = name.to_ascii_lowercase().replace('_', "-");
        match (name.as_str(), arg) {
            ("seq" | "sequential", None) => Ok(WorkloadKind::Seq),
            ("uniform" | "random", None) => Ok(WorkloadKind::Uniform),
            ("pointer-chase" | "pointerchase" | "chase", None) => Ok(WorkloadKind::PointerChase),
            ("stride", Some(arg)) => {
                let step = parse_size(arg).map_err(|e| ParseWorkloadKindError::BadStride {
                    input: text.to_string(),
                    reason: e.reason,
                })?;
                if step == 0 {
                    return Err(ParseWorkloadKindError::BadStride {
                        input: text.to_string(),
                        reason: "step must be > 0".to_string(),
                    });
                }
                Ok(WorkloadKind::Stride { step })
            }
            ("stride", None) => Err(ParseWorkloadKindError::BadStride {
                input: text.to_string(),
                reason: "missing step, e.g. stride:1KiB".to_string(),
            }),
            ("zipf", Some(arg)) => match arg.parse::<f64>() {
                Ok(theta) if theta.is_finite() && theta >= 0.0 => Ok(WorkloadKind::Zipf { theta }),
                _ => Err(ParseWorkloadKindError::BadTheta {
                    input: text.to_string(),
                }),
            },
            ("zipf", None) => Err(ParseWorkloadKindError::BadTheta {
                input: text.to_string(),
            }),
            _ => Err(ParseWorkloadKindError::Unknown(text.to_string())),
        }
    }
}

/// A complete description of a synthetic workload.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorkloadSpec {
    /// Access pattern.
    pub kind: WorkloadKind,
    /// Working-set size in bytes.
    pub wss_bytes: u64,
    /// Total accesses; `None`: `passes` × [`WorkloadSpec::accesses_per_pass`].
    pub accesses: Option<u64>,
    /// Passes over the working set when `accesses` is `None`.
    pub passes: u64,
    /// Seed of the random streams.
    pub seed: u64,
    /// Probability that an access is a write, in `[0, 1]`.
    pub write_ratio: f64,
    /// Bytes per access.
    pub access_size: u32,
    /// First byte of the working set on the device.
    pub base_addr: u64,
}

impl Default for WorkloadSpec {
    fn default() -> Self {
        WorkloadSpec {
            kind: WorkloadKind::Uniform,
            wss_bytes: 1 << 30,
            accesses: None,
            passes: 1,
            seed: 1,
            write_ratio: 0.0,
            access_size: 64,
            base_addr: 0,
        }
    }
}

/// Why a [`WorkloadSpec`] cannot generate accesses.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BuildWorkloadError {
    /// `access_size` is 0 or too large for a trace record.
    #[error("access size must be between 1 and 2^31-1 bytes, got {0}")]
    BadAccessSize(u32),
    /// The working set cannot hold a single access.
    #[error("working set of {wss} bytes is smaller than one access of {access_size} bytes")]
    WssTooSmall {
        /// Working-set size.
        wss: u64,
        /// Access size.
        access_size: u32,
    },
    /// `base_addr + wss_bytes` overflows.
    #[error("base address {base:#x} + working set {wss} overflows 64 bits")]
    Overflow {
        /// Base address.
        base: u64,
        /// Working-set size.
        wss: u64,
    },
    /// `write_ratio` is outside `[0, 1]`.
    #[error("write ratio must be within 0..=1, got {0}")]
    BadWriteRatio(f64),
    /// A stride step smaller than the access size.
    #[error("stride step {step} is smaller than the access size {access_size}")]
    StrideTooSmall {
        /// Step.
        step: u64,
        /// Access size.
        access_size: u32,
    },
    /// A Zipf theta that is negative or not a number.
    #[error("zipf theta must be a number >= 0, got {0}")]
    BadTheta(f64),
}

/// Page-granular layout used by `uniform` and `zipf`: `items` blocks of
/// `item_size` bytes, each holding `slots` access-size slots.
#[derive(Debug, Clone, Copy)]
struct Items {
    items: u64,
    item_size: u64,
    slots: u64,
}

impl WorkloadSpec {
    fn items(&self) -> Items {
        let size = u64::from(self.access_size.max(1));
        let item_size = size.div_ceil(PAGE_SIZE) * PAGE_SIZE;
        let items = self.wss_bytes / item_size;
        if items == 0 {
            // Working set smaller than a page: one item covering it.
            let slots = (self.wss_bytes / size).max(1);
            return Items {
                items: 1,
                item_size: self.wss_bytes,
                slots,
            };
        }
        Items {
            items,
            item_size,
            slots: (item_size / size).max(1),
        }
    }

    fn slots(&self) -> u64 {
        self.wss_bytes / u64::from(self.access_size.max(1))
    }

    /// Checks the spec; every generator needs it to hold.
    pub fn validate(&self) -> Result<(), BuildWorkloadError> {
        if self.access_size == 0 || self.access_size > crate::trace::MAX_LEN {
            return Err(BuildWorkloadError::BadAccessSize(self.access_size));
        }
        if self.wss_bytes < u64::from(self.access_size) {
            return Err(BuildWorkloadError::WssTooSmall {
                wss: self.wss_bytes,
                access_size: self.access_size,
            });
        }
        if self.base_addr.checked_add(self.wss_bytes).is_none() {
            return Err(BuildWorkloadError::Overflow {
                base: self.base_addr,
                wss: self.wss_bytes,
            });
        }
        if !(0.0..=1.0).contains(&self.write_ratio) {
            return Err(BuildWorkloadError::BadWriteRatio(self.write_ratio));
        }
        match self.kind {
            WorkloadKind::Stride { step } if step < u64::from(self.access_size) => {
                Err(BuildWorkloadError::StrideTooSmall {
                    step,
                    access_size: self.access_size,
                })
            }
            WorkloadKind::Zipf { theta } if !(theta.is_finite() && theta >= 0.0) => {
                Err(BuildWorkloadError::BadTheta(theta))
            }
            _ => Ok(()),
        }
    }

    /// Accesses in one pass: pages for `uniform` / `zipf`; slots for `seq`
    /// and `pointer-chase`; one lap for `stride`.
    pub fn accesses_per_pass(&self) -> u64 {
        let size = u64::from(self.access_size.max(1));
        match self.kind {
            WorkloadKind::Seq | WorkloadKind::PointerChase => self.slots(),
            WorkloadKind::Stride { step } => {
                if self.wss_bytes < size {
                    0
                } else {
                    (self.wss_bytes - size) / step.max(1) + 1
                }
            }
            WorkloadKind::Uniform | WorkloadKind::Zipf { .. } => self.items().items,
        }
    }

    /// Accesses the generator will yield.
    pub fn total_accesses(&self) -> u64 {
        self.accesses
            .unwrap_or_else(|| self.accesses_per_pass().saturating_mul(self.passes))
    }

    /// One past the last byte the workload can touch.
    pub fn end_addr(&self) -> u64 {
        self.base_addr.saturating_add(self.wss_bytes)
    }

    /// Builds the generator.
    pub fn generate(&self) -> Result<Workload, BuildWorkloadError> {
        self.validate()?;
        let size = u64::from(self.access_size);
        let mut seeder = SplitMix64(self.seed);
        let addr_rng = Pcg64Mcg::seed_from_u64(seeder.next());
        let write_rng = Pcg64Mcg::seed_from_u64(seeder.next());
        let perm_seed = seeder.next();
        let gen = match self.kind {
            WorkloadKind::Seq => Gen::Seq {
                next: 0,
                slots: self.slots(),
            },
            WorkloadKind::Stride { step } => Gen::Stride {
                cur: 0,
                lap: 0,
                laps: (step / size).max(1),
                step,
                last_start: self.wss_bytes - size,
            },
            WorkloadKind::Uniform => Gen::Uniform {
                rng: addr_rng,
                items: self.items(),
            },
            WorkloadKind::Zipf { theta } => {
                let items = self.items();
                let zipf = Zipf::new(items.items as f64, theta)
                    .map_err(|_| BuildWorkloadError::BadTheta(theta))?;
                Gen::Zipf {
                    rng: addr_rng,
                    zipf,
                    perm: Permutation::new(items.items, perm_seed),
                    items,
                }
            }
            WorkloadKind::PointerChase => {
                let slots = self.slots();
                Gen::PointerChase {
                    perm: Permutation::new(slots, perm_seed),
                    next: 0,
                    slots,
                }
            }
        };
        let writes = if self.write_ratio <= 0.0 {
            Writes::Never
        } else if self.write_ratio >= 1.0 {
            Writes::Always
        } else {
            // P(draw < threshold) = threshold / 2^64 = write_ratio.
            let threshold = (self.write_ratio * 18_446_744_073_709_551_616.0) as u64;
            Writes::Random {
                rng: write_rng,
                threshold,
            }
        };
        Ok(Workload {
            gen,
            writes,
            remaining: self.total_accesses(),
            base: self.base_addr,
            size,
            len: self.access_size,
        })
    }
}

impl fmt::Display for WorkloadSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} wss={} accesses={} access_size={} seed={} write_ratio={}",
            self.kind,
            crate::units::format_size(self.wss_bytes),
            self.total_accesses(),
            self.access_size,
            self.seed,
            self.write_ratio
        )?;
        if self.base_addr != 0 {
            write!(f, " base={:#x}", self.base_addr)?;
        }
        Ok(())
    }
}

/// SplitMix64: derives independent seeds from one.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// A seeded bijection of `[0, n)` onto itself, computed in O(1) time and
/// memory: a keyed mixing function (xor, odd multiply, xorshift — each a
/// bijection on `k`-bit integers) on the next power of two `2^k ≥ n`, with
/// cycle walking to stay below `n` (fewer than two rounds on average).
#[derive(Debug, Clone)]
pub struct Permutation {
    n: u64,
    mask: u64,
    shift: u32,
    keys: [u64; 4],
}

impl Permutation {
    /// A permutation of `[0, n)` chosen by `seed` (`n` = 0 is treated as 1).
    pub fn new(n: u64, seed: u64) -> Self {
        let n = n.max(1);
        let bits = 64 - (n - 1).leading_zeros();
        let mask = if bits >= 64 {
            u64::MAX
        } else {
            (1u64 << bits) - 1
        };
        let mut seeder = SplitMix64(seed);
        let keys = [
            seeder.next(),
            seeder.next() | 1,
            seeder.next() | 1,
            seeder.next(),
        ];
        Permutation {
            n,
            mask,
            shift: (bits / 2).max(1),
            keys,
        }
    }

    /// Size of the domain.
    pub fn len(&self) -> u64 {
        self.n
    }

    /// Always false: the domain holds at least one element.
    pub fn is_empty(&self) -> bool {
        false
    }

    #[inline]
    fn round(&self, x: u64) -> u64 {
        let m = self.mask;
        let mut x = (x ^ self.keys[0]) & m;
        x = x.wrapping_mul(self.keys[1]) & m;
        x ^= x >> self.shift;
        x = x.wrapping_mul(self.keys[2]) & m;
        x ^= x >> self.shift;
        x.wrapping_add(self.keys[3]) & m
    }

    /// The image of `i` (`i` must be below [`Permutation::len`]; larger
    /// values are reduced modulo it).
    #[inline]
    pub fn apply(&self, i: u64) -> u64 {
        let mut x = if i < self.n { i } else { i % self.n };
        loop {
            x = self.round(x);
            if x < self.n {
                return x;
            }
        }
    }
}

#[derive(Debug, Clone)]
enum Gen {
    Seq {
        next: u64,
        slots: u64,
    },
    Stride {
        cur: u64,
        lap: u64,
        laps: u64,
        step: u64,
        last_start: u64,
    },
    Uniform {
        rng: Pcg64Mcg,
        items: Items,
    },
    Zipf {
        rng: Pcg64Mcg,
        zipf: Zipf<f64>,
        perm: Permutation,
        items: Items,
    },
    PointerChase {
        perm: Permutation,
        next: u64,
        slots: u64,
    },
}

#[derive(Debug, Clone)]
enum Writes {
    Never,
    Always,
    Random { rng: Pcg64Mcg, threshold: u64 },
}

/// `(x * n) >> 64`: maps a uniform 64-bit draw onto `[0, n)`; the low half is
/// returned too, as a fresh uniform fraction for a second choice.
#[inline]
fn scale(x: u64, n: u64) -> (u64, u64) {
    let wide = u128::from(x) * u128::from(n);
    ((wide >> 64) as u64, wide as u64)
}

/// The iterator built by [`WorkloadSpec::generate`].
#[derive(Debug, Clone)]
pub struct Workload {
    gen: Gen,
    writes: Writes,
    remaining: u64,
    base: u64,
    size: u64,
    len: u32,
}

impl Workload {
    /// Offset (from the base) of the next access.
    #[inline]
    fn next_offset(&mut self) -> u64 {
        let size = self.size;
        match &mut self.gen {
            Gen::Seq { next, slots } => {
                let slot = *next;
                *next += 1;
                if *next == *slots {
                    *next = 0;
                }
                slot * size
            }
            Gen::Stride {
                cur,
                lap,
                laps,
                step,
                last_start,
            } => {
                let offset = *cur;
                match cur.checked_add(*step) {
                    Some(n) if n <= *last_start => *cur = n,
                    _ => {
                        // Next lap, shifted by one access-size slot.
                        *lap += 1;
                        if *lap == *laps {
                            *lap = 0;
                        }
                        let start = *lap * size;
                        if start > *last_start {
                            *lap = 0;
                            *cur = 0;
                        } else {
                            *cur = start;
                        }
                    }
                }
                offset
            }
            Gen::Uniform { rng, items } => {
                let (item, frac) = scale(rng.next_u64(), items.items);
                let (slot, _) = scale(frac, items.slots);
                item * items.item_size + slot * size
            }
            Gen::Zipf {
                rng,
                zipf,
                perm,
                items,
            } => {
                let rank = zipf.sample(rng) as u64;
                let rank = rank.clamp(1, items.items) - 1;
                let item = perm.apply(rank);
                let slot = if items.slots > 1 {
                    scale(rng.next_u64(), items.slots).0
                } else {
                    0
                };
                item * items.item_size + slot * size
            }
            Gen::PointerChase { perm, next, slots } => {
                let slot = perm.apply(*next);
                *next += 1;
                if *next == *slots {
                    *next = 0;
                }
                slot * size
            }
        }
    }

    #[inline]
    fn next_op(&mut self) -> Op {
        match &mut self.writes {
            Writes::Never => Op::Read,
            Writes::Always => Op::Write,
            Writes::Random { rng, threshold } => {
                if rng.next_u64() < *threshold {
                    Op::Write
                } else {
                    Op::Read
                }
            }
        }
    }
}

impl Iterator for Workload {
    type Item = Access;

    #[inline]
    fn next(&mut self) -> Option<Access> {
        if self.remaining == 0 {
            return None;
        }
        self.remaining -= 1;
        let offset = self.next_offset();
        let op = self.next_op();
        Some(Access {
            time_ns: 0,
            op,
            addr: self.base + offset,
            len: self.len,
        })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        match usize::try_from(self.remaining) {
            Ok(n) => (n, Some(n)),
            Err(_) => (usize::MAX, None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permutation_is_a_bijection() {
        for n in [1u64, 2, 3, 7, 8, 9, 1000, 4097] {
            let p = Permutation::new(n, 42);
            let mut seen = vec![false; n as usize];
            for i in 0..n {
                let j = p.apply(i);
                assert!(j < n);
                assert!(!seen[j as usize], "n={n} collision at {j}");
                seen[j as usize] = true;
            }
        }
    }

    #[test]
    fn kinds_parse_and_print() {
        for text in [
            "seq",
            "stride:1024",
            "uniform",
            "zipf:0.99",
            "pointer-chase",
        ] {
            let kind: WorkloadKind = text.parse().unwrap();
            assert_eq!(kind.to_string(), text);
        }
        assert_eq!(
            "stride:4KiB".parse::<WorkloadKind>().unwrap(),
            WorkloadKind::Stride { step: 4096 }
        );
        assert!("zipf:-1".parse::<WorkloadKind>().is_err());
        assert!("stride".parse::<WorkloadKind>().is_err());
        assert!("bogus".parse::<WorkloadKind>().is_err());
    }
}
