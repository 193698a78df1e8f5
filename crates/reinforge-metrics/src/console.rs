//! [`Console`]: what a person watching the run sees on stderr. A progress bar on a terminal;
//! in CI and log files (no TTY), where a redrawn bar turns into garbage, one plain line per step.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::metrics::Metrics;

/// Metric names shown as the reward, first present wins (verl's names first).
pub const REWARD_KEYS: &[&str] = &["critic/score/mean", "critic/rewards/mean", "reward/mean"];
/// Metric names shown as the KL.
pub const KL_KEYS: &[&str] = &["actor/ppo_kl", "actor/kl_loss", "critic/kl"];
/// Metric names shown as the entropy.
pub const ENTROPY_KEYS: &[&str] = &["actor/entropy"];
/// Metric names shown as throughput in tokens per second.
pub const THROUGHPUT_KEYS: &[&str] = &["perf/throughput", "perf/tokens_per_s"];

/// How the console reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ConsoleMode {
    /// A bar if stderr is a terminal, plain lines otherwise.
    #[default]
    Auto,
    /// Always the progress bar.
    Bar,
    /// Always plain lines.
    Plain,
    /// Nothing.
    Quiet,
}

enum Out {
    Bar(ProgressBar),
    Plain,
    Quiet,
}

/// Reports training progress on stderr.
pub struct Console {
    out: Out,
    total_steps: u64,
    start_step: u64,
    started: Instant,
}

impl std::fmt::Debug for Console {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mode = match self.out {
            Out::Bar(_) => "bar",
            Out::Plain => "plain",
            Out::Quiet => "quiet",
        };
        f.debug_struct("Console")
            .field("mode", &mode)
            .field("total_steps", &self.total_steps)
            .field("start_step", &self.start_step)
            .finish()
    }
}

impl Console {
    /// A console for a run of `total_steps`, resuming after `start_step` (0 for a new run);
    /// bar or plain lines depending on whether stderr is a terminal.
    pub fn new(total_steps: u64, start_step: u64) -> Self {
        Self::with_mode(total_steps, start_step, ConsoleMode::Auto)
    }

    /// A console with an explicit [`ConsoleMode`].
    pub fn with_mode(total_steps: u64, start_step: u64, mode: ConsoleMode) -> Self {
        let use_bar = match mode {
            ConsoleMode::Auto => std::io::stderr().is_terminal(),
            ConsoleMode::Bar => true,
            ConsoleMode::Plain | ConsoleMode::Quiet => false,
        };
        let out = if mode == ConsoleMode::Quiet {
            Out::Quiet
        } else if use_bar {
            // The bar counts the steps of this process only, so its ETA is not skewed by
            // steps done before a resume; the absolute step is shown in the prefix.
            let bar = ProgressBar::with_draw_target(
                Some(total_steps.saturating_sub(start_step)),
                ProgressDrawTarget::stderr(),
            );
            // The template is a constant: if it ever failed to parse, the default style is fine.
            if let Ok(style) = ProgressStyle::with_template(
                "{prefix} [{elapsed_precise}] [{bar:30}] ETA {eta} {msg}",
            ) {
                bar.set_style(style.progress_chars("=> "));
            }
            bar.set_prefix(format!("step {start_step}/{total_steps}"));
            Out::Bar(bar)
        } else {
            Out::Plain
        };
        Console { out, total_steps, start_step, started: Instant::now() }
    }

    /// Shows that `step` finished with `metrics`.
    pub fn update(&mut self, step: u64, metrics: &Metrics) {
        match &self.out {
            Out::Bar(bar) => {
                bar.set_prefix(format!("step {step}/{}", self.total_steps));
                bar.set_message(summary_message(metrics));
                bar.set_position(step.saturating_sub(self.start_step));
            }
            Out::Plain => {
                eprintln!("{}", plain_line(step, self.total_steps, self.start_step, self.started.elapsed(), metrics));
            }
            Out::Quiet => {}
        }
    }

    /// A handle that shows the running step's phase on the bar.
    pub fn phase_display(&self) -> PhaseDisplay {
        match &self.out {
            Out::Bar(bar) => PhaseDisplay { bar: Some(bar.clone()), total_steps: self.total_steps },
            _ => PhaseDisplay::default(),
        }
    }

    /// Prints a line without breaking the bar.
    pub fn println(&self, line: &str) {
        match &self.out {
            Out::Bar(bar) => bar.println(line),
            Out::Plain => eprintln!("{line}"),
            Out::Quiet => {}
        }
    }

    /// Ends the bar (left on screen) and prints the final summary lines.
    pub fn finish(self, summary: &[String]) {
        match &self.out {
            Out::Bar(bar) => {
                bar.finish();
                for line in summary {
                    eprintln!("{line}");
                }
            }
            Out::Plain => {
                for line in summary {
                    eprintln!("{line}");
                }
            }
            Out::Quiet => {}
        }
    }
}

/// `reward 0.532 | kl 0.00123 | entropy 1.23 | 1234 tok/s`, from whichever of those metrics exist.
pub fn summary_message(metrics: &Metrics) -> String {
    let mut parts = Vec::new();
    if let Some(v) = metrics.first_of(REWARD_KEYS) {
        parts.push(format!("reward {}", fmt_num(v)));
    }
    if let Some(v) = metrics.first_of(KL_KEYS) {
        parts.push(format!("kl {}", fmt_num(v)));
    }
    if let Some(v) = metrics.first_of(ENTROPY_KEYS) {
        parts.push(format!("entropy {}", fmt_num(v)));
    }
    if let Some(v) = metrics.first_of(THROUGHPUT_KEYS) {
        parts.push(format!("{v:.0} tok/s"));
    }
    // Where the step's time went, by phase (verl's timing_s names, summed per phase).
    let phases: Vec<String> = PHASE_TIMES
        .iter()
        .filter_map(|(label, keys)| {
            let t: f64 = keys.iter().filter_map(|k| metrics.get(k)).sum();
            keys.iter().any(|k| metrics.get(k).is_some()).then(|| format!("{label} {}s", fmt_num(t)))
        })
        .collect();
    if !phases.is_empty() {
        parts.push(phases.join(" "));
    }
    if let Some(v) = metrics.get("perf/cpu_memory_used_gb") {
        parts.push(format!("rss {} GB", fmt_num(v)));
    }
    if let Some(v) = metrics.get("perf/max_memory_allocated_gb") {
        parts.push(format!("gpu {} GB", fmt_num(v)));
    }
    parts.join(" | ")
}

/// The progress line's phases and the timings that make each.
const PHASE_TIMES: &[(&str, &[&str])] = &[
    ("gen", &["timing_s/gen"]),
    ("search", &["timing_s/retrieval"]),
    ("lp", &["timing_s/old_log_prob", "timing_s/ref", "timing_s/values"]),
    ("upd", &["timing_s/update_actor", "timing_s/update_critic"]),
];

/// Shows the phase a step is in on the bar while it runs (nothing in plain mode: a line per
/// step is enough there). Cheap to clone; hand it to whatever knows the phase.
#[derive(Clone, Default)]
pub struct PhaseDisplay {
    bar: Option<ProgressBar>,
    total_steps: u64,
}

impl PhaseDisplay {
    /// Step `step` is now in `phase`.
    pub fn set(&self, step: u64, phase: &str) {
        if let Some(bar) = &self.bar {
            bar.set_prefix(format!("step {step}/{} {phase}", self.total_steps));
        }
    }
}

/// The plain (non-TTY) line for one step:
/// `step 12/100 (12%) | reward 0.532 | ... | elapsed 1m02s | eta 7m35s`.
pub fn plain_line(step: u64, total_steps: u64, start_step: u64, elapsed: Duration, metrics: &Metrics) -> String {
    let pct = step.saturating_mul(100).checked_div(total_steps).unwrap_or(100);
    let mut line = format!("step {step}/{total_steps} ({pct}%)");
    let msg = summary_message(metrics);
    if !msg.is_empty() {
        line.push_str(" | ");
        line.push_str(&msg);
    }
    line.push_str(&format!(" | elapsed {}", fmt_duration(elapsed)));
    // ETA from this process's own pace: steps before a resume took no time here.
    let done = step.saturating_sub(start_step);
    if done > 0 {
        let remaining = total_steps.saturating_sub(step);
        let eta = elapsed.as_secs_f64() / done as f64 * remaining as f64;
        line.push_str(&format!(" | eta {}", fmt_duration(Duration::from_secs_f64(eta))));
    }
    line
}

/// Three significant digits without noise: `0.532`, `0.00123`, `1.2e-5`, `1234`.
fn fmt_num(v: f64) -> String {
    let a = v.abs();
    if v == 0.0 || !v.is_finite() {
        format!("{v}")
    } else if a >= 1000.0 {
        format!("{v:.0}")
    } else if a >= 1e-3 {
        let decimals = (2 - a.log10().floor() as i32).max(0) as usize;
        format!("{v:.decimals$}")
    } else {
        format!("{v:.1e}")
    }
}

/// `1h02m03s`, `3m12s`, `12s`.
fn fmt_duration(d: Duration) -> String {
    let s = d.as_secs();
    let (h, m, s) = (s / 3600, (s % 3600) / 60, s % 60);
    if h > 0 {
        format!("{h}h{m:02}m{s:02}s")
    } else if m > 0 {
        format!("{m}m{s:02}s")
    } else {
        format!("{s}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_line_format() {
        let m = Metrics::new()
            .with("critic/score/mean", 0.5321)
            .with("actor/ppo_kl", 0.0012345)
            .with("actor/entropy", 1.23456)
            .with("perf/throughput", 1234.4)
            .with("actor/pg_loss", -0.1);
        let line = plain_line(12, 100, 2, Duration::from_secs(20), &m);
        assert_eq!(
            line,
            "step 12/100 (12%) | reward 0.532 | kl 0.00123 | entropy 1.23 | 1234 tok/s | elapsed 20s | eta 2m56s"
        );
        // Nothing known, first step of a run: no message, no ETA yet.
        assert_eq!(plain_line(0, 10, 0, Duration::from_secs(3725), &Metrics::new()), "step 0/10 (0%) | elapsed 1h02m05s");
    }

    #[test]
    fn phases_and_memory_join_the_line() {
        let m = Metrics::new()
            .with("critic/score/mean", 0.5)
            .with("timing_s/gen", 0.2)
            .with("timing_s/old_log_prob", 0.1)
            .with("timing_s/ref", 0.05)
            .with("timing_s/update_actor", 0.7)
            .with("perf/cpu_memory_used_gb", 1.234);
        assert_eq!(summary_message(&m), "reward 0.500 | gen 0.200s lp 0.150s upd 0.700s | rss 1.23 GB");
    }

    #[test]
    fn numbers() {
        assert_eq!(fmt_num(0.0), "0");
        assert_eq!(fmt_num(2.5e-5), "2.5e-5");
        assert_eq!(fmt_num(-0.25), "-0.250");
        assert_eq!(fmt_num(12345.6), "12346");
        assert_eq!(fmt_num(f64::NAN), "NaN");
    }

    #[test]
    fn modes_do_not_panic() {
        let m = Metrics::new().with("critic/score/mean", 1.0);
        for mode in [ConsoleMode::Quiet, ConsoleMode::Plain, ConsoleMode::Bar] {
            let mut c = Console::with_mode(3, 1, mode);
            c.update(2, &m);
            c.println("a note");
            c.update(3, &m);
            c.finish(&["done".to_string()]);
        }
    }
}
