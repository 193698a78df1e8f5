//! A GGUF (v2/v3) reader: header, metadata, tensor directory and tensor data.
//!
//! Everything read from the file is checked against the file length before anything is
//! allocated, so a corrupt or truncated file gives an error that names the file and the
//! problem instead of a panic or a huge allocation. Tensor data is read with positioned
//! reads on demand; only the header and the metadata are kept in memory.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::dequant::{self, GgmlType};
use crate::error::{AssetError, IoContext, Result};

/// The four bytes every GGUF file starts with.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// Alignment of tensor data when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml tensors have at most this many dimensions.
const MAX_DIMS: u32 = 4;
/// Arrays nested deeper than this are rejected (no real file nests at all).
const MAX_ARRAY_DEPTH: usize = 8;

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    /// GGUF type 0.
    U8(u8),
    /// GGUF type 1.
    I8(i8),
    /// GGUF type 2.
    U16(u16),
    /// GGUF type 3.
    I16(i16),
    /// GGUF type 4.
    U32(u32),
    /// GGUF type 5.
    I32(i32),
    /// GGUF type 6.
    F32(f32),
    /// GGUF type 7.
    Bool(bool),
    /// GGUF type 8 (UTF-8).
    String(String),
    /// GGUF type 9.
    Array(MetaArray),
    /// GGUF type 10.
    U64(u64),
    /// GGUF type 11.
    I64(i64),
    /// GGUF type 12.
    F64(f64),
}

/// A metadata array, stored by element type so that a large array costs no more memory
/// than it does on disk (plus `String` overhead).
#[derive(Debug, Clone, PartialEq)]
pub enum MetaArray {
    /// Array of u8.
    U8(Vec<u8>),
    /// Array of i8.
    I8(Vec<i8>),
    /// Array of u16.
    U16(Vec<u16>),
    /// Array of i16.
    I16(Vec<i16>),
    /// Array of u32.
    U32(Vec<u32>),
    /// Array of i32.
    I32(Vec<i32>),
    /// Array of f32.
    F32(Vec<f32>),
    /// Array of bool.
    Bool(Vec<bool>),
    /// Array of strings.
    String(Vec<String>),
    /// Array of arrays.
    Array(Vec<MetaArray>),
    /// Array of u64.
    U64(Vec<u64>),
    /// Array of i64.
    I64(Vec<i64>),
    /// Array of f64.
    F64(Vec<f64>),
}

impl MetaArray {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            MetaArray::U8(v) => v.len(),
            MetaArray::I8(v) => v.len(),
            MetaArray::U16(v) => v.len(),
            MetaArray::I16(v) => v.len(),
            MetaArray::U32(v) => v.len(),
            MetaArray::I32(v) => v.len(),
            MetaArray::F32(v) => v.len(),
            MetaArray::Bool(v) => v.len(),
            MetaArray::String(v) => v.len(),
            MetaArray::Array(v) => v.len(),
            MetaArray::U64(v) => v.len(),
            MetaArray::I64(v) => v.len(),
            MetaArray::F64(v) => v.len(),
        }
    }

    /// Whether the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Integer elements widened to i64 (`None` for non-integer arrays or u64 values
    /// above `i64::MAX`).
    pub fn to_i64_vec(&self) -> Option<Vec<i64>> {
        Some(match self {
            MetaArray::U8(v) => v.iter().map(|&x| x as i64).collect(),
            MetaArray::I8(v) => v.iter().map(|&x| x as i64).collect(),
            MetaArray::U16(v) => v.iter().map(|&x| x as i64).collect(),
            MetaArray::I16(v) => v.iter().map(|&x| x as i64).collect(),
            MetaArray::U32(v) => v.iter().map(|&x| x as i64).collect(),
            MetaArray::I32(v) => v.iter().map(|&x| x as i64).collect(),
            MetaArray::I64(v) => v.clone(),
            MetaArray::U64(v) => v
                .iter()
                .map(|&x| i64::try_from(x).ok())
                .collect::<Option<_>>()?,
            _ => return None,
        })
    }

    /// The elements as strings, if this is a string array.
    pub fn as_strings(&self) -> Option<&[String]> {
        match self {
            MetaArray::String(v) => Some(v),
            _ => None,
        }
    }
}

impl MetaValue {
    /// The value as u64, for any integer type holding a non-negative value.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            MetaValue::U8(x) => Some(x.into()),
            MetaValue::U16(x) => Some(x.into()),
            MetaValue::U32(x) => Some(x.into()),
            MetaValue::U64(x) => Some(x),
            MetaValue::I8(x) => u64::try_from(x).ok(),
            MetaValue::I16(x) => u64::try_from(x).ok(),
            MetaValue::I32(x) => u64::try_from(x).ok(),
            MetaValue::I64(x) => u64::try_from(x).ok(),
            _ => None,
        }
    }

    /// The value as f64, for float and integer types.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetaValue::F32(x) => Some(x.into()),
            MetaValue::F64(x) => Some(x),
            MetaValue::I8(x) => Some(x.into()),
            MetaValue::I16(x) => Some(x.into()),
            MetaValue::I32(x) => Some(x.into()),
            MetaValue::I64(x) => Some(x as f64),
            _ => self.as_u64().map(|x| x as f64),
        }
    }

    /// The value as bool.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetaValue::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// The value as a string slice.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// The value as an array.
    pub fn as_array(&self) -> Option<&MetaArray> {
        match self {
            MetaValue::Array(a) => Some(a),
            _ => None,
        }
    }

    /// The GGUF name of the value's type, for error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            MetaValue::U8(_) => "uint8",
            MetaValue::I8(_) => "int8",
            MetaValue::U16(_) => "uint16",
            MetaValue::I16(_) => "int16",
            MetaValue::U32(_) => "uint32",
            MetaValue::I32(_) => "int32",
            MetaValue::F32(_) => "float32",
            MetaValue::Bool(_) => "bool",
            MetaValue::String(_) => "string",
            MetaValue::Array(_) => "array",
            MetaValue::U64(_) => "uint64",
            MetaValue::I64(_) => "int64",
            MetaValue::F64(_) => "float64",
        }
    }
}

/// One entry of the tensor directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// Tensor name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// GGUF dimensions, fastest-varying first (`[ne0, ne1, ...]`).
    pub dims: Vec<u64>,
    /// Element type.
    pub ggml_type: GgmlType,
    /// Offset of the data from the start of the data section.
    pub offset: u64,
    /// Number of elements (product of `dims`).
    pub n_elements: u64,
    /// Size of the data in bytes; `None` for unknown type ids.
    pub n_bytes: Option<u64>,
}

impl TensorInfo {
    /// The row-major shape, slowest-varying first, as Hugging Face and safetensors use it:
    /// GGUF dims `[ne0, ne1]` are a `[ne1][ne0]` matrix.
    pub fn shape(&self) -> Vec<usize> {
        // Fits in usize: open() checked n_elements (their product) fits in usize.
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }
}

/// An open GGUF file: parsed header, metadata and tensor directory.
#[derive(Debug)]
pub struct GgufFile {
    path: PathBuf,
    /// Behind a mutex because each read is a seek followed by a read on the shared handle.
    file: Mutex<File>,
    file_len: u64,
    version: u32,
    alignment: u64,
    data_offset: u64,
    metadata: Vec<(String, MetaValue)>,
    meta_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
}

impl GgufFile {
    /// Opens and parses `path`, checking every offset and size against the file length.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let file = File::open(&path).at(&path)?;
        let file_len = file.metadata().at(&path)?.len();
        let mut p = Parser {
            r: BufReader::with_capacity(1 << 16, &file),
            pos: 0,
            len: file_len,
            path: &path,
        };

        let magic: [u8; 4] = p.array("magic")?;
        if magic != GGUF_MAGIC {
            return Err(p.invalid(format!(
                "not a GGUF file: the magic is {magic:02x?}, expected \"GGUF\""
            )));
        }
        let version = p.u32("version")?;
        match version {
            2 | 3 => {}
            1 => return Err(AssetError::Unsupported {
                path,
                msg:
                    "GGUF version 1 (32-bit counts); re-convert the model with a current llama.cpp"
                        .into(),
            }),
            v if matches!(v.swap_bytes(), 2 | 3) => {
                return Err(AssetError::Unsupported {
                    path,
                    msg: "big-endian GGUF file; only little-endian files are supported".into(),
                })
            }
            v => {
                return Err(AssetError::Unsupported {
                    path,
                    msg: format!("GGUF version {v} (supported: 2, 3)"),
                })
            }
        }
        let tensor_count = p.u64("tensor count")?;
        let kv_count = p.u64("metadata key count")?;
        // Each KV takes >= 13 bytes (key length, type, 1-byte value) and each tensor info
        // >= 24 bytes; a count that cannot fit in the rest of the file is corruption, and
        // checking it here keeps the capacities below bounded by the file size.
        p.check_count(kv_count, 13, "metadata key count")?;
        p.check_count(tensor_count, 24, "tensor count")?;

        let mut metadata = Vec::with_capacity(kv_count as usize);
        let mut meta_index = HashMap::with_capacity(kv_count as usize);
        for i in 0..kv_count {
            let key = p.string(&format!("key of metadata entry {i}"))?;
            let ty = p.u32(&format!("type of metadata `{key}`"))?;
            let value = p.value(ty, &key, 0)?;
            if meta_index.insert(key.clone(), metadata.len()).is_some() {
                return Err(p.invalid(format!("duplicate metadata key `{key}`")));
            }
            metadata.push((key, value));
        }

        let alignment = match metadata
            .iter()
            .find(|(k, _)| k == "general.alignment")
            .map(|(_, v)| v)
        {
            None => DEFAULT_ALIGNMENT,
            Some(v) => match v.as_u64() {
                Some(a) if a > 0 && a.is_power_of_two() => a,
                _ => {
                    return Err(p.invalid(format!(
                        "general.alignment must be a power of two, got {v:?}"
                    )))
                }
            },
        };

        let mut tensors = Vec::with_capacity(tensor_count as usize);
        let mut tensor_index = HashMap::with_capacity(tensor_count as usize);
        for i in 0..tensor_count {
            let name = p.string(&format!("name of tensor {i}"))?;
            let n_dims = p.u32(&format!("dimension count of tensor `{name}`"))?;
            if n_dims > MAX_DIMS {
                return Err(p.invalid(format!(
                    "tensor `{name}` has {n_dims} dimensions (ggml allows at most {MAX_DIMS})"
                )));
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for d in 0..n_dims {
                dims.push(p.u64(&format!("dimension {d} of tensor `{name}`"))?);
            }
            let type_id = p.u32(&format!("type of tensor `{name}`"))?;
            let offset = p.u64(&format!("data offset of tensor `{name}`"))?;
            let ggml_type = GgmlType::from_id(type_id);

            let n_elements = dims
                .iter()
                .try_fold(1u64, |acc, &d| acc.checked_mul(d))
                .filter(|&n| usize::try_from(n).is_ok())
                .ok_or_else(|| {
                    p.invalid(format!("tensor `{name}` has an impossible shape {dims:?}"))
                })?;
            let n_bytes = match ggml_type.block_layout() {
                None => None,
                Some((block, bytes)) => {
                    // ggml quantizes row by row, so each row must be whole blocks.
                    let ne0 = dims.first().copied().unwrap_or(1);
                    if ne0 % block as u64 != 0 {
                        return Err(p.invalid(format!(
                            "tensor `{name}`: row length {ne0} is not a multiple of the {ggml_type} block size {block}"
                        )));
                    }
                    Some(
                        (n_elements / block as u64)
                            .checked_mul(bytes as u64)
                            .ok_or_else(|| {
                                p.invalid(format!("tensor `{name}` is impossibly large"))
                            })?,
                    )
                }
            };
            if offset % alignment != 0 {
                return Err(p.invalid(format!(
                    "tensor `{name}`: data offset {offset} is not a multiple of the alignment {alignment}"
                )));
            }
            if tensor_index.insert(name.clone(), tensors.len()).is_some() {
                return Err(p.invalid(format!("duplicate tensor name `{name}`")));
            }
            tensors.push(TensorInfo {
                name,
                dims,
                ggml_type,
                offset,
                n_elements,
                n_bytes,
            });
        }

        let data_offset = p.pos.next_multiple_of(alignment);
        if !tensors.is_empty() && data_offset > file_len {
            return Err(p.invalid(format!(
                "truncated: the tensor data section would start at byte {data_offset}, but the file has {file_len} bytes"
            )));
        }
        let data_len = file_len.saturating_sub(data_offset);
        for t in &tensors {
            if let Some(n) = t.n_bytes {
                let end = t.offset.checked_add(n);
                if end.is_none_or(|end| end > data_len) {
                    return Err(p.invalid(format!(
                        "truncated: tensor `{}` ({} bytes at data offset {}) extends past the end of the file (data section has {} bytes)",
                        t.name, n, t.offset, data_len
                    )));
                }
            }
        }
        drop(p);

        Ok(GgufFile {
            path,
            file: Mutex::new(file),
            file_len,
            version,
            alignment,
            data_offset,
            metadata,
            meta_index,
            tensors,
            tensor_index,
        })
    }

    /// The path the file was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The GGUF format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Size of the file in bytes.
    pub fn file_len(&self) -> u64 {
        self.file_len
    }

    /// Alignment of the tensor data (`general.alignment`, default 32).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute file offset where the tensor data section starts.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// All metadata entries in file order.
    pub fn metadata(&self) -> &[(String, MetaValue)] {
        &self.metadata
    }

    /// The metadata value for `key`.
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.meta_index.get(key).map(|&i| &self.metadata[i].1)
    }

    /// The tensor directory in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The directory entry of the tensor called `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// Optional unsigned integer metadata; a value of another type is an error.
    pub fn get_u64(&self, key: &str) -> Result<Option<u64>> {
        self.typed(key, "a non-negative integer", MetaValue::as_u64)
    }

    /// Optional float metadata (integers are accepted too).
    pub fn get_f64(&self, key: &str) -> Result<Option<f64>> {
        self.typed(key, "a number", MetaValue::as_f64)
    }

    /// Optional string metadata.
    pub fn get_str(&self, key: &str) -> Result<Option<&str>> {
        self.typed(key, "a string", MetaValue::as_str)
    }

    /// Optional bool metadata.
    pub fn get_bool(&self, key: &str) -> Result<Option<bool>> {
        self.typed(key, "a bool", MetaValue::as_bool)
    }

    /// Optional array metadata.
    pub fn get_array(&self, key: &str) -> Result<Option<&MetaArray>> {
        self.typed(key, "an array", MetaValue::as_array)
    }

    /// Required unsigned integer metadata.
    pub fn require_u64(&self, key: &str) -> Result<u64> {
        self.get_u64(key)?.ok_or_else(|| self.missing(key))
    }

    fn missing(&self, key: &str) -> AssetError {
        AssetError::InvalidGguf {
            path: self.path.clone(),
            msg: format!("missing metadata key `{key}`"),
        }
    }

    fn typed<'a, T>(
        &'a self,
        key: &str,
        want: &str,
        f: impl FnOnce(&'a MetaValue) -> Option<T>,
    ) -> Result<Option<T>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => f(v).map(Some).ok_or_else(|| AssetError::InvalidGguf {
                path: self.path.clone(),
                msg: format!("metadata `{key}` should be {want}, found {}", v.type_name()),
            }),
        }
    }

    /// The raw bytes of a tensor's data.
    pub fn read_tensor_bytes(&self, t: &TensorInfo) -> Result<Vec<u8>> {
        let n = t.n_bytes.ok_or_else(|| AssetError::Unsupported {
            path: self.path.clone(),
            msg: format!("tensor `{}` has {}", t.name, t.ggml_type),
        })?;
        // open() checked offset + n against the file length, so this cannot overflow or
        // allocate more than the file holds.
        let start = self.data_offset + t.offset;
        let mut buf = vec![0u8; n as usize];
        let mut file = self
            .file
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        file.seek(SeekFrom::Start(start)).at(&self.path)?;
        file.read_exact(&mut buf).map_err(|e| {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                AssetError::InvalidGguf {
                    path: self.path.clone(),
                    msg: format!(
                        "truncated while reading tensor `{}` (the file shrank after it was opened?)",
                        t.name
                    ),
                }
            } else {
                AssetError::io(&self.path, e)
            }
        })?;
        Ok(buf)
    }

    /// A tensor's data dequantized to f32, in GGUF (row-major `[ne1][ne0]`) order.
    pub fn read_tensor_f32(&self, t: &TensorInfo) -> Result<Vec<f32>> {
        if !t.ggml_type.can_dequantize() {
            return Err(AssetError::Unsupported {
                path: self.path.clone(),
                msg: format!(
                    "tensor `{}`: {}",
                    t.name,
                    dequant::DequantError::Unsupported(t.ggml_type)
                ),
            });
        }
        let bytes = self.read_tensor_bytes(t)?;
        dequant::dequantize(t.ggml_type, &bytes, t.n_elements as usize).map_err(|e| {
            AssetError::InvalidGguf {
                path: self.path.clone(),
                msg: format!("tensor `{}`: {e}", t.name),
            }
        })
    }
}

/// Sequential little-endian reads that know how many bytes the file has left.
struct Parser<'a, R: Read> {
    r: R,
    pos: u64,
    len: u64,
    path: &'a Path,
}

impl<R: Read> Parser<'_, R> {
    fn invalid(&self, msg: String) -> AssetError {
        AssetError::InvalidGguf {
            path: self.path.to_path_buf(),
            msg,
        }
    }

    fn remaining(&self) -> u64 {
        self.len - self.pos
    }

    /// Fails unless `n` more bytes exist; called before every read and allocation.
    fn need(&self, n: u64, what: &str) -> Result<()> {
        if n > self.remaining() {
            return Err(self.invalid(format!(
                "truncated: {what} needs {n} bytes at offset {}, but the file has {} bytes",
                self.pos, self.len
            )));
        }
        Ok(())
    }

    /// Fails unless `count` items of at least `min_size` bytes each can fit in the rest of
    /// the file.
    fn check_count(&self, count: u64, min_size: u64, what: &str) -> Result<()> {
        if count.saturating_mul(min_size) > self.remaining() {
            return Err(self.invalid(format!(
                "{what} {count} at offset {} cannot fit in the remaining {} bytes",
                self.pos,
                self.remaining()
            )));
        }
        Ok(())
    }

    fn fill(&mut self, buf: &mut [u8], what: &str) -> Result<()> {
        self.need(buf.len() as u64, what)?;
        self.r.read_exact(buf).map_err(|e| {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                self.invalid(format!(
                    "truncated while reading {what} at offset {}",
                    self.pos
                ))
            } else {
                AssetError::io(self.path, e)
            }
        })?;
        self.pos += buf.len() as u64;
        Ok(())
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        let mut b = [0u8; N];
        self.fill(&mut b, what)?;
        Ok(b)
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    fn string(&mut self, what: &str) -> Result<String> {
        let n = self.u64(what)?;
        self.need(n, what)?;
        let mut buf = vec![0u8; n as usize];
        self.fill(&mut buf, what)?;
        String::from_utf8(buf).map_err(|e| {
            self.invalid(format!(
                "{what} is not valid UTF-8 (at byte {} of the string)",
                e.utf8_error().valid_up_to()
            ))
        })
    }

    fn bool(&mut self, what: &str) -> Result<bool> {
        match self.array::<1>(what)?[0] {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(self.invalid(format!("{what}: bool byte is {b}, expected 0 or 1"))),
        }
    }

    fn value(&mut self, ty: u32, key: &str, depth: usize) -> Result<MetaValue> {
        let what = format!("value of metadata `{key}`");
        let w = what.as_str();
        Ok(match ty {
            0 => MetaValue::U8(u8::from_le_bytes(self.array(w)?)),
            1 => MetaValue::I8(i8::from_le_bytes(self.array(w)?)),
            2 => MetaValue::U16(u16::from_le_bytes(self.array(w)?)),
            3 => MetaValue::I16(i16::from_le_bytes(self.array(w)?)),
            4 => MetaValue::U32(u32::from_le_bytes(self.array(w)?)),
            5 => MetaValue::I32(i32::from_le_bytes(self.array(w)?)),
            6 => MetaValue::F32(f32::from_le_bytes(self.array(w)?)),
            7 => MetaValue::Bool(self.bool(w)?),
            8 => MetaValue::String(self.string(w)?),
            9 => MetaValue::Array(self.meta_array(key, depth)?),
            10 => MetaValue::U64(u64::from_le_bytes(self.array(w)?)),
            11 => MetaValue::I64(i64::from_le_bytes(self.array(w)?)),
            12 => MetaValue::F64(f64::from_le_bytes(self.array(w)?)),
            other => {
                return Err(self.invalid(format!(
                    "metadata `{key}` has unknown value type {other} at offset {}",
                    self.pos - 4
                )))
            }
        })
    }

    fn meta_array(&mut self, key: &str, depth: usize) -> Result<MetaArray> {
        if depth >= MAX_ARRAY_DEPTH {
            return Err(self.invalid(format!(
                "metadata `{key}`: arrays nested more than {MAX_ARRAY_DEPTH} deep"
            )));
        }
        let what = format!("array `{key}`");
        let elem_ty = self.u32(&what)?;
        let n = self.u64(&what)?;
        // Smallest on-disk size per element: strings are at least their 8-byte length,
        // nested arrays their 12-byte header.
        let min_size = match elem_ty {
            0 | 1 | 7 => 1,
            2 | 3 => 2,
            4..=6 => 4,
            8 | 10..=12 => 8,
            9 => 12,
            other => {
                return Err(self.invalid(format!(
                    "metadata `{key}`: array of unknown value type {other}"
                )))
            }
        };
        self.check_count(n, min_size, &format!("element count of {what}"))?;
        let n = n as usize;
        let w = what.as_str();
        macro_rules! numeric {
            ($variant:ident, $t:ty) => {{
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(<$t>::from_le_bytes(self.array(w)?));
                }
                MetaArray::$variant(v)
            }};
        }
        Ok(match elem_ty {
            0 => numeric!(U8, u8),
            1 => numeric!(I8, i8),
            2 => numeric!(U16, u16),
            3 => numeric!(I16, i16),
            4 => numeric!(U32, u32),
            5 => numeric!(I32, i32),
            6 => numeric!(F32, f32),
            7 => {
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.bool(w)?);
                }
                MetaArray::Bool(v)
            }
            8 => {
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.string(w)?);
                }
                MetaArray::String(v)
            }
            9 => {
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.meta_array(key, depth + 1)?);
                }
                MetaArray::Array(v)
            }
            10 => numeric!(U64, u64),
            11 => numeric!(I64, i64),
            12 => numeric!(F64, f64),
            _ => unreachable!("element type checked above"),
        })
    }
}
