//! Embeddings, as llama.cpp computes them: each token's hidden state after the final
//! norm of a decoder, or the last block of an encoder (an embeddings context outputs
//! those instead of logits), pooled over a sequence's tokens and normalised as
//! llama-server and llama-embedding do; and a reranker's scores, its classifier head
//! over the first token's state (computed on the GPU: a reranking context outputs them).

#[cfg(not(target_arch = "wasm32"))]
use super::{Engine, EngineError};
#[cfg(not(target_arch = "wasm32"))]
use crate::batch::Batch;

/// How a sequence's token states become its embedding (llama.cpp's `--pooling`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pooling {
    /// Every token's state.
    None,
    /// Their mean.
    Mean,
    /// The first token's.
    Cls,
    /// The last token's.
    Last,
    /// A reranker's classifier head over the first token's state (the last's, for a
    /// causal model): its scores, of which the first is the relevance.
    Rank,
}

impl Pooling {
    /// The pooling a GGUF declares (`{arch}.pooling_type`, llama.cpp's numbering:
    /// 0 none, 1 mean, 2 cls, 3 last, 4 rank); none where it declares nothing, as
    /// llama.cpp defaults.
    pub fn from_code(code: Option<u32>) -> Result<Pooling, String> {
        match code {
            None | Some(0) => Ok(Pooling::None),
            Some(1) => Ok(Pooling::Mean),
            Some(2) => Ok(Pooling::Cls),
            Some(3) => Ok(Pooling::Last),
            Some(4) => Ok(Pooling::Rank),
            Some(n) => Err(format!(
                "unknown pooling type {n} in the model file (llama.cpp knows 0-4)"
            )),
        }
    }

    /// The pooling the model file `f` declares (see [`Pooling::from_code`]).
    pub fn declared(f: &crate::gguf::GgufFile) -> Result<Pooling, String> {
        let arch = f.get_str("general.architecture").unwrap_or_default();
        let code = f.get_u64(&format!("{arch}.pooling_type")).ok();
        Pooling::from_code(code.map(|c| c.min(u32::MAX as u64) as u32))
    }
}

impl std::str::FromStr for Pooling {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "none" => Pooling::None,
            "mean" => Pooling::Mean,
            "cls" => Pooling::Cls,
            "last" => Pooling::Last,
            "rank" => Pooling::Rank,
            other => {
                return Err(format!(
                    "unknown pooling `{other}` (choose none, mean, cls, last or rank)"
                ))
            }
        })
    }
}

/// `v` scaled as llama.cpp's `common_embd_normalize` does for `norm`: -1 none, 0 the
/// largest magnitude to 32760 (int16's range), 2 Euclidean, any other p the p-norm
/// (1: taxicab). A zero vector stays zero.
pub fn normalize(v: &[f32], norm: i32) -> Vec<f32> {
    let sum: f64 = match norm {
        -1 => 1.0,
        0 => v.iter().fold(0f64, |m, &x| m.max(x.abs() as f64)) / 32760.0,
        2 => v.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt(),
        p => {
            let p = p as f64;
            v.iter()
                .map(|&x| (x.abs() as f64).powf(p))
                .sum::<f64>()
                .powf(1.0 / p)
        }
    };
    let scale = if sum > 0.0 { 1.0 / sum } else { 0.0 };
    v.iter().map(|&x| (x as f64 * scale) as f32).collect()
}

/// Pools `rows` (each token's state, n_embd floats, in order) as `pooling` says: one
/// vector, or every row for [`Pooling::None`].
pub fn pool(rows: &[f32], n_embd: usize, pooling: Pooling) -> Vec<Vec<f32>> {
    let mut it = rows.chunks(n_embd);
    match pooling {
        Pooling::None => it.map(<[f32]>::to_vec).collect(),
        // Rank: the one row the context output, its scores.
        Pooling::Cls | Pooling::Rank => it.next().map(<[f32]>::to_vec).into_iter().collect(),
        Pooling::Last => it.next_back().map(<[f32]>::to_vec).into_iter().collect(),
        Pooling::Mean => {
            let n = (rows.len() / n_embd.max(1)).max(1) as f64;
            let mut sum = vec![0f64; n_embd];
            for r in it {
                for (s, &x) in sum.iter_mut().zip(r) {
                    *s += x as f64;
                }
            }
            vec![sum.into_iter().map(|s| (s / n) as f32).collect()]
        }
    }
}

#[cfg(not(target_arch = "wasm32"))]
impl Engine {
    /// The embedding of `tokens` in an embeddings engine (`EngineOptions::embeddings`):
    /// see [`Engine::embed_many`].
    pub fn embed(
        &mut self,
        tokens: &[u32],
        pooling: Pooling,
    ) -> Result<Vec<Vec<f32>>, EngineError> {
        let mut out = self.embed_many(&[tokens.to_vec()], pooling)?;
        Ok(out.pop().unwrap_or_default())
    }

    /// The embeddings of `inputs` in an embeddings engine (`EngineOptions::embeddings`):
    /// decoded side by side, each on a sequence no session holds (as many at once as
    /// there are free sequences and fit a batch; an input longer than a batch alone, in
    /// pieces), each input's token states pooled, the sequences cleared again. Per input
    /// one vector, or one per token for [`Pooling::None`]; not normalised.
    pub fn embed_many(
        &mut self,
        inputs: &[Vec<u32>],
        pooling: Pooling,
    ) -> Result<Vec<Vec<Vec<f32>>>, EngineError> {
        if !self.ctx.params.embeddings {
            return Err(EngineError::Options(
                "this engine computes logits; embeddings need an engine made with embeddings on (--embeddings)".into(),
            ));
        }
        // Embeddings take the engine's LoRA setting (a server's `POST /lora-adapters`).
        let lora = self.lora_default.clone();
        self.ctx.set_lora(&lora);
        match (pooling == Pooling::Rank, self.ctx.params.rank) {
            (true, false) => {
                return Err(EngineError::Options(
                    "rank pooling (reranking) needs an engine made for it (--reranking, with a reranker model)".into(),
                ))
            }
            (false, true) => {
                return Err(EngineError::Options(
                    "this engine reranks: its outputs are a classifier's scores (rank pooling), not embeddings".into(),
                ))
            }
            _ => {}
        }
        let n_ctx_seq = self.n_ctx_seq() as usize;
        // An encoder's tokens see each other both ways, so each input is decoded whole in
        // one ubatch (as llama.cpp, which refuses longer ones).
        let n_ubatch = self.ctx.params.n_ubatch.min(self.ctx.params.n_batch) as usize;
        let causal = self.model.hp.causal;
        for t in inputs {
            if !causal && t.len() > n_ubatch {
                return Err(EngineError::Options(format!(
                    "input ({} tokens) is too large to process: this model attends both ways, so an input must fit one ubatch; increase the physical batch size (-ub, now {n_ubatch})",
                    t.len()
                )));
            }
            if t.is_empty() {
                return Err(EngineError::EmptyPrompt);
            }
            if t.len() > n_ctx_seq {
                return Err(EngineError::PromptTooLong {
                    n: t.len(),
                    max: n_ctx_seq,
                });
            }
        }
        let free: Vec<u32> = (self.sessions.iter().enumerate())
            .filter(|(_, s)| s.is_none())
            .map(|(i, _)| i as u32)
            .collect();
        if free.is_empty() {
            return Err(EngineError::Options(
                "every sequence is held by a session: an embedding needs a free one (raise -np)"
                    .into(),
            ));
        }
        // The tokens of one decode: a batch, or for an encoder one ubatch.
        let n_batch = match causal {
            true => self.ctx.params.n_batch as usize,
            false => n_ubatch,
        };
        let mut out = Vec::with_capacity(inputs.len());
        let mut next = 0;
        while next < inputs.len() {
            // A group: one input, then more while a sequence is free and the batch holds them.
            let mut group = vec![&inputs[next]];
            let mut n_tok = inputs[next].len();
            next += 1;
            while next < inputs.len()
                && group.len() < free.len()
                && n_tok + inputs[next].len() <= n_batch
            {
                n_tok += inputs[next].len();
                group.push(&inputs[next]);
                next += 1;
            }
            out.extend(self.embed_group(&group, &free, pooling, n_batch)?);
        }
        self.n_steps += 1;
        Ok(out)
    }

    /// One group of [`Engine::embed_many`]: input i on sequence `seqs[i]`, in batches
    /// of at most `n_batch` tokens.
    fn embed_group(
        &mut self,
        group: &[&Vec<u32>],
        seqs: &[u32],
        pooling: Pooling,
        n_batch: usize,
    ) -> Result<Vec<Vec<Vec<f32>>>, EngineError> {
        let width = self.ctx.out_width() as usize;
        let causal = self.model.hp.causal;
        // Only the rows the pooling reads come back.
        let wanted = |i: usize, n: usize| match pooling {
            Pooling::None | Pooling::Mean => true,
            Pooling::Cls => i == 0,
            Pooling::Last => i + 1 == n,
            Pooling::Rank if causal => i + 1 == n,
            Pooling::Rank => i == 0,
        };
        // (input, position) of every token, inputs one after another.
        let all: Vec<(usize, usize)> = (group.iter().enumerate())
            .flat_map(|(g, t)| (0..t.len()).map(move |i| (g, i)))
            .collect();
        for &s in &seqs[..group.len()] {
            // Whatever an earlier caller left there (nobody holds it).
            self.ctx.seq_rm(Some(s), -1, -1)?;
        }
        let mut rows: Vec<Vec<f32>> = vec![Vec::new(); group.len()];
        // Mean pooling's sums and counts per input, from the GPU's runs.
        let mut sums: Option<(Vec<Vec<f64>>, Vec<usize>)> = None;
        let mut result = Ok(());
        for chunk in all.chunks(n_batch) {
            let batch = Batch {
                tokens: chunk.iter().map(|&(g, i)| group[g][i]).collect(),
                pos: chunk.iter().map(|&(_, i)| i as i32).collect(),
                seq: chunk.iter().map(|&(g, _)| 1u64 << seqs[g]).collect(),
                logits: (chunk.iter())
                    .map(|&(g, i)| wanted(i, group[g].len()))
                    .collect(),
                ..Default::default()
            };
            // Mean pooling sums each sequence's rows on the GPU: a row per run comes back.
            if pooling == Pooling::Mean {
                match self.ctx.decode_pooled(&batch) {
                    Ok(runs) => {
                        for run in runs {
                            // Every run is of one of the group's sequences.
                            let Some(g) =
                                (seqs[..group.len()].iter()).position(|&s| run.seq == 1u64 << s)
                            else {
                                continue;
                            };
                            let (sum, n) = sums.get_or_insert_with(|| {
                                (vec![vec![0f64; width]; group.len()], vec![0; group.len()])
                            });
                            for (a, &x) in sum[g].iter_mut().zip(&run.sum) {
                                *a += x as f64;
                            }
                            n[g] += run.n;
                        }
                        continue;
                    }
                    Err(e) => {
                        result = Err(e);
                        break;
                    }
                }
            }
            match self.ctx.decode(&batch) {
                Ok(states) => {
                    let read = chunk.iter().filter(|&&(g, i)| wanted(i, group[g].len()));
                    for (&(g, _), row) in read.zip(states.chunks(width)) {
                        rows[g].extend_from_slice(row);
                    }
                }
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        for &s in &seqs[..group.len()] {
            self.ctx.seq_rm(Some(s), -1, -1)?;
        }
        result?;
        if let Some((sum, n)) = sums {
            return Ok((sum.iter().zip(&n))
                .map(|(s, &n)| {
                    let n = n.max(1) as f64;
                    vec![s.iter().map(|&x| (x / n) as f32).collect()]
                })
                .collect());
        }
        Ok(rows.iter().map(|r| pool(r, width, pooling)).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pools_and_normalises_as_llama_cpp() {
        let rows = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        assert_eq!(pool(&rows, 2, Pooling::Mean), [vec![3.0, 4.0]]);
        assert_eq!(pool(&rows, 2, Pooling::Cls), [vec![1.0, 2.0]]);
        assert_eq!(pool(&rows, 2, Pooling::Last), [vec![5.0, 6.0]]);
        assert_eq!(pool(&rows, 2, Pooling::None).len(), 3);
        assert_eq!(normalize(&[3.0, 4.0], 2), [0.6, 0.8]);
        assert_eq!(normalize(&[3.0, -1.0], 1), [0.75, -0.25]);
        assert_eq!(normalize(&[3.0, 4.0], -1), [3.0, 4.0]);
        assert_eq!(normalize(&[0.5, -1.0], 0), [16380.0, -32760.0]);
        assert_eq!(normalize(&[0.0, 0.0], 2), [0.0, 0.0]);
        assert_eq!("mean".parse::<Pooling>(), Ok(Pooling::Mean));
        assert_eq!("rank".parse::<Pooling>(), Ok(Pooling::Rank));
        assert!("max".parse::<Pooling>().is_err());
        assert_eq!(Pooling::from_code(None), Ok(Pooling::None));
        assert_eq!(Pooling::from_code(Some(3)), Ok(Pooling::Last));
    }
}
