use super::{GgmlType, GgufError, GgufFile, GgufWriter, Value};

fn sample() -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.meta("general.architecture", Value::String("llama".into()))
        .meta("a.u8", Value::U8(7))
        .meta("a.i8", Value::I8(-7))
        .meta("a.u16", Value::U16(700))
        .meta("a.i16", Value::I16(-700))
        .meta("a.u32", Value::U32(70000))
        .meta("a.i32", Value::I32(-70000))
        .meta("a.u64", Value::U64(1 << 40))
        .meta("a.i64", Value::I64(-(1 << 40)))
        .meta("a.f32", Value::F32(0.5))
        .meta("a.f64", Value::F64(0.25))
        .meta("a.bool", Value::Bool(true))
        .meta(
            "a.arr",
            Value::Array(vec![Value::String("x".into()), Value::String("yz".into())]),
        )
        .tensor("t0", &[4, 2], GgmlType::F32, vec![1; 32])
        .tensor("t1", &[32], GgmlType::Q8_0, vec![2; 34]);
    w.to_bytes()
}

fn open_bytes(bytes: &[u8]) -> Result<GgufFile, GgufError> {
    let dir = std::env::temp_dir().join(format!("wgllm-gguf-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let p = dir.join(format!("{n}.gguf"));
    std::fs::write(&p, bytes).unwrap();
    let r = GgufFile::open(&p);
    std::fs::remove_file(&p).ok();
    r
}

#[test]
fn round_trips_every_value_type() {
    let f = open_bytes(&sample()).unwrap();
    assert_eq!(f.version, 3);
    assert_eq!(f.architecture().unwrap(), "llama");
    assert_eq!(f.get("a.i16"), Some(&Value::I16(-700)));
    assert_eq!(f.get("a.i64").unwrap().as_i64(), Some(-(1 << 40)));
    assert_eq!(f.get_f32("a.f64").unwrap(), 0.25);
    assert_eq!(f.get("a.bool").unwrap().as_bool(), Some(true));
    assert_eq!(f.get_array("a.arr").unwrap()[1].as_str(), Some("yz"));
    let t1 = f.tensor("t1").unwrap();
    assert_eq!(t1.ty, GgmlType::Q8_0);
    assert_eq!(t1.n_bytes, 34);
    assert_eq!(t1.file_offset % 32, 0);
    assert_eq!(f.tensor_data(t1), &[2u8; 34][..]);
    assert_eq!(f.tensor_data(f.tensor("t0").unwrap()).len(), 32);
}

#[test]
fn every_truncation_is_an_error_not_a_panic() {
    let bytes = sample();
    for len in 0..bytes.len() - 1 {
        // The last tensor's padding is not data: the file stays valid down to its end.
        let last = open_bytes(&sample()).unwrap();
        let end = last
            .tensors
            .iter()
            .map(|t| t.file_offset + t.n_bytes)
            .max()
            .unwrap();
        let r = open_bytes(&bytes[..len]);
        if (len as u64) < end {
            assert!(r.is_err(), "truncated at {len} accepted");
        }
    }
}

#[test]
fn corrupt_headers_are_named() {
    let mut b = sample();
    b[0] = b'X';
    assert!(matches!(open_bytes(&b), Err(GgufError::BadMagic { .. })));
    let mut b = sample();
    b[4] = 9;
    assert!(matches!(
        open_bytes(&b),
        Err(GgufError::BadVersion { version: 9, .. })
    ));
    let mut b = sample();
    b[16..24].copy_from_slice(&u64::MAX.to_le_bytes()); // metadata count
    let e = open_bytes(&b).unwrap_err().to_string();
    assert!(e.contains("more than the file can hold"), "{e}");
}

#[test]
fn random_byte_flips_never_panic() {
    let base = sample();
    let mut seed = 1u64;
    for _ in 0..2000 {
        let mut b = base.clone();
        for _ in 0..3 {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
            let i = (seed >> 33) as usize % b.len();
            b[i] = (seed >> 13) as u8;
        }
        let _ = open_bytes(&b);
    }
}

/// A file read into memory (a browser page's download) parses as the mapped file does,
/// and its truncations are errors too.
#[test]
fn bytes_in_memory_read_as_the_mapped_file() {
    let bytes = sample();
    let mapped = open_bytes(&bytes).unwrap();
    let owned = GgufFile::from_bytes("download.gguf", bytes.clone()).unwrap();
    assert_eq!(owned.path, "download.gguf");
    assert_eq!(owned.metadata, mapped.metadata);
    assert_eq!(owned.tensors.len(), mapped.tensors.len());
    for (a, b) in owned.tensors.iter().zip(&mapped.tensors) {
        assert_eq!(
            (&a.name, a.file_offset, a.n_bytes),
            (&b.name, b.file_offset, b.n_bytes)
        );
        assert_eq!(owned.tensor_data(a), mapped.tensor_data(b));
    }
    for cut in [0, 3, 20, bytes.len() / 2] {
        assert!(GgufFile::from_bytes("cut.gguf", bytes[..cut].to_vec()).is_err());
    }
}

#[test]
fn a_damaged_key_length_is_refused_briefly() {
    // The first key's length (at byte 24) gains 0x12 in its third byte: a 1.2 MB "key",
    // which the padding after the file would let a reader take whole.
    let mut b = sample();
    b[26] = 0x12;
    b.extend(std::iter::repeat_n(b'k', 2 << 20));
    let e = open_bytes(&b).unwrap_err().to_string();
    assert!(
        e.len() < 300,
        "{} bytes: {}",
        e.len(),
        &e[..300.min(e.len())]
    );
    assert!(e.contains("metadata key #0") && e.contains("65535"), "{e}");
}

#[test]
fn long_names_are_quoted_briefly() {
    assert_eq!(
        super::reader::brief("blk.0.attn_q.weight"),
        "blk.0.attn_q.weight"
    );
    assert_eq!(super::reader::brief("a\nb"), "a\\nb");
    let long = "x".repeat(1000);
    let q = super::reader::brief(&long);
    assert!(
        q.starts_with(&"x".repeat(48)) && q.ends_with("(1000 bytes)"),
        "{q}"
    );
    assert!(q.len() < 70, "{q}");
}
