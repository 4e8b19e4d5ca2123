//! Conservative parallel simulation: the parts of the torus advance in windows no longer
//! than the lookahead, the least time a frame takes from a server of one part to a server
//! of another (the propagation delay plus the shortest frame's transmission time). Nothing
//! a part does inside a window can reach another part before the window ends, so the parts
//! of one window run at the same time without locks; at its end they swap the frames that
//! crossed between them and agree on where the next window starts (the earliest pending
//! event anywhere, so idle stretches cost nothing).
//!
//! With one thread the same windows run one part after the other; the parts, events and
//! their order are the same either way, and so is the result.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::part::{Crossing, Ctx, Emitted, Part};
use super::workers::Workers;
use super::SimConfig;
use crate::time::Time;

/// The lookahead of `cfg`'s links, ns: no frame arrives sooner after it is sent (a frame is
/// at least Ethernet's shortest on the wire, [`super::wire_bytes`]).
pub(super) fn lookahead(cfg: &SimConfig) -> u64 {
    let min_tx = (super::wire_bytes(0) * 8 * 1_000_000_000) / cfg.rate_bps.max(1);
    cfg.delay.as_nanos() as u64 + min_tx
}

/// Runs every part until `until` (inclusive): on the workers' threads, one part each, when
/// there are workers; else one part after the other on this thread.
pub(super) fn run(
    parts: &mut Vec<Part>,
    ctx: &Ctx,
    until: Time,
    lookahead: u64,
    workers: Option<&Workers>,
) {
    let n = parts.len();
    let workers = workers.filter(|w| n > 1 && lookahead > 0 && w.all_started(n));
    let Some(workers) = workers else {
        run_alone(parts, ctx, until, lookahead);
        return;
    };
    let shared = Arc::new(Shared {
        mail: (0..n).map(|_| Mutex::new(Vec::new())).collect(),
        next: (0..n).map(|_| AtomicU64::new(u64::MAX)).collect(),
        free: (0..n).map(|_| AtomicU64::new(u64::MAX)).collect(),
        barrier: SpinBarrier::new(n),
    });
    let ctx = ctx.clone();
    workers.each_part(parts, move |k, p| {
        run_part(k, p, &ctx, &shared, until, lookahead)
    });
}

/// The end (inclusive) of the window that starts at `start`, when no link between parts is
/// free before `free`: a frame sent in the window starts on such a link no sooner than
/// both, and arrives a lookahead later. Busy links between parts (the usual case under
/// load: a jumbo frame occupies a link for tens of microseconds) make windows that much
/// longer than the bare lookahead.
fn window_end(start: Time, free: u64, until: Time, lookahead: u64) -> Time {
    let end = start.0.max(free).saturating_add(lookahead.max(1) - 1);
    Time(end.min(until.0))
}

/// The parts' windows one after the other on this thread.
fn run_alone(parts: &mut [Part], ctx: &Ctx, until: Time, lookahead: u64) {
    loop {
        let crossing: Vec<Crossing> = parts
            .iter_mut()
            .flat_map(|p| std::mem::take(&mut p.outbox))
            .collect();
        for c in crossing {
            parts[c.to_part].accept(c.link, c.far, c.arrive, c.frame);
        }
        let Some(start) = parts.iter_mut().filter_map(|p| p.next_time()).min() else {
            break;
        };
        if start > until {
            break;
        }
        // One part alone has nobody to wait for.
        let end = if parts.len() == 1 {
            until
        } else {
            let free = parts
                .iter()
                .map(Part::boundary_free)
                .min()
                .unwrap_or(u64::MAX);
            window_end(start, free, until, lookahead)
        };
        for p in parts.iter_mut() {
            p.run_window(ctx, end);
        }
    }
}

/// What the threads of a parallel run share.
struct Shared {
    /// Frames for each part, left by the others at the end of a window.
    mail: Vec<Mutex<Vec<Crossing>>>,
    /// Each part's earliest pending event after the exchange (`u64::MAX`: none).
    next: Vec<AtomicU64>,
    /// Each part's [`Part::boundary_free`].
    free: Vec<AtomicU64>,
    barrier: SpinBarrier,
}

/// One thread's part through every window of the run.
fn run_part(me: usize, p: &mut Part, ctx: &Ctx, sh: &Shared, until: Time, lookahead: u64) {
    loop {
        // Leave what crossed for its parts; once everyone has, take ours.
        // A lock per frame: uncontended but for the moment the other part does the same.
        for c in std::mem::take(&mut p.outbox) {
            lock(&sh.mail[c.to_part]).push(c);
        }
        sh.barrier.wait();
        for c in std::mem::take(&mut *lock(&sh.mail[me])) {
            p.accept(c.link, c.far, c.arrive, c.frame);
        }
        sh.next[me].store(p.next_time().map_or(u64::MAX, |t| t.0), Ordering::Release);
        sh.free[me].store(p.boundary_free(), Ordering::Release);
        sh.barrier.wait();
        let least = |v: &[AtomicU64]| {
            v.iter()
                .map(|n| n.load(Ordering::Acquire))
                .min()
                .unwrap_or(u64::MAX)
        };
        let start = least(&sh.next);
        if start == u64::MAX || start > until.0 {
            break;
        }
        let end = window_end(Time(start), least(&sh.free), until, lookahead);
        p.run_window(ctx, end);
    }
}

/// A mailbox's contents, even if a thread panicked holding it (its part's run is lost
/// anyway; the panic reaches the caller through the thread scope).
fn lock(m: &Mutex<Vec<Crossing>>) -> std::sync::MutexGuard<'_, Vec<Crossing>> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The events of every part's last run, in the order one part would have produced them:
/// by the time and id of the simulator event each came from.
pub(super) fn merged_events(parts: &mut [Part]) -> Vec<Emitted> {
    if parts.len() == 1 {
        return std::mem::take(&mut parts[0].events);
    }
    let mut all: Vec<Emitted> = parts
        .iter_mut()
        .flat_map(|p| std::mem::take(&mut p.events))
        .collect();
    // Stable: events of one simulator event keep their order.
    all.sort_by_key(|e| (e.0, e.1));
    all
}

/// A barrier for threads that each have a core: they spin rather than sleep (a window
/// lasts microseconds; a futex wake-up would cost more), yielding when it takes long.
struct SpinBarrier {
    n: usize,
    arrived: AtomicUsize,
    generation: AtomicUsize,
}

impl SpinBarrier {
    fn new(n: usize) -> SpinBarrier {
        SpinBarrier {
            n,
            arrived: AtomicUsize::new(0),
            generation: AtomicUsize::new(0),
        }
    }

    fn wait(&self) {
        let g = self.generation.load(Ordering::Acquire);
        if self.arrived.fetch_add(1, Ordering::AcqRel) + 1 == self.n {
            self.arrived.store(0, Ordering::Relaxed);
            self.generation.store(g.wrapping_add(1), Ordering::Release);
            return;
        }
        let mut spins = 0u32;
        while self.generation.load(Ordering::Acquire) == g {
            spins = spins.saturating_add(1);
            if spins < 2000 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }
}
