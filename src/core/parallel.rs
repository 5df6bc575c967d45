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

/// How a step spreads its items over threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Workers {
    /// How many threads; 1 does every item on the calling thread.
    pub threads: usize,
    /// Fewer items than this are done on the calling thread: threads do not pay for the
    /// few a run after one change has.
    pub min_items: usize,
}

impl Default for Workers {
    /// The cores this process may use (its CPU quota included, which the standard library
    /// reads from cgroups), at most [`MAX_WORKERS`], from 256 items: below that a run takes
    /// tens of milliseconds alone, and each thread's allocator heap would add its own pages
    /// (6 MiB of 26 at 100 Ingresses).
    fn default() -> Self {
        Self {
            threads: std::thread::available_parallelism()
                .map_or(1, std::num::NonZero::get)
                .clamp(1, MAX_WORKERS),
            min_items: 256,
        }
    }
}

impl Workers {
    /// Every item on the calling thread.
    pub const ONE: Workers = Workers {
        threads: 1,
        min_items: usize::MAX,
    };

    /// Whether `items` items are spread over threads.
    pub fn spread(self, items: usize) -> bool {
        self.threads > 1 && items >= self.min_items.max(2)
    }
}

/// `f` of each of `items`, in order: computed by threads that each take the next item when
/// they finish one when `workers` spreads that many, else on this thread.
///
/// The threads are new even when this one could take a share: `f` may keep per-thread state
/// (the policy engine's run budget), which must not mix with this thread's.
pub fn map<I: Sync, T: Send>(items: &[I], workers: Workers, f: impl Fn(&I) -> T + Sync) -> Vec<T> {
    map_with(items, workers, || (), |(), item| f(item))
}

/// [`map`], with state that each thread makes once with `init` and passes to `f`.
pub fn map_with<I: Sync, S, T: Send>(
    items: &[I],
    workers: Workers,
    init: impl Fn() -> S + Sync,
    f: impl Fn(&mut S, &I) -> T + Sync,
) -> Vec<T> {
    if !workers.spread(items.len()) {
        let mut state = init();
        return items.iter().map(|item| f(&mut state, item)).collect();
    }
    let next = AtomicUsize::new(0);
    let work = || {
        let mut state = init();
        let mut done = Vec::new();
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(item) = items.get(i) else {
                return done;
            };
            done.push((i, f(&mut state, item)));
        }
    };
    let mut done: Vec<(usize, T)> = std::thread::scope(|scope| {
        let threads = workers.threads.min(items.len());
        let handles: Vec<_> = (0..threads).map(|_| scope.spawn(work)).collect();
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
        for threads in [0, 1, 2, 3, 8, 2000] {
            let workers = Workers {
                threads,
                min_items: 1,
            };
            let seen = std::sync::Mutex::new(std::collections::HashSet::new());
            let out = map(&items, workers, |i| {
                seen.lock().unwrap().insert(std::thread::current().id());
                i * i
            });
            assert_eq!(out, expected, "{threads} threads");
            let seen = seen.into_inner().unwrap();
            if threads > 1 {
                // Never this thread: workers keep per-thread state.
                assert!(!seen.contains(&std::thread::current().id()));
            } else {
                assert_eq!(seen, [std::thread::current().id()].into());
            }
        }
        let few = Workers {
            threads: 4,
            min_items: 2000,
        };
        let seen = std::sync::Mutex::new(std::collections::HashSet::new());
        map(&items, few, |_| {
            seen.lock().unwrap().insert(std::thread::current().id());
        });
        assert_eq!(
            seen.into_inner().unwrap(),
            [std::thread::current().id()].into()
        );
        assert!(map(&[] as &[u8], Workers::default(), |_| 0).is_empty());
    }

    #[test]
    fn each_thread_makes_its_state_once() {
        let items: Vec<u32> = (0..500).collect();
        let made = AtomicUsize::new(0);
        let workers = Workers {
            threads: 3,
            min_items: 1,
        };
        let out = map_with(
            &items,
            workers,
            || {
                made.fetch_add(1, Ordering::Relaxed);
                0_u32
            },
            |count, i| {
                *count += 1;
                *i
            },
        );
        assert_eq!(out, items);
        assert!(made.load(Ordering::Relaxed) <= 3);
    }

    #[test]
    fn a_panic_in_a_worker_reaches_the_caller() {
        let items: Vec<u32> = (0..100).collect();
        let caught = std::panic::catch_unwind(|| {
            map(
                &items,
                Workers {
                    threads: 2,
                    min_items: 1,
                },
                |i| {
                    assert!(*i != 57, "item 57");
                    *i
                },
            )
        });
        assert!(caught.is_err());
    }
}
