//! Where a Reinforge run's numbers go.
//!
//! - [`Metrics`]: one step's values by verl-style name (`actor/pg_loss`, `critic/score/mean`,
//!   `timing_s/gen`), with helpers for mean/max/min of a slice.
//! - [`RunLog`]: for a run directory, `metrics.jsonl` (one JSON object per step, appended and
//!   flushed per line; on resume, records after the resumed step move to
//!   `metrics.jsonl.superseded` so curves do not repeat and no row is lost) and a TensorBoard event file written by hand ([`tfevents`]: TFRecord framing,
//!   CRC32C, a few protobuf fields).
//! - [`Console`]: a progress bar with ETA and reward/KL/entropy/tokens-per-second on a
//!   terminal; one plain line per step when stderr is not a TTY (CI, log files).
//!
//! Dependencies are files and the terminal only: `serde_json` for JSONL, `crc32c` for record
//! checksums, `indicatif` for the bar, `tracing` for warnings, `reinforge-lease` for the fence
//! checked before every write. No tensor or engine crate: the
//! trainer turns its tensors into `f64`s before they get here.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod console;
pub mod error;
pub mod jsonl;
pub mod metrics;
pub mod runlog;
pub mod tfevents;

pub use console::{plain_line, summary_message, Console, ConsoleMode, PhaseDisplay};
pub use error::{MetricsError, Result};
pub use jsonl::{record_line, superseded_path, truncate_after, JsonlWriter, Truncation, METRICS_FILE, SUPERSEDED_SUFFIX};
pub use metrics::Metrics;
pub use runlog::{unix_time, utc_stamp, RunLog, RunLogOptions, SAMPLES_FILE, TEXT_LOG_FILE};
pub use tfevents::{EventWriter, FILE_VERSION};
