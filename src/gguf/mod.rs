//! GGUF files: a memory-mapped reader for the header, metadata and tensor table.
//!
//! Every read is bounds-checked, so a truncated or corrupt file yields a [`GgufError`]
//! naming what was wrong and where, never a panic.

mod reader;
pub mod types;
mod writer;

pub use reader::{GgufFile, TensorInfo};
pub use types::GgmlType;
pub use writer::{write_split, GgufWriter};

use std::fmt;

/// Errors from reading a GGUF file.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("cannot open {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} is not a GGUF file (magic {magic:?}, expected \"GGUF\")")]
    BadMagic { path: String, magic: [u8; 4] },
    #[error("{path}: unsupported GGUF version {version} (wgllm reads versions 2 and 3)")]
    BadVersion { path: String, version: u32 },
    #[error("{path}: file is truncated or corrupt: {what} at byte {offset} runs past the end ({len} bytes); re-download the model")]
    Truncated {
        path: String,
        what: String,
        offset: u64,
        len: u64,
    },
    #[error("{path}: corrupt GGUF: {msg}")]
    Corrupt { path: String, msg: String },
    #[error("{path}: metadata key `{key}` {problem}")]
    Metadata {
        path: String,
        key: String,
        problem: String,
    },
}

/// A metadata value. Arrays keep their element values (token lists are large but cheap).
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Vec<Value>),
}

impl Value {
    /// Any integer value widened to i64 (u64 above i64::MAX is rejected).
    pub fn as_i64(&self) -> Option<i64> {
        Some(match *self {
            Value::U8(v) => v as i64,
            Value::I8(v) => v as i64,
            Value::U16(v) => v as i64,
            Value::I16(v) => v as i64,
            Value::U32(v) => v as i64,
            Value::I32(v) => v as i64,
            Value::U64(v) => i64::try_from(v).ok()?,
            Value::I64(v) => v,
            Value::Bool(b) => b as i64,
            _ => return None,
        })
    }

    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v as f64),
            Value::F64(v) => Some(v),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    pub fn type_name(&self) -> &'static str {
        match self {
            Value::U8(_) => "u8",
            Value::I8(_) => "i8",
            Value::U16(_) => "u16",
            Value::I16(_) => "i16",
            Value::U32(_) => "u32",
            Value::I32(_) => "i32",
            Value::U64(_) => "u64",
            Value::I64(_) => "i64",
            Value::F32(_) => "f32",
            Value::F64(_) => "f64",
            Value::Bool(_) => "bool",
            Value::String(_) => "string",
            Value::Array(_) => "array",
        }
    }
}

impl fmt::Display for Value {
    /// Short form for `wgllm inspect`: long arrays are summarised.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::String(s) => {
                let mut shown: String = s.chars().take(120).collect();
                if shown.len() < s.len() {
                    shown.push('…');
                }
                write!(f, "{shown:?}")
            }
            Value::Array(a) => {
                let head: Vec<String> = a.iter().take(6).map(|v| v.to_string()).collect();
                let more = if a.len() > 6 { ", …" } else { "" };
                write!(f, "[{}{}] ({} items)", head.join(", "), more, a.len())
            }
            Value::F32(v) => write!(f, "{v}"),
            Value::F64(v) => write!(f, "{v}"),
            Value::Bool(v) => write!(f, "{v}"),
            other => write!(f, "{}", other.as_i64().unwrap_or_default()),
        }
    }
}

#[cfg(test)]
mod tests;
