//! A 64-way radix tree of page-cache entries with marks, in the spirit of `lib/xarray.c` (and
//! the `lib/radix-tree.c` of the 4.x kernels the seeds were measured on): DIRTY, WRITEBACK and
//! TOWRITE marks are kept on every level, so a tagged walk skips clean subtrees; gang lookups by
//! mark (`find_get_pages_range_tag`) and `tag_pages_for_writeback` (DIRTY -> TOWRITE over a
//! range, so a sync writes what was dirty when it started and a writer cannot livelock it).
//!
//! The tree itself is not synchronized: its owner (an address space) keeps it under its
//! `tree_lock`, which is where lock contention is measured.

use crate::conv::Narrow;

const SHIFT: u32 = 6;
const FANOUT: usize = 1 << SHIFT;
const MASK: u64 = FANOUT as u64 - 1;

/// Marks (`PAGECACHE_TAG_*` / `XA_MARK_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mark {
    Dirty = 0,
    Writeback = 1,
    Towrite = 2,
}

const NR_MARKS: usize = 3;

#[derive(Debug)]
enum Slot<T> {
    Empty,
    Leaf(T),
    Node(Box<Node<T>>),
}

#[derive(Debug)]
struct Node<T> {
    slots: [Slot<T>; FANOUT],
    /// Bit i of marks[m]: slot i holds an entry with mark m, or a subtree that does.
    marks: [u64; NR_MARKS],
    /// Occupied slots.
    count: u32,
}

impl<T> Node<T> {
    fn new() -> Box<Self> {
        Box::new(Node {
            slots: std::array::from_fn(|_| Slot::Empty),
            marks: [0; NR_MARKS],
            count: 0,
        })
    }
}

/// The tree. Indices are page offsets; entries are small copyable values (frame numbers).
#[derive(Debug)]
pub struct RadixTree<T: Copy> {
    root: Option<Box<Node<T>>>,
    /// Levels below and including the root: the tree covers indices < 64^height.
    height: u32,
    len: usize,
}

impl<T: Copy> Default for RadixTree<T> {
    fn default() -> Self {
        RadixTree {
            root: None,
            height: 0,
            len: 0,
        }
    }
}

fn slot_of(index: u64, level: u32) -> usize {
    ((index >> (level * SHIFT)) & MASK) as usize
}

impl<T: Copy> RadixTree<T> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Entries stored.
    #[cfg(any(test, loom, feature = "testing"))]
    pub fn len(&self) -> usize {
        self.len
    }

    #[cfg(any(test, loom, feature = "testing"))]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn max_index(&self) -> u64 {
        if self.height > 64 / SHIFT {
            u64::MAX
        } else {
            (1u64 << (self.height * SHIFT)).wrapping_sub(1)
        }
    }

    /// Adds levels on top until `index` fits; marks of the old root carry up.
    fn grow(&mut self, index: u64) {
        if self.root.is_none() {
            self.root = Some(Node::new());
            self.height = 1;
        }
        while index > self.max_index() {
            let old = self.root.take().expect("root");
            let mut n = Node::new();
            for m in 0..NR_MARKS {
                if old.marks[m] != 0 {
                    n.marks[m] |= 1;
                }
            }
            n.count = 1;
            n.slots[0] = Slot::Node(old);
            self.root = Some(n);
            self.height += 1;
        }
    }

    /// Stores `entry` at `index`; returns the entry it replaced (whose marks are kept).
    pub fn insert(&mut self, index: u64, entry: T) -> Option<T> {
        self.grow(index);
        let mut level = self.height - 1;
        let mut node = self.root.as_mut().expect("root");
        loop {
            let i = slot_of(index, level);
            if level == 0 {
                return match std::mem::replace(&mut node.slots[i], Slot::Leaf(entry)) {
                    Slot::Leaf(old) => Some(old),
                    _ => {
                        node.count += 1;
                        self.len += 1;
                        None
                    }
                };
            }
            if matches!(node.slots[i], Slot::Empty) {
                node.slots[i] = Slot::Node(Node::new());
                node.count += 1;
            }
            node = match &mut node.slots[i] {
                Slot::Node(n) => n,
                _ => unreachable!("interior slot holds a leaf"),
            };
            level -= 1;
        }
    }

    /// The entry at `index`.
    pub fn get(&self, index: u64) -> Option<T> {
        if self.root.is_none() || index > self.max_index() {
            return None;
        }
        let mut node = self.root.as_ref()?;
        let mut level = self.height - 1;
        loop {
            match &node.slots[slot_of(index, level)] {
                Slot::Leaf(v) if level == 0 => return Some(*v),
                Slot::Node(n) if level > 0 => node = n,
                _ => return None,
            }
            level -= 1;
        }
    }

    /// Removes the entry at `index` and its marks; empty nodes are freed.
    pub fn remove(&mut self, index: u64) -> Option<T> {
        if self.root.is_none() || index > self.max_index() {
            return None;
        }
        let h = self.height;
        let out = Self::remove_rec(self.root.as_mut().expect("root"), index, h - 1);
        if out.is_some() {
            self.len -= 1;
            if self.len == 0 {
                self.root = None;
                self.height = 0;
            }
        }
        out
    }

    fn remove_rec(node: &mut Node<T>, index: u64, level: u32) -> Option<T> {
        let i = slot_of(index, level);
        let bit = 1u64 << i;
        if level == 0 {
            let Slot::Leaf(v) = std::mem::replace(&mut node.slots[i], Slot::Empty) else {
                return None;
            };
            node.count -= 1;
            for m in &mut node.marks {
                *m &= !bit;
            }
            return Some(v);
        }
        let Slot::Node(child) = &mut node.slots[i] else {
            return None;
        };
        let out = Self::remove_rec(child, index, level - 1)?;
        let (child_marks, child_empty) = (child.marks, child.count == 0);
        for (m, cm) in node.marks.iter_mut().zip(child_marks) {
            if cm == 0 {
                *m &= !bit;
            }
        }
        if child_empty {
            node.slots[i] = Slot::Empty;
            node.count -= 1;
        }
        Some(out)
    }

    /// Sets `mark` on the entry at `index` (and on every level above it). Returns false if there
    /// is no entry there.
    pub fn set_mark(&mut self, index: u64, mark: Mark) -> bool {
        if self.get(index).is_none() {
            return false;
        }
        let mut level = self.height - 1;
        let mut node = self.root.as_mut().expect("root");
        loop {
            let i = slot_of(index, level);
            node.marks[mark as usize] |= 1 << i;
            if level == 0 {
                return true;
            }
            node = match &mut node.slots[i] {
                Slot::Node(n) => n,
                _ => unreachable!("checked by get"),
            };
            level -= 1;
        }
    }

    /// Clears `mark` on the entry at `index`, and on each level whose subtree holds no other
    /// entry with it. Returns whether the mark was set.
    pub fn clear_mark(&mut self, index: u64, mark: Mark) -> bool {
        if !self.get_mark(index, mark) {
            return false;
        }
        let h = self.height;
        Self::clear_rec(
            self.root.as_mut().expect("root"),
            index,
            h - 1,
            mark as usize,
        );
        true
    }

    fn clear_rec(node: &mut Node<T>, index: u64, level: u32, m: usize) {
        let i = slot_of(index, level);
        if level > 0 {
            if let Slot::Node(child) = &mut node.slots[i] {
                Self::clear_rec(child, index, level - 1, m);
                if child.marks[m] != 0 {
                    return;
                }
            }
        }
        node.marks[m] &= !(1 << i);
    }

    /// Whether the entry at `index` has `mark`.
    pub fn get_mark(&self, index: u64, mark: Mark) -> bool {
        if self.root.is_none() || index > self.max_index() {
            return false;
        }
        let mut node = self.root.as_ref().expect("root");
        let mut level = self.height - 1;
        loop {
            let i = slot_of(index, level);
            if node.marks[mark as usize] & (1 << i) == 0 {
                return false;
            }
            if level == 0 {
                return matches!(node.slots[i], Slot::Leaf(_));
            }
            match &node.slots[i] {
                Slot::Node(n) => node = n,
                _ => return false,
            }
            level -= 1;
        }
    }

    /// Whether any entry has `mark` (`mapping_tagged`): one look at the root.
    pub fn tagged(&self, mark: Mark) -> bool {
        self.root
            .as_ref()
            .is_some_and(|r| r.marks[mark as usize] != 0)
    }

    /// Appends up to `max` (index, entry) pairs with `mark` in `[start, end]`, in index order
    /// (`find_get_pages_range_tag`). Unmarked subtrees are skipped without being visited.
    /// Returns the number appended.
    pub fn gang_lookup_tag(
        &self,
        start: u64,
        end: u64,
        mark: Mark,
        max: usize,
        out: &mut Vec<(u64, T)>,
    ) -> usize {
        let Some(root) = &self.root else { return 0 };
        if start > end || max == 0 {
            return 0;
        }
        let before = out.len();
        Self::walk_tag(
            root,
            self.height - 1,
            0,
            start,
            end.min(self.max_index()),
            mark as usize,
            max,
            out,
        );
        out.len() - before
    }

    /// Appends up to `max` (index, entry) pairs in `[start, end]`, in index order
    /// (`find_get_entries`). Returns the number appended.
    pub fn gang_lookup(&self, start: u64, end: u64, max: usize, out: &mut Vec<(u64, T)>) -> usize {
        let Some(root) = &self.root else { return 0 };
        if start > end || max == 0 {
            return 0;
        }
        let before = out.len();
        Self::walk_all(
            root,
            self.height - 1,
            0,
            start,
            end.min(self.max_index()),
            before + max,
            out,
        );
        out.len() - before
    }

    fn walk_all(
        node: &Node<T>,
        level: u32,
        base: u64,
        start: u64,
        end: u64,
        max: usize,
        out: &mut Vec<(u64, T)>,
    ) -> bool {
        let span = 1u64 << (level * SHIFT);
        for i in 0..FANOUT as u64 {
            let Some(lo) = i.checked_mul(span).and_then(|o| base.checked_add(o)) else {
                return true;
            };
            let hi = lo.saturating_add(span - 1);
            if hi < start {
                continue;
            }
            if lo > end {
                return true;
            }
            match &node.slots[i.usize()] {
                Slot::Leaf(v) if level == 0 => {
                    out.push((lo, *v));
                    if out.len() >= max {
                        return false;
                    }
                }
                Slot::Node(n)
                    if level > 0 && !Self::walk_all(n, level - 1, lo, start, end, max, out) =>
                {
                    return false;
                }
                _ => {}
            }
        }
        true
    }

    #[allow(clippy::too_many_arguments)]
    fn walk_tag(
        node: &Node<T>,
        level: u32,
        base: u64,
        start: u64,
        end: u64,
        m: usize,
        max: usize,
        out: &mut Vec<(u64, T)>,
    ) -> bool {
        let mut bits = node.marks[m];
        while bits != 0 {
            let i = bits.trailing_zeros() as u64;
            bits &= bits - 1;
            let span = 1u64 << (level * SHIFT);
            // The top level of a full-height tree covers more than 64 bits: stop at overflow.
            let Some(lo) = i.checked_mul(span).and_then(|o| base.checked_add(o)) else {
                return true;
            };
            let hi = lo.saturating_add(span - 1);
            if hi < start {
                continue;
            }
            if lo > end {
                return true;
            }
            match &node.slots[i.usize()] {
                Slot::Leaf(v) if level == 0 => {
                    out.push((lo, *v));
                    if out.len() >= max {
                        return false;
                    }
                }
                Slot::Node(n)
                    if level > 0 && !Self::walk_tag(n, level - 1, lo, start, end, m, max, out) =>
                {
                    return false;
                }
                _ => {}
            }
        }
        true
    }

    /// `tag_pages_for_writeback`: sets TOWRITE on every DIRTY entry in `[start, end]`; returns
    /// how many were tagged. Writeback then walks TOWRITE, so pages dirtied after this call do
    /// not extend the walk.
    pub fn tag_pages_for_writeback(&mut self, start: u64, end: u64) -> usize {
        let mut tagged = 0;
        let mut next = start;
        let mut batch = Vec::with_capacity(64);
        loop {
            batch.clear();
            if self.gang_lookup_tag(next, end, Mark::Dirty, 64, &mut batch) == 0 {
                return tagged;
            }
            for &(i, _) in &batch {
                self.set_mark(i, Mark::Towrite);
                tagged += 1;
            }
            let last = batch.last().expect("non-empty").0;
            if last >= end {
                return tagged;
            }
            next = last + 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gang_lookup_all_entries_in_range() {
        let mut t = RadixTree::new();
        for i in [3u64, 64, 65, 5000, 1 << 20] {
            t.insert(i, i.u32());
        }
        let mut out = vec![];
        assert_eq!(t.gang_lookup(4, 1 << 21, 10, &mut out), 4);
        assert_eq!(
            out.iter().map(|e| e.0).collect::<Vec<_>>(),
            vec![64, 65, 5000, 1 << 20]
        );
        out.clear();
        assert_eq!(t.gang_lookup(0, u64::MAX, 2, &mut out), 2);
        assert_eq!(out, vec![(3, 3), (64, 64)]);
    }
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    #[test]
    fn insert_get_remove_across_levels() {
        let mut t = RadixTree::new();
        for i in [0u64, 1, 63, 64, 4095, 4096, 1 << 30, u64::MAX] {
            assert_eq!(t.insert(i, u32::try_from(i).unwrap_or(u32::MAX)), None);
        }
        assert_eq!(t.len(), 8);
        assert_eq!(t.get(4096), Some(4096));
        assert_eq!(t.get(65), None);
        assert_eq!(t.insert(64, 7), Some(64));
        assert_eq!(t.remove(64), Some(7));
        assert_eq!(t.remove(64), None);
        assert_eq!(t.get(u64::MAX), Some(u32::MAX));
        for i in [0u64, 1, 63, 4095, 4096, 1 << 30, u64::MAX] {
            assert!(t.remove(i).is_some());
        }
        assert!(t.is_empty());
        assert!(!t.tagged(Mark::Dirty));
    }

    #[test]
    fn marks_propagate_and_clear_up_the_tree() {
        let mut t = RadixTree::new();
        t.insert(5, 1u32);
        t.insert(70_000, 2);
        assert!(!t.tagged(Mark::Dirty));
        assert!(t.set_mark(70_000, Mark::Dirty));
        assert!(!t.set_mark(70_001, Mark::Dirty), "no entry there");
        assert!(t.tagged(Mark::Dirty));
        assert!(t.get_mark(70_000, Mark::Dirty) && !t.get_mark(5, Mark::Dirty));
        t.set_mark(5, Mark::Dirty);
        assert!(t.clear_mark(70_000, Mark::Dirty));
        assert!(t.tagged(Mark::Dirty), "index 5 still dirty");
        assert!(t.clear_mark(5, Mark::Dirty));
        assert!(!t.tagged(Mark::Dirty));
        t.set_mark(5, Mark::Writeback);
        t.remove(5);
        assert!(!t.tagged(Mark::Writeback), "removal clears marks");
    }

    #[test]
    fn tag_pages_for_writeback_snapshots_dirty() {
        let mut t = RadixTree::new();
        for i in 0..1000u64 {
            t.insert(i * 3, i.u32());
            if i % 2 == 0 {
                t.set_mark(i * 3, Mark::Dirty);
            }
        }
        assert_eq!(t.tag_pages_for_writeback(0, 1500), 251);
        let mut out = vec![];
        assert_eq!(
            t.gang_lookup_tag(0, u64::MAX, Mark::Towrite, 10_000, &mut out),
            251
        );
        assert!(out.iter().all(|&(i, _)| i <= 1500 && (i / 3) % 2 == 0));
        assert!(out.windows(2).all(|w| w[0].0 < w[1].0), "index order");
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u64),
        Remove(u64),
        Set(u64, u8),
        Clear(u64, u8),
        Lookup(u64, u64, u8, usize),
    }

    fn mark(m: u8) -> Mark {
        [Mark::Dirty, Mark::Writeback, Mark::Towrite][m as usize % 3]
    }

    proptest! {
        #[test]
        fn matches_a_model(ops in proptest::collection::vec(
            prop_oneof![
                (0u64..5000).prop_map(Op::Insert),
                (0u64..5000).prop_map(Op::Remove),
                (0u64..5000, 0u8..3).prop_map(|(i, m)| Op::Set(i, m)),
                (0u64..5000, 0u8..3).prop_map(|(i, m)| Op::Clear(i, m)),
                (0u64..5000, 0u64..5000, 0u8..3, 1usize..50).prop_map(|(a, b, m, n)| Op::Lookup(a, b, m, n)),
            ], 1..400)) {
            let mut t = RadixTree::new();
            let mut model: BTreeMap<u64, (u32, [bool; 3])> = BTreeMap::new();
            for op in ops {
                match op {
                    Op::Insert(i) => {
                        let old = t.insert(i, i.u32());
                        prop_assert_eq!(old, model.get(&i).map(|e| e.0));
                        model.entry(i).or_insert((i.u32(), [false; 3]));
                    }
                    Op::Remove(i) => prop_assert_eq!(t.remove(i), model.remove(&i).map(|e| e.0)),
                    Op::Set(i, m) => {
                        let ok = t.set_mark(i, mark(m));
                        prop_assert_eq!(ok, model.contains_key(&i));
                        if let Some(e) = model.get_mut(&i) { e.1[m as usize] = true; }
                    }
                    Op::Clear(i, m) => {
                        let was = t.clear_mark(i, mark(m));
                        let want = model.get(&i).is_some_and(|e| e.1[m as usize]);
                        prop_assert_eq!(was, want);
                        if let Some(e) = model.get_mut(&i) { e.1[m as usize] = false; }
                    }
                    Op::Lookup(a, b, m, n) => {
                        let mut out = vec![];
                        t.gang_lookup_tag(a, b, mark(m), n, &mut out);
                        let want: Vec<(u64, u32)> = model.range(a..=b.max(a)).filter(|(_, e)| e.1[m as usize] && a <= b).map(|(i, e)| (*i, e.0)).take(n).collect();
                        prop_assert_eq!(out, want);
                    }
                }
                prop_assert_eq!(t.len(), model.len());
                for m in 0..3u8 {
                    prop_assert_eq!(t.tagged(mark(m)), model.values().any(|e| e.1[m as usize]));
                }
            }
        }
    }
}
