//! Intrusive doubly linked lists over slot ids, the building block of every
//! policy. Links live in the slots' [`Frame`]s, next to the cache's own
//! record of the slot (a slot is on at most one list); list heads live in a
//! flat array indexed by list id (policies use `set * lists_per_set + k`).
//!
//! Orientation: the *front* holds the newest / most recently used slot, the
//! *back* the oldest / least recently used one. `prev` points toward the
//! front, `next` toward the back.

use crate::slot::{Frame, SlotId, NIL};

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

/// The heads of many intrusive lists whose links live in the slots'
/// [`Frame`]s (passed to every call).
#[derive(Debug, Clone)]
pub(crate) struct SlotLists {
    heads: Vec<Head>,
}

impl SlotLists {
    /// `lists` (initially empty) lists.
    pub(crate) fn new(lists: usize) -> Self {
        SlotLists {
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
    pub(crate) fn toward_front(frames: &[Frame], slot: SlotId) -> Option<SlotId> {
        let p = frames[slot as usize].prev;
        (p != NIL).then_some(p)
    }

    /// The oldest slot of `list` and the one before it (the next two
    /// `pop_back`s if nothing changes in between).
    #[inline]
    pub(crate) fn back_two(&self, frames: &[Frame], list: usize) -> [Option<SlotId>; 2] {
        let back = self.heads[list].back;
        let Some(frame) = frames.get(back as usize) else {
            return [None, None];
        };
        let before = frame.prev;
        [Some(back), (before != NIL).then_some(before)]
    }

    /// Links `slot` (on no list) at the front of `list`.
    #[inline]
    pub(crate) fn push_front(&mut self, frames: &mut [Frame], list: usize, slot: SlotId) {
        let head = &mut self.heads[list];
        let old = head.front;
        head.front = slot;
        if old == NIL {
            head.back = slot;
        }
        head.len += 1;
        let frame = &mut frames[slot as usize];
        frame.prev = NIL;
        frame.next = old;
        if old != NIL {
            frames[old as usize].prev = slot;
        }
    }

    /// Unlinks `slot`, which must be on `list`.
    #[inline]
    pub(crate) fn unlink(&mut self, frames: &mut [Frame], list: usize, slot: SlotId) {
        let frame = &mut frames[slot as usize];
        let (prev, next) = (frame.prev, frame.next);
        frame.prev = NIL;
        frame.next = NIL;
        let head = &mut self.heads[list];
        debug_assert!(head.len > 0, "unlink from an empty list");
        head.len -= 1;
        if prev == NIL {
            head.front = next;
        } else {
            frames[prev as usize].next = next;
        }
        if next == NIL {
            head.back = prev;
        } else {
            frames[next as usize].prev = prev;
        }
    }

    /// Moves `slot`, which is on `list`, to its front.
    #[inline]
    pub(crate) fn move_to_front(&mut self, frames: &mut [Frame], list: usize, slot: SlotId) {
        if self.heads[list].front != slot {
            self.unlink(frames, list, slot);
            self.push_front(frames, list, slot);
        }
    }

    /// Unlinks and returns the oldest slot of `list`.
    #[inline]
    pub(crate) fn pop_back(&mut self, frames: &mut [Frame], list: usize) -> Option<SlotId> {
        let b = self.back(list)?;
        self.unlink(frames, list, b);
        Some(b)
    }

    /// Unlinks and returns the newest slot of `list`.
    #[inline]
    pub(crate) fn pop_front(&mut self, frames: &mut [Frame], list: usize) -> Option<SlotId> {
        let f = self.front(list)?;
        self.unlink(frames, list, f);
        Some(f)
    }

    /// Slots of `list` from the back (oldest) to the front (newest).
    #[cfg(test)]
    pub(crate) fn iter_from_back<'a>(
        &'a self,
        frames: &'a [Frame],
        list: usize,
    ) -> impl Iterator<Item = SlotId> + 'a {
        std::iter::successors(self.back(list), move |&s| Self::toward_front(frames, s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_pop_unlink() {
        let mut l = SlotLists::new(2);
        let f = &mut vec![Frame::free(NIL); 8][..];
        for s in 0..4 {
            l.push_front(f, 0, s);
        }
        l.push_front(f, 1, 7);
        assert_eq!(l.iter_from_back(f, 0).collect::<Vec<_>>(), vec![0, 1, 2, 3]);
        l.unlink(f, 0, 2);
        assert_eq!(l.iter_from_back(f, 0).collect::<Vec<_>>(), vec![0, 1, 3]);
        l.move_to_front(f, 0, 0);
        assert_eq!(l.iter_from_back(f, 0).collect::<Vec<_>>(), vec![1, 3, 0]);
        assert_eq!(l.pop_back(f, 0), Some(1));
        assert_eq!(l.pop_front(f, 0), Some(0));
        assert_eq!(l.len(0), 1);
        assert_eq!(l.pop_back(f, 0), Some(3));
        assert_eq!(l.pop_back(f, 0), None);
        assert_eq!(l.front(0), None);
        assert_eq!(l.len(1), 1);
        assert_eq!(l.back(1), Some(7));
    }
}
