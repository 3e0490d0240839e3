//! The paged KV cache's bookkeeping: a pool of fixed-size blocks with reference counts, and the
//! prefix cache of full prompt blocks keyed by chained hashes of their tokens.
//!
//! A block's id is its index in the pool tensors (rows `id * block_size..`). Prompt blocks are
//! registered under `hash(parent hash, tokens)` (the prompt's last block with the tokens it
//! holds); a later prompt starting with the same tokens takes them by reference instead of
//! computing them. Full shared blocks are never written again. A shared last block (a repeated
//! prompt) is copied to a block of the sharer's own before the sharer writes into it
//! (copy-on-write, see `paged.rs`); its owner writes only past the registered tokens, which no
//! sharer reads. Unreferenced registered blocks stay cached until the pool needs them, oldest
//! first.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::hash::{DefaultHasher, Hash, Hasher};

/// The chained hash of a full block: its parent's hash and its tokens.
pub(super) fn block_hash(parent: u64, tokens: &[u32]) -> u64 {
    let mut h = DefaultHasher::new();
    parent.hash(&mut h);
    tokens.hash(&mut h);
    h.finish()
}

/// The block pool.
#[derive(Debug)]
pub(super) struct BlockPool {
    refs: Vec<u32>,
    /// Unreferenced blocks holding nothing reusable.
    free: VecDeque<u32>,
    /// The hash a block is registered under.
    hash_of: Vec<Option<u64>>,
    /// Registered blocks by hash.
    cached: HashMap<u64, u32>,
    /// Unreferenced registered blocks by the time they were released (oldest evicted first).
    evictable: BTreeMap<u64, u32>,
    released_at: Vec<u64>,
    tick: u64,
    used: usize,
}

impl BlockPool {
    pub(super) fn new(n_blocks: usize) -> Self {
        Self {
            refs: vec![0; n_blocks],
            free: (0..n_blocks as u32).collect(),
            hash_of: vec![None; n_blocks],
            cached: HashMap::new(),
            evictable: BTreeMap::new(),
            released_at: vec![0; n_blocks],
            tick: 0,
            used: 0,
        }
    }

    /// Blocks in the pool.
    pub(super) fn total(&self) -> usize {
        self.refs.len()
    }

    /// Blocks referenced by some sequence.
    pub(super) fn used(&self) -> usize {
        self.used
    }

    /// Blocks an allocation can take (free or evictable).
    pub(super) fn available(&self) -> usize {
        self.free.len() + self.evictable.len()
    }

    /// A block for one sequence (reference count 1), evicting the oldest unreferenced cached
    /// block when no free one is left.
    pub(super) fn alloc(&mut self) -> Option<u32> {
        let b = match self.free.pop_front() {
            Some(b) => b,
            None => {
                let (_, b) = self.evictable.pop_first()?;
                if let Some(h) = self.hash_of[b as usize].take() {
                    self.cached.remove(&h);
                }
                b
            }
        };
        self.refs[b as usize] = 1;
        self.used += 1;
        Some(b)
    }

    /// Drops one reference.
    pub(super) fn release(&mut self, b: u32) {
        let i = b as usize;
        debug_assert!(self.refs[i] > 0, "block {b} released twice");
        self.refs[i] = self.refs[i].saturating_sub(1);
        if self.refs[i] > 0 {
            return;
        }
        self.used -= 1;
        if self.hash_of[i].is_some() {
            self.tick += 1;
            self.released_at[i] = self.tick;
            self.evictable.insert(self.tick, b);
        } else {
            self.free.push_back(b);
        }
    }

    /// The cached block registered under `hash`, with one more reference.
    pub(super) fn lookup(&mut self, hash: u64) -> Option<u32> {
        let b = *self.cached.get(&hash)?;
        let i = b as usize;
        if self.refs[i] == 0 {
            self.evictable.remove(&self.released_at[i]);
            self.used += 1;
        }
        self.refs[i] += 1;
        Some(b)
    }

    /// Registers a full block under `hash` unless another block already holds that content.
    pub(super) fn register(&mut self, b: u32, hash: u64) {
        if self.hash_of[b as usize].is_some() || self.cached.contains_key(&hash) {
            return;
        }
        self.hash_of[b as usize] = Some(hash);
        self.cached.insert(hash, b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_counted_shared_and_evicted_oldest_first() {
        let mut p = BlockPool::new(3);
        let (a, b, c) = (p.alloc().unwrap(), p.alloc().unwrap(), p.alloc().unwrap());
        assert_eq!((p.used(), p.available()), (3, 0));
        assert!(p.alloc().is_none());
        let (ha, hb) = (block_hash(0, &[1, 2]), block_hash(0, &[3, 4]));
        p.register(a, ha);
        p.register(b, hb);
        // Same content again: the first registration stays.
        p.register(c, ha);
        assert_eq!(p.lookup(ha), Some(a));
        p.release(a);
        p.release(a);
        p.release(b);
        p.release(c);
        assert_eq!((p.used(), p.available()), (0, 3));
        // c was never registered: it goes first; then the oldest cached block (a).
        assert_eq!(p.alloc(), Some(c));
        assert_eq!(p.alloc(), Some(a));
        assert_eq!(p.lookup(ha), None);
        assert_eq!(p.lookup(hb), Some(b));
        assert_eq!(p.used(), 3);
        for x in [a, b, c] {
            p.release(x);
        }
        assert_eq!(p.used(), 0);
        assert_ne!(block_hash(ha, &[5]), block_hash(hb, &[5]));
    }
}
