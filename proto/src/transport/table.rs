//! Handle tables for the engine's resources (PDs, MRs, MWs, CQs, SRQs, AHs): a slab, so that
//! insert and remove are O(1) and a freed handle is used again. rxe's pools do the same
//! (`xa_alloc_cyclic`); a device that never reused them ran out after 2^19 registrations in a
//! process's life, however few it held at once.
//!
//! A handle is `base + slot`. A freed slot is held back for the next `hold` removals before it
//! can be handed out again, so that a handle the program still sees in a late record (a
//! completion event of a CQ it just destroyed, read after it created the next one) does not
//! name the next object at once. Keys never name a slot directly: an R_Key or L_Key is looked
//! up by its random tag ([`super::resources::KeyOwner`]), and a freed key's tag names nothing
//! afterwards, so a reused slot never makes an old key valid again.

use slab::Slab;
use std::collections::VecDeque;

/// Handles of one kind of resource.
#[derive(Debug, Clone)]
pub struct Table<T> {
    /// `None`: removed, held back (in `held`) before the slot is freed.
    slots: Slab<Option<T>>,
    held: VecDeque<usize>,
    hold: usize,
    base: u32,
    /// Most live entries (the handle space `base..base + capacity`).
    capacity: usize,
    live: usize,
}

impl<T> Table<T> {
    /// A table whose handles are `base..base + capacity`, holding back `hold` freed slots.
    pub fn new(base: u32, capacity: usize, hold: usize) -> Table<T> {
        Table {
            slots: Slab::new(),
            held: VecDeque::new(),
            hold,
            base,
            capacity,
            live: 0,
        }
    }

    fn slot(&self, handle: u32) -> Option<usize> {
        handle.checked_sub(self.base).map(|s| s as usize)
    }

    /// Inserts `value`; its handle, or `None` when the table holds `capacity` entries.
    pub fn insert(&mut self, value: T) -> Option<u32> {
        if self.live >= self.capacity {
            return None;
        }
        // Every handle stays below the capacity: near it, held slots are freed early.
        while self.slots.vacant_key() >= self.capacity {
            let s = self.held.pop_front()?;
            self.slots.remove(s);
        }
        let slot = self.slots.insert(Some(value));
        self.live += 1;
        Some(self.base + slot as u32)
    }

    pub fn get(&self, handle: &u32) -> Option<&T> {
        self.slots.get(self.slot(*handle)?)?.as_ref()
    }

    pub fn get_mut(&mut self, handle: &u32) -> Option<&mut T> {
        let slot = self.slot(*handle)?;
        self.slots.get_mut(slot)?.as_mut()
    }

    pub fn contains_key(&self, handle: &u32) -> bool {
        self.get(handle).is_some()
    }

    /// Removes and returns the entry; its slot is handed out again after `hold` more removals.
    pub fn remove(&mut self, handle: &u32) -> Option<T> {
        let slot = self.slot(*handle)?;
        let value = self.slots.get_mut(slot)?.take()?;
        self.live -= 1;
        self.held.push_back(slot);
        while self.held.len() > self.hold {
            if let Some(s) = self.held.pop_front() {
                self.slots.remove(s);
            }
        }
        Some(value)
    }

    /// Live entries.
    pub fn len(&self) -> usize {
        self.live
    }

    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    pub fn values(&self) -> impl Iterator<Item = &T> {
        self.slots.iter().filter_map(|(_, v)| v.as_ref())
    }

    /// Live entries with their handles.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &T)> {
        let base = self.base;
        self.slots
            .iter()
            .filter_map(move |(s, v)| v.as_ref().map(|v| (base + s as u32, v)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_are_reused_after_the_hold_and_never_pass_the_capacity() {
        let mut t: Table<u32> = Table::new(1, 4, 2);
        let a = t.insert(10).unwrap();
        let b = t.insert(20).unwrap();
        assert_eq!((a, b), (1, 2));
        assert_eq!(t.get(&a), Some(&10));
        assert_eq!(t.remove(&a), Some(10));
        assert_eq!(t.get(&a), None);
        assert_eq!(t.remove(&a), None, "removed once");
        // Held back: the next insert does not get `a`.
        let c = t.insert(30).unwrap();
        assert_ne!(c, a);
        assert_eq!(t.remove(&b), Some(20));
        assert_eq!(t.remove(&c), Some(30));
        // Three removals with a hold of 2: `a`'s slot is free again.
        let d = t.insert(40).unwrap();
        assert_eq!(d, a);
        assert_eq!(t.len(), 1);
        assert_eq!(t.get(&0), None, "below the base");
        assert_eq!(t.get(&99), None);
    }

    #[test]
    fn a_register_deregister_loop_never_runs_out() {
        let mut t: Table<u64> = Table::new(1, 1 << 19, 0);
        let held = t.insert(0).unwrap();
        for i in 0..(1u64 << 20) {
            let h = t.insert(i).unwrap();
            assert!(h < 1 + (1 << 19));
            assert_eq!(t.remove(&h), Some(i));
        }
        assert_eq!(t.len(), 1);
        assert!(t.contains_key(&held));
        let mut full: Table<u8> = Table::new(5, 3, 0);
        for _ in 0..3 {
            full.insert(0).unwrap();
        }
        assert_eq!(full.insert(0), None, "at capacity");
        assert_eq!(full.iter().map(|(h, _)| h).collect::<Vec<_>>(), [5, 6, 7]);
    }
}
