//! Pool logic over the host allocator: overlap, alignment, accounting, budget, leaks.

use std::sync::Arc;

use proptest::prelude::*;

use super::*;
use crate::budget::{Budget, Tracker};

fn accounted(limit: u64) -> (Arc<Accounted<HostAllocator>>, Arc<Budget>, Arc<Tracker>) {
    let budget = Arc::new(Budget::new(limit));
    let tracker = Arc::new(Tracker::default());
    let a = Arc::new(Accounted::new(
        Arc::new(HostAllocator::new()),
        budget.clone(),
        tracker.clone(),
    ));
    (a, budget, tracker)
}

fn disjoint(blocks: &[(u64, u64)]) -> bool {
    let mut v: Vec<(u64, u64)> = blocks.to_vec();
    v.sort();
    v.windows(2).all(|w| w[0].0 + w[0].1 <= w[1].0)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn arena_slots_are_aligned_disjoint_and_inside_their_chunk(
        reqs in prop::collection::vec((1u64..200_000, 0u32..9), 1..60),
        chunk in 1u64..400_000,
    ) {
        let (raw, budget, tracker) = accounted(u64::MAX);
        {
            let arena = WeightArena::new(raw.clone(), chunk, "weights").unwrap();
            let mut slots = Vec::new();
            for &(bytes, a) in &reqs {
                let align = 1u64 << a;
                let s = arena.alloc_slot(bytes, align).unwrap();
                prop_assert_eq!(s.addr % align, 0);
                let (base, size) = arena.chunk(s.chunk).unwrap();
                prop_assert_eq!(s.addr, base + s.offset);
                prop_assert!(s.offset + s.bytes <= size);
                slots.push((s.addr, s.bytes));
            }
            prop_assert!(disjoint(&slots));
            let st = arena.stats();
            prop_assert_eq!(st.bytes_in_use, reqs.iter().map(|r| r.0).sum::<u64>());
            prop_assert_eq!(st.allocation_calls as usize, arena.chunk_count());
            prop_assert_eq!(st.hits + st.misses, reqs.len() as u64);
            prop_assert_eq!(budget.used(), st.bytes_pooled);
            prop_assert_eq!(tracker.live_count(), arena.chunk_count());
        }
        prop_assert_eq!(budget.used(), 0);
        prop_assert!(tracker.report().is_clean());
    }

    #[test]
    fn planned_arena_makes_one_allocation_per_chunk(
        sizes in prop::collection::vec(1u64..100_000, 1..80),
        max_chunk in 50_000u64..2_000_000,
    ) {
        let (raw, _budget, tracker) = accounted(u64::MAX);
        let plan = WeightArena::plan_chunks(&sizes, 256, max_chunk).unwrap();
        let arena = WeightArena::for_sizes(raw.clone(), &sizes, 256, max_chunk, "model").unwrap();
        let calls_before = raw.allocation_calls();
        for &s in &sizes {
            arena.alloc_slot(s, 256).unwrap();
        }
        // Every tensor fit the planned chunks: no allocation call per tensor.
        prop_assert_eq!(raw.allocation_calls(), calls_before);
        prop_assert_eq!(arena.chunk_count(), plan.len());
        prop_assert!(plan.len() <= sizes.len());
        drop(arena);
        prop_assert!(tracker.report().is_clean());
    }
}

#[test]
fn over_budget_is_a_typed_error_before_the_allocator_runs() {
    let (raw, _, tracker) = accounted(1000);
    let e = raw.allocate(2000, "too big").unwrap_err();
    assert!(
        matches!(
            e,
            crate::GpuError::BudgetExceeded {
                requested: 2000,
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(raw.allocation_calls(), 0, "no allocator call was made");
    assert_eq!(tracker.live_count(), 0);
}

#[test]
fn failing_allocator_leaves_budget_untouched() {
    let budget = Arc::new(Budget::new(u64::MAX));
    let raw = Accounted::new(
        Arc::new(HostAllocator::failing_after(0)),
        budget.clone(),
        Arc::new(Tracker::default()),
    );
    assert!(raw.allocate(100, "x").is_err());
    assert_eq!(budget.used(), 0);
}

#[test]
fn leak_report_names_what_is_left() {
    let (raw, _, tracker) = accounted(u64::MAX);
    let arena = WeightArena::new(raw, 1 << 16, "gemma weights").unwrap();
    arena.alloc_slot(10, 1).unwrap();
    let report = tracker.report();
    assert_eq!(report.entries.len(), 1);
    assert!(report.to_string().contains("gemma weights"));
    drop(arena);
    assert!(tracker.report().is_clean());
}

#[test]
fn bad_alignment_is_rejected() {
    let (raw, _, _) = accounted(u64::MAX);
    let arena = WeightArena::new(raw, 1 << 16, "w").unwrap();
    assert!(arena.alloc_slot(10, 3).is_err());
    assert!(arena.alloc_slot(10, 4096).is_err());
}

/// Blocks found live stay live until the count of ended blocks moves; foreign blocks (mapped
/// host memory) count as live without budget or tracker entries.
#[test]
fn ended_blocks_are_counted_and_foreign_blocks_listed() {
    let (raw, budget, tracker) = accounted(1 << 20);
    let a = raw.allocate(4096, "a").unwrap();
    let b = raw.allocate(8192, "b").unwrap();
    let foreign = 1u64 << 60;
    raw.add_foreign(foreign, 512);
    let blocks = raw
        .blocks_of(&[(a + 16, 64), (b, 8192), (foreign + 100, 400)])
        .expect("all inside live blocks");
    assert_eq!(blocks.len(), 3);
    assert!(
        raw.blocks_of(&[(foreign + 100, 500)]).is_none(),
        "past the end"
    );
    assert_eq!(
        (raw.ends(), budget.used(), tracker.live_count()),
        (0, 12288, 2)
    );
    assert!(raw.all_live(&blocks));
    raw.deallocate(b, 8192);
    assert_eq!(raw.ends(), 1);
    assert!(!raw.all_live(&blocks));
    raw.remove_foreign(foreign);
    assert_eq!(raw.ends(), 2);
    assert!(raw.blocks_of(&[(foreign, 4)]).is_none());
    raw.deallocate(a, 4096);
    assert_eq!((raw.ends(), budget.used(), tracker.live_count()), (3, 0, 0));
}
