//! Test helpers: a minimal GGUF writer, simple quantizers and a tiny llama model.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

use half::{bf16, f16};

/// A metadata value to write.
#[derive(Debug, Clone)]
pub enum Val {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    Str(String),
    /// Element type id and elements (all of that type).
    Arr(u32, Vec<Val>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl Val {
    pub fn type_id(&self) -> u32 {
        match self {
            Val::U8(_) => 0,
            Val::I8(_) => 1,
            Val::U16(_) => 2,
            Val::I16(_) => 3,
            Val::U32(_) => 4,
            Val::I32(_) => 5,
            Val::F32(_) => 6,
            Val::Bool(_) => 7,
            Val::Str(_) => 8,
            Val::Arr(..) => 9,
            Val::U64(_) => 10,
            Val::I64(_) => 11,
            Val::F64(_) => 12,
        }
    }

    fn write_payload(&self, out: &mut Vec<u8>) {
        match self {
            Val::U8(x) => out.extend(x.to_le_bytes()),
            Val::I8(x) => out.extend(x.to_le_bytes()),
            Val::U16(x) => out.extend(x.to_le_bytes()),
            Val::I16(x) => out.extend(x.to_le_bytes()),
            Val::U32(x) => out.extend(x.to_le_bytes()),
            Val::I32(x) => out.extend(x.to_le_bytes()),
            Val::F32(x) => out.extend(x.to_le_bytes()),
            Val::Bool(x) => out.push(*x as u8),
            Val::Str(s) => write_str(out, s),
            Val::Arr(ty, items) => {
                out.extend(ty.to_le_bytes());
                out.extend((items.len() as u64).to_le_bytes());
                for i in items {
                    i.write_payload(out);
                }
            }
            Val::U64(x) => out.extend(x.to_le_bytes()),
            Val::I64(x) => out.extend(x.to_le_bytes()),
            Val::F64(x) => out.extend(x.to_le_bytes()),
        }
    }
}

pub fn s(x: &str) -> Val {
    Val::Str(x.to_string())
}

pub fn strs<I: IntoIterator<Item = S>, S: Into<String>>(items: I) -> Val {
    Val::Arr(8, items.into_iter().map(|x| Val::Str(x.into())).collect())
}

fn write_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

/// A tensor to write: name, GGUF dims (ne0 first), ggml type id, raw data.
#[derive(Debug, Clone)]
pub struct RawTensor {
    pub name: String,
    pub dims: Vec<u64>,
    pub ty: u32,
    pub data: Vec<u8>,
}

/// Builds GGUF bytes.
#[derive(Debug, Clone)]
pub struct GgufBuilder {
    pub version: u32,
    pub alignment: u64,
    pub kv: Vec<(String, Val)>,
    pub tensors: Vec<RawTensor>,
}

impl GgufBuilder {
    pub fn new() -> Self {
        GgufBuilder {
            version: 3,
            alignment: 32,
            kv: Vec::new(),
            tensors: Vec::new(),
        }
    }

    pub fn kv(&mut self, key: &str, v: Val) -> &mut Self {
        self.kv.push((key.to_string(), v));
        self
    }

    pub fn tensor(&mut self, name: &str, dims: &[u64], ty: u32, data: Vec<u8>) -> &mut Self {
        self.tensors.push(RawTensor {
            name: name.to_string(),
            dims: dims.to_vec(),
            ty,
            data,
        });
        self
    }

    /// The file bytes; also returns the absolute offset of the data section.
    pub fn build_with_offset(&self) -> (Vec<u8>, usize) {
        let a = self.alignment as usize;
        let mut out = Vec::new();
        out.extend(b"GGUF");
        out.extend(self.version.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend((self.kv.len() as u64).to_le_bytes());
        for (k, v) in &self.kv {
            write_str(&mut out, k);
            out.extend(v.type_id().to_le_bytes());
            v.write_payload(&mut out);
        }
        let mut offset = 0usize;
        let mut offsets = Vec::new();
        for t in &self.tensors {
            write_str(&mut out, &t.name);
            out.extend((t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend(d.to_le_bytes());
            }
            out.extend(t.ty.to_le_bytes());
            out.extend((offset as u64).to_le_bytes());
            offsets.push(offset);
            offset = (offset + t.data.len()).next_multiple_of(a);
        }
        let data_start = out.len().next_multiple_of(a);
        // No padding without tensors, so that tests can patch the last metadata byte.
        if !self.tensors.is_empty() {
            out.resize(data_start, 0);
        }
        for (t, off) in self.tensors.iter().zip(offsets) {
            out.resize(data_start + off, 0);
            out.extend(&t.data);
        }
        (out, data_start)
    }

    pub fn build(&self) -> Vec<u8> {
        self.build_with_offset().0
    }
}

// ---- simple quantizers (round to nearest; exactness is not the point, decoding is) ----

pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn f16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter()
        .flat_map(|&x| f16::from_f32(x).to_le_bytes())
        .collect()
}

pub fn bf16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter()
        .flat_map(|&x| bf16::from_f32(x).to_le_bytes())
        .collect()
}

pub fn q8_0_bytes(v: &[f32]) -> Vec<u8> {
    let mut out = Vec::new();
    for b in v.chunks(32) {
        let amax = b.iter().fold(0f32, |m, x| m.max(x.abs()));
        let d = amax / 127.0;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        out.extend(f16::from_f32(d).to_le_bytes());
        out.extend(b.iter().map(|x| (x * id).round() as i8 as u8));
    }
    out
}

pub fn q4_1_bytes(v: &[f32]) -> Vec<u8> {
    let mut out = Vec::new();
    for b in v.chunks(32) {
        let min = b.iter().copied().fold(f32::INFINITY, f32::min);
        let max = b.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let d = (max - min) / 15.0;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        out.extend(f16::from_f32(d).to_le_bytes());
        out.extend(f16::from_f32(min).to_le_bytes());
        let q = |x: f32| (((x - min) * id).round() as i32).clamp(0, 15) as u8;
        out.extend((0..16).map(|j| q(b[j]) | (q(b[j + 16]) << 4)));
    }
    out
}

pub fn q4_0_bytes(v: &[f32]) -> Vec<u8> {
    let mut out = Vec::new();
    for b in v.chunks(32) {
        let amax = b.iter().fold(0f32, |m, x| m.max(x.abs()));
        let d = amax / 7.0;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        out.extend(f16::from_f32(d).to_le_bytes());
        let q = |x: f32| ((x * id).round() as i32 + 8).clamp(0, 15) as u8;
        out.extend((0..16).map(|j| q(b[j]) | (q(b[j + 16]) << 4)));
    }
    out
}

/// Deterministic pseudo-random values in [-1, 1).
pub fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// GPT-2's byte-to-unicode table (the byte-level BPE alphabet).
pub fn byte_chars() -> Vec<char> {
    let mut bs: Vec<u32> = (b'!' as u32..=b'~' as u32)
        .chain(0xA1..=0xAC)
        .chain(0xAE..=0xFF)
        .collect();
    let mut cs = bs.clone();
    let mut n = 0;
    for b in 0..256u32 {
        if !bs.contains(&b) {
            bs.push(b);
            cs.push(256 + n);
            n += 1;
        }
    }
    let mut table = vec!['\0'; 256];
    for (b, c) in bs.into_iter().zip(cs) {
        table[b as usize] = char::from_u32(c).unwrap();
    }
    table
}

/// The tiny llama used by the import tests.
pub struct TinyLlama {
    pub builder: GgufBuilder,
    /// Expected HF tensors: name -> (shape, values), computed independently of the crate.
    pub expected: BTreeMap<String, (Vec<usize>, Vec<f32>)>,
    pub tokens: Vec<String>,
    pub merges: Vec<String>,
}

pub const HIDDEN: usize = 64;
pub const HEADS: usize = 4;
pub const KV_HEADS: usize = 2;
pub const HEAD_DIM: usize = 16;
pub const INTER: usize = 96;
pub const LAYERS: usize = 2;
pub const CHAT_TEMPLATE: &str = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}";

/// HF rows from GGUF rows: within each head, HF row `i*hd/2 + j` is GGUF row `2*j + i`.
pub fn unpermute(gguf: &[f32], rows: usize, cols: usize, heads: usize) -> Vec<f32> {
    let hd = rows / heads;
    let mut out = vec![0f32; gguf.len()];
    for h in 0..heads {
        for i in 0..2 {
            for j in 0..hd / 2 {
                let dst = (h * hd + i * hd / 2 + j) * cols;
                let src = (h * hd + 2 * j + i) * cols;
                out[dst..dst + cols].copy_from_slice(&gguf[src..src + cols]);
            }
        }
    }
    out
}

/// Decodes the test's own quantized bytes to f32 without the crate, so that expectations
/// are independent of the code under test.
pub fn decode(ty: u32, data: &[u8]) -> Vec<f32> {
    let h = |b: &[u8], at: usize| f16::from_le_bytes([b[at], b[at + 1]]).to_f32();
    match ty {
        0 => data
            .chunks(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect(),
        1 => data.chunks(2).map(|b| h(b, 0)).collect(),
        30 => data
            .chunks(2)
            .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        8 => data
            .chunks(34)
            .flat_map(|b| (0..32).map(move |j| b[2 + j] as i8 as f32 * h(b, 0)))
            .collect(),
        3 => data
            .chunks(20)
            .flat_map(|b| {
                (0..32).map(move |j| {
                    let q = if j < 16 {
                        b[4 + j] & 15
                    } else {
                        b[4 + j - 16] >> 4
                    };
                    q as f32 * h(b, 0) + h(b, 2)
                })
            })
            .collect(),
        2 => data
            .chunks(18)
            .flat_map(|b| {
                (0..32).map(move |j| {
                    let q = if j < 16 {
                        b[2 + j] & 15
                    } else {
                        b[2 + j - 16] >> 4
                    };
                    (q as i32 - 8) as f32 * h(b, 0)
                })
            })
            .collect(),
        _ => panic!("test decoder lacks type {ty}"),
    }
}

impl TinyLlama {
    /// A 2-layer llama (hidden 64, 4 heads, 2 KV heads, head_dim 16, MLP 96) with a
    /// byte-level vocabulary of 3 control tokens, 256 byte tokens and 2 merges, and tensors
    /// in Q8_0, Q4_1, Q4_0, F16, BF16 and F32.
    pub fn new() -> Self {
        let mut tokens: Vec<String> = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        tokens.extend(byte_chars().into_iter().map(String::from));
        tokens.extend(["Ġt".to_string(), "he".to_string()]);
        let merges = vec!["Ġ t".to_string(), "h e".to_string()];
        let vocab = tokens.len();
        let mut types = vec![Val::I32(1); vocab];
        for t in types.iter_mut().take(3) {
            *t = Val::I32(3);
        }

        let mut b = GgufBuilder::new();
        b.kv("general.architecture", s("llama"))
            .kv("general.name", s("tiny"))
            .kv("llama.block_count", Val::U32(LAYERS as u32))
            .kv("llama.context_length", Val::U32(128))
            .kv("llama.embedding_length", Val::U32(HIDDEN as u32))
            .kv("llama.feed_forward_length", Val::U32(INTER as u32))
            .kv("llama.attention.head_count", Val::U32(HEADS as u32))
            .kv("llama.attention.head_count_kv", Val::U32(KV_HEADS as u32))
            .kv("llama.rope.freq_base", Val::F32(10000.0))
            .kv("llama.attention.layer_norm_rms_epsilon", Val::F32(1e-6))
            .kv("llama.rope.dimension_count", Val::U32(HEAD_DIM as u32))
            .kv("tokenizer.ggml.model", s("gpt2"))
            .kv("tokenizer.ggml.pre", s("smollm"))
            .kv("tokenizer.ggml.tokens", strs(tokens.clone()))
            .kv("tokenizer.ggml.token_type", Val::Arr(5, types))
            .kv("tokenizer.ggml.merges", strs(merges.clone()))
            .kv("tokenizer.ggml.bos_token_id", Val::U32(1))
            .kv("tokenizer.ggml.eos_token_id", Val::U32(2))
            .kv("tokenizer.ggml.padding_token_id", Val::U32(2))
            .kv("tokenizer.ggml.add_bos_token", Val::Bool(false))
            .kv("tokenizer.chat_template", s(CHAT_TEMPLATE));

        let mut expected = BTreeMap::new();
        let mut seed = 0u64;
        let mut add = |b: &mut GgufBuilder,
                       gguf: &str,
                       hf: &str,
                       rows: usize,
                       cols: usize,
                       ty: u32,
                       heads: Option<usize>| {
            seed += 1;
            let v = values(rows * cols, seed);
            let data = match ty {
                0 => f32_bytes(&v),
                1 => f16_bytes(&v),
                30 => bf16_bytes(&v),
                8 => q8_0_bytes(&v),
                3 => q4_1_bytes(&v),
                2 => q4_0_bytes(&v),
                _ => unreachable!(),
            };
            let mut want = decode(ty, &data);
            if let Some(h) = heads {
                want = unpermute(&want, rows, cols, h);
            }
            let dims: Vec<u64> = if rows == 1 {
                vec![cols as u64]
            } else {
                vec![cols as u64, rows as u64]
            };
            let shape = if rows == 1 {
                vec![cols]
            } else {
                vec![rows, cols]
            };
            b.tensor(gguf, &dims, ty, data);
            expected.insert(hf.to_string(), (shape, want));
        };
        add(
            &mut b,
            "token_embd.weight",
            "model.embed_tokens.weight",
            vocab,
            HIDDEN,
            8,
            None,
        );
        for l in 0..LAYERS {
            let g = |p: &str| format!("blk.{l}.{p}.weight");
            let h = |p: &str| format!("model.layers.{l}.{p}.weight");
            add(
                &mut b,
                &g("attn_norm"),
                &h("input_layernorm"),
                1,
                HIDDEN,
                0,
                None,
            );
            add(
                &mut b,
                &g("attn_q"),
                &h("self_attn.q_proj"),
                HEADS * HEAD_DIM,
                HIDDEN,
                3,
                Some(HEADS),
            );
            add(
                &mut b,
                &g("attn_k"),
                &h("self_attn.k_proj"),
                KV_HEADS * HEAD_DIM,
                HIDDEN,
                3,
                Some(KV_HEADS),
            );
            add(
                &mut b,
                &g("attn_v"),
                &h("self_attn.v_proj"),
                KV_HEADS * HEAD_DIM,
                HIDDEN,
                2,
                None,
            );
            add(
                &mut b,
                &g("attn_output"),
                &h("self_attn.o_proj"),
                HIDDEN,
                HEADS * HEAD_DIM,
                1,
                None,
            );
            add(
                &mut b,
                &g("ffn_norm"),
                &h("post_attention_layernorm"),
                1,
                HIDDEN,
                0,
                None,
            );
            add(
                &mut b,
                &g("ffn_gate"),
                &h("mlp.gate_proj"),
                INTER,
                HIDDEN,
                30,
                None,
            );
            add(
                &mut b,
                &g("ffn_up"),
                &h("mlp.up_proj"),
                INTER,
                HIDDEN,
                0,
                None,
            );
            add(
                &mut b,
                &g("ffn_down"),
                &h("mlp.down_proj"),
                HIDDEN,
                INTER,
                8,
                None,
            );
        }
        add(
            &mut b,
            "output_norm.weight",
            "model.norm.weight",
            1,
            HIDDEN,
            0,
            None,
        );
        TinyLlama {
            builder: b,
            expected,
            tokens,
            merges,
        }
    }
}

/// A fresh, empty directory under the target's temporary directory.
///
/// Each test binary owns one base directory and clears it on first use, so that runs do
/// not accumulate files.
pub fn temp_dir(tag: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    static BASE: OnceLock<PathBuf> = OnceLock::new();
    let base = BASE.get_or_init(|| {
        let exe = std::env::current_exe().unwrap();
        let name = exe.file_stem().unwrap().to_string_lossy().into_owned();
        let base = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join("reinforge-assets-tests")
            .join(name);
        if base.exists() {
            std::fs::remove_dir_all(&base).unwrap();
        }
        base
    });
    let dir = base.join(format!(
        "{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    if dir.exists() {
        std::fs::remove_dir_all(&dir).unwrap();
    }
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
