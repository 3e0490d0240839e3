//! Memory budget, pressure levels and the allocation tracker, wrapped around any raw allocator
//! by `pool::Accounted` so the same accounting runs over device memory and the host test allocator.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::error::{GpuError, Result};

/// How much of the device's free memory a budget may use.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BudgetConfig {
    /// Fraction of the free memory (at budget creation) that may be used, in (0, 1].
    pub fraction: f64,
    /// Bytes always left free for the driver, BLAS workspaces and other processes.
    pub reserve_bytes: u64,
}

impl BudgetConfig {
    /// For a dedicated inference machine: 92% of free memory, 512 MiB kept back.
    pub fn inference() -> Self {
        BudgetConfig {
            fraction: 0.92,
            reserve_bytes: 512 << 20,
        }
    }

    /// For a shared or small machine (desktop GPU driving a display): 70%, 1 GiB kept back.
    pub fn constrained() -> Self {
        BudgetConfig {
            fraction: 0.70,
            reserve_bytes: 1 << 30,
        }
    }

    /// The byte limit this configuration gives for `free` bytes.
    pub fn limit_for(&self, free: u64) -> u64 {
        let fraction = if self.fraction.is_finite() {
            self.fraction.clamp(0.0, 1.0)
        } else {
            0.0
        };
        let scaled = (free as f64 * fraction) as u64;
        scaled.min(free.saturating_sub(self.reserve_bytes))
    }
}

/// Pressure on a budget, from the share of it in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Pressure {
    /// Under 60% used.
    Low,
    /// 60% to 80%.
    Medium,
    /// 80% to 95%: caches should shrink.
    High,
    /// 95% or more: release everything releasable.
    Critical,
}

impl Pressure {
    /// The level for `used` bytes of `limit`.
    pub fn from_usage(used: u64, limit: u64) -> Pressure {
        if limit == 0 {
            return if used == 0 {
                Pressure::Low
            } else {
                Pressure::Critical
            };
        }
        let pct = used as f64 / limit as f64;
        if pct < 0.60 {
            Pressure::Low
        } else if pct < 0.80 {
            Pressure::Medium
        } else if pct < 0.95 {
            Pressure::High
        } else {
            Pressure::Critical
        }
    }
}

/// A byte budget: allocations reserve before any driver call and release when freed.
#[derive(Debug)]
pub struct Budget {
    limit: AtomicU64,
    used: AtomicU64,
    peak: AtomicU64,
}

impl Budget {
    /// A budget of `limit` bytes.
    pub fn new(limit: u64) -> Self {
        Budget {
            limit: AtomicU64::new(limit),
            used: AtomicU64::new(0),
            peak: AtomicU64::new(0),
        }
    }

    /// A budget from the free memory and a configuration.
    pub fn from_free(free: u64, config: BudgetConfig) -> Self {
        Budget::new(config.limit_for(free))
    }

    /// Reserves `bytes`, or says why not.
    pub fn try_reserve(&self, bytes: u64, tag: &str) -> Result<()> {
        let limit = self.limit.load(Ordering::Relaxed);
        let mut used = self.used.load(Ordering::Relaxed);
        loop {
            let new = used
                .checked_add(bytes)
                .filter(|&n| n <= limit)
                .ok_or_else(|| GpuError::BudgetExceeded {
                    tag: tag.to_owned(),
                    requested: bytes,
                    used,
                    limit,
                })?;
            match self
                .used
                .compare_exchange_weak(used, new, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => {
                    self.peak.fetch_max(new, Ordering::Relaxed);
                    return Ok(());
                }
                Err(actual) => used = actual,
            }
        }
    }

    /// Returns `bytes` to the budget.
    pub fn release(&self, bytes: u64) {
        let _ = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |u| {
                Some(u.saturating_sub(bytes))
            });
    }

    /// Bytes reserved now.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// Highest `used` seen.
    pub fn peak(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }

    /// The limit in bytes.
    pub fn limit(&self) -> u64 {
        self.limit.load(Ordering::Relaxed)
    }

    /// Changes the limit (allocations already made stay).
    pub fn set_limit(&self, limit: u64) {
        self.limit.store(limit, Ordering::Relaxed);
    }

    /// Bytes still available.
    pub fn available(&self) -> u64 {
        self.limit().saturating_sub(self.used())
    }

    /// The current pressure level.
    pub fn pressure(&self) -> Pressure {
        Pressure::from_usage(self.used(), self.limit())
    }
}

/// One live allocation as the tracker saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrackedAllocation {
    /// The id [`Tracker::record`] returned.
    pub id: u64,
    /// What the allocation is for, as its owner named it.
    pub tag: String,
    /// Its size in bytes.
    pub bytes: u64,
    /// Time since it was recorded.
    pub age: Duration,
}

/// Records every live allocation with a tag, its size and its birth time.
#[derive(Debug, Default)]
pub struct Tracker {
    live: Mutex<HashMap<u64, (String, u64, Instant)>>,
    next: AtomicU64,
}

impl Tracker {
    /// Records an allocation and returns its id.
    pub fn record(&self, tag: &str, bytes: u64) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.live
            .lock()
            .insert(id, (tag.to_owned(), bytes, Instant::now()));
        id
    }

    /// An id no recorded allocation has or will have, for memory tracked elsewhere.
    pub(crate) fn fresh_id(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    /// Forgets an allocation; false if the id was not live (a double free).
    pub fn forget(&self, id: u64) -> bool {
        self.live.lock().remove(&id).is_some()
    }

    /// Number of live allocations.
    pub fn live_count(&self) -> usize {
        self.live.lock().len()
    }

    /// Bytes of live allocations.
    pub fn live_bytes(&self) -> u64 {
        self.live.lock().values().map(|(_, b, _)| b).sum()
    }

    /// Every live allocation, oldest first.
    pub fn report(&self) -> LeakReport {
        let now = Instant::now();
        let mut entries: Vec<TrackedAllocation> = self
            .live
            .lock()
            .iter()
            .map(|(&id, (tag, bytes, born))| TrackedAllocation {
                id,
                tag: tag.clone(),
                bytes: *bytes,
                age: now.saturating_duration_since(*born),
            })
            .collect();
        entries.sort_by_key(|e| e.id);
        LeakReport { entries }
    }
}

/// Allocations still live at a check point.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeakReport {
    /// The live allocations, oldest first.
    pub entries: Vec<TrackedAllocation>,
}

impl LeakReport {
    /// True when nothing is live.
    pub fn is_clean(&self) -> bool {
        self.entries.is_empty()
    }

    /// Total live bytes.
    pub fn bytes(&self) -> u64 {
        self.entries.iter().map(|e| e.bytes).sum()
    }
}

impl fmt::Display for LeakReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_clean() {
            return f.write_str("no live allocations");
        }
        writeln!(
            f,
            "{} live allocations, {} bytes:",
            self.entries.len(),
            self.bytes()
        )?;
        for e in &self.entries {
            writeln!(
                f,
                "  #{} {} bytes, {:.3}s old: {}",
                e.id,
                e.bytes,
                e.age.as_secs_f64(),
                e.tag
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_keep_reserve_and_fraction() {
        let gib = 1u64 << 30;
        // 70% of 8 GiB (5.6 GiB) is below 8 GiB minus the 1 GiB reserve.
        assert_eq!(
            BudgetConfig::constrained().limit_for(8 * gib),
            (8.0 * gib as f64 * 0.7) as u64
        );
        // With 2 GiB free the reserve binds: 1 GiB, not 1.4 GiB.
        assert_eq!(BudgetConfig::constrained().limit_for(2 * gib), gib);
        assert_eq!(
            BudgetConfig::inference().limit_for(100 << 20),
            0,
            "reserve exceeds free"
        );
        let c = BudgetConfig {
            fraction: 1.0,
            reserve_bytes: 10,
        };
        assert_eq!(c.limit_for(100), 90);
        let nan = BudgetConfig {
            fraction: f64::NAN,
            reserve_bytes: 0,
        };
        assert_eq!(nan.limit_for(100), 0);
    }

    #[test]
    fn pressure_levels() {
        assert_eq!(Pressure::from_usage(0, 100), Pressure::Low);
        assert_eq!(Pressure::from_usage(59, 100), Pressure::Low);
        assert_eq!(Pressure::from_usage(60, 100), Pressure::Medium);
        assert_eq!(Pressure::from_usage(80, 100), Pressure::High);
        assert_eq!(Pressure::from_usage(95, 100), Pressure::Critical);
        assert_eq!(Pressure::from_usage(1, 0), Pressure::Critical);
        assert_eq!(Pressure::from_usage(0, 0), Pressure::Low);
    }

    #[test]
    fn budget_refuses_before_overflowing() {
        let b = Budget::new(100);
        b.try_reserve(60, "a").expect("fits");
        let e = b.try_reserve(41, "b").expect_err("over budget");
        assert!(matches!(
            e,
            GpuError::BudgetExceeded {
                requested: 41,
                used: 60,
                limit: 100,
                ..
            }
        ));
        b.try_reserve(40, "c").expect("exactly fits");
        assert_eq!(b.pressure(), Pressure::Critical);
        b.release(100);
        assert_eq!(b.used(), 0);
        assert_eq!(b.peak(), 100);
        assert!(b.try_reserve(u64::MAX, "huge").is_err());
    }

    #[test]
    fn tracker_reports_live_allocations() {
        let t = Tracker::default();
        let a = t.record("weights", 10);
        let b = t.record("kv", 20);
        assert_eq!(t.live_bytes(), 30);
        assert!(t.forget(a));
        assert!(!t.forget(a), "double forget is reported");
        let r = t.report();
        assert_eq!(r.entries.len(), 1);
        assert_eq!(r.entries[0].tag, "kv");
        assert!(r.to_string().contains("kv"));
        assert!(t.forget(b));
        assert!(t.report().is_clean());
    }
}
