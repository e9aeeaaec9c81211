//! uid/gid translation between guests and the host, with virtiofsd's
//! `--translate-uid` / `--translate-gid` syntax.
//!
//! Each rule is `TYPE:...` (numbers are decimal):
//!
//! | rule | guest → host | host → guest |
//! | --- | --- | --- |
//! | `guest:G:H:N` | `[G, G+N)` to `[H, H+N)` | — |
//! | `host:H:G:N` | — | `[H, H+N)` to `[G, G+N)` |
//! | `map:G:H:N` | `[G, G+N)` to `[H, H+N)` | `[H, H+N)` to `[G, G+N)` |
//! | `squash-guest:G:H:N` | all of `[G, G+N)` to `H` | — |
//! | `squash-host:H:G:N` | — | all of `[H, H+N)` to `G` |
//! | `forbid-guest:G:N` | `[G, G+N)` refused (`EPERM`) | — |
//!
//! As in virtiofsd, an id no rule covers passes unchanged, and two rules of
//! one direction may not overlap. Guest → host applies to the credentials a
//! request acts with and to the owner a guest sets (chown); host → guest
//! applies to the attributes guests see.

use std::fmt;

/// Why a `--translate-uid` / `--translate-gid` rule was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseIdMapError {
    /// The rule type is none of the known ones.
    #[error("`{rule}`: unknown type `{kind}` (guest, host, map, squash-guest, squash-host, forbid-guest)")]
    UnknownType {
        /// The rule.
        rule: String,
        /// Its type.
        kind: String,
    },
    /// Wrong number of `:`-separated fields.
    #[error("`{rule}`: expected {expected}")]
    Fields {
        /// The rule.
        rule: String,
        /// The expected shape.
        expected: &'static str,
    },
    /// A field is not a decimal u32.
    #[error("`{rule}`: `{field}` is not a number in 0..=4294967295")]
    Number {
        /// The rule.
        rule: String,
        /// The field.
        field: String,
        /// Why.
        #[source]
        source: std::num::ParseIntError,
    },
    /// A range of 0 ids, or one that runs past 4294967295.
    #[error("`{rule}`: the range must hold 1 or more ids and end at or below 4294967296")]
    Range {
        /// The rule.
        rule: String,
    },
    /// Two rules of one direction cover a common id.
    #[error("`{rule}`: its {direction} range overlaps an earlier rule's")]
    Overlap {
        /// The rule.
        rule: String,
        /// `guest-to-host` or `host-to-guest`.
        direction: &'static str,
    },
}

/// What a guest→host (or host→guest) range maps to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    /// `base + (id - start)`.
    Shift(u32),
    /// One id for the whole range.
    Squash(u32),
    /// Refused.
    Forbid,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Span {
    start: u32,
    /// Ids in the range (up to 2^32).
    count: u64,
    to: Target,
}

impl Span {
    fn end(&self) -> u64 {
        u64::from(self.start) + self.count
    }
    fn covers(&self, id: u32) -> bool {
        id >= self.start && u64::from(id) < self.end()
    }
    fn apply(&self, id: u32) -> Option<u32> {
        match self.to {
            // In range by construction: `id - start < count` and the target
            // range fits in u32 (checked at parse time).
            Target::Shift(base) => Some(base.wrapping_add(id - self.start)),
            Target::Squash(to) => Some(to),
            Target::Forbid => None,
        }
    }
}

/// The guest id is refused by a `forbid-guest` rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Forbidden;

/// One direction-pair of uid (or gid) translation rules.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IdMap {
    to_host: Vec<Span>,
    to_guest: Vec<Span>,
    rules: Vec<String>,
}

impl IdMap {
    /// Builds the map from rules in virtiofsd's syntax (see the module docs).
    pub fn parse<S: AsRef<str>>(rules: &[S]) -> Result<Self, ParseIdMapError> {
        let mut map = IdMap::default();
        for r in rules {
            map.add(r.as_ref())?;
        }
        Ok(map)
    }

    /// No rule: every id passes unchanged.
    pub fn is_identity(&self) -> bool {
        self.to_host.is_empty() && self.to_guest.is_empty()
    }

    /// The host id for guest id `id`; `Err` if a `forbid-guest` rule covers it.
    pub fn to_host(&self, id: u32) -> Result<u32, Forbidden> {
        match self.to_host.iter().find(|s| s.covers(id)) {
            Some(s) => s.apply(id).ok_or(Forbidden),
            None => Ok(id),
        }
    }

    /// The guest id for host id `id`.
    pub fn to_guest(&self, id: u32) -> u32 {
        self.to_guest
            .iter()
            .find(|s| s.covers(id))
            .and_then(|s| s.apply(id))
            .unwrap_or(id)
    }

    /// Whether some guest id is translated to host id `id` by a rule
    /// (`guest`, `map` or `squash-guest`): the host ids a guest's own
    /// mapped users own.
    pub fn is_guest_owned_host_id(&self, id: u32) -> bool {
        self.to_host.iter().any(|s| match s.to {
            Target::Shift(base) => id >= base && u64::from(id) < u64::from(base) + s.count,
            Target::Squash(to) => to == id,
            Target::Forbid => false,
        })
    }

    fn add(&mut self, rule: &str) -> Result<(), ParseIdMapError> {
        let fields: Vec<&str> = rule.split(':').collect();
        let (kind, nums) = fields.split_first().unwrap_or((&"", &[]));
        let number = |f: &str| {
            f.parse::<u32>().map_err(|source| ParseIdMapError::Number {
                rule: rule.to_owned(),
                field: f.to_owned(),
                source,
            })
        };
        let shape = |expected| ParseIdMapError::Fields {
            rule: rule.to_owned(),
            expected,
        };
        // (guest → host span, host → guest span)
        let (g2h, h2g) = match *kind {
            "forbid-guest" => {
                let [from, count] = nums else {
                    return Err(shape("forbid-guest:<guest base>:<count>"));
                };
                let (from, count) = (number(from)?, number(count)?);
                (Some((from, count, Target::Forbid)), None)
            }
            "guest" | "host" | "map" | "squash-guest" | "squash-host" => {
                let [a, b, count] = nums else {
                    return Err(shape("<type>:<source base>:<target base>:<count>"));
                };
                let (a, b, count) = (number(a)?, number(b)?, number(count)?);
                match *kind {
                    "guest" => (Some((a, count, Target::Shift(b))), None),
                    "host" => (None, Some((a, count, Target::Shift(b)))),
                    "map" => (
                        Some((a, count, Target::Shift(b))),
                        Some((b, count, Target::Shift(a))),
                    ),
                    "squash-guest" => (Some((a, count, Target::Squash(b))), None),
                    _ => (None, Some((a, count, Target::Squash(b)))),
                }
            }
            other => {
                return Err(ParseIdMapError::UnknownType {
                    rule: rule.to_owned(),
                    kind: other.to_owned(),
                })
            }
        };
        let span = |(start, count, to): (u32, u32, Target)| {
            let s = Span {
                start,
                count: u64::from(count),
                to,
            };
            let target_fits = match to {
                Target::Shift(base) => u64::from(base) + s.count <= 1 << 32,
                _ => true,
            };
            if count == 0 || s.end() > 1 << 32 || !target_fits {
                return Err(ParseIdMapError::Range {
                    rule: rule.to_owned(),
                });
            }
            Ok(s)
        };
        let g2h = g2h.map(span).transpose()?;
        let h2g = h2g.map(span).transpose()?;
        let overlaps = |list: &[Span], s: &Span| {
            list.iter()
                .any(|o| u64::from(s.start) < o.end() && u64::from(o.start) < s.end())
        };
        if let Some(s) = &g2h {
            if overlaps(&self.to_host, s) {
                return Err(ParseIdMapError::Overlap {
                    rule: rule.to_owned(),
                    direction: "guest-to-host",
                });
            }
        }
        if let Some(s) = &h2g {
            if overlaps(&self.to_guest, s) {
                return Err(ParseIdMapError::Overlap {
                    rule: rule.to_owned(),
                    direction: "host-to-guest",
                });
            }
        }
        self.to_host.extend(g2h);
        self.to_guest.extend(h2g);
        self.rules.push(rule.to_owned());
        Ok(())
    }
}

impl fmt::Display for IdMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.rules.is_empty() {
            return f.write_str("identity");
        }
        f.write_str(&self.rules.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_is_both_ways_and_the_rest_passes_unchanged() {
        let m = IdMap::parse(&["map:0:100000:65536"]).unwrap();
        assert_eq!(m.to_host(0), Ok(100_000));
        assert_eq!(m.to_host(1000), Ok(101_000));
        assert_eq!(m.to_host(65_535), Ok(165_535));
        assert_eq!(m.to_host(65_536), Ok(65_536));
        assert_eq!(m.to_guest(100_000), 0);
        assert_eq!(m.to_guest(0), 0);
        assert_eq!(m.to_guest(165_536), 165_536);
        assert!(m.is_guest_owned_host_id(100_000));
        assert!(!m.is_guest_owned_host_id(0));
        assert!(IdMap::default().is_identity());
    }

    #[test]
    fn squash_one_way_and_forbid() {
        let m = IdMap::parse(&[
            "squash-guest:0:1000:1",
            "forbid-guest:1:999",
            "squash-host:0:65534:1",
            "guest:5000:7000:10",
            "host:9000:3000:2",
        ])
        .unwrap();
        assert_eq!(m.to_host(0), Ok(1000));
        assert_eq!(m.to_host(1), Err(Forbidden));
        assert_eq!(m.to_host(999), Err(Forbidden));
        assert_eq!(m.to_host(1000), Ok(1000));
        assert_eq!(m.to_host(5009), Ok(7009));
        assert_eq!(m.to_guest(0), 65_534);
        assert_eq!(m.to_guest(7009), 7009, "guest: is one way");
        assert_eq!(m.to_guest(9001), 3001);
        assert!(m.is_guest_owned_host_id(1000));
        assert!(m.is_guest_owned_host_id(7000));
        assert!(!m.is_guest_owned_host_id(9000));
    }

    #[test]
    fn whole_id_space_fits_but_not_more() {
        let m = IdMap::parse(&["squash-guest:0:4242:4294967295"]).unwrap();
        assert_eq!(m.to_host(u32::MAX - 1), Ok(4242));
        assert_eq!(m.to_host(u32::MAX), Ok(u32::MAX));
        assert!(IdMap::parse(&["forbid-guest:1:4294967295"]).is_ok());
        assert!(matches!(
            IdMap::parse(&["forbid-guest:2:4294967295"]),
            Err(ParseIdMapError::Range { .. })
        ));
        assert!(matches!(
            IdMap::parse(&["map:0:4294967000:1000"]),
            Err(ParseIdMapError::Range { .. })
        ));
    }

    #[test]
    fn bad_rules_are_refused_with_a_reason() {
        let err = |r: &str| IdMap::parse(&[r]).unwrap_err();
        assert!(matches!(
            err("rot13:1:2:3"),
            ParseIdMapError::UnknownType { .. }
        ));
        assert!(matches!(err(""), ParseIdMapError::UnknownType { .. }));
        assert!(matches!(err("map:1:2"), ParseIdMapError::Fields { .. }));
        assert!(matches!(
            err("forbid-guest:1:2:3"),
            ParseIdMapError::Fields { .. }
        ));
        assert!(matches!(err("map:-1:2:3"), ParseIdMapError::Number { .. }));
        assert!(matches!(err("map:1:x:3"), ParseIdMapError::Number { .. }));
        assert!(matches!(err("map:1:2:0"), ParseIdMapError::Range { .. }));
        let e = IdMap::parse(&["map:0:1000:10", "guest:5:0:1"]).unwrap_err();
        assert!(matches!(
            e,
            ParseIdMapError::Overlap {
                direction: "guest-to-host",
                ..
            }
        ));
        let e = IdMap::parse(&["map:0:1000:10", "host:1009:0:1"]).unwrap_err();
        assert!(matches!(
            e,
            ParseIdMapError::Overlap {
                direction: "host-to-guest",
                ..
            }
        ));
        // Adjacent ranges do not overlap.
        assert!(IdMap::parse(&["map:0:1000:10", "map:10:2000:10"]).is_ok());
        assert!(err("map:1:2:0").to_string().contains("map:1:2:0"));
    }
}
