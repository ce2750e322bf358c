//! The bounds-checked byte cursor and the GGUF layout on top of it.

use super::{GgmlType, GgufError, Value};
use memmap2::Mmap;
use std::collections::BTreeMap;
use std::path::Path;

/// One entry of the tensor table.
#[derive(Clone, Debug)]
pub struct TensorInfo {
    pub name: String,
    /// Dimensions, ne[0] first (the contiguous one).
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// Byte offset of the data from the start of its file.
    pub file_offset: u64,
    pub n_bytes: u64,
    /// Which file of a split model holds the data (0: the first, the one opened).
    pub part: u16,
}

impl TensorInfo {
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
    /// Number of rows: the product of every dimension but the first.
    pub fn n_rows(&self) -> u64 {
        self.dims.iter().skip(1).product()
    }
}

/// The longest metadata key or tensor name read (GGUF's limit for keys).
const MAX_NAME_BYTES: u64 = 65535;

/// How errors quote a key or name read from a file: whole (escaped) when short, else its
/// first 48 characters and its length, so that damaged input cannot make a long message.
pub(crate) fn brief(s: &str) -> String {
    const MAX_CHARS: usize = 48;
    if s.chars().count() <= MAX_CHARS {
        return s.escape_debug().to_string();
    }
    let head: String = s.chars().take(MAX_CHARS).collect();
    format!("{}… ({} bytes)", head.escape_debug(), s.len())
}

/// Where a file's bytes are: a memory map of a file on disk, or bytes the caller read
/// (a browser page has no files to map: it reads a picked file or a download into one
/// buffer, the only copy it keeps while the tensors are uploaded).
enum FileBytes {
    Map(Mmap),
    Owned(Vec<u8>),
}

impl std::ops::Deref for FileBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            FileBytes::Map(m) => m,
            FileBytes::Owned(v) => v,
        }
    }
}

/// An open, parsed GGUF file. Tensor data stays in the memory map (or the caller's
/// buffer) until uploaded.
pub struct GgufFile {
    pub path: String,
    pub version: u32,
    pub metadata: BTreeMap<String, Value>,
    pub tensors: Vec<TensorInfo>,
    pub data_offset: u64,
    pub alignment: u64,
    map: FileBytes,
    /// The other files of a split model (part 2 onwards).
    parts: Vec<FileBytes>,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    path: &'a str,
}

const MAX_ARRAY_DEPTH: usize = 4;
const MAX_DIMS: u32 = 4;

impl<'a> Cursor<'a> {
    fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8], GgufError> {
        let end = (self.pos as u64).checked_add(n);
        match end {
            Some(end) if end <= self.buf.len() as u64 => {
                let s = &self.buf[self.pos..end as usize];
                self.pos = end as usize;
                Ok(s)
            }
            _ => Err(GgufError::Truncated {
                path: self.path.to_string(),
                what: what.to_string(),
                offset: self.pos as u64,
                len: self.buf.len() as u64,
            }),
        }
    }
    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], GgufError> {
        Ok(self
            .take(N as u64, what)?
            .try_into()
            .expect("length checked"))
    }
    fn u8(&mut self, what: &str) -> Result<u8, GgufError> {
        Ok(self.array::<1>(what)?[0])
    }
    fn u32(&mut self, what: &str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }
    fn u64(&mut self, what: &str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }
    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }
    fn string(&mut self, what: &str) -> Result<String, GgufError> {
        let n = self.u64(what)?;
        let bytes = self.take(n, what)?;
        Ok(String::from_utf8_lossy(bytes).into_owned())
    }
    /// A metadata key or tensor name: GGUF keys are at most 65535 bytes, so a longer
    /// one is a corrupt length (a flipped byte), refused before it is read or quoted.
    fn name(&mut self, what: &str) -> Result<String, GgufError> {
        let at = self.pos;
        let n = self.u64(what)?;
        if n > MAX_NAME_BYTES {
            return Err(self.corrupt(format!(
                "{what} at byte {at} claims {n} bytes (at most {MAX_NAME_BYTES}): the file is \
                 damaged; download or convert it again"
            )));
        }
        self.pos = at;
        self.string(what)
    }
    fn corrupt(&self, msg: String) -> GgufError {
        GgufError::Corrupt {
            path: self.path.to_string(),
            msg,
        }
    }

    fn value(&mut self, ty: u32, what: &str, depth: usize) -> Result<Value, GgufError> {
        Ok(match ty {
            0 => Value::U8(self.u8(what)?),
            1 => Value::I8(self.u8(what)? as i8),
            2 => Value::U16(u16::from_le_bytes(self.array(what)?)),
            3 => Value::I16(i16::from_le_bytes(self.array(what)?)),
            4 => Value::U32(self.u32(what)?),
            5 => Value::I32(self.u32(what)? as i32),
            6 => Value::F32(f32::from_le_bytes(self.array(what)?)),
            7 => match self.u8(what)? {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(self.corrupt(format!("{what}: bool byte {b} is neither 0 nor 1"))),
            },
            8 => Value::String(self.string(what)?),
            9 => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(self.corrupt(format!("{what}: arrays nested too deeply")));
                }
                let elem_ty = self.u32(what)?;
                let n = self.u64(what)?;
                // Reject counts the file cannot hold before allocating for them (each
                // element takes at least its type's smallest encoding).
                let least = match elem_ty {
                    0 | 1 | 7 => 1,
                    2 | 3 => 2,
                    4..=6 => 4,
                    9 => 12,
                    _ => 8,
                };
                if n.saturating_mul(least) > self.remaining() {
                    return Err(self.corrupt(format!(
                        "{what}: array claims {n} elements but only {} bytes remain",
                        self.remaining()
                    )));
                }
                // A held value is larger than its encoding: reserve a bounded amount and
                // let the vector grow as elements really arrive.
                let mut items = Vec::with_capacity((n as usize).min(1 << 16));
                for _ in 0..n {
                    items.push(self.value(elem_ty, what, depth + 1)?);
                }
                Value::Array(items)
            }
            10 => Value::U64(self.u64(what)?),
            11 => Value::I64(self.u64(what)? as i64),
            12 => Value::F64(f64::from_le_bytes(self.array(what)?)),
            other => {
                return Err(self.corrupt(format!("{what}: unknown metadata value type {other}")))
            }
        })
    }
}

impl GgufFile {
    /// Opens and parses `path`. The tensor data is checked to lie inside the file. The
    /// first file of a split model brings the others in: one model, whatever the files.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, GgufError> {
        let mut f = Self::open_one(path.as_ref())?;
        f.join_parts(path.as_ref())?;
        Ok(f)
    }

    fn open_one(path_ref: &Path) -> Result<Self, GgufError> {
        let path = path_ref.display().to_string();
        let io_err = |source| GgufError::Io {
            path: path.clone(),
            source,
        };
        let file = std::fs::File::open(path_ref).map_err(io_err)?;
        if file.metadata().map_err(io_err)?.is_dir() {
            return Err(io_err(std::io::Error::other("is a directory")));
        }
        // SAFETY: the map is read-only; wgllm never writes to model files, and a file
        // changed underneath us is outside what any mmap-based loader can guard against.
        let map = unsafe { Mmap::map(&file) }.map_err(io_err)?;
        Self::parse(path, FileBytes::Map(map))
    }

    /// Parses a file already read into memory; `name` stands for its path in messages.
    /// A split model's first file alone is refused (its other files cannot be reached).
    pub fn from_bytes(name: impl Into<String>, bytes: Vec<u8>) -> Result<Self, GgufError> {
        let f = Self::parse(name.into(), FileBytes::Owned(bytes))?;
        if let Some((_, n)) = f.split_index()? {
            return Err(GgufError::Corrupt {
                path: f.path.clone(),
                msg: format!("one file of a model split into {n}; merge them first (llama-gguf-split --merge)"),
            });
        }
        Ok(f)
    }

    fn parse(path: String, map: FileBytes) -> Result<Self, GgufError> {
        let mut c = Cursor {
            buf: &map,
            pos: 0,
            path: &path,
        };
        let magic: [u8; 4] = match c.array("magic") {
            Ok(m) => m,
            Err(_) => {
                let mut magic = [0u8; 4];
                magic[..map.len()].copy_from_slice(&map);
                return Err(GgufError::BadMagic { path, magic });
            }
        };
        if &magic != b"GGUF" {
            return Err(GgufError::BadMagic { path, magic });
        }
        let version = c.u32("version")?;
        if !(2..=3).contains(&version) {
            return Err(GgufError::BadVersion { path, version });
        }
        let n_tensors = c.u64("tensor count")?;
        let n_kv = c.u64("metadata count")?;
        // A metadata entry is at least 13 bytes, a tensor entry at least 24.
        if n_kv > c.remaining() / 13 || n_tensors > c.remaining() / 24 {
            return Err(c.corrupt(format!(
                "header claims {n_kv} metadata entries and {n_tensors} tensors, more than the file can hold"
            )));
        }
        let mut metadata = BTreeMap::new();
        for i in 0..n_kv {
            let key = c.name(&format!("metadata key #{i}"))?;
            let k = brief(&key);
            let ty = c.u32(&format!("type of `{k}`"))?;
            let v = c.value(ty, &format!("value of `{k}`"), 0)?;
            metadata.insert(key, v);
        }
        let alignment = match metadata.get("general.alignment") {
            None => 32,
            Some(v) => match v.as_i64() {
                Some(a) if a > 0 && (a as u64).is_power_of_two() => a as u64,
                _ => {
                    return Err(c.corrupt(format!(
                        "general.alignment = {v} is not a positive power of two"
                    )))
                }
            },
        };
        let mut raw = Vec::with_capacity((n_tensors as usize).min(1 << 16));
        for i in 0..n_tensors {
            let name = c.name(&format!("name of tensor #{i}"))?;
            let nm = brief(&name);
            let n_dims = c.u32(&format!("dimension count of `{nm}`"))?;
            if n_dims == 0 || n_dims > MAX_DIMS {
                return Err(c.corrupt(format!(
                    "tensor `{nm}` has {n_dims} dimensions (1..=4 allowed)"
                )));
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                dims.push(c.u64(&format!("dimensions of `{nm}`"))?);
            }
            let ty = GgmlType::from_id(c.u32(&format!("type of `{nm}`"))?);
            let rel = c.u64(&format!("offset of `{nm}`"))?;
            raw.push((name, dims, ty, rel));
        }
        let data_offset = (c.pos as u64).div_ceil(alignment) * alignment;
        let file_len = map.len() as u64;
        let mut tensors = Vec::with_capacity(raw.len());
        for (name, dims, ty, rel) in raw {
            let nm = brief(&name);
            let n_elems = dims
                .iter()
                .try_fold(1u64, |acc, &d| acc.checked_mul(d))
                .ok_or_else(|| c.corrupt(format!("tensor `{nm}`: dimensions {dims:?} overflow")))?;
            let n_bytes = match ty.block_layout() {
                None => 0, // unknown type: kept so the loader can name it in its error
                Some(_) => {
                    let per_row = ty.row_bytes(dims[0]).ok_or_else(|| {
                        c.corrupt(format!(
                            "tensor `{nm}`: row length {} is not a multiple of the {ty} block size {}",
                            dims[0],
                            ty.block_size()
                        ))
                    })?;
                    per_row
                        .checked_mul(n_elems / dims[0].max(1))
                        .ok_or_else(|| c.corrupt(format!("tensor `{nm}`: size overflows")))?
                }
            };
            if rel % alignment != 0 {
                return Err(c.corrupt(format!(
                    "tensor `{nm}`: data offset {rel} is not aligned to {alignment}"
                )));
            }
            let file_offset = data_offset
                .checked_add(rel)
                .filter(|o| o.checked_add(n_bytes).is_some_and(|end| end <= file_len))
                .ok_or_else(|| GgufError::Truncated {
                    path: path.clone(),
                    what: format!("data of tensor `{nm}` ({n_bytes} bytes)"),
                    offset: data_offset.saturating_add(rel),
                    len: file_len,
                })?;
            tensors.push(TensorInfo {
                name,
                dims,
                ty,
                file_offset,
                n_bytes,
                part: 0,
            });
        }
        Ok(Self {
            path,
            version,
            metadata,
            tensors,
            data_offset,
            alignment,
            map,
            parts: Vec::new(),
        })
    }

    /// `split.no` and `split.count` (llama.cpp's split models): None for a whole file.
    fn split_index(&self) -> Result<Option<(u64, u64)>, GgufError> {
        if self.get("split.count").is_none() {
            return Ok(None);
        }
        let n = self.get_u64("split.count")?;
        let k = self.get_u64("split.no")?;
        if n <= 1 {
            return Ok(None);
        }
        if k >= n {
            return Err(GgufError::Metadata {
                path: self.path.clone(),
                key: "split.no".into(),
                problem: format!("is {k}, past split.count {n}"),
            });
        }
        Ok(Some((k, n)))
    }

    /// Opens the other files of a split model whose first file this is
    /// (`NAME-00001-of-0000N.gguf`, the rest beside it as llama-gguf-split names them)
    /// and takes their tensors in.
    fn join_parts(&mut self, first: &Path) -> Result<(), GgufError> {
        let Some((k, n)) = self.split_index()? else {
            return Ok(());
        };
        let corrupt = |msg: String| GgufError::Corrupt {
            path: self.path.clone(),
            msg,
        };
        let name = first
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default();
        let suffix = format!("-{:05}-of-{n:05}.gguf", k + 1);
        if k != 0 {
            return Err(corrupt(format!(
                "this is part {} of a model split into {n} files; open the first part (…-00001-of-{n:05}.gguf)",
                k + 1
            )));
        }
        let Some(prefix) = name.strip_suffix(&suffix) else {
            return Err(corrupt(format!(
                "the first part of a model split into {n} files must be named NAME{suffix} (llama-gguf-split's names) so that the others can be found"
            )));
        };
        for part in 1..n {
            let path = first.with_file_name(format!("{prefix}-{:05}-of-{n:05}.gguf", part + 1));
            if !path.exists() {
                return Err(GgufError::Io {
                    path: path.display().to_string(),
                    source: std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        format!("part {} of this split model is missing (all {n} files must lie together)", part + 1),
                    ),
                });
            }
            let other = GgufFile::open_one(&path)?;
            if other.split_index()? != Some((part, n)) {
                return Err(GgufError::Metadata {
                    path: other.path.clone(),
                    key: "split.no".into(),
                    problem: format!("does not say part {} of {n}", part + 1),
                });
            }
            let idx = self.parts.len() as u16 + 1;
            for mut t in other.tensors {
                if self.tensor(&t.name).is_some() {
                    return Err(corrupt(format!(
                        "tensor `{}` is in two parts",
                        brief(&t.name)
                    )));
                }
                t.part = idx;
                self.tensors.push(t);
            }
            self.parts.push(other.map);
        }
        if let Some(total) = self.get("split.tensors.count").and_then(|v| v.as_i64()) {
            if total as usize != self.tensors.len() {
                return Err(corrupt(format!(
                    "split.tensors.count says {total} tensors, the {n} files hold {}",
                    self.tensors.len()
                )));
            }
        }
        Ok(())
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The raw bytes of a tensor, as stored in the file.
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        let map = match t.part {
            0 => &self.map,
            k => &self.parts[k as usize - 1],
        };
        &map[t.file_offset as usize..(t.file_offset + t.n_bytes) as usize]
    }

    /// A hash that tells this file's weights from another's of the same shape (another
    /// fine-tune, another quantization): every tensor's name, type and dimensions and
    /// the first and last bytes of its data (a few pages read, not the file). Stable
    /// across runs and builds (FNV-1a), so files that record it can be checked later.
    pub fn fingerprint(&self) -> u64 {
        const EDGE: usize = 64;
        let mut h = Fnv1a::default();
        for t in &self.tensors {
            h.write(t.name.as_bytes());
            h.write(format!("{:?}", t.ty).as_bytes());
            for d in &t.dims {
                h.write(&d.to_le_bytes());
            }
            let data = self.tensor_data(t);
            h.write(&data[..data.len().min(EDGE)]);
            h.write(&data[data.len().saturating_sub(EDGE)..]);
        }
        h.0
    }

    /// Bytes of every file of the model.
    pub fn file_size(&self) -> u64 {
        self.map.len() as u64 + self.parts.iter().map(|p| p.len() as u64).sum::<u64>()
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }

    fn meta_err(&self, key: &str, problem: impl Into<String>) -> GgufError {
        GgufError::Metadata {
            path: self.path.clone(),
            key: key.to_string(),
            problem: problem.into(),
        }
    }

    /// A required integer key.
    pub fn get_u64(&self, key: &str) -> Result<u64, GgufError> {
        let v = self
            .get(key)
            .ok_or_else(|| self.meta_err(key, "is missing"))?;
        v.as_i64()
            .and_then(|i| u64::try_from(i).ok())
            .ok_or_else(|| {
                self.meta_err(
                    key,
                    format!("should be a non-negative integer, found {}", v.type_name()),
                )
            })
    }

    /// A required float key (integers are accepted).
    pub fn get_f32(&self, key: &str) -> Result<f32, GgufError> {
        let v = self
            .get(key)
            .ok_or_else(|| self.meta_err(key, "is missing"))?;
        v.as_f64().map(|f| f as f32).ok_or_else(|| {
            self.meta_err(key, format!("should be a number, found {}", v.type_name()))
        })
    }

    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        let v = self
            .get(key)
            .ok_or_else(|| self.meta_err(key, "is missing"))?;
        v.as_str().ok_or_else(|| {
            self.meta_err(key, format!("should be a string, found {}", v.type_name()))
        })
    }

    pub fn get_array(&self, key: &str) -> Result<&[Value], GgufError> {
        let v = self
            .get(key)
            .ok_or_else(|| self.meta_err(key, "is missing"))?;
        v.as_array().ok_or_else(|| {
            self.meta_err(key, format!("should be an array, found {}", v.type_name()))
        })
    }

    /// The model architecture (`general.architecture`).
    pub fn architecture(&self) -> Result<&str, GgufError> {
        self.get_str("general.architecture")
    }
}

/// 64-bit FNV-1a: a hash whose value never changes between builds or platforms.
struct Fnv1a(u64);

impl Default for Fnv1a {
    fn default() -> Self {
        Fnv1a(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv1a {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
    }
}
