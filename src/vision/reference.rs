//! The encoder on the CPU, in f64, straight from the file's tensors: the reference the
//! GPU graph is tested against on every device, and the tool that tells where a
//! difference from llama.cpp comes from (its CPU backend computes GELU through a table
//! of f16 values, [`Gelu::GgmlTable`]).

use super::encoder::EncoderInput;
use super::mmproj::{ClipHparams, Projector};
use crate::gguf::GgufFile;
use crate::quant;
use half::f16;

/// How the feed-forward's GELU (tanh form) is computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gelu {
    Exact,
    /// As ggml's CPU backend: the input rounded to f16 and looked up in a table of f16
    /// results (inputs beyond ±10 pass through or vanish).
    GgmlTable,
}

fn gelu(x: f64, kind: Gelu) -> f64 {
    let exact =
        |x: f64| 0.5 * x * (1.0 + (0.797_884_560_802_865_4 * x * (1.0 + 0.044715 * x * x)).tanh());
    match kind {
        Gelu::Exact => exact(x),
        Gelu::GgmlTable => {
            let x32 = x as f32;
            if x32 <= -10.0 {
                0.0
            } else if x32 >= 10.0 {
                x32 as f64
            } else {
                let h = f16::from_f32(x32).to_f32();
                f16::from_f32(exact(h as f64) as f32).to_f32() as f64
            }
        }
    }
}

fn values(f: &GgufFile, name: &str) -> Vec<f64> {
    let t = f
        .tensor(name)
        .unwrap_or_else(|| panic!("{name} is missing"));
    let n = t.dims.iter().product::<u64>() as usize;
    let mut v = vec![0f32; n];
    quant::dequantize_row(t.ty, f.tensor_data(t), &mut v);
    v.into_iter().map(|x| x as f64).collect()
}

/// y = W x + b for W of `rows` rows of x.len() values.
fn affine(w: &[f64], b: Option<&[f64]>, x: &[f64]) -> Vec<f64> {
    let cols = x.len();
    (0..w.len() / cols)
        .map(|r| {
            let dot: f64 = w[r * cols..(r + 1) * cols]
                .iter()
                .zip(x)
                .map(|(a, b)| a * b)
                .sum();
            dot + b.map_or(0.0, |b| b[r])
        })
        .collect()
}

fn layer_norm(x: &[f64], w: &[f64], b: &[f64], eps: f64) -> Vec<f64> {
    let n = x.len() as f64;
    let mean = x.iter().sum::<f64>() / n;
    let var = x.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
    let s = 1.0 / (var + eps).sqrt();
    x.iter()
        .zip(w.iter().zip(b))
        .map(|(v, (w, b))| (v - mean) * s * w + b)
        .collect()
}

fn rms_norm(x: &[f64], w: &[f64], eps: f64) -> Vec<f64> {
    let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let s = 1.0 / (ms + eps).sqrt();
    x.iter().zip(w).map(|(v, w)| v * s * w).collect()
}

/// A tensor's values, or `n` zeros where the file has none.
fn values_or_zeros(f: &GgufFile, name: &str, n: usize) -> Vec<f64> {
    match f.tensor(name) {
        Some(_) => values(f, name),
        None => vec![0.0; n],
    }
}

/// x rotated in place by NeoX halves of each head with the patch's (cos, sin) pairs.
fn rotate(x: &mut [f64], table: &[[f32; 2]], hd: usize) {
    let half = hd / 2;
    for head in x.chunks_exact_mut(hd) {
        for (k, [c, s]) in table.iter().enumerate().take(half) {
            let (c, s) = (*c as f64, *s as f64);
            let (a, b) = (head[k], head[k + half]);
            head[k] = a * c - b * s;
            head[k + half] = a * s + b * c;
        }
    }
}

/// The embeddings of `input` (the encoder's planar input, as prepared for the GPU):
/// [n_out, n_tokens] as f32, like the graph's.
pub fn encode_reference(
    f: &GgufFile,
    hp: &ClipHparams,
    input: &EncoderInput,
    gelu_kind: Gelu,
) -> Vec<f32> {
    let (e, p) = (hp.n_embd as usize, hp.patch_size as usize);
    let (width, height) = (input.width as usize, input.height as usize);
    let (pw, ph) = (width / p, height / p);
    let pixels = &input.pixels;
    let eps = hp.eps as f64;
    let qwen = hp.projector == Projector::Qwen25vl;
    // The patch kernel (Qwen2.5-VL: the sum of its two) in f16, as llama.cpp's
    // convolution multiplies it (the pixels are rounded already).
    let half_kernel =
        |v: Vec<f64>| -> Vec<f64> { v.into_iter().map(|v| f16::from_f64(v).to_f64()).collect() };
    let mut kernel = half_kernel(values(f, "v.patch_embd.weight"));
    if qwen {
        let second = half_kernel(values(f, "v.patch_embd.weight.1"));
        kernel.iter_mut().zip(second).for_each(|(a, b)| *a += b);
    }
    let bias = values_or_zeros(f, "v.patch_embd.bias", e);
    let pos = (!qwen).then(|| values(f, "v.position_embd.weight"));
    let row = 3 * p * p;
    let mut x: Vec<Vec<f64>> = (0..pw * ph)
        .map(|t| {
            let (py, px) = (t / pw, t % pw);
            let mut patch = Vec::with_capacity(row);
            for c in 0..3 {
                for ky in 0..p {
                    for kx in 0..p {
                        patch.push(pixels[(c * height + py * p + ky) * width + px * p + kx] as f64);
                    }
                }
            }
            let mut v = affine(&kernel, Some(&bias), &patch);
            if let Some(pos) = &pos {
                v.iter_mut()
                    .zip(&pos[t * e..(t + 1) * e])
                    .for_each(|(a, b)| *a += b);
            }
            v
        })
        .collect();
    let (nh, hd) = (hp.n_head as usize, hp.head_dim as usize);
    let scale = 1.0 / (hd as f64).sqrt();
    let n = pw * ph;
    let rope = qwen.then(|| super::encoder::rotary_table(hp.head_dim, pw as u32, ph as u32));
    let window = hp
        .dynamic
        .map(|d| super::encoder::window_mask(pw as u32, ph as u32, d.window_cells));
    let norm = |v: &[f64], w: &[f64], b: &[f64]| match qwen {
        true => rms_norm(v, w, eps),
        false => layer_norm(v, w, b, eps),
    };
    for il in 0..hp.n_layer {
        let t = |s: &str| values_or_zeros(f, &format!("v.blk.{il}.{s}"), e);
        let full = hp
            .dynamic
            .is_none_or(|d| d.n_wa_pattern == 0 || (il + 1).is_multiple_of(d.n_wa_pattern));
        let sees = |q: usize, k: usize| match (&window, full) {
            (Some(m), false) => m[q * n + k] == 0.0,
            _ => true,
        };
        let (ln1w, ln1b, ln2w, ln2b) = (
            t("ln1.weight"),
            t("ln1.bias"),
            t("ln2.weight"),
            t("ln2.bias"),
        );
        let (wq, wk, wv, wo) = (
            t("attn_q.weight"),
            t("attn_k.weight"),
            t("attn_v.weight"),
            t("attn_out.weight"),
        );
        let (bq, bk, bv, bo) = (
            t("attn_q.bias"),
            t("attn_k.bias"),
            t("attn_v.bias"),
            t("attn_out.bias"),
        );
        let (wu, bu, wd, bd) = (
            t("ffn_up.weight"),
            t("ffn_up.bias"),
            t("ffn_down.weight"),
            t("ffn_down.bias"),
        );
        let h: Vec<Vec<f64>> = x.iter().map(|v| norm(v, &ln1w, &ln1b)).collect();
        let mut q: Vec<Vec<f64>> = h.iter().map(|v| affine(&wq, Some(&bq), v)).collect();
        let mut k: Vec<Vec<f64>> = h.iter().map(|v| affine(&wk, Some(&bk), v)).collect();
        let vv: Vec<Vec<f64>> = h.iter().map(|v| affine(&wv, Some(&bv), v)).collect();
        if let Some(table) = &rope {
            for (j, (qj, kj)) in q.iter_mut().zip(k.iter_mut()).enumerate() {
                let pairs = &table[j * hd / 2..(j + 1) * hd / 2];
                rotate(qj, pairs, hd);
                rotate(kj, pairs, hd);
            }
        }
        for (i, xi) in x.iter_mut().enumerate() {
            let mut o = vec![0f64; e];
            for head in 0..nh {
                let r = head * hd..(head + 1) * hd;
                let s: Vec<f64> = k
                    .iter()
                    .enumerate()
                    .map(|(j, kj)| match sees(i, j) {
                        true => {
                            q[i][r.clone()]
                                .iter()
                                .zip(&kj[r.clone()])
                                .map(|(a, b)| a * b)
                                .sum::<f64>()
                                * scale
                        }
                        false => f64::NEG_INFINITY,
                    })
                    .collect();
                let m = s.iter().cloned().fold(f64::MIN, f64::max);
                let ex: Vec<f64> = s.iter().map(|v| (v - m).exp()).collect();
                let sum: f64 = ex.iter().sum();
                for (j, w) in ex.iter().enumerate() {
                    for d in r.clone() {
                        o[d] += w / sum * vv[j][d];
                    }
                }
            }
            let a = affine(&wo, Some(&bo), &o);
            xi.iter_mut().zip(a).for_each(|(x, a)| *x += a);
        }
        let gate = qwen.then(|| (t("ffn_gate.weight"), t("ffn_gate.bias")));
        for xi in x.iter_mut() {
            let h = norm(xi, &ln2w, &ln2b);
            let u: Vec<f64> = match &gate {
                Some((wg, bg)) => affine(wg, Some(bg), &h)
                    .into_iter()
                    .zip(affine(&wu, Some(&bu), &h))
                    .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
                    .collect(),
                None => affine(&wu, Some(&bu), &h)
                    .into_iter()
                    .map(|v| gelu(v, gelu_kind))
                    .collect(),
            };
            let d = affine(&wd, Some(&bd), &u);
            xi.iter_mut().zip(d).for_each(|(x, d)| *x += d);
        }
    }
    if f.tensor("v.post_ln.weight").is_some() {
        let w = values(f, "v.post_ln.weight");
        let b = values_or_zeros(f, "v.post_ln.bias", e);
        x = x.iter().map(|v| norm(v, &w, &b)).collect();
    }
    let per = pw;
    match hp.projector {
        Projector::Gemma3 => {
            let (k, q) = (hp.merge as usize, per / hp.merge as usize);
            let norm = values(f, "mm.soft_emb_norm.weight");
            let proj = values(f, "mm.input_projection.weight");
            let n_out = proj.len() / e;
            let mut out = Vec::with_capacity(n_out * q * q);
            for cell in 0..q * q {
                let (cy, cx) = (cell / q, cell % q);
                let mut m = vec![0f64; e];
                for ky in 0..k {
                    for kx in 0..k {
                        let src = &x[(cy * k + ky) * per + cx * k + kx];
                        m.iter_mut()
                            .zip(src)
                            .for_each(|(a, b)| *a += b / (k * k) as f64);
                    }
                }
                let rms = (m.iter().map(|v| v * v).sum::<f64>() / e as f64 + eps).sqrt();
                let y: Vec<f64> = m.iter().zip(&norm).map(|(v, w)| v / rms * w).collect();
                for o in 0..n_out {
                    let v: f64 = (0..e).map(|i| proj[i * n_out + o] * y[i]).sum();
                    out.push(v as f32);
                }
            }
            out
        }
        Projector::Idefics3 => {
            // Cells of s x s patches side by side in one row (dy, then dx), zeros past
            // the grid's edge, then the projection.
            let s = hp.merge as usize;
            let q = per.div_ceil(s);
            let fc = values(f, "mm.model.fc.weight");
            let mut out = Vec::new();
            for cell in 0..q * q {
                let (cy, cx) = (cell / q, cell % q);
                let mut row = Vec::with_capacity(e * s * s);
                for dy in 0..s {
                    for dx in 0..s {
                        let (py, px) = (cy * s + dy, cx * s + dx);
                        match py < per && px < per {
                            true => row.extend_from_slice(&x[py * per + px]),
                            false => row.extend(std::iter::repeat_n(0.0, e)),
                        }
                    }
                }
                out.extend(affine(&fc, None, &row).into_iter().map(|v| v as f32));
            }
            out
        }
        Projector::Qwen25vl => {
            // Each cell's 2 x 2 patches side by side, cells in raster order; the merger.
            let (w0, b0) = (values(f, "mm.0.weight"), values(f, "mm.0.bias"));
            let (w2, b2) = (values(f, "mm.2.weight"), values(f, "mm.2.bias"));
            let mut out = Vec::new();
            for cy in 0..ph / 2 {
                for cx in 0..pw / 2 {
                    let mut row = Vec::with_capacity(4 * e);
                    for dy in 0..2 {
                        for dx in 0..2 {
                            row.extend_from_slice(&x[(cy * 2 + dy) * pw + cx * 2 + dx]);
                        }
                    }
                    let m: Vec<f64> = affine(&w0, Some(&b0), &row)
                        .into_iter()
                        .map(|v| gelu(v, gelu_kind))
                        .collect();
                    out.extend(affine(&w2, Some(&b2), &m).into_iter().map(|v| v as f32));
                }
            }
            out
        }
    }
}
