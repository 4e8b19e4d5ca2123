//! The threads that run the parts of the torus, started once for the simulator's life.
//!
//! A paced experiment hands the simulator work every 10 simulated microseconds (a batch of
//! sends, then a run to the next tick): starting threads for each of those cost more than
//! the work itself (4096 servers on two threads: a third of the time in the kernel,
//! zeroing the new threads' stacks and heaps). The workers stay; each call moves the parts
//! to them and back (a part is a handful of pointers), so no part is shared between
//! threads and nothing here needs `unsafe`.

use std::any::Any;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

use super::part::Part;

/// What a worker runs on the part it is given: `(part number, part)`, returning anything.
type Job = Arc<dyn Fn(usize, &mut Part) -> Box<dyn Any + Send> + Send + Sync>;

/// A part on its way back from a worker, with what the job returned or its panic.
type Done = (usize, Part, std::thread::Result<Box<dyn Any + Send>>);

/// One thread per part but the first (which the caller's thread runs).
pub(super) struct Workers {
    to: Vec<Sender<(usize, Part, Job)>>,
    back: Receiver<Done>,
    threads: Vec<JoinHandle<()>>,
}

impl Workers {
    /// Threads for parts `1..parts` (none for a single part).
    pub(super) fn new(parts: usize) -> Workers {
        let (done, back) = channel::<Done>();
        let mut to = Vec::new();
        let mut threads = Vec::new();
        for k in 1..parts {
            let (tx, rx) = channel::<(usize, Part, Job)>();
            let done = done.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("sim-part-{k}"))
                .spawn(move || {
                    while let Ok((k, mut part, job)) = rx.recv() {
                        let r = catch_unwind(AssertUnwindSafe(|| job(k, &mut part)));
                        // The job's captures (the view of which servers are up among them)
                        // go before the part goes back, so the caller holds them alone.
                        drop(job);
                        if done.send((k, part, r)).is_err() {
                            break;
                        }
                    }
                });
            // A thread that cannot start leaves its parts to the caller's thread.
            if let Ok(h) = spawned {
                to.push(tx);
                threads.push(h);
            }
        }
        Workers { to, back, threads }
    }

    /// Whether every part but the first has a thread: parts that wait for each other in
    /// a window need to run at the same time.
    pub(super) fn all_started(&self, parts: usize) -> bool {
        self.to.len() + 1 >= parts
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
        let mut away = 0;
        for (k, slot) in all.iter_mut().enumerate().skip(1) {
            // A part with no worker stays here and is run on this thread.
            let Some(tx) = self.to.get(k - 1) else {
                continue;
            };
            let Some(part) = slot.take() else { continue };
            if let Err(e) = tx.send((k, part, job.clone())) {
                // Its worker died: run it here too.
                *slot = Some(e.0 .1);
            } else {
                away += 1;
            }
        }
        for (k, slot) in all.iter_mut().enumerate() {
            if let Some(p) = slot.as_mut() {
                results[k] = Some(catch_unwind(AssertUnwindSafe(|| job(k, p))));
            }
        }
        for _ in 0..away {
            // A worker always sends its part back (its job's panic is caught), so this
            // ends; a worker gone altogether would close the channel and end it too.
            let Ok((k, part, r)) = self.back.recv() else {
                break;
            };
            all[k] = Some(part);
            results[k] = Some(r);
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

impl Drop for Workers {
    fn drop(&mut self) {
        // Closing their queues ends the workers' loops.
        self.to.clear();
        for h in self.threads.drain(..) {
            let _ = h.join();
        }
    }
}
