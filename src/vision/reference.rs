//! The encoder on the CPU, in f64, straight from the file's tensors: the reference the
//! GPU graph is tested against on every device, and the tool that tells where a
//! difference from llama.cpp comes from (its CPU backend computes GELU through a table
//! of f16 values, [`Gelu::GgmlTable`]).

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

/// The embeddings of `pixels` (the encoder's planar input, as prepared for the GPU):
/// [n_out, n_tokens] as f32, like the graph's.
pub fn encode_reference(
    f: &GgufFile,
    hp: &ClipHparams,
    pixels: &[f32],
    gelu_kind: Gelu,
) -> Vec<f32> {
    let (e, p, side) = (
        hp.n_embd as usize,
        hp.patch_size as usize,
        hp.image_size as usize,
    );
    let per = side / p;
    let eps = hp.eps as f64;
    // The patch kernel in f16 (llama.cpp's convolution; the pixels are rounded already).
    let kernel: Vec<f64> = values(f, "v.patch_embd.weight")
        .into_iter()
        .map(|v| f16::from_f64(v).to_f64())
        .collect();
    let bias = values(f, "v.patch_embd.bias");
    let pos = values(f, "v.position_embd.weight");
    let row = 3 * p * p;
    let mut x: Vec<Vec<f64>> = (0..per * per)
        .map(|t| {
            let (py, px) = (t / per, t % per);
            let mut patch = Vec::with_capacity(row);
            for c in 0..3 {
                for ky in 0..p {
                    for kx in 0..p {
                        patch.push(pixels[(c * side + py * p + ky) * side + px * p + kx] as f64);
                    }
                }
            }
            let mut v = affine(&kernel, Some(&bias), &patch);
            v.iter_mut()
                .zip(&pos[t * e..(t + 1) * e])
                .for_each(|(a, b)| *a += b);
            v
        })
        .collect();
    let (nh, hd) = (hp.n_head as usize, hp.head_dim as usize);
    let scale = 1.0 / (hd as f64).sqrt();
    for il in 0..hp.n_layer {
        let t = |s: &str| values(f, &format!("v.blk.{il}.{s}"));
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
        let h: Vec<Vec<f64>> = x.iter().map(|v| layer_norm(v, &ln1w, &ln1b, eps)).collect();
        let q: Vec<Vec<f64>> = h.iter().map(|v| affine(&wq, Some(&bq), v)).collect();
        let k: Vec<Vec<f64>> = h.iter().map(|v| affine(&wk, Some(&bk), v)).collect();
        let vv: Vec<Vec<f64>> = h.iter().map(|v| affine(&wv, Some(&bv), v)).collect();
        for (i, xi) in x.iter_mut().enumerate() {
            let mut o = vec![0f64; e];
            for head in 0..nh {
                let r = head * hd..(head + 1) * hd;
                let s: Vec<f64> = k
                    .iter()
                    .map(|kj| {
                        q[i][r.clone()]
                            .iter()
                            .zip(&kj[r.clone()])
                            .map(|(a, b)| a * b)
                            .sum::<f64>()
                            * scale
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
        for xi in x.iter_mut() {
            let h = layer_norm(xi, &ln2w, &ln2b, eps);
            let u: Vec<f64> = affine(&wu, Some(&bu), &h)
                .into_iter()
                .map(|v| gelu(v, gelu_kind))
                .collect();
            let d = affine(&wd, Some(&bd), &u);
            xi.iter_mut().zip(d).for_each(|(x, d)| *x += d);
        }
    }
    if f.tensor("v.post_ln.weight").is_some() {
        let (w, b) = (values(f, "v.post_ln.weight"), values(f, "v.post_ln.bias"));
        x = x.iter().map(|v| layer_norm(v, &w, &b, eps)).collect();
    }
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
    }
}
