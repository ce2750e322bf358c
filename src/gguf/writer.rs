//! A small GGUF writer: synthetic models for tests, benchmarks and fuzz seeds.

use super::{GgmlType, Value};

#[derive(Default)]
pub struct GgufWriter {
    metadata: Vec<(String, Value)>,
    tensors: Vec<(String, Vec<u64>, GgmlType, Vec<u8>)>,
}

fn type_id(ty: GgmlType) -> u32 {
    (0..64)
        .find(|&id| GgmlType::from_id(id) == ty)
        .expect("writer: type has an id")
}

fn value_type(v: &Value) -> u32 {
    match v {
        Value::U8(_) => 0,
        Value::I8(_) => 1,
        Value::U16(_) => 2,
        Value::I16(_) => 3,
        Value::U32(_) => 4,
        Value::I32(_) => 5,
        Value::F32(_) => 6,
        Value::Bool(_) => 7,
        Value::String(_) => 8,
        Value::Array(_) => 9,
        Value::U64(_) => 10,
        Value::I64(_) => 11,
        Value::F64(_) => 12,
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.push(*x as u8),
        Value::U16(x) => out.extend(x.to_le_bytes()),
        Value::I16(x) => out.extend(x.to_le_bytes()),
        Value::U32(x) => out.extend(x.to_le_bytes()),
        Value::I32(x) => out.extend(x.to_le_bytes()),
        Value::F32(x) => out.extend(x.to_le_bytes()),
        Value::Bool(x) => out.push(*x as u8),
        Value::String(s) => put_str(out, s),
        Value::Array(items) => {
            let elem = items.first().map_or(4, value_type);
            out.extend(elem.to_le_bytes());
            out.extend((items.len() as u64).to_le_bytes());
            items.iter().for_each(|i| put_value(out, i));
        }
        Value::U64(x) => out.extend(x.to_le_bytes()),
        Value::I64(x) => out.extend(x.to_le_bytes()),
        Value::F64(x) => out.extend(x.to_le_bytes()),
    }
}

impl GgufWriter {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn meta(&mut self, key: &str, v: Value) -> &mut Self {
        self.metadata.push((key.to_string(), v));
        self
    }

    /// Sets `key` to `v`, replacing the value it had (tests that change a file).
    pub fn set_meta(&mut self, key: &str, v: Value) -> &mut Self {
        match self.metadata.iter_mut().find(|(k, _)| k == key) {
            Some(kv) => kv.1 = v,
            None => self.metadata.push((key.to_string(), v)),
        }
        self
    }

    /// Adds a tensor from already-encoded bytes of type `ty`.
    pub fn tensor(&mut self, name: &str, dims: &[u64], ty: GgmlType, data: Vec<u8>) -> &mut Self {
        self.tensors
            .push((name.to_string(), dims.to_vec(), ty, data));
        self
    }

    /// Serializes with 32-byte alignment (GGUF version 3).
    /// Drops a tensor added before (for files that must lack one: error tests).
    pub fn remove_tensor(&mut self, name: &str) -> &mut Self {
        self.tensors.retain(|t| t.0 != name);
        self
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.write_to(&mut out).expect("writing to memory");
        out
    }

    /// Streams the file to `out` (a 7B model need not fit twice in memory).
    pub fn write_to(&self, out: &mut impl std::io::Write) -> std::io::Result<()> {
        const ALIGN: usize = 32;
        let mut head = Vec::new();
        head.extend(b"GGUF");
        head.extend(3u32.to_le_bytes());
        head.extend((self.tensors.len() as u64).to_le_bytes());
        head.extend((self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            put_str(&mut head, k);
            head.extend(value_type(v).to_le_bytes());
            put_value(&mut head, v);
        }
        let mut offset = 0usize;
        for (name, dims, ty, data) in &self.tensors {
            put_str(&mut head, name);
            head.extend((dims.len() as u32).to_le_bytes());
            dims.iter().for_each(|d| head.extend(d.to_le_bytes()));
            head.extend(type_id(*ty).to_le_bytes());
            head.extend((offset as u64).to_le_bytes());
            offset += data.len().div_ceil(ALIGN) * ALIGN;
        }
        head.resize(head.len().div_ceil(ALIGN) * ALIGN, 0);
        out.write_all(&head)?;
        let zeros = [0u8; ALIGN];
        for (_, _, _, data) in &self.tensors {
            out.write_all(data)?;
            out.write_all(&zeros[..data.len().div_ceil(ALIGN) * ALIGN - data.len()])?;
        }
        out.flush()
    }

    pub fn write(&self, path: impl AsRef<std::path::Path>) -> std::io::Result<()> {
        let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
        self.write_to(&mut f)
    }
}

/// Writes the model `f` as llama-gguf-split lays out a split model: `n` files
/// `PREFIX-0000K-of-0000N.gguf` holding the tensors in order, about equal in count; the
/// first carries the metadata, each carries `split.no`, `split.count` and
/// `split.tensors.count`. Returns the files' paths.
pub fn write_split(
    f: &super::GgufFile,
    prefix: &std::path::Path,
    n: usize,
) -> std::io::Result<Vec<std::path::PathBuf>> {
    let n = n.clamp(1, f.tensors.len().max(1));
    let per = f.tensors.len().div_ceil(n);
    let mut paths = Vec::with_capacity(n);
    for (k, chunk) in f.tensors.chunks(per.max(1)).enumerate() {
        let mut w = GgufWriter::new();
        if k == 0 {
            for (key, v) in &f.metadata {
                // The writer aligns to 32 bytes and says nothing else.
                if key != "general.alignment" && !key.starts_with("split.") {
                    w.meta(key, v.clone());
                }
            }
        }
        w.meta("split.no", Value::U16(k as u16));
        w.meta("split.count", Value::U16(n as u16));
        w.meta("split.tensors.count", Value::I32(f.tensors.len() as i32));
        for t in chunk {
            w.tensor(&t.name, &t.dims, t.ty, f.tensor_data(t).to_vec());
        }
        let name = format!(
            "{}-{:05}-of-{n:05}.gguf",
            prefix
                .file_name()
                .map(|p| p.to_string_lossy())
                .unwrap_or_default(),
            k + 1
        );
        let path = prefix.with_file_name(name);
        w.write(&path)?;
        paths.push(path);
    }
    Ok(paths)
}
