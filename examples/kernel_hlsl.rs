//! Writes every kernel variant's HLSL, as wgpu's DX12 backend would hand it to its
//! compiler, into a folder: `scripts/dx12-wine.sh --hlsl-check` compiles each file with
//! vkd3d-shader (the HLSL compiler behind Wine's `d3dcompiler_47.dll`) and reports the
//! failures by kernel key.
//!
//! `cargo run --release --example kernel_hlsl -- DIR` writes `DIR/NNNN.hlsl` per variant
//! and `DIR/index.tsv` (file, shader model, kernel key). Built for Windows, `kernel_hlsl
//! --compile [--as-written] [SUBSTRING]` instead compiles each shader-model-5.1 variant
//! (those whose name contains SUBSTRING) with `D3DCompile` from `d3dcompiler_47.dll`
//! (Microsoft's FXC, or Wine's vkd3d-shader), with the profile and flags wgpu's FXC path
//! uses and the short loops written out as `Gpu::pipeline` writes them for FXC (unless
//! --as-written), and prints one line per failure, progress, and a count. Shader model 5.1 is what FXC
//! (and so vkd3d-shader) compiles; variants with subgroups (6.0) or f16 (6.2) need DXC and
//! are listed with their model so the check can say why it leaves them out. The naga
//! options follow wgpu-hal's DX12 device for our pipelines: runtime checks off (the
//! kernels are created trusted), workgroup memory zeroed only where the key reads memory
//! it did not write.

use naga::back::hlsl;
use std::fmt::Write as _;
use wgllm::gpu::Kernel as _;
use wgllm::ops::KernelKey;

fn main() {
    if std::env::args().nth(1).as_deref() == Some("--compile") {
        std::process::exit(compile_all());
    }
    let dir = match std::env::args_os().nth(1) {
        Some(d) => std::path::PathBuf::from(d),
        None => {
            eprintln!("usage: kernel_hlsl DIR");
            std::process::exit(2);
        }
    };
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("error: creating {}: {e}", dir.display());
        std::process::exit(1);
    }
    let mut index = String::new();
    let mut failed = 0;
    let keys = KernelKey::all();
    for (i, key) in keys.iter().enumerate() {
        let file = format!("{i:04}.hlsl");
        match translate(*key, false) {
            Ok((model, text)) => {
                if let Err(e) = std::fs::write(dir.join(&file), text) {
                    eprintln!("error: writing {file}: {e}");
                    std::process::exit(1);
                }
                let _ = writeln!(index, "{file}\t{model}\t{key}");
            }
            Err(e) => {
                failed += 1;
                let _ = writeln!(index, "-\tnaga-error\t{key}\t{e}");
            }
        }
    }
    if let Err(e) = std::fs::write(dir.join("index.tsv"), index) {
        eprintln!("error: writing index.tsv: {e}");
        std::process::exit(1);
    }
    eprintln!(
        "{} kernel variants written to {} ({failed} naga could not translate)",
        keys.len() - failed,
        dir.display()
    );
}

/// The key's HLSL and the shader model it needs ("5_1", "6_0", "6_2"); `unrolled`: with
/// the short loops of the shader-model-5.1 variants written out, as `Gpu::pipeline`
/// compiles them for FXC.
fn translate(key: KernelKey, unrolled: bool) -> Result<(&'static str, String), String> {
    let mut src = key.source()?;
    let sm6 = key
        .features()
        .intersects(wgpu::Features::SHADER_F16 | wgpu::Features::SUBGROUP);
    if unrolled && !sm6 {
        src = wgllm::gpu::unroll::unroll(&src, wgllm::gpu::unroll::MAX_TRIPS);
    }
    let module = naga::front::wgsl::parse_str(&src).map_err(|e| format!("parse: {e}"))?;
    let info =
        naga::valid::Validator::new(naga::valid::ValidationFlags::all(), key.naga_capabilities())
            .validate(&module)
            .map_err(|e| format!("validate: {e}"))?;
    let features = key.features();
    let (model, sm) = if features.contains(wgpu::Features::SHADER_F16) {
        ("6_2", hlsl::ShaderModel::V6_2)
    } else if features.contains(wgpu::Features::SUBGROUP) {
        ("6_0", hlsl::ShaderModel::V6_0)
    } else {
        ("5_1", hlsl::ShaderModel::V5_1)
    };
    let opts = hlsl::Options {
        shader_model: sm,
        zero_initialize_workgroup_memory: key.reads_unwritten_workgroup_memory(),
        restrict_indexing: false,
        force_loop_bounding: false,
        ..Default::default()
    };
    let pipe = hlsl::PipelineOptions {
        entry_point: Some((naga::ShaderStage::Compute, "main".into())),
    };
    let mut out = String::new();
    hlsl::Writer::new(&mut out, &opts, &pipe)
        .write(&module, &info, None)
        .map_err(|e| format!("HLSL: {e:?}"))?;
    Ok((model, out))
}

/// Compiles every SM 5.1 variant with D3DCompile; returns the exit code (1: failures).
#[cfg(windows)]
fn compile_all() -> i32 {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;
    // `--compile [--as-written] [SUBSTRING]`: only the keys whose name contains it;
    // the short loops written out as `Gpu::pipeline` does for FXC, unless --as-written.
    let mut args: Vec<String> = std::env::args().skip(2).collect();
    let as_written = args.iter().any(|a| a == "--as-written");
    args.retain(|a| a != "--as-written");
    let only = args.first().cloned().unwrap_or_default();
    let keys: Vec<KernelKey> = (KernelKey::all().into_iter())
        .filter(|k| k.to_string().contains(&only))
        .collect();
    let (ok, dxc_only, coop) = (
        AtomicUsize::new(0),
        AtomicUsize::new(0),
        AtomicUsize::new(0),
    );
    let failures = Mutex::new(Vec::new());
    let next = AtomicUsize::new(0);
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get());
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(key) = keys.get(i) else {
                    break;
                };
                if i % 100 == 0 {
                    eprintln!("{i} of {} variants ...", keys.len());
                }
                let outcome = match translate(*key, !as_written) {
                    Ok(("5_1", text)) => fxc::compile(&text, "cs_5_1").map(drop),
                    Ok(_) => {
                        dxc_only.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    Err(_)
                        if key
                            .features()
                            .contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX) =>
                    {
                        coop.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    Err(e) => Err(format!("naga: {e}")),
                };
                match outcome {
                    Ok(()) => {
                        ok.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => {
                        // The errors, not the warnings that come before them.
                        let errors: Vec<&str> = (e.lines())
                            .filter(|l| l.contains("error"))
                            .take(2)
                            .collect();
                        let line = format!("FAIL {key}: {}", errors.join(" | "));
                        println!("{line}");
                        failures.lock().unwrap().push(line);
                    }
                }
            });
        }
    });
    let failed = failures.lock().unwrap().len();
    println!(
        "{} variants: {} compiled (cs_5_1), {failed} failed, {} need DXC (subgroups or f16: shader model 6), {} cooperative-matrix (none on DX12 through wgpu)",
        keys.len(),
        ok.into_inner(),
        dxc_only.into_inner(),
        coop.into_inner()
    );
    i32::from(failed > 0)
}

#[cfg(not(windows))]
fn compile_all() -> i32 {
    eprintln!("--compile calls d3dcompiler_47.dll: build this example for Windows (scripts/dx12-wine.sh --hlsl-check)");
    2
}

/// `D3DCompile` from d3dcompiler_47.dll, called as wgpu-hal's FXC path calls it.
#[cfg(windows)]
mod fxc {
    use std::ffi::{c_char, c_void, CString};

    /// ID3DBlob's vtable: IUnknown's three methods, then the buffer's pointer and size.
    #[repr(C)]
    struct BlobVtbl {
        query_interface: usize,
        add_ref: usize,
        release: unsafe extern "system" fn(*mut Blob) -> u32,
        pointer: unsafe extern "system" fn(*mut Blob) -> *const c_void,
        size: unsafe extern "system" fn(*mut Blob) -> usize,
    }
    #[repr(C)]
    struct Blob {
        vtbl: *const BlobVtbl,
    }

    #[link(name = "d3dcompiler_47")]
    extern "system" {
        #[link_name = "D3DCompile"]
        fn d3d_compile(
            src: *const c_void,
            len: usize,
            name: *const c_char,
            defines: *const c_void,
            include: *const c_void,
            entry: *const c_char,
            target: *const c_char,
            flags1: u32,
            flags2: u32,
            code: *mut *mut Blob,
            errors: *mut *mut Blob,
        ) -> i32;
    }

    /// D3DCOMPILE_ENABLE_STRICTNESS, as wgpu-hal sets it.
    const ENABLE_STRICTNESS: u32 = 1 << 11;

    /// Reads a blob's bytes and releases it.
    unsafe fn take(blob: *mut Blob) -> Vec<u8> {
        if blob.is_null() {
            return Vec::new();
        }
        let v = &*(*blob).vtbl;
        let (p, n) = ((v.pointer)(blob), (v.size)(blob));
        let out = std::slice::from_raw_parts(p as *const u8, n).to_vec();
        (v.release)(blob);
        out
    }

    /// The bytecode's size, or the compiler's messages.
    pub fn compile(hlsl: &str, target: &str) -> Result<usize, String> {
        let (name, entry) = (
            CString::new("kernel.hlsl").unwrap(),
            CString::new("main").unwrap(),
        );
        let target = CString::new(target).unwrap();
        let (mut code, mut errors) = (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: the pointers are valid for the call; the blobs it returns are read and
        // released once each.
        let hr = unsafe {
            d3d_compile(
                hlsl.as_ptr().cast(),
                hlsl.len(),
                name.as_ptr(),
                std::ptr::null(),
                std::ptr::null(),
                entry.as_ptr(),
                target.as_ptr(),
                ENABLE_STRICTNESS,
                0,
                &mut code,
                &mut errors,
            )
        };
        let (code, errors) = unsafe { (take(code), take(errors)) };
        if hr < 0 {
            let msg = String::from_utf8_lossy(&errors)
                .trim_end_matches('\0')
                .to_string();
            return Err(format!("HRESULT {:#010x}: {msg}", hr as u32));
        }
        Ok(code.len())
    }
}
