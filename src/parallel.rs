//! Whole-cluster steps of a pipeline run spread over the machine's cores.
//!
//! A cold start or a script change translates every Ingress and renders every backend
//! section; each of those is independent of the others. They are computed ahead by worker
//! threads and used in order by the run, which checks each result as it would its own (the
//! operation budget, see `translate`) and computes it again where it does not fit, so the
//! output is the same for any number of workers. Runs after one change do too little for
//! threads to pay.

use std::sync::atomic::{AtomicUsize, Ordering};

/// At most this many workers, whatever the machine offers.
const MAX_WORKERS: usize = 8;

/// How many workers a run uses by default: the cores this process may use (its CPU quota
/// included, which the standard library reads from cgroups), at most [`MAX_WORKERS`].
pub fn available() -> usize {
    std::thread::available_parallelism()
        .map_or(1, std::num::NonZero::get)
        .clamp(1, MAX_WORKERS)
}

/// `f` of each of `items`, in order, computed by `workers` threads that each take the next
/// item when they finish one. With one worker (or one item), on this thread.
///
/// The workers are new threads even when this one could take a share: `f` may keep
/// per-thread state (the policy engine's run budget), which must not mix with this thread's.
pub fn map<I: Sync, T: Send>(items: &[I], workers: usize, f: impl Fn(&I) -> T + Sync) -> Vec<T> {
    let workers = workers.min(items.len());
    if workers <= 1 {
        return items.iter().map(f).collect();
    }
    let next = AtomicUsize::new(0);
    let work = || {
        let mut done = Vec::new();
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(item) = items.get(i) else {
                return done;
            };
            done.push((i, f(item)));
        }
    };
    let mut done: Vec<(usize, T)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers).map(|_| scope.spawn(work)).collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    });
    done.sort_unstable_by_key(|(i, _)| *i);
    done.into_iter().map(|(_, t)| t).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_come_in_order_for_any_number_of_workers() {
        let items: Vec<u64> = (0..1000).collect();
        let expected: Vec<u64> = items.iter().map(|i| i * i).collect();
        for workers in [0, 1, 2, 3, 8, 2000] {
            let threads = std::sync::Mutex::new(std::collections::HashSet::new());
            let out = map(&items, workers, |i| {
                threads.lock().unwrap().insert(std::thread::current().id());
                i * i
            });
            assert_eq!(out, expected, "{workers} workers");
            let threads = threads.into_inner().unwrap();
            if workers > 1 {
                // Never this thread: workers keep per-thread state.
                assert!(!threads.contains(&std::thread::current().id()));
            } else {
                assert_eq!(threads.len(), 1);
            }
        }
        assert!(map(&[] as &[u8], 4, |_| 0).is_empty());
    }

    #[test]
    fn a_panic_in_a_worker_reaches_the_caller() {
        let items: Vec<u32> = (0..100).collect();
        let caught = std::panic::catch_unwind(|| {
            map(&items, 2, |i| {
                assert!(*i != 57, "item 57");
                *i
            })
        });
        assert!(caught.is_err());
    }
}
