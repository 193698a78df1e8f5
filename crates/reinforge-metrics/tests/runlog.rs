//! RunLog output checked from the outside: metrics.jsonl parsed as JSON, and TensorBoard
//! event files read back by an independent decoder written here (bitwise CRC32C, TFRecord
//! framing, protobuf wire format), sharing no code with the writer.

use std::fs;
use std::path::{Path, PathBuf};

use reinforge_metrics::{tfevents, Metrics, MetricsError, RunLog, RunLogOptions, METRICS_FILE};

// ---------------------------------------------------------------------------------------------
// Independent decoder
// ---------------------------------------------------------------------------------------------

/// CRC32C the slow, obvious way: reflected Castagnoli polynomial, one bit at a time.
fn crc32c_bitwise(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 { (crc >> 1) ^ 0x82F6_3B78 } else { crc >> 1 };
        }
    }
    !crc
}

// Written as the TFRecord format states it, not as the writer computes it.
#[allow(clippy::manual_rotate)]
fn mask(crc: u32) -> u32 {
    ((crc >> 15) | (crc << 17)).wrapping_add(0xa282_ead8)
}

/// Splits a TFRecord file into record payloads, checking both CRCs of every record.
fn read_records(bytes: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < bytes.len() {
        assert!(bytes.len() - pos >= 12, "truncated record header at {pos}");
        let len_bytes = &bytes[pos..pos + 8];
        let len = u64::from_le_bytes(len_bytes.try_into().unwrap()) as usize;
        let len_crc = u32::from_le_bytes(bytes[pos + 8..pos + 12].try_into().unwrap());
        assert_eq!(len_crc, mask(crc32c_bitwise(len_bytes)), "length CRC of record at {pos}");
        let data_start = pos + 12;
        assert!(bytes.len() >= data_start + len + 4, "truncated record data at {pos}");
        let data = &bytes[data_start..data_start + len];
        let data_crc = u32::from_le_bytes(bytes[data_start + len..data_start + len + 4].try_into().unwrap());
        assert_eq!(data_crc, mask(crc32c_bitwise(data)), "data CRC of record at {pos}");
        out.push(data.to_vec());
        pos = data_start + len + 4;
    }
    out
}

#[derive(Debug)]
enum Field {
    Varint(u64),
    Fixed64(u64),
    Bytes(Vec<u8>),
    Fixed32(u32),
}

fn read_varint(b: &[u8], pos: &mut usize) -> u64 {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = b[*pos];
        *pos += 1;
        v |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return v;
        }
    }
    panic!("varint too long");
}

fn parse_message(b: &[u8]) -> Vec<(u64, Field)> {
    let mut pos = 0;
    let mut fields = Vec::new();
    while pos < b.len() {
        let key = read_varint(b, &mut pos);
        let (field, wire) = (key >> 3, key & 7);
        let value = match wire {
            0 => Field::Varint(read_varint(b, &mut pos)),
            1 => {
                let v = u64::from_le_bytes(b[pos..pos + 8].try_into().unwrap());
                pos += 8;
                Field::Fixed64(v)
            }
            2 => {
                let len = read_varint(b, &mut pos) as usize;
                let v = b[pos..pos + len].to_vec();
                pos += len;
                Field::Bytes(v)
            }
            5 => {
                let v = u32::from_le_bytes(b[pos..pos + 4].try_into().unwrap());
                pos += 4;
                Field::Fixed32(v)
            }
            w => panic!("unexpected wire type {w}"),
        };
        fields.push((field, value));
    }
    fields
}

#[derive(Debug, Default)]
struct Event {
    wall_time: f64,
    step: i64,
    file_version: Option<String>,
    scalars: Vec<(String, f32)>,
    session_status: Option<u64>,
}

fn decode_event(b: &[u8]) -> Event {
    let mut ev = Event::default();
    for (field, value) in parse_message(b) {
        match (field, value) {
            (1, Field::Fixed64(v)) => ev.wall_time = f64::from_bits(v),
            (2, Field::Varint(v)) => ev.step = v as i64,
            (3, Field::Bytes(s)) => ev.file_version = Some(String::from_utf8(s).unwrap()),
            (5, Field::Bytes(summary)) => {
                for (f, value) in parse_message(&summary) {
                    let (1, Field::Bytes(value)) = (f, value) else { panic!("bad Summary field {f}") };
                    let (mut tag, mut simple) = (None, None);
                    for (vf, vv) in parse_message(&value) {
                        match (vf, vv) {
                            (1, Field::Bytes(t)) => tag = Some(String::from_utf8(t).unwrap()),
                            (2, Field::Fixed32(x)) => simple = Some(f32::from_bits(x)),
                            other => panic!("bad Summary.Value field {other:?}"),
                        }
                    }
                    ev.scalars.push((tag.expect("tag"), simple.expect("simple_value")));
                }
            }
            (6, Field::Bytes(log)) => {
                for (f, v) in parse_message(&log) {
                    if let (1, Field::Varint(status)) = (f, v) {
                        ev.session_status = Some(status);
                    }
                }
            }
            other => panic!("unexpected Event field {other:?}"),
        }
    }
    ev
}

fn read_events(path: &Path) -> Vec<Event> {
    read_records(&fs::read(path).unwrap()).iter().map(|r| decode_event(r)).collect()
}

fn event_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().contains("tfevents"))
        .collect();
    v.sort();
    v
}

fn jsonl(dir: &Path) -> Vec<serde_json::Map<String, serde_json::Value>> {
    fs::read_to_string(dir.join(METRICS_FILE))
        .unwrap()
        .lines()
        .map(|l| match serde_json::from_str(l).unwrap() {
            serde_json::Value::Object(m) => m,
            other => panic!("not an object: {other}"),
        })
        .collect()
}

fn step_metrics(step: u64) -> Metrics {
    let mut m = Metrics::new()
        .with("actor/pg_loss", -0.5 + step as f64 * 0.125)
        .with("timing_s/gen", 1.5)
        .with("actor/ppo_kl", 1e-3 * step as f64);
    m.add_stats("critic/score", &[0.0, step as f64]);
    m
}

// ---------------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------------

#[test]
fn crc32c_known_vectors() {
    // RFC 3720 (iSCSI) appendix B.4 and the common "123456789" check value.
    let ascending: Vec<u8> = (0..32).collect();
    let cases: [(&[u8], u32); 5] = [
        (b"", 0),
        (b"123456789", 0xE306_9283),
        (&[0u8; 32], 0x8A91_36AA),
        (&[0xffu8; 32], 0x62A8_AB43),
        (&ascending, 0x46DD_794E),
    ];
    for (data, want) in cases {
        assert_eq!(crc32c_bitwise(data), want, "test decoder CRC of {data:?}");
        assert_eq!(tfevents::masked_crc32c(data), mask(want), "writer's masked CRC of {data:?}");
    }
    let long: Vec<u8> = (0..10_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    assert_eq!(tfevents::masked_crc32c(&long), mask(crc32c_bitwise(&long)));
}

#[test]
fn event_bytes_match_hand_encoding() {
    // Event { wall_time: 2.0, step: 5, summary { value { tag: "a", simple_value: 1.0 } } }
    let ev = tfevents::encode_scalars_event(2.0, 5, [("a", 1.0)]);
    let mut want = vec![0x09];
    want.extend_from_slice(&2.0f64.to_le_bytes());
    want.extend_from_slice(&[0x10, 0x05, 0x2a, 0x0a, 0x0a, 0x08, 0x0a, 0x01, b'a', 0x15, 0x00, 0x00, 0x80, 0x3f]);
    assert_eq!(ev, want);

    let fv = tfevents::encode_file_version_event(0.5);
    let mut want = vec![0x09];
    want.extend_from_slice(&0.5f64.to_le_bytes());
    want.extend_from_slice(&[0x1a, 13]);
    want.extend_from_slice(b"brain.Event:2");
    assert_eq!(fv, want);

    let mut rec = Vec::new();
    tfevents::frame_record(b"abc", &mut rec);
    assert_eq!(rec.len(), 8 + 4 + 3 + 4);
    assert_eq!(read_records(&rec), vec![b"abc".to_vec()]);
}

#[test]
fn tensorboard_file_decodes() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = RunLog::create(dir.path()).unwrap();
    for step in 1..=3 {
        log.log_at(step, 1_700_000_000.0 + step as f64, &step_metrics(step)).unwrap();
    }
    let path = log.events_path().unwrap().to_path_buf();
    let name = path.file_name().unwrap().to_str().unwrap().to_string();
    assert!(name.starts_with("events.out.tfevents.") && name.ends_with(".reinforge"), "{name}");
    let unix: u64 = name.split('.').nth(3).unwrap().parse().expect("unix seconds in the name");
    assert!(unix > 1_600_000_000);

    let events = read_events(&path);
    assert_eq!(events.len(), 5, "{events:?}");
    assert_eq!(events[0].file_version.as_deref(), Some("brain.Event:2"));
    assert!(events[0].wall_time > 1_600_000_000.0);
    assert!(events[0].scalars.is_empty());
    assert_eq!(events[1].session_status, Some(1));
    assert_eq!(events[1].step, 0);
    for (i, ev) in events[2..].iter().enumerate() {
        let step = i as u64 + 1;
        assert_eq!(ev.step, step as i64);
        assert_eq!(ev.wall_time, 1_700_000_000.0 + step as f64);
        assert!(ev.file_version.is_none());
        let want: Vec<(String, f32)> = step_metrics(step).iter().map(|(k, v)| (k.to_string(), v as f32)).collect();
        assert_eq!(ev.scalars, want);
    }
    let tags: Vec<&str> = events[2].scalars.iter().map(|(t, _)| t.as_str()).collect();
    assert_eq!(
        tags,
        ["actor/pg_loss", "actor/ppo_kl", "critic/score/max", "critic/score/mean", "critic/score/min", "timing_s/gen"]
    );
}

#[test]
fn jsonl_content() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = RunLog::create(dir.path()).unwrap();
    log.log_at(1, 1_700_000_001.25, &step_metrics(1)).unwrap();
    log.log(2, &step_metrics(2).with("actor/grad_norm", f64::NAN)).unwrap();

    let text = fs::read_to_string(dir.path().join(METRICS_FILE)).unwrap();
    assert_eq!(text.lines().count(), 2);
    assert!(text.ends_with('\n'));
    let first = text.lines().next().unwrap();
    assert_eq!(
        first,
        r#"{"step":1,"timestamp":1700000001.25,"actor/pg_loss":-0.375,"actor/ppo_kl":0.001,"critic/score/max":1.0,"critic/score/mean":0.5,"critic/score/min":0.0,"timing_s/gen":1.5}"#
    );
    let rows = jsonl(dir.path());
    assert_eq!(rows[1]["step"], 2);
    assert!(rows[1]["timestamp"].as_f64().unwrap() > 1_600_000_000.0);
    assert!(rows[1]["actor/grad_norm"].is_null(), "NaN is written as null");
    let keys: Vec<&str> = rows[1].keys().map(String::as_str).take(2).collect();
    assert_eq!(keys, ["step", "timestamp"]);

    // A metric may not shadow the record's own keys; nothing is written for that step.
    let err = log.log(3, &Metrics::new().with("step", 1.0)).unwrap_err();
    assert!(matches!(err, MetricsError::ReservedName { .. }), "{err}");
    assert_eq!(jsonl(dir.path()).len(), 2);
    let events = read_events(log.events_path().unwrap());
    assert_eq!(events.last().unwrap().step, 2);
}

#[test]
fn resume_truncates_later_steps() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut log = RunLog::create(dir.path()).unwrap();
        for step in 1..=5 {
            log.log(step, &step_metrics(step)).unwrap();
        }
    }
    // The previous process died mid-line.
    let path = dir.path().join(METRICS_FILE);
    let mut text = fs::read_to_string(&path).unwrap();
    text.push_str(r#"{"step":6,"timesta"#);
    fs::write(&path, text).unwrap();

    // Resumed from the checkpoint at step 3: steps 4 and 5 are redone.
    let mut log = RunLog::resume(dir.path(), 3).unwrap();
    let steps: Vec<u64> = jsonl(dir.path()).iter().map(|r| r["step"].as_u64().unwrap()).collect();
    assert_eq!(steps, [1, 2, 3]);
    // The removed rows, the partial one included, are kept aside verbatim and counted.
    let aside = dir.path().join("metrics.jsonl.superseded");
    let t = log.truncation().clone();
    assert_eq!((t.kept, t.dropped, t.superseded.as_deref()), (3, 3, Some(aside.as_path())));
    let set_aside = fs::read_to_string(&aside).unwrap();
    let lines: Vec<&str> = set_aside.lines().collect();
    assert_eq!(lines.len(), 3);
    for (line, step) in lines[..2].iter().zip([4u64, 5]) {
        let row: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(row["step"], step);
        assert_eq!(row["actor/pg_loss"], -0.5 + step as f64 * 0.125);
    }
    assert_eq!(lines[2], r#"{"step":6,"timesta"#);
    log.log(4, &Metrics::new().with("actor/pg_loss", 42.0)).unwrap();
    let rows = jsonl(dir.path());
    let steps: Vec<u64> = rows.iter().map(|r| r["step"].as_u64().unwrap()).collect();
    assert_eq!(steps, [1, 2, 3, 4]);
    assert_eq!(rows[3]["actor/pg_loss"], 42.0);
    assert!(rows[3].get("timing_s/gen").is_none());

    // A second event file, which starts with a restart marker at the first redone step.
    let files = event_files(dir.path());
    assert_eq!(files.len(), 2, "{files:?}");
    let resumed = log.events_path().unwrap();
    assert!(files.iter().any(|f| f == resumed));
    let events = read_events(resumed);
    assert_eq!(events[0].file_version.as_deref(), Some("brain.Event:2"));
    assert_eq!((events[1].session_status, events[1].step), (Some(1), 4));
    assert_eq!(events[2].step, 4);
    assert_eq!(events[2].scalars, [("actor/pg_loss".to_string(), 42.0f32)]);
    // The first file is untouched and still decodes.
    let old = files.iter().find(|f| *f != resumed).unwrap();
    assert_eq!(read_events(old).len(), 2 + 5);

    // Resuming beyond every logged step keeps everything; a fresh run empties the log.
    drop(log);
    RunLog::resume(dir.path(), 100).unwrap();
    assert_eq!(jsonl(dir.path()).len(), 4);
    // A fresh run in the same directory starts an empty log; the old rows join the others aside.
    let log = RunLog::create(dir.path()).unwrap();
    assert_eq!(fs::read_to_string(&path).unwrap(), "");
    assert_eq!((log.truncation().kept, log.truncation().dropped), (0, 4));
    assert_eq!(fs::read_to_string(&aside).unwrap().lines().count(), 3 + 4);
}

#[test]
fn sinks_can_be_turned_off() {
    let dir = tempfile::tempdir().unwrap();
    let opts = RunLogOptions { jsonl: true, tensorboard: false, ..RunLogOptions::default() };
    let mut log = RunLog::open(dir.path().join("run"), None, &opts).unwrap();
    log.log(1, &step_metrics(1)).unwrap();
    assert!(log.events_path().is_none());
    assert!(event_files(&dir.path().join("run")).is_empty());
    assert_eq!(jsonl(&dir.path().join("run")).len(), 1);
}

#[test]
fn a_run_that_lost_its_directory_writes_no_metrics() {
    use reinforge_lease::{Lease, LeaseOptions, Takeover};
    let dir = tempfile::tempdir().unwrap();
    let (old, _) = Lease::acquire(dir.path(), &LeaseOptions::default()).unwrap();
    let opts = RunLogOptions { fence: Some(old.fence()), ..RunLogOptions::default() };
    let mut log = RunLog::open(dir.path(), None, &opts).unwrap();
    log.log(1, &step_metrics(1)).unwrap();
    let before = fs::read(dir.path().join(METRICS_FILE)).unwrap();
    let events_before = fs::read(log.events_path().unwrap()).unwrap();

    let forced = LeaseOptions { takeover: Takeover::Force, ..LeaseOptions::default() };
    let (_new, _) = Lease::acquire(dir.path(), &forced).unwrap();
    let err = log.log(2, &step_metrics(2)).unwrap_err();
    assert!(matches!(err, MetricsError::Fenced(_)), "{err}");
    assert!(err.to_string().contains("lost ownership"), "{err}");
    assert_eq!(fs::read(dir.path().join(METRICS_FILE)).unwrap(), before);
    assert_eq!(fs::read(log.events_path().unwrap()).unwrap(), events_before);
    // Nor may it open the log again, which would truncate the new owner's rows.
    assert!(matches!(RunLog::open(dir.path(), Some(0), &opts), Err(MetricsError::Fenced(_))));
    assert_eq!(fs::read(dir.path().join(METRICS_FILE)).unwrap(), before);
}
