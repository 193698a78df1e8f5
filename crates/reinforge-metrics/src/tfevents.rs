//! TensorBoard event files, written by hand.
//!
//! Why no TensorBoard crate: the existing ones (`tensorboard-rs` and friends) pull in a
//! protobuf code generator/runtime and image-encoding stacks, while scalars need only
//! TFRecord framing plus three tiny protobuf messages, about a hundred lines here.
//!
//! File layout: a sequence of TFRecords, each
//! `u64 LE length | u32 LE masked_crc32c(length bytes) | data | u32 LE masked_crc32c(data)`,
//! where `data` is a serialized `tensorflow.Event`:
//!
//! ```text
//! Event      { double wall_time = 1; int64 step = 2; string file_version = 3;
//!              Summary summary = 5; SessionLog session_log = 6; }
//! Summary    { repeated Value value = 1; }
//! Value      { string tag = 1; float simple_value = 2; }
//! SessionLog { SessionStatus status = 1; }   // START = 1
//! ```
//!
//! The first event of a file carries only `file_version = "brain.Event:2"`.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::{io_err, Result};
use crate::metrics::Metrics;

/// `file_version` of the first event; version 2 enables `SessionLog`-based restart handling.
pub const FILE_VERSION: &str = "brain.Event:2";

/// `SessionLog.status` value for a (re)start.
const SESSION_START: u64 = 1;

/// Protobuf wire types used here.
const WIRE_VARINT: u32 = 0;
const WIRE_FIXED64: u32 = 1;
const WIRE_LEN: u32 = 2;
const WIRE_FIXED32: u32 = 5;

/// TFRecord's checksum: CRC32C rotated right by 15 bits plus a constant, so that a CRC of
/// data that itself holds CRCs does not degenerate.
pub fn masked_crc32c(data: &[u8]) -> u32 {
    let crc = crc32c::crc32c(data);
    // ((crc >> 15) | (crc << 17)) + 0xa282ead8, as the TFRecord format states it.
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// Appends `data` framed as one TFRecord to `out`.
pub fn frame_record(data: &[u8], out: &mut Vec<u8>) {
    let len = (data.len() as u64).to_le_bytes();
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc32c(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc32c(data).to_le_bytes());
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_key(out: &mut Vec<u8>, field: u32, wire: u32) {
    put_varint(out, u64::from((field << 3) | wire));
}

fn put_len_delimited(out: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    put_key(out, field, WIRE_LEN);
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// Event fields 1 (wall_time) and 2 (step).
fn event_header(wall_time: f64, step: Option<i64>) -> Vec<u8> {
    let mut ev = Vec::with_capacity(64);
    put_key(&mut ev, 1, WIRE_FIXED64);
    ev.extend_from_slice(&wall_time.to_le_bytes());
    if let Some(step) = step {
        put_key(&mut ev, 2, WIRE_VARINT);
        // int64 is encoded as its two's-complement u64.
        put_varint(&mut ev, step as u64);
    }
    ev
}

/// The serialized first event of a file: `wall_time` and `file_version`.
pub fn encode_file_version_event(wall_time: f64) -> Vec<u8> {
    let mut ev = event_header(wall_time, None);
    put_len_delimited(&mut ev, 3, FILE_VERSION.as_bytes());
    ev
}

/// A serialized event holding one summary with a `simple_value` per scalar. Values are stored
/// as f32, which is what `simple_value` is.
pub fn encode_scalars_event<'a>(wall_time: f64, step: i64, scalars: impl IntoIterator<Item = (&'a str, f64)>) -> Vec<u8> {
    let mut summary = Vec::new();
    let mut value = Vec::new();
    for (tag, v) in scalars {
        value.clear();
        put_len_delimited(&mut value, 1, tag.as_bytes());
        put_key(&mut value, 2, WIRE_FIXED32);
        value.extend_from_slice(&(v as f32).to_le_bytes());
        put_len_delimited(&mut summary, 1, &value);
    }
    let mut ev = event_header(wall_time, Some(step));
    put_len_delimited(&mut ev, 5, &summary);
    ev
}

/// A serialized `SessionLog { status: START }` event at `step`. TensorBoard treats it as a
/// restart and discards this run's earlier data at steps `>= step`, the event-file
/// counterpart of truncating `metrics.jsonl` on resume.
pub fn encode_session_start_event(wall_time: f64, step: i64) -> Vec<u8> {
    let mut session_log = Vec::new();
    put_key(&mut session_log, 1, WIRE_VARINT);
    put_varint(&mut session_log, SESSION_START);
    let mut ev = event_header(wall_time, Some(step));
    put_len_delimited(&mut ev, 6, &session_log);
    ev
}

/// `events.out.tfevents.<unix>.<hostname>.reinforge`; TensorBoard finds files by `tfevents`.
pub fn event_file_name(unix_secs: u64, hostname: &str) -> String {
    format!("events.out.tfevents.{unix_secs}.{hostname}.reinforge")
}

/// This machine's host name, reduced to characters safe in a file name.
pub use reinforge_lease::hostname;

/// Writes one TensorBoard event file; every event is written and flushed as it comes.
#[derive(Debug)]
pub struct EventWriter {
    path: PathBuf,
    file: File,
}

impl EventWriter {
    /// Creates a new event file in `dir` and writes its `file_version` event. The name's
    /// timestamp is bumped while a file of that name exists (two starts in one second).
    pub fn create(dir: impl AsRef<Path>, wall_time: f64) -> Result<Self> {
        let dir = dir.as_ref();
        let host = hostname();
        let mut secs = wall_time.max(0.0) as u64;
        let (path, file) = loop {
            let path = dir.join(event_file_name(secs, &host));
            match OpenOptions::new().write(true).create_new(true).open(&path) {
                Ok(f) => break (path, f),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => secs += 1,
                Err(e) => return Err(io_err("create", &path)(e)),
            }
        };
        let mut w = EventWriter { path, file };
        w.write_event(&encode_file_version_event(wall_time))?;
        Ok(w)
    }

    /// Writes all of `metrics` as scalars of `step`.
    pub fn write_scalars(&mut self, step: u64, wall_time: f64, metrics: &Metrics) -> Result<()> {
        let step = i64::try_from(step).unwrap_or(i64::MAX);
        self.write_event(&encode_scalars_event(wall_time, step, metrics.iter()))
    }

    /// Marks a restart at `step` (see [`encode_session_start_event`]).
    pub fn write_session_start(&mut self, step: u64, wall_time: f64) -> Result<()> {
        let step = i64::try_from(step).unwrap_or(i64::MAX);
        self.write_event(&encode_session_start_event(wall_time, step))
    }

    /// The event file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn write_event(&mut self, event: &[u8]) -> Result<()> {
        let mut record = Vec::with_capacity(event.len() + 16);
        frame_record(event, &mut record);
        // One write per record: TensorBoard tails the file and must not see half a record
        // longer than necessary; the File is unbuffered, so no flush is needed.
        self.file.write_all(&record).map_err(io_err("append to", &self.path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints() {
        let mut v = Vec::new();
        put_varint(&mut v, 300);
        assert_eq!(v, [0xac, 0x02]);
        v.clear();
        put_varint(&mut v, -1i64 as u64);
        assert_eq!(v.len(), 10);
    }

    #[test]
    fn known_masked_crc() {
        // CRC32C("123456789") = 0xE3069283 (RFC 3720 check value), then masked.
        assert_eq!(crc32c::crc32c(b"123456789"), 0xE306_9283);
        // ((0xE3069283 >> 15) | (0xE3069283 << 17)) + 0xa282ead8, computed independently.
        assert_eq!(masked_crc32c(b"123456789"), 0xC78A_B0E5);
    }

    #[test]
    fn hostname_is_file_safe() {
        let h = hostname();
        assert!(!h.is_empty());
        assert!(h.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)));
    }
}
