//! The GGUF reader on hand-built files: round trips, and errors on corrupt input.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use reinforge_assets::{AssetError, GgmlType, GgufFile, MetaArray, MetaValue};

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

/// A file with every metadata type, nested and empty arrays, and six tensor types.
fn sample(version: u32, alignment: Option<u64>) -> (GgufBuilder, Vec<(String, Vec<f32>)>) {
    let mut b = GgufBuilder::new();
    b.version = version;
    if let Some(a) = alignment {
        b.alignment = a;
        b.kv("general.alignment", Val::U32(a as u32));
    }
    b.kv("u8", Val::U8(200))
        .kv("i8", Val::I8(-100))
        .kv("u16", Val::U16(60000))
        .kv("i16", Val::I16(-30000))
        .kv("u32", Val::U32(4_000_000_000))
        .kv("i32", Val::I32(-2_000_000_000))
        .kv("f32", Val::F32(1.5))
        .kv("bool", Val::Bool(true))
        .kv("str", s("héllo"))
        .kv("u64", Val::U64(u64::MAX))
        .kv("i64", Val::I64(i64::MIN))
        .kv("f64", Val::F64(-2.25))
        .kv("arr.i32", Val::Arr(5, vec![Val::I32(-1), Val::I32(7)]))
        .kv("arr.str", strs(["a", "", "ċ"]))
        .kv("arr.empty", Val::Arr(6, vec![]))
        .kv(
            "arr.bool",
            Val::Arr(7, vec![Val::Bool(false), Val::Bool(true)]),
        )
        .kv(
            "arr.nested",
            Val::Arr(
                9,
                vec![
                    Val::Arr(0, vec![Val::U8(1), Val::U8(2)]),
                    Val::Arr(0, vec![]),
                ],
            ),
        );
    let mut want = Vec::new();
    let mut add = |b: &mut GgufBuilder, name: &str, ty: u32, dims: &[u64], data: Vec<u8>| {
        want.push((name.to_string(), decode(ty, &data)));
        b.tensor(name, dims, ty, data);
    };
    add(&mut b, "f32", 0, &[3], f32_bytes(&[1.0, -2.0, 3.5]));
    add(
        &mut b,
        "f16",
        1,
        &[2, 2],
        f16_bytes(&[0.5, -0.25, 8.0, 1e-3]),
    );
    add(
        &mut b,
        "bf16",
        30,
        &[4],
        bf16_bytes(&[1.0, 2.0, -3.0, 0.125]),
    );
    add(&mut b, "q8_0", 8, &[64, 2], q8_0_bytes(&values(128, 1)));
    add(&mut b, "q4_1", 3, &[32, 3], q4_1_bytes(&values(96, 2)));
    add(&mut b, "q4_0", 2, &[32], q4_0_bytes(&values(32, 3)));
    (b, want)
}

#[test]
fn hand_built_file_round_trips() {
    let dir = temp_dir("roundtrip");
    for (version, alignment) in [(3, None), (2, None), (3, Some(64)), (3, Some(8))] {
        let (b, want) = sample(version, alignment);
        let (bytes, data_start) = b.build_with_offset();
        let path = write(&dir, &format!("v{version}-{alignment:?}.gguf"), &bytes);
        let g = GgufFile::open(&path).unwrap();
        assert_eq!(g.version(), version);
        assert_eq!(g.alignment(), alignment.unwrap_or(32));
        assert_eq!(g.data_offset(), data_start as u64);
        assert_eq!(g.get("u8"), Some(&MetaValue::U8(200)));
        assert_eq!(g.get("i8"), Some(&MetaValue::I8(-100)));
        assert_eq!(g.get("u16"), Some(&MetaValue::U16(60000)));
        assert_eq!(g.get("i16"), Some(&MetaValue::I16(-30000)));
        assert_eq!(g.get_u64("u32").unwrap(), Some(4_000_000_000));
        assert_eq!(g.get("i32"), Some(&MetaValue::I32(-2_000_000_000)));
        assert_eq!(g.get_f64("f32").unwrap(), Some(1.5));
        assert_eq!(g.get_bool("bool").unwrap(), Some(true));
        assert_eq!(g.get_str("str").unwrap(), Some("héllo"));
        assert_eq!(g.get_u64("u64").unwrap(), Some(u64::MAX));
        assert_eq!(g.get("i64"), Some(&MetaValue::I64(i64::MIN)));
        assert_eq!(g.get("f64"), Some(&MetaValue::F64(-2.25)));
        assert_eq!(
            g.get_array("arr.i32").unwrap(),
            Some(&MetaArray::I32(vec![-1, 7]))
        );
        assert_eq!(
            g.get_array("arr.str")
                .unwrap()
                .unwrap()
                .as_strings()
                .unwrap(),
            ["a", "", "ċ"]
        );
        assert_eq!(
            g.get_array("arr.empty").unwrap(),
            Some(&MetaArray::F32(vec![]))
        );
        assert_eq!(
            g.get_array("arr.bool").unwrap(),
            Some(&MetaArray::Bool(vec![false, true]))
        );
        assert_eq!(
            g.get_array("arr.nested").unwrap(),
            Some(&MetaArray::Array(vec![
                MetaArray::U8(vec![1, 2]),
                MetaArray::U8(vec![])
            ]))
        );
        // Type mismatches are errors that name the key.
        let e = g.get_str("u8").unwrap_err().to_string();
        assert!(e.contains("`u8`") && e.contains("uint8"), "{e}");

        assert_eq!(g.tensors().len(), want.len());
        for (name, values) in &want {
            let t = g.tensor(name).unwrap();
            assert_eq!(&g.read_tensor_f32(t).unwrap(), values, "{name}");
            assert_eq!(t.offset % g.alignment(), 0);
        }
        let q = g.tensor("q8_0").unwrap();
        assert_eq!(q.dims, [64, 2]);
        assert_eq!(q.shape(), [2, 64]);
        assert_eq!(q.ggml_type, GgmlType::Q8_0);
        assert_eq!(q.n_bytes, Some(2 * 2 * 34));
    }
}

fn open_err(bytes: &[u8], name: &str) -> String {
    let dir = temp_dir("corrupt");
    let path = write(&dir, name, bytes);
    match GgufFile::open(&path) {
        Ok(_) => panic!("{name}: corrupt file opened"),
        Err(e) => {
            let msg = e.to_string();
            assert!(msg.contains(name), "error does not name the file: {msg}");
            msg
        }
    }
}

#[test]
fn every_truncation_is_an_error() {
    let (b, _) = sample(3, None);
    let bytes = b.build();
    let dir = temp_dir("truncate");
    let path = dir.join("t.gguf");
    for len in 0..bytes.len() {
        std::fs::write(&path, &bytes[..len]).unwrap();
        let e = GgufFile::open(&path).expect_err(&format!("prefix of {len} bytes opened"));
        let msg = e.to_string();
        assert!(msg.contains("t.gguf"), "{msg}");
        assert!(
            matches!(e, AssetError::InvalidGguf { .. }),
            "prefix {len}: unexpected error kind: {msg}"
        );
    }
    let msg = open_err(&bytes[..bytes.len() - 1], "short.gguf");
    assert!(msg.contains("truncated") && msg.contains("q4_0"), "{msg}");
}

/// Overwrites 8 bytes at `at`.
fn patch_u64(bytes: &mut [u8], at: usize, v: u64) {
    bytes[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

#[test]
fn corrupt_headers_give_specific_errors() {
    let (b, _) = sample(3, None);
    let good = b.build();

    let mut x = good.clone();
    x[0] = b'X';
    assert!(open_err(&x, "magic.gguf").contains("not a GGUF file"));

    let mut x = good.clone();
    x[4..8].copy_from_slice(&1u32.to_le_bytes());
    assert!(open_err(&x, "v1.gguf").contains("version 1"));
    x[4..8].copy_from_slice(&3u32.to_be_bytes());
    assert!(open_err(&x, "be.gguf").contains("big-endian"));
    x[4..8].copy_from_slice(&9u32.to_le_bytes());
    assert!(open_err(&x, "v9.gguf").contains("version 9"));

    // Absurd counts must be rejected before any allocation.
    let mut x = good.clone();
    patch_u64(&mut x, 8, u64::MAX);
    assert!(open_err(&x, "tcount.gguf").contains("tensor count"));
    let mut x = good.clone();
    patch_u64(&mut x, 16, 1 << 60);
    assert!(open_err(&x, "kvcount.gguf").contains("metadata key count"));

    // First key length.
    let mut x = good.clone();
    patch_u64(&mut x, 24, u64::MAX - 3);
    assert!(open_err(&x, "keylen.gguf").contains("truncated"));

    // The first KV is "u8" (8 + 2 bytes of key); its type sits at 34.
    let mut x = good.clone();
    x[34..38].copy_from_slice(&77u32.to_le_bytes());
    assert!(open_err(&x, "vtype.gguf").contains("unknown value type 77"));

    // "bool" value byte.
    let mut b2 = GgufBuilder::new();
    b2.kv("flag", Val::Bool(true));
    let mut x = b2.build();
    let last = x.len() - 1;
    x[last] = 2;
    assert!(open_err(&x, "bool.gguf").contains("expected 0 or 1"));

    // Invalid UTF-8 in a string.
    let mut b2 = GgufBuilder::new();
    b2.kv("name", s("ab"));
    let mut x = b2.build();
    let last = x.len() - 1;
    x[last] = 0xFF;
    assert!(open_err(&x, "utf8.gguf").contains("UTF-8"));

    // Array element count far beyond the file.
    let mut b2 = GgufBuilder::new();
    b2.kv("a", Val::Arr(4, vec![Val::U32(1)]));
    let mut x = b2.build();
    let n_at = x.len() - 4 - 8;
    patch_u64(&mut x, n_at, 1 << 62);
    assert!(open_err(&x, "arrlen.gguf").contains("element count"));

    // Bad alignment.
    let mut b2 = GgufBuilder::new();
    b2.kv("general.alignment", Val::U32(3));
    assert!(open_err(&b2.build(), "align.gguf").contains("power of two"));

    // Tensor problems.
    let tensor_file = |dims: &[u64], ty: u32, data: Vec<u8>| {
        let mut b2 = GgufBuilder::new();
        b2.tensor("w", dims, ty, data);
        b2
    };
    let b2 = tensor_file(&[1, 1, 1, 1, 1], 0, vec![0; 4]);
    assert!(open_err(&b2.build(), "dims.gguf").contains("5 dimensions"));
    let b2 = tensor_file(&[31], 8, vec![0; 34]);
    assert!(open_err(&b2.build(), "block.gguf").contains("not a multiple of the Q8_0 block"));
    let b2 = tensor_file(&[u64::MAX, 4], 0, vec![0; 4]);
    assert!(open_err(&b2.build(), "shape.gguf").contains("impossible shape"));
    // A tensor whose data offset is misaligned, and one past the end of the file.
    let mut x = tensor_file(&[4], 0, vec![0; 16]).build();
    let off_at = 24 + 8 + 1 + 4 + 8 + 4; // counts, name len + "w", n_dims, dim, type
    patch_u64(&mut x, off_at, 4);
    assert!(open_err(&x, "misaligned.gguf").contains("not a multiple of the alignment"));
    patch_u64(&mut x, off_at, 64);
    assert!(open_err(&x, "past.gguf").contains("extends past the end"));
    patch_u64(&mut x, off_at, u64::MAX - 31);
    assert!(open_err(&x, "overflow.gguf").contains("extends past the end"));

    // Duplicates.
    let mut b2 = GgufBuilder::new();
    b2.kv("k", Val::U8(1)).kv("k", Val::U8(2));
    assert!(open_err(&b2.build(), "dupkey.gguf").contains("duplicate metadata key"));
    let mut b2 = GgufBuilder::new();
    b2.tensor("w", &[1], 0, vec![0; 4])
        .tensor("w", &[1], 0, vec![0; 4]);
    assert!(open_err(&b2.build(), "duptensor.gguf").contains("duplicate tensor"));
}

#[test]
fn unsupported_tensor_types_are_named() {
    let dir = temp_dir("types");
    let mut b = GgufBuilder::new();
    b.tensor("k3", &[256], 11, vec![0; 110])
        .tensor("odd", &[4], 99, vec![0; 4]);
    let path = write(&dir, "types.gguf", &b.build());
    let g = GgufFile::open(&path).unwrap();
    let e = g
        .read_tensor_f32(g.tensor("k3").unwrap())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("Q3_K") && e.contains("k3") && e.contains("types.gguf"),
        "{e}"
    );
    let t = g.tensor("odd").unwrap();
    assert_eq!(t.ggml_type, GgmlType::Unknown(99));
    let e = g.read_tensor_f32(t).unwrap_err().to_string();
    assert!(e.contains("99") && e.contains("odd"), "{e}");
}

/// Seeded byte flips: opening and reading must never panic, whatever the damage.
#[test]
fn random_corruption_never_panics() {
    let (b, _) = sample(3, None);
    let good = b.build();
    let dir = temp_dir("fuzz");
    let path = dir.join("fuzz.gguf");
    let mut s = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let mut opened = 0;
    for _ in 0..400 {
        let mut x = good.clone();
        for _ in 0..1 + next() % 4 {
            let i = (next() % x.len() as u64) as usize;
            x[i] = next() as u8;
        }
        std::fs::write(&path, &x).unwrap();
        if let Ok(g) = GgufFile::open(&path) {
            opened += 1;
            for t in g.tensors() {
                let _ = g.read_tensor_f32(t);
            }
        }
    }
    // Most flips land in tensor data or values and still parse.
    assert!(opened > 0);
}
