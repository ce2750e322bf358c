//! LoRA adapters: GGUF files of low-rank pairs (A, B) beside a base model's weights, as
//! llama.cpp's `convert_lora_to_gguf.py` writes them, applied at run time as
//! `W x + scale · B (A x)` next to each adapted matmul — the base weights are never merged
//! or copied. An adapter is checked against the model it is loaded for (architecture,
//! every pair's shapes) and uploaded once; which adapters apply, at what scale, is a
//! setting of the context ([`LoraScales`]), so a server can change it per request.

use super::{GateUp, Model, ModelError};
use crate::gguf::{GgmlType, GgufFile, TensorInfo};
use crate::graph::{LoraTerm, LoraTerms};
use crate::ops::{Ffn, Weight};
use crate::quant;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// One adapter file, uploaded for one model.
pub struct LoraAdapter {
    /// The file it was read from (llama-server's `/lora-adapters` shows it).
    pub path: String,
    /// `adapter.lora.alpha`; 0 applies the user's scale unchanged.
    pub alpha: f32,
    /// `adapter.lora.task_name` and `adapter.lora.prompt_prefix`, where the file has them.
    pub task_name: String,
    pub prompt_prefix: String,
    pairs: Vec<LoraPair>,
    /// Bytes of GPU memory its pairs take.
    pub gpu_bytes: u64,
    /// [`GgufFile::fingerprint`] of its file: what a slot file records of the adapters
    /// its cells were computed with.
    pub fingerprint: u64,
}

/// One adapted base tensor's pair, and where that tensor's output lives (resolved once,
/// when the adapter is loaded for its model).
struct LoraPair {
    target: Target,
    a: Arc<Weight>,
    b: Arc<Weight>,
    rank: u32,
}

/// The user's scale of each loaded adapter, in load order (llama.cpp's
/// `common_adapter_lora_info::scale`); an adapter at 0 is left out of the graph.
pub type LoraScales = Vec<f32>;

/// Where a base tensor's output lives among the uploaded weights: the weight that
/// computes it, and the rows of that weight's output it occupies.
#[derive(Clone)]
struct Target {
    weight: Arc<Weight>,
    /// Output row j of the tensor is row `offset + j * step` of the weight's output.
    offset: u32,
    step: u32,
    /// The tensor's input length and output rows ([n_in, n_out] as GGUF writes it).
    n_in: u32,
    n_out: u32,
    /// The token embedding: its correction is `B` times the rows of `A` at the tokens.
    embedding: bool,
}

/// The error for an adapter file that cannot be applied to this model.
fn bad(path: &str, msg: impl Into<String>) -> ModelError {
    ModelError::BadHparams {
        path: path.to_string(),
        msg: msg.into(),
    }
}

/// Every base tensor an adapter may correct, by name: the dense projections of the
/// attention and feed-forward blocks, the output head and the token embedding.
fn targets(m: &Model) -> HashMap<String, Target> {
    let (hp, w) = (&m.hp, &m.weights);
    let mut t = HashMap::new();
    let whole = |t: &mut HashMap<String, Target>, weight: &Arc<Weight>| {
        if !weight.name.contains('+') {
            let target = Target {
                weight: weight.clone(),
                offset: 0,
                step: 1,
                n_in: weight.n_cols,
                n_out: weight.n_rows,
                embedding: false,
            };
            t.insert(weight.name.clone(), target);
        }
    };
    for (il, lw) in w.layers.iter().enumerate() {
        // Q, K and V stacked in runs of same-typed weights (see `LayerWeights::qkv`).
        for part in &lw.qkv {
            let mut offset = 0;
            for name in part.name.split('+') {
                let rows = match name.strip_prefix(&format!("blk.{il}.")) {
                    Some("attn_q.weight") => hp.n_embd_q(),
                    Some("attn_k.weight") | Some("attn_v.weight") => hp.n_embd_kv(),
                    _ => part.n_rows,
                };
                let target = Target {
                    weight: part.clone(),
                    offset,
                    step: 1,
                    n_in: part.n_cols,
                    n_out: rows,
                    embedding: false,
                };
                t.insert(name.to_string(), target);
                offset += rows;
            }
        }
        whole(&mut t, &lw.wo);
        if let Ffn::Dense { gate_up, down } = &lw.ffn {
            match gate_up {
                // Gate and up rows alternate: gate j is row 2j, up j row 2j + 1. Phi-3's
                // one fused tensor (gate rows, then up rows) is left out: its correction
                // would need splitting across the two.
                GateUp::Interleaved(gu) => {
                    let names: Vec<&str> = gu.name.split('+').collect();
                    if names.len() == 2 {
                        for (k, name) in names.iter().enumerate() {
                            let target = Target {
                                weight: gu.clone(),
                                offset: k as u32,
                                step: 2,
                                n_in: gu.n_cols,
                                n_out: gu.n_rows / 2,
                                embedding: false,
                            };
                            t.insert(name.to_string(), target);
                        }
                    }
                }
                GateUp::Split { gate, up } => {
                    whole(&mut t, gate);
                    whole(&mut t, up);
                }
            }
            whole(&mut t, down);
        }
    }
    if !Arc::ptr_eq(&w.output, &w.tok_embd) {
        whole(&mut t, &w.output);
    }
    let e = &w.tok_embd;
    let target = Target {
        weight: e.clone(),
        offset: 0,
        step: 1,
        n_in: e.n_cols,
        n_out: e.n_rows,
        embedding: true,
    };
    t.insert(e.name.clone(), target);
    t
}

/// A tensor's values as f32 rows of `n_cols`, each padded with zeros to `pad_cols` (the
/// kernels read whole blocks of 32), with `pad_rows - n_rows` zero rows after them.
fn padded_rows(f: &GgufFile, t: &TensorInfo, pad_cols: usize, pad_rows: usize) -> Vec<f32> {
    let (n_cols, n_rows) = (t.dims[0] as usize, t.dims[1] as usize);
    let data = f.tensor_data(t);
    let row_bytes = data.len() / n_rows.max(1);
    let mut out = vec![0f32; pad_cols * pad_rows];
    for r in 0..n_rows {
        let src = &data[r * row_bytes..(r + 1) * row_bytes];
        quant::dequantize_row(t.ty, src, &mut out[r * pad_cols..r * pad_cols + n_cols]);
    }
    out
}

/// The rank padded to whole GPU blocks: A gains zero rows and B zero columns, which add
/// exact zeros to every product.
fn padded(n: usize) -> usize {
    n.next_multiple_of(quant::GPU_BLOCK)
}

impl LoraAdapter {
    /// Reads an adapter file and uploads its pairs for `model`, checking what llama.cpp
    /// checks: `general.type` adapter, `adapter.type` lora, the model's architecture, both
    /// halves of every pair, shapes that fit the base tensor.
    pub fn load(model: &Model, f: &GgufFile) -> Result<LoraAdapter, ModelError> {
        let path = f.path.clone();
        let text = |k: &str| f.get(k).and_then(|v| v.as_str()).unwrap_or("").to_string();
        let general_type = text("general.type");
        if general_type != "adapter" {
            return Err(bad(
                &path,
                format!("not a LoRA adapter: general.type is `{general_type}`, an adapter's is `adapter` (was a model given as --lora?)"),
            ));
        }
        let arch = text("general.architecture");
        if arch != model.arch_name {
            return Err(bad(
                &path,
                format!("the adapter is for architecture `{arch}` and the model is `{}`: give the adapter of this base model", model.arch_name),
            ));
        }
        let adapter_type = text("adapter.type");
        if adapter_type != "lora" {
            return Err(bad(
                &path,
                format!(
                    "adapter.type is `{adapter_type}`: only LoRA adapters (`lora`) are supported"
                ),
            ));
        }
        if f.get("adapter.alora.invocation_tokens").is_some() {
            return Err(bad(
                &path,
                "activated LoRA (aLoRA, `adapter.alora.invocation_tokens`) is not supported: its adapter applies only after an invocation sequence, which wgllm does not track",
            ));
        }
        let alpha = match f.get("adapter.lora.alpha") {
            None => 0.0,
            Some(v) => v
                .as_f64()
                .filter(|a| a.is_finite())
                .ok_or_else(|| bad(&path, "adapter.lora.alpha should be a finite number"))?
                as f32,
        };
        // The halves of each pair, by base tensor name (sorted, so uploads keep one order).
        let mut halves: BTreeMap<String, [Option<&TensorInfo>; 2]> = BTreeMap::new();
        for t in &f.tensors {
            if let Some(base) = t.name.strip_suffix(".lora_a") {
                halves.entry(base.to_string()).or_default()[0] = Some(t);
            } else if let Some(base) = t.name.strip_suffix(".lora_b") {
                halves.entry(base.to_string()).or_default()[1] = Some(t);
            } else if t.name.ends_with("_norm.weight") {
                // llama.cpp skips an adapter's norm vectors too.
                log::info!(
                    "{path}: adapter tensor `{}` (a norm) is not applied, as in llama.cpp",
                    t.name
                );
            } else {
                return Err(bad(
                    &path,
                    format!(
                        "tensor `{}` is neither a `.lora_a` nor a `.lora_b` half",
                        t.name
                    ),
                ));
            }
        }
        if halves.is_empty() {
            return Err(bad(&path, "the adapter has no LoRA tensors"));
        }
        let targets = targets(model);
        let mut pairs = Vec::new();
        let mut gpu_bytes = 0;
        for (base, [a, b]) in halves {
            let (Some(a), Some(b)) = (a, b) else {
                return Err(bad(
                    &path,
                    format!("the pair for `{base}` lacks one of its halves (.lora_a, .lora_b)"),
                ));
            };
            let target = targets.get(&base).ok_or_else(|| {
                let why = match model.hp.arch {
                    super::Arch::Phi3 if base.ends_with(".ffn_up.weight") => {
                        "Phi-3's one gate/up tensor, which wgllm splits at load, is not adapted".to_string()
                    }
                    _ if model.weights.layers.is_empty() => format!(
                        "wgllm adapts the layers of llama-family and Gemma models only, not {}'s",
                        model.arch_name
                    ),
                    _ => "this model does not have it, or wgllm does not adapt it (it adapts the attention and dense feed-forward projections, the output head and the token embedding; not experts): maybe the wrong base model?".to_string(),
                };
                bad(&path, format!("the adapter corrects `{base}`: {why}"))
            })?;
            // A tied head shares the embedding's weight: a correction in the embedding's
            // flipped layout cannot apply to its matmul (llama.cpp aborts on it there).
            if target.embedding && Arc::ptr_eq(&model.weights.output, &model.weights.tok_embd) {
                return Err(bad(
                    &path,
                    format!("the adapter corrects `{base}`, which this model also uses as its output head (tied embeddings): an embedding pair cannot apply to the head, and llama.cpp cannot run it either"),
                ));
            }
            for t in [a, b] {
                if t.dims.len() != 2 || quant::format(t.ty).is_none() || t.dims.contains(&0) {
                    return Err(bad(
                        &path,
                        format!(
                            "`{}` should be a matrix of a weight type wgllm reads, found {:?} {}",
                            t.name, t.dims, t.ty
                        ),
                    ));
                }
            }
            let rank = b.dims[0];
            // An embedding's halves are flipped (llama.cpp's `llm_build_inp_embd`): A is
            // [r, n_vocab] (read by rows), B [r, n_embd].
            let (want_a, want_b) = match target.embedding {
                true => (
                    [a.dims[0], target.n_out as u64],
                    [a.dims[0], target.n_in as u64],
                ),
                false => ([target.n_in as u64, rank], [rank, target.n_out as u64]),
            };
            if a.dims != want_a || b.dims != want_b {
                return Err(bad(
                    &path,
                    format!("the pair for `{base}` has shapes {:?} and {:?}, and that tensor needs {want_a:?} and {want_b:?}: maybe the wrong base model?", a.dims, b.dims),
                ));
            }
            let r = rank as usize;
            let rp = padded(r);
            let (aw, bw) = if target.embedding {
                let (na, nb) = (a.dims[1] as usize, b.dims[1] as usize);
                (
                    upload(model, a, padded_rows(f, a, rp, na), rp, na)?,
                    upload(model, b, padded_rows(f, b, rp, nb), rp, nb)?,
                )
            } else {
                let (n_in, n_out) = (a.dims[0] as usize, b.dims[1] as usize);
                (
                    upload(model, a, padded_rows(f, a, n_in, rp), n_in, rp)?,
                    upload(model, b, padded_rows(f, b, rp, n_out), rp, n_out)?,
                )
            };
            gpu_bytes += aw.gpu_bytes() + bw.gpu_bytes();
            pairs.push(LoraPair {
                target: target.clone(),
                a: Arc::new(aw),
                b: Arc::new(bw),
                rank: rank as u32,
            });
        }
        Ok(LoraAdapter {
            path,
            alpha,
            task_name: text("adapter.lora.task_name"),
            prompt_prefix: text("adapter.lora.prompt_prefix"),
            pairs,
            gpu_bytes,
            fingerprint: f.fingerprint(),
        })
    }

    /// Base tensors this adapter corrects.
    pub fn n_pairs(&self) -> usize {
        self.pairs.len()
    }

    /// The scale a pair of rank r is applied at for the user's `scale`: scale · alpha / r,
    /// or the user's scale where alpha is 0 (llama.cpp's `get_scale`).
    pub fn pair_scale(&self, rank: u32, scale: f32) -> f32 {
        match self.alpha {
            0.0 => scale,
            alpha => scale * alpha / rank as f32,
        }
    }
}

/// Uploads a half as an f16 weight where the file's type is f16 (the same values), else
/// f32 (dequantized: a q8_0 or bf16 half is read as the values llama.cpp multiplies with).
fn upload(
    model: &Model,
    t: &TensorInfo,
    values: Vec<f32>,
    n_cols: usize,
    n_rows: usize,
) -> Result<Weight, ModelError> {
    let (ty, bytes) = match t.ty {
        GgmlType::F16 => (GgmlType::F16, quant::quantize_row(GgmlType::F16, &values)),
        _ => (GgmlType::F32, bytemuck::cast_slice(&values).to_vec()),
    };
    let name = t.name.as_str();
    Ok(Weight::upload(
        &model.gpu, name, ty, n_cols, n_rows, &bytes,
    )?)
}

/// The corrections for `adapters` at `scales` (one per adapter; a missing or zero scale
/// leaves that adapter out), for a graph of `model`.
pub fn terms(adapters: &[Arc<LoraAdapter>], scales: &[f32]) -> LoraTerms {
    let mut terms = LoraTerms::default();
    for (ad, &scale) in adapters.iter().zip(scales) {
        if scale == 0.0 {
            continue;
        }
        for p in &ad.pairs {
            let t = &p.target;
            let term = LoraTerm {
                a: p.a.clone(),
                b: p.b.clone(),
                scale: ad.pair_scale(p.rank, scale),
                offset: t.offset,
                step: t.step,
            };
            terms.add(&t.weight, term);
        }
    }
    terms
}
