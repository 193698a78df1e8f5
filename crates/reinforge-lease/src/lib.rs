//! Run-directory ownership: one process at a time publishes into a run directory.
//!
//! `reinforge train` takes its run directory's [`Lease`] before it reads or writes anything
//! there, and every write that publishes state (a checkpoint's rename, `latest`, the metrics
//! log, TensorBoard files, `placement.json`) first asks its [`Fence`] whether the directory is
//! still its own. A second run on the same directory is refused with who holds it; a holder
//! that is gone, or silent past the timeout, is taken over; a holder that was paused past the
//! timeout and taken over stops with an error instead of writing.
//!
//! ```text
//! <run dir>/lease/gen-000000000007.json   the owner: host, pid, start, Ray job, heartbeat, timeout
//! <run dir>/lease/gen-000000000006.json   the one before (kept for the record)
//! ```
//!
//! The protocol (why it holds on NFS and other shared file systems, without OS locks) is in
//! the [`lease`](mod@lease) module.
//!
//! Dependencies: files only (`serde_json` for records, `tracing` for warnings). Nothing else in
//! Reinforge is below it; the checkpoint and metrics crates take a [`Fence`].

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod error;
pub mod identity;
pub mod lease;

pub use error::LeaseError;
pub use identity::{boot_time_secs, fmt_age, hostname, process_state, unix_now, Identity, ProcessState};
pub use lease::{
    inspect, Acquired, Fence, Lease, LeaseOptions, LeaseRecord, LeaseView, Takeover, Verdict, DEFAULT_TIMEOUT, FORMAT,
    LEASE_DIR,
};
