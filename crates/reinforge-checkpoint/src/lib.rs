//! Crash-safe checkpoint directories for Reinforge.
//!
//! A checkpoint root holds one directory per saved step plus a pointer to the newest:
//!
//! ```text
//! <root>/global_step_N/            arbitrary named files, e.g. actor/model.safetensors,
//!                                  actor/optimizer.safetensors, critic/..., trainer_state.json
//! <root>/global_step_N/manifest.json   {format, version, step, files: [{path, size, sha256}],
//!                                       created_unix, meta}
//! <root>/latest                    "global_step_N"
//! ```
//!
//! The job of this crate is to make "kill -9 at any moment" safe:
//!
//! - [`save`] / [`CheckpointWriter`] write into `<root>/.tmp-global_step_N-<pid>-<nanos>/`, fsync
//!   each file, write `manifest.json` last, rename the directory into place, and only then
//!   rewrite `latest` atomically. Old checkpoints beyond [`SaveOptions::keep_last`] and
//!   temporaries of dead writers are pruned. The crash analysis is in the [`write`](mod@write) module.
//! - [`resolve`] turns a [`Resume`] choice into a verified [`Checkpoint`] (sizes always,
//!   SHA-256 by default), falling back from a broken `latest` to the newest complete step.
//!
//! - With [`SaveOptions::fence`], every publishing step (rename into place, `latest`, pruning)
//!   first checks that this process still owns the run directory (`reinforge-lease`), so a run
//!   that lost its directory to another changes nothing there.
//!
//! Dependencies are files only: `serde_json` for the manifest, `sha2` for hashes, `tracing`
//! for warnings, `reinforge-lease` for the fence. No tensor or engine crate: what goes into the
//! files is the caller's business.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod error;
mod fsutil;
pub mod manifest;
pub mod read;
pub mod write;

pub use error::{BoxError, CheckpointError, Result};
pub use manifest::{
    parse_step_dir_name, step_dir_name, FileEntry, Manifest, FORMAT, LATEST_FILE, MANIFEST_FILE,
    STEP_DIR_PREFIX, VERSION,
};
pub use read::{list_checkpoints, open, read_latest, resolve, resolve_with, Checkpoint, LoadOptions, Resume};
pub use write::{prune, save, write_latest, CheckpointWriter, CrashPoint, SaveOptions};
