//! Where device time goes, op by op: [`super::Gpu::profile`] runs a closure with every kernel,
//! GEMM, copy and NCCL call it queues bracketed by timestamps taken on the stream (GPU events;
//! on the emulator, whose ops run as they are queued, wall time), and sums the time per kernel
//! name or GEMM shape — `nsys`'s kernel summary, without `nsys`, which GPU nodes often lack.
//! What `reinforge bench rollout|train --profile` writes. A graph replay is one op: profile
//! eager work to see its kernels.
//!
//! An op's start is timestamped when the stream reaches it. While the device has queued work
//! (a training step's large kernels) that is when the op before it ends, so each op's time is
//! its own. When the device waits for the host instead (eager decoding of a small model), the
//! start is stamped at once and the op's time also holds its launch from the host: per-op times
//! are then upper bounds, and the idle time a lower bound.

use std::collections::HashMap;
use std::time::Instant;

/// Work an op does, for its achieved rates (zero where unknown).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Cost {
    /// Floating-point operations (2 per multiply-add).
    pub flops: f64,
    /// Bytes it must move at least once.
    pub bytes: f64,
}

/// A timestamp on the stream.
pub(crate) enum Stamp {
    /// A recorded CUDA event (timing enabled), destroyed after reading.
    Event(EventHandle),
    /// When an emulator op started or ended.
    Wall(Instant),
}

/// A CUDA event as a plain address, so a profile in progress can live in the shared `Gpu`.
pub(crate) struct EventHandle(pub cudarc::driver::sys::CUevent);
// SAFETY: the driver lets any thread with the context current use an event; the profile only
// reads it through the `Gpu` that made it.
unsafe impl Send for EventHandle {}

/// One op as queued.
pub(crate) struct Span {
    pub label: String,
    pub cost: Cost,
    pub start: Stamp,
    pub end: Stamp,
}

/// One op's totals over the profile.
#[derive(Debug, Clone, serde::Serialize)]
pub struct OpTotal {
    /// The kernel's name, `gemm M×N×K …` for a GEMM, or the copy's kind.
    pub op: String,
    /// Times it ran.
    pub calls: usize,
    /// Device time, summed.
    pub seconds: f64,
    /// Floating-point operations, summed (GEMMs).
    pub flops: f64,
    /// Bytes moved at least once, summed (GEMMs and copies).
    pub bytes: f64,
}

impl OpTotal {
    /// Achieved FLOP/s (`None` without a FLOP count).
    pub fn flops_per_s(&self) -> Option<f64> {
        (self.flops > 0.0 && self.seconds > 0.0).then(|| self.flops / self.seconds)
    }
    /// Achieved bytes/s (`None` without a byte count).
    pub fn bytes_per_s(&self) -> Option<f64> {
        (self.bytes > 0.0 && self.seconds > 0.0).then(|| self.bytes / self.seconds)
    }
}

/// Device time of a stretch of work, per op.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Profile {
    /// The device (`NVIDIA H100 80GB HBM3`, `emulator`).
    pub device: String,
    /// Per op, the most time first.
    pub ops: Vec<OpTotal>,
    /// Ops queued.
    pub launches: usize,
    /// Time the device spent in ops.
    pub busy_seconds: f64,
    /// Time between one op's end and the next one's start: the device waiting for the host
    /// (launch overhead, host work between steps). CUDA graphs remove most of it.
    pub idle_seconds: f64,
}

/// Per-op sums of the spans folded in so far (a profile is folded in batches, so a long one
/// holds a bounded number of events).
#[derive(Default)]
pub(crate) struct Totals {
    ops: Vec<OpTotal>,
    index: HashMap<String, usize>,
    launches: usize,
    busy: f64,
    idle: f64,
}

impl Totals {
    /// Adds `spans` (in queue order); `seconds(a, b)` is the time from stamp a to b. The idle
    /// time before a batch's first span is not counted: the host was reading the last batch.
    pub(crate) fn add(&mut self, spans: &[Span], mut seconds: impl FnMut(&Stamp, &Stamp) -> f64) {
        for (i, s) in spans.iter().enumerate() {
            let t = seconds(&s.start, &s.end).max(0.0);
            self.busy += t;
            if i > 0 {
                self.idle += seconds(&spans[i - 1].end, &s.start).max(0.0);
            }
            let k = match self.index.get(&s.label) {
                Some(&k) => k,
                None => {
                    self.ops.push(OpTotal { op: s.label.clone(), calls: 0, seconds: 0.0, flops: 0.0, bytes: 0.0 });
                    self.index.insert(s.label.clone(), self.ops.len() - 1);
                    self.ops.len() - 1
                }
            };
            let o = &mut self.ops[k];
            o.calls += 1;
            o.seconds += t;
            o.flops += s.cost.flops;
            o.bytes += s.cost.bytes;
        }
        self.launches += spans.len();
    }

    /// The profile of everything added.
    pub(crate) fn finish(mut self, device: &str) -> Profile {
        self.ops.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
        Profile { device: device.to_string(), ops: self.ops, launches: self.launches, busy_seconds: self.busy, idle_seconds: self.idle }
    }
}

impl Profile {
    /// The `top` costliest ops as a table, with a header line of totals.
    pub fn table(&self, top: usize) -> String {
        let ms = |s: f64| s * 1e3;
        let mut out = format!(
            "{} ops on {}: {:.3} ms busy, {:.3} ms idle between ops\n{:>10} {:>6} {:>7}  {:<48} {:>9} {:>9}\n",
            self.launches,
            self.device,
            ms(self.busy_seconds),
            ms(self.idle_seconds),
            "ms",
            "%busy",
            "calls",
            "op",
            "TFLOP/s",
            "GB/s"
        );
        let rate = |v: Option<f64>, unit: f64| v.map_or_else(|| "-".to_string(), |v| format!("{:.1}", v / unit));
        for o in self.ops.iter().take(top) {
            out.push_str(&format!(
                "{:>10.3} {:>5.1}% {:>7}  {:<48} {:>9} {:>9}\n",
                ms(o.seconds),
                100.0 * o.seconds / self.busy_seconds.max(1e-30),
                o.calls,
                o.op,
                rate(o.flops_per_s(), 1e12),
                rate(o.bytes_per_s(), 1e9)
            ));
        }
        if self.ops.len() > top {
            let rest: f64 = self.ops[top..].iter().map(|o| o.seconds).sum();
            out.push_str(&format!("{:>10.3} {:>5.1}%          ({} more ops)\n", ms(rest), 100.0 * rest / self.busy_seconds.max(1e-30), self.ops.len() - top));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn sums_per_label_and_splits_busy_from_idle() {
        let t0 = Instant::now();
        let at = |ms: u64| Stamp::Wall(t0 + Duration::from_millis(ms));
        let span = |label: &str, a, b, flops| Span { label: label.into(), cost: Cost { flops, bytes: 0.0 }, start: at(a), end: at(b) };
        let spans = [span("k", 0, 2, 0.0), span("g", 3, 7, 8e9), span("k", 7, 8, 0.0), span("g", 10, 12, 8e9)];
        let secs = |a: &Stamp, b: &Stamp| match (a, b) {
            (Stamp::Wall(a), Stamp::Wall(b)) => b.duration_since(*a).as_secs_f64(),
            _ => unreachable!(),
        };
        // Two batches: the gap between them (8 → 10 ms) is the host reading the first.
        let mut t = Totals::default();
        t.add(&spans[..3], secs);
        t.add(&spans[3..], secs);
        let p = t.finish("test");
        assert_eq!(p.launches, 4);
        assert!((p.busy_seconds - 0.009).abs() < 1e-9);
        assert!((p.idle_seconds - 0.001).abs() < 1e-9);
        assert_eq!(p.ops[0].op, "g");
        assert_eq!((p.ops[0].calls, p.ops[1].calls), (2, 2));
        assert!((p.ops[0].flops_per_s().unwrap() - 16e9 / 0.006).abs() < 1.0);
        assert_eq!(p.ops[1].flops_per_s(), None);
        let t = p.table(1);
        assert!(t.contains("(1 more ops)"), "{t}");
    }
}
