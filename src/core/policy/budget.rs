//! Operation budgets: a value the caller of a hook run passes in and gets back, and the meter
//! that counts one script call against it.
//!
//! A pipeline run owns one [`Budget`] and threads it through its hook runs in a fixed order,
//! so every replica stops at the same object. Work done ahead on another thread starts from
//! [`Budget::whole`] and is charged to the run's budget again when the run takes its result
//! ([`Budget::charge`]).

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rhai::Dynamic;

/// Operations one hook call may perform before it is stopped.
pub const MAX_OPERATIONS_PER_CALL: u64 = 100_000;
/// Operations all hook calls of one pipeline run may perform together. Counting operations,
/// not time, keeps the result the same on every replica however busy its machine is.
pub const MAX_OPERATIONS_PER_RUN: u64 = 200_000_000;
/// Wall-clock cap of one hook call: a safety net for work that operations do not count well
/// (a huge string built in few steps). Far above what any sane hook needs (microseconds), so
/// only an already-broken script can hit it, the one case where replicas may then differ.
pub const MAX_CALL_TIME: Duration = Duration::from_secs(1);

/// What the hook calls of a run may still do: the operations allowed and spent, and how many
/// calls were stopped (by the budget or the clock).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    limit: u64,
    spent: u64,
    stops: u64,
}

impl Default for Budget {
    fn default() -> Self {
        Self::new(MAX_OPERATIONS_PER_RUN)
    }
}

impl Budget {
    /// A run's budget of `limit` operations, nothing spent.
    pub fn new(limit: u64) -> Self {
        Self {
            limit,
            spent: 0,
            stops: 0,
        }
    }

    /// The same limit with nothing spent: for work done ahead, whose operations the run
    /// charges when it takes the result.
    pub fn whole(self) -> Self {
        Self::new(self.limit)
    }

    /// Operations spent so far (a stopped call may take it past the limit).
    pub fn spent(self) -> u64 {
        self.spent
    }

    /// Operations a call may still perform before it is stopped.
    pub fn left(self) -> u64 {
        self.limit.saturating_sub(self.spent)
    }

    /// Charges the operations of hook calls a kept result stands for, as if they ran; false,
    /// and nothing charged, when they would exhaust the budget (then the work is done again,
    /// and its scripts stop where any replica's stop).
    pub fn charge(&mut self, operations: u64) -> bool {
        if self.spent.saturating_add(operations) > self.limit {
            return false;
        }
        self.spent += operations;
        true
    }

    /// Records a call that ran: its operations, and whether it was stopped.
    pub(crate) fn spend(&mut self, operations: u64, stopped: bool) {
        self.spent = self.spent.saturating_add(operations);
        self.stops += u64::from(stopped);
    }

    /// Whether a call was stopped since `earlier` (a result that depends on the budget or
    /// the clock, which must not be kept).
    pub fn stopped_since(self, earlier: Budget) -> bool {
        self.stops != earlier.stops
    }

    /// The operations spent since `earlier`, or `None` when a call was stopped since.
    pub fn used_since(self, earlier: Budget) -> Option<u64> {
        (!self.stopped_since(earlier)).then(|| self.spent.saturating_sub(earlier.spent))
    }
}

/// Why a call was stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stop {
    Budget,
    Clock,
}

/// Counts one call's operations for the engine's progress callback. An engine is lent to
/// one call at a time (see `super::Engines`), so its meter is that call's.
#[derive(Debug)]
pub(crate) struct Meter {
    /// When the meter was made: `deadline` counts nanoseconds from here.
    epoch: Instant,
    deadline: AtomicU64,
    /// Operations the call may perform before the run's budget is exhausted.
    left: AtomicU64,
    used: AtomicU64,
    /// 0 while running, else `1 + Stop as u8`.
    stop: AtomicU8,
}

impl Default for Meter {
    fn default() -> Self {
        Self {
            epoch: Instant::now(),
            deadline: AtomicU64::new(u64::MAX),
            left: AtomicU64::new(0),
            used: AtomicU64::new(0),
            stop: AtomicU8::new(0),
        }
    }
}

impl Meter {
    /// Starts a call that may perform `left` operations (the run's budget left), now.
    pub(crate) fn start(&self, left: u64) {
        let started = u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let cap = u64::try_from(MAX_CALL_TIME.as_nanos()).unwrap_or(u64::MAX);
        self.deadline
            .store(started.saturating_add(cap), Ordering::Relaxed);
        self.left.store(left, Ordering::Relaxed);
        self.used.store(0, Ordering::Relaxed);
        self.stop.store(0, Ordering::Relaxed);
    }

    /// The operations the call performed, and whether (why) it was stopped.
    pub(crate) fn finish(&self) -> (u64, Option<Stop>) {
        let stop = match self.stop.load(Ordering::Relaxed) {
            1 => Some(Stop::Budget),
            2 => Some(Stop::Clock),
            _ => None,
        };
        (self.used.load(Ordering::Relaxed), stop)
    }

    /// The engine's progress callback: stops the call past the run's budget or the
    /// wall-clock cap (the per-call operation limit is the engine's own).
    pub(crate) fn progress(&self, operations: u64) -> Option<Dynamic> {
        self.used.store(operations, Ordering::Relaxed);
        if operations > self.left.load(Ordering::Relaxed) {
            self.stop.store(1 + Stop::Budget as u8, Ordering::Relaxed);
            return Some("the pipeline run's operation budget is exhausted".into());
        }
        if operations.is_multiple_of(1024) {
            let now = u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX);
            if now > self.deadline.load(Ordering::Relaxed) {
                self.stop.store(1 + Stop::Clock as u8, Ordering::Relaxed);
                return Some(
                    format!("the call ran longer than {}s", MAX_CALL_TIME.as_secs()).into(),
                );
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_done_ahead_has_the_whole_budget_and_is_charged_when_taken() {
        let mut run = Budget::new(1000);
        assert!(run.charge(300));
        let mut ahead = run.whole();
        assert_eq!(ahead.spent(), 0);
        assert!(ahead.charge(900));
        assert!(!ahead.charge(200));
        assert_eq!(run.spent(), 300);
        assert!(!run.charge(ahead.spent()), "900 more would exhaust it");
        assert_eq!(run.spent(), 300, "nothing charged");
        assert!(run.charge(700));
        assert_eq!(run.left(), 0);
    }

    #[test]
    fn a_stop_is_counted_and_leaves_nothing_to_keep() {
        let mut run = Budget::new(100);
        let before = run;
        run.spend(40, false);
        assert_eq!(run.used_since(before), Some(40));
        run.spend(61, true);
        assert_eq!(run.used_since(before), None);
        assert!(run.stopped_since(before));
        assert_eq!((run.spent(), run.left()), (101, 0));
    }

    #[test]
    fn the_meter_stops_a_call_past_the_budget_left() {
        let meter = Meter::default();
        meter.start(10);
        assert!((1..=10).all(|ops| meter.progress(ops).is_none()));
        let stop = meter
            .progress(11)
            .map(|d| d.to_string())
            .unwrap_or_default();
        assert!(stop.contains("budget is exhausted"), "{stop}");
        assert_eq!(meter.finish(), (11, Some(Stop::Budget)));
        // The next call starts afresh.
        meter.start(100);
        assert!(meter.progress(11).is_none());
        assert_eq!(meter.finish(), (11, None));
    }

    #[test]
    fn a_call_past_the_wall_clock_cap_is_stopped() {
        let meter = Meter::default();
        meter.start(u64::MAX);
        // As if the call had started more than the cap ago.
        meter.deadline.store(0, Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(1));
        assert!(
            meter.progress(1023).is_none(),
            "checked every 1024 operations"
        );
        let stop = meter
            .progress(2048)
            .map(|d| d.to_string())
            .unwrap_or_default();
        assert!(stop.contains("longer than"), "{stop}");
        assert_eq!(meter.finish(), (2048, Some(Stop::Clock)));
    }
}
