//! The threads that run the parts of the torus, started once for the simulator's life.
//!
//! A paced experiment hands the simulator work every 10 simulated microseconds (a batch of
//! sends, then a run to the next tick): starting threads for each of those cost more than
//! the work itself (4096 servers on two threads: a third of the time in the kernel,
//! zeroing the new threads' stacks and heaps). The workers stay; each call moves the parts
//! to them and back (a part is a handful of pointers), so no part is shared between
//! threads and nothing here needs `unsafe`.
//!
//! A call on a small torus lasts microseconds, less than waking a sleeping thread takes, so
//! both sides spin a while for the other before they sleep on a condition variable.

use std::any::Any;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use super::part::Part;

/// What a worker runs on the part it is given: `(part number, part)`, returning anything.
type Job = Arc<dyn Fn(usize, &mut Part) -> Box<dyn Any + Send> + Send + Sync>;

/// A part on its way back from a worker, with what the job returned or its panic.
type Done = (Part, std::thread::Result<Box<dyn Any + Send>>);

/// Spins (about 30 us) before a side waiting for the other sleeps.
const SPINS: u32 = 20_000;

/// A worker's state: nothing to do, a job waiting, its part back, or told to stop.
const IDLE: u8 = 0;
const READY: u8 = 1;
const DONE: u8 = 2;
const STOP: u8 = 3;

/// What the caller and one worker hand each other.
struct Slot {
    state: AtomicU8,
    cell: Mutex<Handover>,
    wake: Condvar,
}

#[derive(Default)]
struct Handover {
    job: Option<(usize, Part, Job)>,
    done: Option<Done>,
}

impl Slot {
    fn lock(&self) -> MutexGuard<'_, Handover> {
        // A panic never happens while the lock is held (jobs run outside it).
        self.cell.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sets the state under the lock (so a sleeper cannot miss it) and wakes the other side.
    fn set(&self, g: MutexGuard<'_, Handover>, state: u8) {
        self.state.store(state, Ordering::Release);
        drop(g);
        self.wake.notify_all();
    }

    /// Waits until the state is one of `want`, spinning first; the lock, held.
    fn wait_for(&self, want: &[u8]) -> MutexGuard<'_, Handover> {
        for _ in 0..SPINS {
            if want.contains(&self.state.load(Ordering::Acquire)) {
                break;
            }
            std::hint::spin_loop();
        }
        let mut g = self.lock();
        while !want.contains(&self.state.load(Ordering::Acquire)) {
            g = self.wake.wait(g).unwrap_or_else(|e| e.into_inner());
        }
        g
    }
}

/// One thread per part but the first (which the caller's thread runs).
pub(super) struct Workers {
    slots: Vec<Arc<Slot>>,
    threads: Vec<JoinHandle<()>>,
}

impl Workers {
    /// Threads for parts `1..parts` (none for a single part).
    pub(super) fn new(parts: usize) -> Workers {
        let mut slots = Vec::new();
        let mut threads = Vec::new();
        for k in 1..parts {
            let slot = Arc::new(Slot {
                state: AtomicU8::new(IDLE),
                cell: Mutex::new(Handover::default()),
                wake: Condvar::new(),
            });
            let mine = slot.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("sim-part-{k}"))
                .spawn(move || work(&mine));
            // A thread that cannot start leaves its part to the caller's thread.
            match spawned {
                Ok(h) => {
                    slots.push(slot);
                    threads.push(h);
                }
                Err(_) => break,
            }
        }
        Workers { slots, threads }
    }

    /// Whether every part but the first has a thread: parts that wait for each other in
    /// a window need to run at the same time.
    pub(super) fn all_started(&self, parts: usize) -> bool {
        self.slots.len() + 1 >= parts
    }

    /// Calls `f(k, part)` for every part, part 0 on this thread and the others on the
    /// workers at the same time; the results in part order. A panic in any part is raised
    /// here once every part is back.
    pub(super) fn each_part<R: Send + 'static>(
        &self,
        parts: &mut Vec<Part>,
        f: impl Fn(usize, &mut Part) -> R + Send + Sync + 'static,
    ) -> Vec<R> {
        let job: Job = Arc::new(move |k, p: &mut Part| Box::new(f(k, p)) as Box<dyn Any + Send>);
        let mut all: Vec<Option<Part>> = std::mem::take(parts).into_iter().map(Some).collect();
        let mut results: Vec<Option<std::thread::Result<Box<dyn Any + Send>>>> =
            (0..all.len()).map(|_| None).collect();
        let mut away = Vec::new();
        for (k, slot) in all.iter_mut().enumerate().skip(1) {
            // A part with no worker stays here and is run on this thread.
            let Some(w) = self.slots.get(k - 1) else {
                continue;
            };
            let Some(part) = slot.take() else { continue };
            let mut g = w.lock();
            g.job = Some((k, part, job.clone()));
            w.set(g, READY);
            away.push(k);
        }
        for (k, slot) in all.iter_mut().enumerate() {
            if let Some(p) = slot.as_mut() {
                results[k] = Some(catch_unwind(AssertUnwindSafe(|| job(k, p))));
            }
        }
        for k in away {
            let w = &self.slots[k - 1];
            let mut g = w.wait_for(&[DONE]);
            if let Some((part, r)) = g.done.take() {
                all[k] = Some(part);
                results[k] = Some(r);
            }
            w.set(g, IDLE);
        }
        *parts = all.into_iter().flatten().collect();
        let mut out = Vec::with_capacity(results.len());
        for r in results.into_iter().flatten() {
            match r {
                Ok(b) => match b.downcast::<R>() {
                    Ok(v) => out.push(*v),
                    Err(_) => resume_unwind(Box::new("a part's job returned another type")),
                },
                Err(panic) => resume_unwind(panic),
            }
        }
        out
    }
}

/// A worker's life: take a part, run the job on it, hand it back, until told to stop. The
/// job's panic is caught and handed back with the part, so the part is never lost.
fn work(slot: &Slot) {
    loop {
        let mut g = slot.wait_for(&[READY, STOP]);
        if slot.state.load(Ordering::Acquire) == STOP {
            return;
        }
        let Some((k, mut part, job)) = g.job.take() else {
            slot.set(g, IDLE);
            continue;
        };
        drop(g);
        let r = catch_unwind(AssertUnwindSafe(|| job(k, &mut part)));
        // The job's captures (the view of which servers are up among them) go before the
        // part goes back, so the caller holds them alone.
        drop(job);
        let mut g = slot.lock();
        g.done = Some((part, r));
        slot.set(g, DONE);
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for s in &self.slots {
            let g = s.lock();
            s.set(g, STOP);
        }
        for h in self.threads.drain(..) {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(n: usize) -> Vec<Part> {
        (0..n)
            .map(|k| Part::new(k * 10, Vec::new(), Vec::new()))
            .collect()
    }

    #[test]
    fn every_part_runs_and_comes_back_in_order() {
        let w = Workers::new(3);
        assert!(w.all_started(3));
        let mut ps = parts(3);
        for round in 0..200 {
            let got = w.each_part(&mut ps, move |k, p| (k, p.lo, round));
            assert_eq!(got, [(0, 0, round), (1, 10, round), (2, 20, round)]);
        }
        assert_eq!(ps.iter().map(|p| p.lo).collect::<Vec<_>>(), [0, 10, 20]);
    }

    #[test]
    fn a_panicking_part_is_raised_here_and_loses_no_part() {
        let w = Workers::new(2);
        let mut ps = parts(2);
        let r = catch_unwind(AssertUnwindSafe(|| {
            w.each_part(&mut ps, |k, _| {
                if k == 1 {
                    panic!("part 1 fails");
                }
                k
            })
        }));
        assert!(r.is_err());
        assert_eq!(ps.len(), 2);
        // The workers still serve.
        assert_eq!(w.each_part(&mut ps, |k, p| k + p.lo), [0, 11]);
    }
}
