//! Ghost queues: per set, a FIFO of the page numbers of recent victims, as
//! libCacheSim's S3-FIFO and 2Q keep them (a `FIFO` cache of object ids with
//! a capacity in objects; a ghost hit *removes* its entry, so the older
//! entries stay longer).
//!
//! Entries are nodes of a pool of `sets * per_set` records, `per_set` per
//! set; a node is 16 bytes (its page and its two links), so looking a ghost
//! up, unlinking it and reusing it each touch one cache line. The cache
//! stores the node number of a ghost page in its page table (see
//! [`crate::cache`]); [`GhostQueues::holds`] confirms it, so a page-table
//! entry left behind by a node that has since been reused for another page
//! (a page pushed out of a full FIFO keeps its stale entry) is never taken
//! for a ghost.

/// "No node" in links and heads.
const NIL: u32 = u32::MAX;
/// `prev` of a node that holds no ghost (never used, or removed).
const DEAD: u32 = u32::MAX - 1;

/// Largest number of nodes a pool may have (node numbers stay below the
/// sentinels).
pub(crate) const MAX_NODES: u64 = DEAD as u64;

/// One ghost: a page and its links (`prev` toward newer entries, `next`
/// toward older ones).
#[derive(Debug, Clone, Copy)]
struct Node {
    page: u64,
    prev: u32,
    next: u32,
}

const UNUSED: Node = Node {
    page: 0,
    prev: DEAD,
    next: NIL,
};

/// Per-set FIFO state.
#[derive(Debug, Clone, Copy)]
struct Queue {
    /// Newest entry.
    newest: u32,
    /// Oldest entry (the next one pushed out).
    oldest: u32,
    len: u32,
    /// Stack of removed nodes, linked through `next`.
    free: u32,
    /// Nodes `set * per_set .. + fresh` have been handed out at least once.
    fresh: u32,
}

const EMPTY: Queue = Queue {
    newest: NIL,
    oldest: NIL,
    len: 0,
    free: NIL,
    fresh: 0,
};

/// The ghost FIFOs of every set of a cache.
#[derive(Debug, Clone)]
pub(crate) struct GhostQueues {
    per_set: u32,
    nodes: Vec<Node>,
    queues: Vec<Queue>,
}

impl GhostQueues {
    /// FIFOs of `per_set` entries for `sets` sets (`per_set` = 0: none; the
    /// caller keeps `sets * per_set` within [`MAX_NODES`]).
    pub(crate) fn new(sets: u32, per_set: u32) -> Self {
        let total = u64::from(sets) * u64::from(per_set);
        debug_assert!(total <= MAX_NODES, "ghost pool too large");
        GhostQueues {
            per_set,
            nodes: vec![UNUSED; total as usize],
            queues: if per_set == 0 {
                Vec::new()
            } else {
                vec![EMPTY; sets as usize]
            },
        }
    }

    /// Entries per set.
    #[cfg(test)]
    pub(crate) fn capacity(&self) -> u32 {
        self.per_set
    }

    /// Total number of nodes (node numbers are below it).
    #[inline]
    pub(crate) fn nodes(&self) -> u32 {
        self.nodes.len() as u32
    }

    /// Is `node` the live ghost of `page`?
    #[inline]
    pub(crate) fn holds(&self, node: u32, page: u64) -> bool {
        self.nodes
            .get(node as usize)
            .is_some_and(|n| n.prev != DEAD && n.page == page)
    }

    /// Entries of `set` now.
    #[cfg(test)]
    pub(crate) fn len(&self, set: u32) -> u32 {
        self.queues.get(set as usize).map_or(0, |q| q.len)
    }

    /// Appends `page` as the newest ghost of `set`, pushing out the oldest
    /// one if the FIFO is full. Returns the node now holding `page` and the
    /// page pushed out, if any; `None` when the capacity is 0.
    #[inline]
    pub(crate) fn push(&mut self, set: u32, page: u64) -> Option<(u32, Option<u64>)> {
        if self.per_set == 0 {
            return None;
        }
        let base = set * self.per_set;
        let q = self.queues[set as usize];
        let (node, pushed_out) = if q.len == self.per_set {
            let old = q.oldest;
            let pushed_out = self.nodes[old as usize].page;
            self.unlink(set, old);
            (old, Some(pushed_out))
        } else if q.free != NIL {
            let node = q.free;
            self.queues[set as usize].free = self.nodes[node as usize].next;
            (node, None)
        } else {
            self.queues[set as usize].fresh += 1;
            (base + q.fresh, None)
        };
        let q = &mut self.queues[set as usize];
        let newer_end = q.newest;
        q.newest = node;
        if newer_end == NIL {
            q.oldest = node;
        }
        q.len += 1;
        self.nodes[node as usize] = Node {
            page,
            prev: NIL,
            next: newer_end,
        };
        if newer_end != NIL {
            self.nodes[newer_end as usize].prev = node;
        }
        Some((node, pushed_out))
    }

    /// Takes the live `node` of `set` out of its FIFO (a ghost hit).
    #[inline]
    pub(crate) fn remove(&mut self, set: u32, node: u32) {
        self.unlink(set, node);
        let q = &mut self.queues[set as usize];
        self.nodes[node as usize] = Node {
            page: 0,
            prev: DEAD,
            next: q.free,
        };
        q.free = node;
    }

    /// Unlinks the live `node` (its own links are left for the caller).
    #[inline]
    fn unlink(&mut self, set: u32, node: u32) {
        let Node { prev, next, .. } = self.nodes[node as usize];
        debug_assert!(prev != DEAD, "unlinking a dead ghost");
        let q = &mut self.queues[set as usize];
        q.len -= 1;
        if prev == NIL {
            q.newest = next;
        } else {
            self.nodes[prev as usize].next = next;
        }
        if next == NIL {
            q.oldest = prev;
        } else {
            self.nodes[next as usize].prev = prev;
        }
    }

    /// The ghosts of `set`, oldest first, with their nodes.
    pub(crate) fn entries(&self, set: u32) -> Vec<(u32, u64)> {
        let mut out = Vec::new();
        let Some(q) = self.queues.get(set as usize) else {
            return out;
        };
        let mut cur = q.oldest;
        while cur != NIL && out.len() <= self.per_set as usize {
            let n = self.nodes[cur as usize];
            out.push((cur, n.page));
            cur = n.prev;
        }
        out
    }

    /// Checks the links of every FIFO (for tests; O(nodes)): lengths match,
    /// both directions agree, every node lies in its set's range, and
    /// removed nodes are dead.
    pub(crate) fn check(&self) -> Result<(), String> {
        for (set, q) in self.queues.iter().enumerate() {
            let range =
                set as u64 * u64::from(self.per_set)..(set as u64 + 1) * u64::from(self.per_set);
            let mut n = 0u32;
            let mut cur = q.newest;
            let mut newer = NIL;
            while cur != NIL {
                if !range.contains(&u64::from(cur)) || n >= self.per_set {
                    return Err(format!("ghost FIFO of set {set} is corrupt"));
                }
                let node = self.nodes[cur as usize];
                if node.prev != newer {
                    return Err(format!("ghost node {cur} of set {set}: bad back link"));
                }
                newer = cur;
                cur = node.next;
                n += 1;
            }
            if n != q.len || q.oldest != newer {
                return Err(format!(
                    "ghost FIFO of set {set}: {n} linked, length {}",
                    q.len
                ));
            }
            let mut cur = q.free;
            let mut freed = 0u32;
            while cur != NIL {
                if !range.contains(&u64::from(cur)) || freed > self.per_set {
                    return Err(format!("ghost free list of set {set} is corrupt"));
                }
                if self.nodes[cur as usize].prev != DEAD {
                    return Err(format!("free ghost node {cur} is live"));
                }
                freed += 1;
                cur = self.nodes[cur as usize].next;
            }
            if q.len + freed != q.fresh {
                return Err(format!(
                    "set {set}: {} ghosts + {freed} free nodes, {} handed out",
                    q.len, q.fresh
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pages(g: &GhostQueues, set: u32) -> Vec<u64> {
        g.entries(set).into_iter().map(|(_, p)| p).collect()
    }

    #[test]
    fn fifo_with_removal() {
        let mut g = GhostQueues::new(2, 3);
        let (a, out) = g.push(0, 10).unwrap();
        assert_eq!(out, None);
        let (b, _) = g.push(0, 11).unwrap();
        let (_, _) = g.push(0, 12).unwrap();
        assert!(g.holds(a, 10) && !g.holds(a, 11));
        assert_eq!(pages(&g, 0), vec![10, 11, 12]);
        // Full: the oldest goes, its node is reused.
        let (d, out) = g.push(0, 13).unwrap();
        assert_eq!((d, out), (a, Some(10)));
        assert!(!g.holds(a, 10) && g.holds(a, 13));
        // A ghost hit frees room: the next push pushes nothing out.
        g.remove(0, b);
        assert!(!g.holds(b, 11));
        assert_eq!(pages(&g, 0), vec![12, 13]);
        let (e, out) = g.push(0, 14).unwrap();
        assert_eq!((e, out), (b, None));
        assert_eq!(pages(&g, 0), vec![12, 13, 14]);
        assert_eq!(g.push(0, 15).unwrap().1, Some(12));
        // The other set is separate.
        assert_eq!(g.len(1), 0);
        let (f, _) = g.push(1, 20).unwrap();
        assert!((3..6).contains(&f));
        g.check().unwrap();
        // Removing the newest, the oldest, the only one.
        let nodes: Vec<_> = g.entries(0).into_iter().map(|(n, _)| n).collect();
        g.remove(0, nodes[2]);
        g.remove(0, nodes[0]);
        assert_eq!(pages(&g, 0), vec![14]);
        g.remove(0, nodes[1]);
        assert_eq!(g.len(0), 0);
        g.check().unwrap();
        assert_eq!(g.push(0, 1).unwrap().1, None);
        g.check().unwrap();
    }

    #[test]
    fn zero_capacity_keeps_nothing() {
        let mut g = GhostQueues::new(4, 0);
        assert_eq!(g.push(2, 5), None);
        assert_eq!(g.nodes(), 0);
        assert!(!g.holds(0, 5));
        assert!(g.entries(2).is_empty());
        g.check().unwrap();
    }
}
