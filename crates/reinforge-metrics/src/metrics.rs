//! [`Metrics`]: one step's numbers, by verl-style slash-separated name.

use std::collections::BTreeMap;
use std::time::Duration;

/// One step's metrics: name → value, iterated in name order (so every sink writes them in the
/// same, stable order). Names follow verl: `actor/pg_loss`, `critic/score/mean`, `timing_s/gen`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Metrics {
    values: BTreeMap<String, f64>,
}

impl Metrics {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets `name` to `value` (replacing an earlier value).
    pub fn insert(&mut self, name: impl Into<String>, value: f64) {
        self.values.insert(name.into(), value);
    }

    /// Builder form of [`insert`](Self::insert).
    pub fn with(mut self, name: impl Into<String>, value: f64) -> Self {
        self.insert(name, value);
        self
    }

    /// The value of `name`.
    pub fn get(&self, name: &str) -> Option<f64> {
        self.values.get(name).copied()
    }

    /// The first of `names` that is present (for metrics with several conventional names).
    pub fn first_of(&self, names: &[&str]) -> Option<f64> {
        names.iter().find_map(|n| self.get(n))
    }

    /// Adds `value` to `name` (starting from 0): sums over micro-batches.
    pub fn accumulate(&mut self, name: &str, value: f64) {
        let total = self.get(name).unwrap_or(0.0) + value;
        self.insert(name, total);
    }

    /// Adds `prefix/mean`, `prefix/max` and `prefix/min` of `values`; adds nothing when it is
    /// empty (a mean of nothing would be NaN and poison the curves).
    pub fn add_stats<T: Copy + Into<f64>>(&mut self, prefix: &str, values: &[T]) {
        if values.is_empty() {
            return;
        }
        let mut sum = 0.0;
        let mut max = f64::NEG_INFINITY;
        let mut min = f64::INFINITY;
        for &v in values {
            let v: f64 = v.into();
            sum += v;
            max = max.max(v);
            min = min.min(v);
        }
        self.insert(format!("{prefix}/mean"), sum / values.len() as f64);
        self.insert(format!("{prefix}/max"), max);
        self.insert(format!("{prefix}/min"), min);
    }

    /// Adds `timing_s/<name>` in seconds, as verl's `marked_timer` does.
    pub fn add_timing(&mut self, name: &str, elapsed: Duration) {
        self.insert(format!("timing_s/{name}"), elapsed.as_secs_f64());
    }

    /// Copies every metric of `other` in, each name prefixed with `prefix/` (none if empty).
    pub fn extend_prefixed(&mut self, prefix: &str, other: &Metrics) {
        for (k, v) in other.iter() {
            let name = if prefix.is_empty() { k.to_string() } else { format!("{prefix}/{k}") };
            self.insert(name, v);
        }
    }

    /// Name/value pairs in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, f64)> + '_ {
        self.values.iter().map(|(k, v)| (k.as_str(), *v))
    }

    /// Number of metrics.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }
}

impl<K: Into<String>> FromIterator<(K, f64)> for Metrics {
    fn from_iter<I: IntoIterator<Item = (K, f64)>>(iter: I) -> Self {
        let mut m = Metrics::new();
        m.extend(iter);
        m
    }
}

impl<K: Into<String>> Extend<(K, f64)> for Metrics {
    fn extend<I: IntoIterator<Item = (K, f64)>>(&mut self, iter: I) {
        for (k, v) in iter {
            self.insert(k, v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_and_helpers() {
        let mut m = Metrics::new();
        m.add_stats("critic/score", &[1.0f32, 0.0, 0.5, 0.5]);
        assert_eq!(m.get("critic/score/mean"), Some(0.5));
        assert_eq!(m.get("critic/score/max"), Some(1.0));
        assert_eq!(m.get("critic/score/min"), Some(0.0));
        m.add_stats::<f64>("empty", &[]);
        assert_eq!(m.len(), 3);
        m.add_stats("response_length", &[3u32, 5]);
        assert_eq!(m.get("response_length/mean"), Some(4.0));
        m.add_timing("gen", Duration::from_millis(1500));
        assert_eq!(m.get("timing_s/gen"), Some(1.5));
        let names: Vec<&str> = m.iter().map(|(k, _)| k).collect();
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(names, sorted);
        assert_eq!(m.first_of(&["nope", "timing_s/gen"]), Some(1.5));

        let mut all = Metrics::new();
        all.extend_prefixed("val", &Metrics::from_iter([("acc", 0.25)]));
        assert_eq!(all.get("val/acc"), Some(0.25));
    }
}
