//! Intrusive doubly linked lists over slot ids, the building block of every
//! policy. Links live in one flat array indexed by slot (a slot is on at most
//! one list of a given [`SlotLists`]); list heads live in another flat array
//! indexed by list id (policies use `set * lists_per_set + k`).
//!
//! Orientation: the *front* holds the newest / most recently used slot, the
//! *back* the oldest / least recently used one. `prev` points toward the
//! front, `next` toward the back.

use crate::slot::{prefetch_read, SlotId};

/// "No slot" in links and heads.
pub(crate) const NIL: u32 = u32::MAX;

#[derive(Debug, Clone, Copy)]
struct Link {
    prev: u32,
    next: u32,
}

#[derive(Debug, Clone, Copy)]
struct Head {
    front: u32,
    back: u32,
    len: u32,
}

const EMPTY_HEAD: Head = Head {
    front: NIL,
    back: NIL,
    len: 0,
};

/// Many intrusive lists sharing one link array.
#[derive(Debug, Clone)]
pub(crate) struct SlotLists {
    links: Vec<Link>,
    heads: Vec<Head>,
}

impl SlotLists {
    /// `slots` slots, `lists` (initially empty) lists.
    pub(crate) fn new(slots: usize, lists: usize) -> Self {
        SlotLists {
            links: vec![
                Link {
                    prev: NIL,
                    next: NIL
                };
                slots
            ],
            heads: vec![EMPTY_HEAD; lists],
        }
    }

    /// Number of slots on `list`.
    #[inline]
    pub(crate) fn len(&self, list: usize) -> u32 {
        self.heads[list].len
    }

    /// Newest slot of `list`.
    #[inline]
    pub(crate) fn front(&self, list: usize) -> Option<SlotId> {
        let f = self.heads[list].front;
        (f != NIL).then_some(f)
    }

    /// Oldest slot of `list`.
    #[inline]
    pub(crate) fn back(&self, list: usize) -> Option<SlotId> {
        let b = self.heads[list].back;
        (b != NIL).then_some(b)
    }

    /// The slot before `slot` going toward the front of its list.
    #[cfg(test)]
    pub(crate) fn toward_front(&self, slot: SlotId) -> Option<SlotId> {
        let p = self.links[slot as usize].prev;
        (p != NIL).then_some(p)
    }

    /// The oldest slot of `list` and the one before it (the next two
    /// `pop_back`s if nothing changes in between).
    #[inline]
    pub(crate) fn back_two(&self, list: usize) -> [Option<SlotId>; 2] {
        let back = self.heads[list].back;
        if back == NIL {
            return [None, None];
        }
        let before = self.links[back as usize].prev;
        [Some(back), (before != NIL).then_some(before)]
    }

    /// Starts loading the links of `slot` into the CPU cache.
    #[inline]
    pub(crate) fn prefetch_link(&self, slot: SlotId) {
        if let Some(link) = self.links.get(slot as usize) {
            prefetch_read(link);
        }
    }

    /// Links `slot` (on no list) at the front of `list`.
    #[inline]
    pub(crate) fn push_front(&mut self, list: usize, slot: SlotId) {
        let head = &mut self.heads[list];
        let old = head.front;
        head.front = slot;
        if old == NIL {
            head.back = slot;
        }
        head.len += 1;
        self.links[slot as usize] = Link {
            prev: NIL,
            next: old,
        };
        if old != NIL {
            self.links[old as usize].prev = slot;
        }
    }

    /// Unlinks `slot`, which must be on `list`.
    #[inline]
    pub(crate) fn unlink(&mut self, list: usize, slot: SlotId) {
        let Link { prev, next } = self.links[slot as usize];
        let head = &mut self.heads[list];
        debug_assert!(head.len > 0, "unlink from an empty list");
        head.len -= 1;
        if prev == NIL {
            head.front = next;
        } else {
            self.links[prev as usize].next = next;
        }
        if next == NIL {
            head.back = prev;
        } else {
            self.links[next as usize].prev = prev;
        }
        self.links[slot as usize] = Link {
            prev: NIL,
            next: NIL,
        };
    }

    /// Moves `slot`, which is on `list`, to its front.
    #[inline]
    pub(crate) fn move_to_front(&mut self, list: usize, slot: SlotId) {
        if self.heads[list].front != slot {
            self.unlink(list, slot);
            self.push_front(list, slot);
        }
    }

    /// Unlinks and returns the oldest slot of `list`.
    #[inline]
    pub(crate) fn pop_back(&mut self, list: usize) -> Option<SlotId> {
        let b = self.back(list)?;
        self.unlink(list, b);
        Some(b)
    }

    /// Unlinks and returns the newest slot of `list`.
    #[inline]
    pub(crate) fn pop_front(&mut self, list: usize) -> Option<SlotId> {
        let f = self.front(list)?;
        self.unlink(list, f);
        Some(f)
    }

    /// Slots of `list` from the back (oldest) to the front (newest).
    #[cfg(test)]
    pub(crate) fn iter_from_back(&self, list: usize) -> impl Iterator<Item = SlotId> + '_ {
        std::iter::successors(self.back(list), move |&s| self.toward_front(s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_pop_unlink() {
        let mut l = SlotLists::new(8, 2);
        for s in 0..4 {
            l.push_front(0, s);
        }
        l.push_front(1, 7);
        assert_eq!(l.iter_from_back(0).collect::<Vec<_>>(), vec![0, 1, 2, 3]);
        l.unlink(0, 2);
        assert_eq!(l.iter_from_back(0).collect::<Vec<_>>(), vec![0, 1, 3]);
        l.move_to_front(0, 0);
        assert_eq!(l.iter_from_back(0).collect::<Vec<_>>(), vec![1, 3, 0]);
        assert_eq!(l.pop_back(0), Some(1));
        assert_eq!(l.pop_front(0), Some(0));
        assert_eq!(l.len(0), 1);
        assert_eq!(l.pop_back(0), Some(3));
        assert_eq!(l.pop_back(0), None);
        assert_eq!(l.front(0), None);
        assert_eq!(l.len(1), 1);
        assert_eq!(l.back(1), Some(7));
    }
}
