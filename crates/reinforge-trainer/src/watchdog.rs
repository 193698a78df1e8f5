//! The stall watchdog: a thread beside the controller that knows which step and phase the
//! controller is in, and what every worker rank last reported. When a step runs longer than
//! max(3 × the slowest step so far, `trainer.stall_timeout_s`) it prints which ranks are in which
//! phase on which node, dumps the controller's and the busy ranks' thread stacks to
//! `<run dir>/stalls/step-N/`, and with `trainer.on_stall = "restart"` ends the step as if a worker
//! were lost, so the run restarts from its last checkpoint.
//!
//! Every second it also writes `<run dir>/ranks.json` (step, phase, each rank's activity and
//! age), which `reinforge cluster status` shows for live runs.

use crate::config::TrainConfig;
use crate::roles::RankMonitor;
use crate::run::Phase;
use reinforge_cluster::activity;
use reinforge_lease::Fence;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Where the controller is: shared by the step loop (writer) and the watchdog (reader).
#[derive(Clone, Default)]
pub struct StepClock(Arc<Mutex<ClockState>>);

#[derive(Default)]
struct ClockState {
    step: usize,
    phase: Option<(Phase, Instant)>,
    step_since: Option<Instant>,
    slowest: f64,
    reported: usize,
}

impl StepClock {
    fn with<T>(&self, f: impl FnOnce(&mut ClockState) -> T) -> T {
        f(&mut self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Step `n` (1-based) starts.
    pub fn start_step(&self, n: usize) {
        self.with(|s| {
            s.step = n;
            s.step_since = Some(Instant::now());
        });
    }

    /// The controller enters `phase`.
    pub fn phase(&self, phase: Phase) {
        self.with(|s| s.phase = Some((phase, Instant::now())));
    }

    /// A dynamic-sampling round ended: the step is making progress however many rounds its
    /// data needs, so the stall limit counts from here.
    pub fn round_done(&self) {
        self.with(|s| {
            if let Some(t) = s.step_since.replace(Instant::now()) {
                s.slowest = s.slowest.max(t.elapsed().as_secs_f64());
            }
        });
    }

    /// The current step ended (checkpoint included).
    pub fn end_step(&self) {
        self.with(|s| {
            if let Some(t) = s.step_since.take() {
                s.slowest = s.slowest.max(t.elapsed().as_secs_f64());
            }
        });
    }
}

/// The controller and its ranks at one instant (`ranks.json`).
#[derive(Serialize)]
struct Snapshot {
    step: usize,
    phase: String,
    phase_s: f64,
    step_s: f64,
    pid: u32,
    host: String,
    updated_unix: f64,
    ranks: Vec<crate::roles::RankView>,
}

/// Runs until dropped.
pub struct Watchdog {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    out_dir: PathBuf,
    fence: Fence,
}

impl Watchdog {
    /// Starts watching the run whose controller updates `clock`.
    pub fn start(cfg: &TrainConfig, out_dir: PathBuf, clock: StepClock, monitor: Option<Arc<dyn RankMonitor>>, fence: Fence) -> Self {
        activity::allow_stack_dumps();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let (floor, restart) = (cfg.trainer.stall_timeout_s, cfg.trainer.on_stall == "restart");
        let (dir, fence2) = (out_dir.clone(), fence.clone());
        let thread = std::thread::spawn(move || {
            // Stalls are judged ten times a second (cheap), the status file written once.
            for tick in 0u64.. {
                if flag.load(Ordering::SeqCst) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
                if tick % 10 == 0 && fence.check().is_ok() {
                    write_status(&out_dir, &snapshot(&clock, monitor.as_deref()), &fence);
                }
                let (step, since, slowest, reported) = clock.with(|s| (s.step, s.step_since, s.slowest, s.reported));
                let limit = (3.0 * slowest).max(floor);
                if let Some(t) = since.filter(|t| t.elapsed().as_secs_f64() > limit && reported != step) {
                    clock.with(|s| s.reported = step);
                    let why = format!(
                        "step {step} has run {:.1}s, over {limit:.1}s (max(3 × slowest step {slowest:.1}s, trainer.stall_timeout_s = {floor}))",
                        t.elapsed().as_secs_f64()
                    );
                    report(&out_dir, &why, &snapshot(&clock, monitor.as_deref()), monitor.as_deref(), restart, &clock, t, &fence);
                }
            }
        });
        Self { stop, thread: Some(thread), out_dir: dir, fence: fence2 }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // A run that ended is not live: `cluster status` must not show it.
        if self.fence.check().is_ok() {
            let _ = std::fs::remove_file(self.out_dir.join("ranks.json"));
        }
    }
}

fn snapshot(clock: &StepClock, monitor: Option<&dyn RankMonitor>) -> Snapshot {
    let (step, phase, step_since) = clock.with(|s| (s.step, s.phase, s.step_since));
    Snapshot {
        step,
        phase: phase.map_or("starting".into(), |(p, _)| p.to_string()),
        phase_s: phase.map_or(0.0, |(_, t)| t.elapsed().as_secs_f64()),
        step_s: step_since.map_or(0.0, |t| t.elapsed().as_secs_f64()),
        pid: std::process::id(),
        host: reinforge_lease::hostname(),
        updated_unix: SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64()),
        ranks: monitor.map(|m| m.ranks()).unwrap_or_default(),
    }
}

/// `ranks.json`, replaced atomically so a reader never sees half of it.
fn write_status(out_dir: &Path, snap: &Snapshot, fence: &Fence) {
    if let Ok(body) = serde_json::to_vec_pretty(snap) {
        let _ = fence.publish(&out_dir.join("ranks.json"), &body);
    }
}

#[allow(clippy::too_many_arguments)]
fn report(out_dir: &Path, why: &str, snap: &Snapshot, monitor: Option<&dyn RankMonitor>, restart: bool, clock: &StepClock, started: Instant, fence: &Fence) {
    eprintln!("stall: {why}; the controller is in {} for {:.1}s", snap.phase, snap.phase_s);
    for r in &snap.ranks {
        eprintln!("stall:   {} on node {}: {} for {:.1}s (last heartbeat {:.1}s ago)", r.rank, r.node, r.activity, r.activity_s, r.beat_age_s);
    }
    // Taken before the ownership check: gdb stops the whole process (the lease's heartbeat
    // with it) while it reads the stacks, for no longer than the lease can go without one.
    let limit = activity::STACKS_LIMIT.min(fence.max_freeze().saturating_sub(activity::STACKS_SLACK));
    let controller = format!("# controller in {}\n{}", snap.phase, activity::stacks(limit));
    // A run that lost its directory (it was paused, say, which also looks like a stall)
    // reports nothing there: the new owner's `stalls/` are its own.
    if let Err(e) = fence.check() {
        eprintln!("stall: not reported in {}: {e}", out_dir.display());
        return;
    }
    let dir = out_dir.join("stalls").join(format!("step-{}", snap.step));
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("stall: cannot create {}: {e}", dir.display());
        return;
    }
    let files = [("report.txt", format!("{why}\n{}\n", serde_json::to_string_pretty(snap).unwrap_or_default())), ("controller.txt", controller)];
    for (name, text) in files {
        let path = dir.join(name);
        match fence.publish(&path, text.as_bytes()) {
            Ok(()) => {}
            // Only a lost directory ends the report: a full disk (a stall's classic cause)
            // must not keep the ranks' stacks or the restart from happening.
            Err(e @ reinforge_lease::LeaseError::Lost { .. }) => {
                eprintln!("stall: not reported in {}: {e}", out_dir.display());
                return;
            }
            Err(e) => eprintln!("stall: cannot write {}: {e}", path.display()),
        }
    }
    // Every rank, not only those whose last heartbeat said busy: that report is up to a
    // heartbeat old, and the idle ranks show what the busy one is keeping them from.
    let all: Vec<String> = snap.ranks.iter().map(|r| r.rank.clone()).collect();
    if let Some(m) = monitor {
        m.request_stacks(&dir, why, &all);
    }
    eprintln!("stall: stacks in {} (controller.txt, and each rank's as it answers)", dir.display());
    if !restart {
        return;
    }
    match monitor {
        Some(m) => {
            // The busy ranks' stacks come with their next heartbeats; give them a moment.
            let deadline = Instant::now() + Duration::from_secs(20);
            while Instant::now() < deadline && all.iter().any(|r| !dir.join(format!("{}.txt", r.replace(':', "-"))).exists()) {
                std::thread::sleep(Duration::from_millis(200));
            }
            // A step that got going again while the stacks came in is not restarted.
            if clock.with(|s| s.step == snap.step && s.step_since == Some(started)) {
                m.fail(format!("stall: {why} (trainer.on_stall = restart)"));
            } else {
                eprintln!("stall: step {} finished after all; not restarting", snap.step);
            }
        }
        None => eprintln!("stall: trainer.on_stall = restart applies to cluster runs; a single-process run only reports"),
    }
}
