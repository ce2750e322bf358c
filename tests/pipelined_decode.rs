//! Decode steps submitted before the last token is read (`Context::submit_step`): the
//! next step's token is the GPU's draw from the step before, copied on the GPU. On a
//! tiny random llama: the tokens equal those of steps each waited for, with sampling and
//! penalties; the step submitted past the end is cut back and the cache then answers as
//! the waited-for one does; bad uses are refused.

mod common;

use wgllm::context::{Batch, Context, ContextParams, GpuDraw, InFlight};
use wgllm::gguf::GgmlType;
use wgllm::gpu::{Gpu, GpuOptions};
use wgllm::sample::{gpu_row, Sampler, SamplerParams};

fn params() -> SamplerParams {
    SamplerParams {
        temp: 1.0,
        seed: 99,
        repeat_penalty: 1.3,
        repeat_last_n: 8,
        presence_penalty: 0.2,
        ..Default::default()
    }
}

fn draw(s: &Sampler, index: usize, ahead: usize) -> GpuDraw {
    let mut row = gpu_row(s.params(), 256)
        .unwrap()
        .with_uniform(s.peek_uniform_at(ahead));
    row.slot = 0;
    GpuDraw { index, row }
}

fn sync(ctx: &mut Context, s: &Sampler) {
    let row = gpu_row(s.params(), 256).unwrap();
    let hist: Vec<u32> = s.penalty_history().iter().copied().collect();
    ctx.sync_sampler(0, s.history_stamp(), &row, &hist, None)
        .unwrap();
}

fn context() -> Context {
    context_with(32, 32)
}

fn context_with(n_batch: u32, n_ubatch: u32) -> Context {
    let gpu = Gpu::new(&GpuOptions {
        no_f16: true,
        ..Default::default()
    })
    .unwrap();
    let model = common::tiny_model(gpu, GgmlType::Q8_0);
    Context::new(model, ContextParams::new(256, n_batch, n_ubatch)).unwrap()
}

const PROMPT: [u32; 5] = [1, 17, 42, 99, 7];
const N: usize = 40;

/// Steps waited for: each token drawn, read, then decoded.
fn waited(ctx: &mut Context) -> (Vec<u32>, Sampler) {
    let mut s = Sampler::new(params(), 256);
    sync(ctx, &s);
    let mut out = Vec::new();
    let mut batch = Batch::simple(&PROMPT, 0, false);
    for i in 0..N {
        let d = draw(&s, batch.tokens.len() - 1, 0);
        let got = ctx.decode_drawing(&batch, &[d]).unwrap();
        let t = got.picks[0].token;
        s.accept_gpu_pick(t).unwrap();
        ctx.set_sampler_stamp(0, s.history_stamp());
        out.push(t);
        batch = Batch::simple(&[t], (PROMPT.len() + i) as i32, true);
    }
    (out, s)
}

#[test]
fn steps_submitted_ahead_equal_steps_waited_for() {
    let mut a = context();
    let (want, sa) = waited(&mut a);

    let mut b = context();
    let mut s = Sampler::new(params(), 256);
    sync(&mut b, &s);
    let mut got = Vec::new();
    let mut flight: std::collections::VecDeque<InFlight> = Default::default();
    let prompt = Batch::simple(&PROMPT, 0, false);
    flight.push_back(
        b.submit_step(&prompt, &[draw(&s, PROMPT.len() - 1, 0)], &[])
            .unwrap(),
    );
    let mut pos = PROMPT.len() as i32;
    while got.len() < N {
        // The next step goes in before the token it decodes is read.
        let next = Batch::simple(&[0], pos, true);
        flight.push_back(
            b.submit_step(&next, &[draw(&s, 0, flight.len())], &[(0, 0)])
                .unwrap(),
        );
        pos += 1;
        let done = b.finish_step_blocking(flight.pop_front().unwrap()).unwrap();
        let t = done.picks[0].token;
        s.accept_gpu_pick(t).unwrap();
        got.push(t);
    }
    assert_eq!(
        got, want,
        "tokens drawn ahead differ from tokens waited for"
    );
    // One step was submitted past the last token: it decoded token N-1 at `pos - 1`.
    // The waited-for loop never decoded that token; cut it back.
    assert_eq!(flight.len(), 1);
    b.finish_step_blocking(flight.pop_front().unwrap()).unwrap();
    assert_eq!(b.memory().seq_pos_max(0), pos - 1);
    b.seq_rm(Some(0), pos - 1, -1).unwrap();
    assert_eq!(b.memory().seq_pos_max(0), a.memory().seq_pos_max(0));
    // The speculative step's token went into the GPU's penalty history: it is synced
    // again from the host's, and both caches then answer alike.
    assert_eq!(b.sampler_stamp(0), None);
    sync(&mut b, &s);
    assert_eq!(s.penalty_history(), sa.penalty_history());
    let last = Batch::simple(&[want[N - 1]], pos - 1, true);
    let la = a.decode(&last).unwrap();
    let lb = b.decode(&last).unwrap();
    let e = common::nmse(&lb, &la);
    assert!(
        e < 1e-10,
        "logits after the cut-back step differ: nmse {e:e}"
    );
}

#[test]
fn bad_steps_ahead_are_refused() {
    let mut c = context_with(64, 32);
    let s = Sampler::new(params(), 256);
    // Nothing was drawn yet: no token can be fed from a draw.
    let e = c
        .submit_step(&Batch::simple(&[0], 0, true), &[], &[(0, 0)])
        .err()
        .unwrap();
    assert!(e.to_string().contains("drew"), "{e}");
    // A step of more than one ubatch cannot go ahead.
    sync(&mut c, &s);
    let long: Vec<u32> = (0..40).collect();
    let e = c
        .submit_step(&Batch::simple(&long, 0, false), &[], &[])
        .err()
        .unwrap();
    assert!(e.to_string().contains("one ubatch"), "{e}");
    assert_eq!(c.memory().seq_pos_max(0), -1, "a refused step left cells");
}
