//! Running a batch: split into ubatches as the memory asks, each placed in memory, its
//! inputs filled, its graph recorded and submitted (with the draws of GPU sampling), and
//! its results read back; and steps submitted ahead of their readback.

use super::{
    Batch, Context, ContextError, Decoded, Drawn, GpuDraw, GraphKey, StepStats, GRAPH_CACHE,
};
use crate::graph::{GraphInput, GraphIo, UbatchView};
use crate::kv::CacheKind;
use crate::ops::uniforms::SampleRow;
use crate::ops::View;
use std::sync::Arc;

impl Context {
    /// Splits a checked batch into ubatches as the memory asks and decodes them in order;
    /// the logit rows (and draws) come back in batch order whatever order the split took.
    pub(super) async fn decode_ubatches(
        &mut self,
        batch: &Batch,
        draws: &[GpuDraw],
    ) -> Result<Decoded, ContextError> {
        let placed = self.with_mrope(batch);
        let batch = placed.as_ref();
        let ub = self.params.n_ubatch.min(self.params.n_batch) as usize;
        let width = self.out_width() as usize;
        let draw_of = draw_index(draws);
        let mut rows: Vec<(usize, Vec<f32>)> = Vec::new();
        let mut picks = vec![Drawn::default(); draws.len()];
        let mut read_bytes = 0;
        // A split model pipelines ubatches without draws: the next one's first part
        // starts on the main device while the one before runs on the others.
        let pipelined = self.pipelined && self.step.sets.len() > 1 && !self.profile_next;
        let mut flight: Option<(InFlightUbatch, Vec<(usize, u32)>)> = None;
        for idx in self.memory.split(batch, ub, self.n_out_max as usize)? {
            let u = sub_batch(batch, &idx);
            let (read, drawn, which) = output_rows(batch, &idx, draws, &draw_of);
            let rs: Vec<u32> = read.iter().map(|x| x.1).collect();
            if pipelined && drawn.is_empty() {
                let set = self.next_set;
                self.next_set = (set + 1) % self.step.sets.len();
                let mut new = self.start_ubatch(&u, &rs, set)?;
                read_bytes += new.logit_bytes;
                if let Some((old, old_read)) = flight.take() {
                    self.n_overlapped += 1;
                    let out = self.overlap(old, &mut new).await?;
                    keep_rows(&mut rows, &old_read, &out, width);
                }
                flight = Some((new, read));
                continue;
            }
            if let Some((old, old_read)) = flight.take() {
                let out = self.wait_rows(old.run, old.logit_bytes).await?;
                keep_rows(&mut rows, &old_read, &out, width);
            }
            let (out, got) = self.decode_ubatch(&u, &rs, &drawn).await?;
            if !drawn.is_empty() {
                self.last_draws = drawn.len();
            }
            read_bytes += self.last_step.read_bytes;
            keep_rows(&mut rows, &read, &out, width);
            for (j, p) in which.into_iter().zip(got) {
                picks[j] = p;
            }
        }
        if let Some((old, old_read)) = flight.take() {
            let out = self.wait_rows(old.run, old.logit_bytes).await?;
            keep_rows(&mut rows, &old_read, &out, width);
        }
        self.last_step.read_bytes = read_bytes;
        rows.sort_by_key(|(i, _)| *i);
        Ok(Decoded {
            logits: rows.into_iter().flat_map(|(_, r)| r).collect(),
            picks,
        })
    }

    /// [`Context::decode_pooled`]'s ubatches: each one's runs of a sequence set summed on
    /// the GPU after its graph, and only the sums read back.
    #[cfg(not(target_arch = "wasm32"))]
    pub(super) async fn decode_pooled_ubatches(
        &mut self,
        batch: &Batch,
    ) -> Result<Vec<super::PooledRun>, ContextError> {
        let placed = self.with_mrope(batch);
        let batch = placed.as_ref();
        let ub = self.params.n_ubatch.min(self.params.n_batch) as usize;
        let width = self.out_width() as usize;
        let mut runs = Vec::new();
        for idx in self.memory.split(batch, ub, self.n_out_max as usize)? {
            let u = sub_batch(batch, &idx);
            // Output rows are the ubatch's tokens in order: a run per change of set.
            let mut starts = vec![0u32];
            let mut sets = Vec::new();
            for (r, &s) in u.seq.iter().enumerate() {
                if sets.last() != Some(&s) {
                    if r > 0 {
                        starts.push(r as u32);
                    }
                    sets.push(s);
                }
            }
            starts.push(u.seq.len() as u32);
            let run = self.submit_ubatch_with(&u, &[], &[], &[], Some(&starts))?;
            let (sums, _) = self.finish_ubatch(run).await?;
            for ((s, w), sum) in sets.iter().zip(starts.windows(2)).zip(sums.chunks(width)) {
                runs.push(super::PooledRun {
                    seq: *s,
                    sum: sum.to_vec(),
                    n: (w[1] - w[0]) as usize,
                });
            }
        }
        Ok(runs)
    }

    /// Runs one ubatch's graph; returns the logit rows `read` (output row indices, in
    /// order) and the tokens of the rows `drawn`.
    async fn decode_ubatch(
        &mut self,
        u: &Batch,
        read: &[u32],
        drawn: &[crate::ops::uniforms::SampleRow],
    ) -> Result<(Vec<f32>, Vec<Drawn>), ContextError> {
        let run = self.submit_ubatch(u, read, drawn, &[])?;
        let key = run.key;
        let out = self.finish_ubatch(run).await?;
        // `WGLLM_PROFILE=1` on a page, which cannot block where a native graph run
        // profiles itself (`Graph::submit`): every step read back is timed and logged.
        let logged = cfg!(target_arch = "wasm32") && self.model.gpu.tuning.profile;
        if std::mem::take(&mut self.profile_next) || logged {
            let gpu = self.model.gpu.clone();
            if let Some((_, graph)) = self.graphs.iter().find(|(k, _)| *k == key) {
                // The draws' dispatches (recorded for these rows) are timed after it.
                let draws = match (&self.sampling, drawn.is_empty()) {
                    (Some(s), false) => s.dispatches(),
                    _ => &[],
                };
                let cost = crate::graph::OpCost {
                    bytes: drawn.len() as u64 * self.model.hp.n_vocab as u64 * 4,
                    flops: 0,
                };
                let mut p = graph.profile(&gpu, ("sampling", draws, cost)).await?;
                // Replayed draws recorded their tokens again in the penalty history.
                for r in drawn {
                    self.forget_sampler_stamp(r.slot);
                }
                (p.n_tok, p.n_kv) = (key.0, key.1);
                if logged {
                    crate::graph::log_ops(&p);
                }
                self.last_profile = Some(p);
            }
        }
        Ok(out)
    }

    /// The first half of [`Context::decode_ubatch`]: places the ubatch, fills its inputs,
    /// records and submits its graph (and draws), without waiting. `feed` lists (ubatch
    /// position, draw) pairs: that token's id is copied on the GPU from the draw of the
    /// step submitted before.
    fn submit_ubatch(
        &mut self,
        u: &Batch,
        read: &[u32],
        drawn: &[crate::ops::uniforms::SampleRow],
        feed: &[(usize, usize)],
    ) -> Result<UbatchRun, ContextError> {
        self.submit_ubatch_with(u, read, drawn, feed, None)
    }

    /// Places ubatch `u` in memory, fills input set `set` from it and finds or builds
    /// its graph: the graph's index in the cache and its key.
    fn prepare(&mut self, u: &Batch, set: usize) -> Result<(usize, GraphKey), ContextError> {
        let gpu = self.model.gpu.clone();
        let ubv = UbatchView {
            tokens: &u.tokens,
            pos: &u.pos,
            seq: &u.seq,
            logits: &u.logits,
            embd: &u.embd,
            non_causal: u.non_causal,
            mrope: &u.mrope,
        };
        self.memory.place(&ubv)?;
        // Every declared input fills itself from the ubatch and the memory it went to.
        // A split model's other devices get the same data in their copies.
        let inputs = &self.step.sets[set];
        for ((input, buf), copies) in inputs.inputs.iter().zip(&inputs.mirrors) {
            let data = crate::memory::fill_input(&*self.memory, input, &ubv)?;
            if !data.is_empty() {
                gpu.write(buf, 0, data.as_bytes());
                for (d, copy) in copies.iter().enumerate() {
                    if let Some(copy) = copy {
                        self.model.placement.gpus()[d].write(copy, 0, data.as_bytes());
                    }
                }
            }
        }
        let n_out = ubv.logits.iter().filter(|&&l| l).count() as u32;
        let (n_kv, n_kv_window) = (
            self.memory.n_kv(CacheKind::Full),
            self.memory.n_kv(CacheKind::Window),
        );
        let key = (
            u.tokens.len() as u32,
            n_kv,
            n_kv_window,
            self.memory.n_rs(),
            n_out,
            self.lora.generation,
            set as u32,
            !u.embd.is_empty() as u32,
        );
        if let Some(i) = self.graphs.iter().position(|(k, _)| *k == key) {
            return Ok((i, key));
        }
        let io = GraphIo {
            n_tok: key.0,
            n_kv: key.1,
            n_kv_window: key.2,
            n_rs: key.3,
            n_out,
            inputs: (inputs.inputs.iter())
                .map(|(i, buf)| (*i, View::whole(buf)))
                .collect(),
            logits: View::whole(&self.step.logits),
            embeddings: self.params.embeddings,
            rank: self.params.rank,
            embd_input: key.7 != 0,
            lora: self.lora.terms.clone(),
            mirrors: inputs.mirror_views.clone(),
        };
        let graph = self.model.build_graph(&io, &*self.memory)?;
        self.n_graph_builds += 1;
        log::debug!(
            "graph for {key:?}: {} dispatches in {} part(s), {} scratch buffers ({:.1} MiB)",
            graph.n_dispatches(),
            graph.parts().len(),
            graph.scratch.len(),
            graph.scratch_bytes as f64 / (1 << 20) as f64
        );
        if self.graphs.len() == GRAPH_CACHE * self.step.sets.len() {
            self.graphs.pop_front();
        }
        self.graphs.push_back((key, Arc::new(graph)));
        Ok((self.graphs.len() - 1, key))
    }

    /// Starts ubatch `u` on a split model without waiting for any part (its inputs in
    /// set `set`): its first part is submitted, its logit rows `read` are read back by
    /// its last.
    fn start_ubatch(
        &mut self,
        u: &Batch,
        read: &[u32],
        set: usize,
    ) -> Result<InFlightUbatch, ContextError> {
        let (idx, key) = self.prepare(u, set)?;
        let row_bytes = self.out_width() as u64 * 4;
        let regions: Vec<(wgpu::Buffer, u64, u64)> = (row_runs(read, row_bytes).into_iter())
            .map(|(at, n)| (self.step.logits.clone(), at, n))
            .collect();
        let logit_bytes = regions.iter().map(|r| r.2).sum();
        let graph = self.graphs[idx].1.clone();
        let run = graph.start(regions)?;
        self.last_step = StepStats {
            n_tok: key.0,
            dispatches: graph.n_dispatches(),
            barriers: graph.n_barriers(),
            record_ns: 0,
            read_bytes: logit_bytes,
            submit_ns: 0,
            wait_ns: 0,
        };
        Ok(InFlightUbatch { run, logit_bytes })
    }

    /// Runs `old` to its end with `new` a part behind it, so that each device works on
    /// one while the other's part runs on another device; returns `old`'s logit rows.
    async fn overlap(
        &mut self,
        old: InFlightUbatch,
        new: &mut InFlightUbatch,
    ) -> Result<Vec<f32>, ContextError> {
        let mut run = old.run;
        while !run.done() {
            run.advance()?;
            if !new.run.done() && new.run.part() + 1 < run.part() {
                new.run.advance()?;
            }
        }
        self.wait_rows(run, old.logit_bytes).await
    }

    /// Waits for a staged run's last part and returns its logit rows.
    async fn wait_rows(
        &mut self,
        run: crate::graph::Staged,
        logit_bytes: u64,
    ) -> Result<Vec<f32>, ContextError> {
        let gpu = self.model.gpu.clone();
        let (data, wait_ns) = run.finish()?.wait(&gpu).await?;
        self.last_step.wait_ns = wait_ns;
        let data = data.unwrap_or_default();
        let n = (logit_bytes as usize).min(data.len());
        Ok(bytemuck::pod_collect_to_vec(&data[..n]))
    }

    /// [`Context::submit_ubatch`], or with `pool` (run starts) the runs' sums read back.
    fn submit_ubatch_with(
        &mut self,
        u: &Batch,
        read: &[u32],
        drawn: &[crate::ops::uniforms::SampleRow],
        feed: &[(usize, usize)],
        pool: Option<&[u32]>,
    ) -> Result<UbatchRun, ContextError> {
        let gpu = self.model.gpu.clone();
        let (idx, key) = self.prepare(u, 0)?;
        let graph = &self.graphs[idx].1;
        // Logit rows to read, as runs of consecutive rows; then the drawn tokens.
        let row_bytes = self.out_width() as u64 * 4;
        let mut regions: Vec<(&wgpu::Buffer, u64, u64)> = (row_runs(read, row_bytes).into_iter())
            .map(|(at, n)| (&self.step.logits, at, n))
            .collect();
        // Pooled: the runs' sums instead of the rows.
        let mut pool_dispatch = Vec::new();
        if let (Some(starts), Some((starts_buf, sums))) = (pool, &self.step.pool) {
            let n_runs = starts.len().saturating_sub(1) as u32;
            gpu.write(starts_buf, 0, bytemuck::cast_slice(starts));
            pool_dispatch.push(crate::ops::pool::pool_rows(
                &gpu,
                &View::whole(&self.step.logits),
                &View::whole(starts_buf),
                &View::whole(sums),
                self.out_width(),
                n_runs,
            )?);
            regions = vec![(sums, 0, n_runs as u64 * row_bytes)];
        }
        let logit_bytes: u64 = regions.iter().map(|r| r.2).sum();
        // Tokens drawn by the step before, copied into this step's token input before
        // the result buffer is drawn into again.
        let fed_from = if feed.is_empty() {
            None
        } else {
            let tokens_in = (self.step.sets[0].inputs.iter())
                .find(|(i, _)| *i == GraphInput::Tokens)
                .map(|(_, b)| b.clone());
            match (self.sampling.as_ref(), tokens_in) {
                (Some(st), Some(t)) => Some((st.result().clone(), t)),
                _ => {
                    return Err(ContextError::BadBatch(
                        "a token fed from a draw, but nothing was drawn".into(),
                    ))
                }
            }
        };
        let pre: Vec<crate::graph::CopyRegion> = match &fed_from {
            None => Vec::new(),
            Some((result, tokens_in)) => (feed.iter())
                .map(|&(pos, j)| crate::graph::CopyRegion {
                    src: result,
                    src_offset: j as u64 * 8,
                    dst: tokens_in,
                    dst_offset: pos as u64 * 4,
                    bytes: 4,
                })
                .collect(),
        };
        let extra: &[crate::ops::Dispatch] = if !pool_dispatch.is_empty() {
            &pool_dispatch
        } else if drawn.is_empty() {
            &[]
        } else {
            let st = self
                .sampling
                .as_mut()
                .expect("draws are checked against a synced state");
            let (d, result, probs) = st.record(&gpu, &self.step.logits, drawn)?;
            regions.push((result, 0, drawn.len() as u64 * 8));
            // Then each row's final candidates, where it asks for them.
            for (j, r) in drawn.iter().enumerate() {
                if r.n_probs > 0 {
                    let at = crate::ops::sample::probs_bytes(j as u32);
                    regions.push((probs, at, r.n_probs as u64 * 8));
                }
            }
            d
        };
        let read_bytes: u64 = regions.iter().map(|r| r.2).sum();
        let sub = graph.submit(&gpu, &pre, extra, &regions)?;
        let (submit_ns, _) = graph.submit_wait_ns();
        self.last_step = StepStats {
            n_tok: key.0,
            dispatches: graph.n_dispatches() + extra.len(),
            barriers: graph.n_barriers() + crate::ops::barriers(extra),
            record_ns: graph.record_ns(),
            read_bytes,
            submit_ns,
            wait_ns: 0,
        };
        Ok(UbatchRun {
            sub,
            key,
            logit_bytes,
            n_probs: drawn.iter().map(|r| r.n_probs as usize).collect(),
        })
    }

    /// The second half: waits for the ubatch's readback and splits it into logit rows
    /// and drawn tokens.
    async fn finish_ubatch(
        &mut self,
        run: UbatchRun,
    ) -> Result<(Vec<f32>, Vec<Drawn>), ContextError> {
        let gpu = self.model.gpu.clone();
        let (data, wait_ns) = run.sub.wait(&gpu).await?;
        self.last_step.wait_ns = wait_ns;
        let data = data.unwrap_or_default();
        let (logits, rest) = data.split_at((run.logit_bytes as usize).min(data.len()));
        let (tokens, mut probs) = rest.split_at((run.n_probs.len() * 8).min(rest.len()));
        let pair = |c: &[u8]| {
            let t = u32::from_le_bytes(c[..4].try_into().unwrap());
            (t, f32::from_le_bytes(c[4..8].try_into().unwrap()))
        };
        let picks = (tokens.chunks_exact(8).zip(&run.n_probs))
            .map(|(c, &n)| {
                let (token, prob) = pair(c);
                let (mine, after) = probs.split_at((n * 8).min(probs.len()));
                probs = after;
                // Places past the chain's last candidate (and underflowed weights) hold
                // probability 0, which the host's list leaves out too.
                let top = (mine.chunks_exact(8).map(pair))
                    .filter(|&(_, p)| p > 0.0)
                    .collect();
                Drawn { token, prob, top }
            })
            .collect();
        Ok((bytemuck::pod_collect_to_vec(logits), picks))
    }

    /// Submits a decode step without waiting for it: the batch must fit one ubatch, and
    /// the tokens `feed` names (batch index, index of a draw of the step submitted just
    /// before) take the token that draw picks, copied on the GPU — their ids in `batch`
    /// are placeholders. So step N+1 is on its way before token N is read: finish each
    /// step with [`Context::finish_step`], in the order submitted. The cells of a step
    /// are placed when it is submitted; cutting one back (a stop found when its token
    /// arrives) is `seq_rm` after it finishes. A failure while steps are in flight
    /// leaves the cache holding them.
    pub fn submit_step(
        &mut self,
        batch: &Batch,
        draws: &[GpuDraw],
        feed: &[(usize, usize)],
    ) -> Result<InFlight, ContextError> {
        self.check_decode(batch)?;
        self.check_draws(batch, draws)?;
        if let Some(&(i, j)) = feed
            .iter()
            .find(|&&(i, j)| i >= batch.tokens.len() || j >= self.last_draws)
        {
            return Err(ContextError::BadBatch(format!(
                "token {i} fed from draw {j}, but the step before drew {}",
                self.last_draws
            )));
        }
        self.memory.update(true)?;
        let saved = self.memory.checkpoint();
        let out = self.submit_one(batch, draws, feed);
        if out.is_err() {
            self.memory.rollback(saved);
            if let Some(s) = self.sampling.as_mut() {
                s.forget_all();
            }
        }
        out
    }

    fn submit_one(
        &mut self,
        batch: &Batch,
        draws: &[GpuDraw],
        feed: &[(usize, usize)],
    ) -> Result<InFlight, ContextError> {
        let placed = self.with_mrope(batch);
        let batch = placed.as_ref();
        let ub = self.params.n_ubatch.min(self.params.n_batch) as usize;
        let split = self.memory.split(batch, ub, self.n_out_max as usize)?;
        let [idx] = &split[..] else {
            return Err(ContextError::BadBatch(format!(
                "a step submitted ahead must fit one ubatch; this one takes {}",
                split.len()
            )));
        };
        let u = sub_batch(batch, idx);
        let draw_of = draw_index(draws);
        let (read_rows, drawn, which) = output_rows(batch, idx, draws, &draw_of);
        let pos_of: std::collections::HashMap<usize, usize> =
            idx.iter().enumerate().map(|(p, &i)| (i, p)).collect();
        let feed_u: Vec<(usize, usize)> = feed.iter().map(|&(i, j)| (pos_of[&i], j)).collect();
        let rs: Vec<u32> = read_rows.iter().map(|x| x.1).collect();
        let run = self.submit_ubatch(&u, &rs, &drawn, &feed_u)?;
        if !drawn.is_empty() {
            self.last_draws = drawn.len();
        }
        Ok(InFlight { run, which })
    }

    /// Waits for a step submitted by [`Context::submit_step`] and returns its logit rows
    /// (in the order of its ubatch: the batch's, for a KV cache) and drawn tokens, as
    /// [`Context::decode_drawing_async`] does.
    pub async fn finish_step(&mut self, step: InFlight) -> Result<Decoded, ContextError> {
        let out = self.finish_ubatch(step.run).await;
        let (logits, got) = match out {
            Ok(x) => x,
            Err(e) => {
                if let Some(s) = self.sampling.as_mut() {
                    s.forget_all();
                }
                return Err(e);
            }
        };
        let mut picks = vec![Drawn::default(); step.which.len()];
        for (j, p) in step.which.into_iter().zip(got) {
            picks[j] = p;
        }
        Ok(Decoded { logits, picks })
    }

    /// [`Context::finish_step`], blocking (native targets).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn finish_step_blocking(&mut self, step: InFlight) -> Result<Decoded, ContextError> {
        pollster::block_on(self.finish_step(step))
    }
}

/// The output rows `read` (in order) as runs of consecutive rows of `row_bytes` each:
/// (byte offset, bytes), one readback region a run.
fn row_runs(read: &[u32], row_bytes: u64) -> Vec<(u64, u64)> {
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for &r in read {
        let at = r as u64 * row_bytes;
        match runs.last_mut() {
            Some(last) if last.0 + last.1 == at => last.1 += row_bytes,
            _ => runs.push((at, row_bytes)),
        }
    }
    runs
}

/// Adds the logit rows `out` (`width` floats each) of the output rows `read` (batch
/// index, row) to `rows`.
fn keep_rows(rows: &mut Vec<(usize, Vec<f32>)>, read: &[(usize, u32)], out: &[f32], width: usize) {
    for ((i, _), row) in read.iter().zip(out.chunks(width.max(1))) {
        rows.push((*i, row.to_vec()));
    }
}

impl Context {
    /// `batch` with each token's M-RoPE position where the model has M-RoPE and the
    /// caller gave none (as llama.cpp's mtmd helper places them): a sequence's time goes
    /// on from its last cell's next time (see `Cell::rope_next`), one per text token; the
    /// tokens of an image (`Batch::image`, raster order) share their time and take their
    /// rows and columns from it, and the token after the image has the time past the
    /// image's larger side. A checked batch's sequences are continuous, so each starts
    /// where its cells end.
    fn with_mrope<'a>(&self, batch: &'a Batch) -> std::borrow::Cow<'a, Batch> {
        use std::borrow::Cow;
        if self.model.hp.mrope.is_none() || !batch.mrope.is_empty() {
            return Cow::Borrowed(batch);
        }
        let mem = &self.memory;
        // Where each sequence's time stands: after its last cell, or (a sequence with no
        // cells) at the batch's first position of it.
        let start = |s: u32, pos: i32| match mem.seq_pos_max(s) {
            -1 => pos,
            _ => mem.seq_rope_next(s),
        };
        let mut next: std::collections::HashMap<u32, i32> = Default::default();
        let mut mrope = Vec::with_capacity(batch.tokens.len());
        if let Some(piece) = batch.image {
            // One sequence (checked). A later piece's time is its image's: every cell of
            // the image holds the time past the image, t0 + the larger side.
            let s = batch.seq.first().map_or(0, |set| set.trailing_zeros());
            let side = piece.nx.max(piece.ny) as i32;
            let t = match piece.first {
                0 => start(s, batch.pos.first().copied().unwrap_or(0)),
                _ => mem.seq_rope_next(s) - side,
            };
            for j in 0..batch.tokens.len() as u32 {
                let k = piece.first + j;
                mrope.push(crate::batch::MropePos {
                    t,
                    row: t + (k / piece.nx.max(1)) as i32,
                    col: t + (k % piece.nx.max(1)) as i32,
                    next: t + side,
                });
            }
        } else {
            for (&set, &pos) in batch.seq.iter().zip(&batch.pos) {
                // A token of several sequences (a shared prefix) goes on from the lowest's
                // time, and every one of them goes on from it.
                let low = set.trailing_zeros();
                let t = *next.entry(low).or_insert_with(|| start(low, pos));
                let mut rest = set;
                while rest != 0 {
                    next.insert(rest.trailing_zeros(), t + 1);
                    rest &= rest - 1;
                }
                mrope.push(crate::batch::MropePos {
                    t,
                    row: t,
                    col: t,
                    next: t + 1,
                });
            }
        }
        Cow::Owned(Batch {
            mrope,
            ..batch.clone()
        })
    }
}

/// The tokens `idx` of `batch`, in that order.
fn sub_batch(batch: &Batch, idx: &[usize]) -> Batch {
    Batch {
        tokens: idx.iter().map(|&i| batch.tokens[i]).collect(),
        pos: idx.iter().map(|&i| batch.pos[i]).collect(),
        seq: idx.iter().map(|&i| batch.seq[i]).collect(),
        logits: idx.iter().map(|&i| batch.logits[i]).collect(),
        embd: match batch.embd.len().checked_div(batch.tokens.len()) {
            Some(w) if w > 0 => (idx.iter())
                .flat_map(|&i| batch.embd[i * w..(i + 1) * w].iter().copied())
                .collect(),
            _ => Vec::new(),
        },
        non_causal: batch.non_causal,
        image: batch.image,
        mrope: match batch.mrope.is_empty() {
            true => Vec::new(),
            false => idx.iter().map(|&i| batch.mrope[i]).collect(),
        },
    }
}

/// Each draw's position in `draws`, by the batch index it samples.
fn draw_index(draws: &[GpuDraw]) -> std::collections::HashMap<usize, usize> {
    draws
        .iter()
        .enumerate()
        .map(|(j, d)| (d.index, j))
        .collect()
}

/// The output rows of ubatch `idx` in its order: those read back as (batch index, row),
/// and those drawn on the GPU (their settings with the row filled in, and which draw).
type OutputRows = (Vec<(usize, u32)>, Vec<SampleRow>, Vec<usize>);

fn output_rows(
    batch: &Batch,
    idx: &[usize],
    draws: &[GpuDraw],
    draw_of: &std::collections::HashMap<usize, usize>,
) -> OutputRows {
    let (mut read, mut drawn, mut which) = (Vec::new(), Vec::new(), Vec::new());
    for (r, &i) in idx.iter().filter(|&&i| batch.logits[i]).enumerate() {
        match draw_of.get(&i) {
            Some(&j) => {
                let mut row = draws[j].row;
                row.row = r as u32;
                drawn.push(row);
                which.push(j);
            }
            None => read.push((i, r as u32)),
        }
    }
    (read, drawn, which)
}

/// A split model's ubatch in flight part by part, its logit rows still to come.
struct InFlightUbatch {
    run: crate::graph::Staged,
    logit_bytes: u64,
}

/// One ubatch submitted, its readback still to come.
struct UbatchRun {
    sub: crate::graph::Submitted,
    key: GraphKey,
    logit_bytes: u64,
    /// Per drawn row, in row order: the final candidates read back after the tokens.
    n_probs: Vec<usize>,
}

/// A step submitted ahead ([`Context::submit_step`]), to finish in order.
pub struct InFlight {
    run: UbatchRun,
    /// The draw each drawn row answers, in row order.
    which: Vec<usize>,
}
