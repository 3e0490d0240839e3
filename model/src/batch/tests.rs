//! Engine tests on tiny synthetic models: requests decoded together give the tokens
//! `generate` gives for each alone; stop conditions, cancellation and refusals.

use std::path::PathBuf;
use std::sync::mpsc::Receiver;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use super::*;
use crate::generate::{generate, GenerateOptions};
use crate::placement::DeviceChoice;
use crate::sampling::Sampler;
use crate::session::{KvPlan, Session};
use crate::synth::SynthOptions;
use crate::text::TextModel;

/// A tiny Gemma 3 with an 8-token sliding window (so short prompts already slide), written once
/// per test binary.
fn gemma() -> Arc<Model> {
    static M: OnceLock<Arc<Model>> = OnceLock::new();
    Arc::clone(M.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("rocmforge-batch-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path: PathBuf = dir.join("gemma3-w8.gguf");
        let mut o = SynthOptions::parse("gemma3", "tiny", "q4_k_m", 11).expect("options");
        o.extras.window = Some(8);
        o.extras.qk_std = Some(0.2);
        crate::synth::write(&o, None, &path).expect("write");
        Arc::new(Model::load(&path, |_, _| {}).expect("load"))
    }))
}

fn session_opts() -> SessionOptions {
    SessionOptions {
        n_ctx: 128,
        n_batch: 32,
        n_threads: 2,
        device: DeviceChoice::Cpu,
        ..SessionOptions::default()
    }
}

fn engine_opts(max_seqs: usize) -> EngineOptions {
    EngineOptions {
        session: session_opts(),
        max_seqs,
        n_ctx_per_seq: 128,
        block_size: 16,
        kv_blocks: None,
        host_kv_limit: None,
        step_tokens: 32,
        prefix_cache: false,
        exact: true,
        swap: Default::default(),
        step_padding: Default::default(),
    }
}

/// Greedy tokens of `generate` alone on a fresh session.
fn alone(m: &Model, prompt: &[u32], n: usize) -> Vec<u32> {
    alone_with(m, &session_opts(), prompt, n)
}

/// [`alone`] with other session options.
fn alone_with(m: &Model, opts: &SessionOptions, prompt: &[u32], n: usize) -> Vec<u32> {
    let tm = TextModel::from_model(m.clone()).expect("text model");
    let mut s = Session::new(m, opts).expect("session");
    let mut sampler = Sampler::new(SamplerConfig::greedy());
    let o = GenerateOptions {
        max_tokens: n,
        stop_strings: Vec::new(),
        ignore_eog: true,
    };
    generate(&mut s, &tm, &mut sampler, prompt, &o, |_| {})
        .expect("generate")
        .tokens
}

/// Every event until `Done`/`Error`: tokens, then the final event.
fn collect(rx: &Receiver<Event>) -> (Vec<u32>, Event) {
    let mut toks = Vec::new();
    loop {
        match rx.recv_timeout(Duration::from_secs(120)).expect("event") {
            Event::Token { id, .. } => toks.push(id),
            e => return (toks, e),
        }
    }
}

fn prompt(seed: u32, n: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (seed * 31 + i * 7) % 250 + 3)
        .collect()
}

/// Waits for the worker to publish an idle state and returns it.
fn idle_stats(e: &BatchEngine) -> EngineStats {
    let t0 = Instant::now();
    loop {
        let s = e.stats();
        if s.running == 0 && s.waiting == 0 {
            return s;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "engine never idle: {s:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn requests_together_give_the_tokens_of_each_alone() {
    let m = gemma();
    let prompts = [prompt(1, 5), prompt(2, 23), prompt(3, 40), prompt(4, 2)];
    let n = 20;
    let want: Vec<Vec<u32>> = prompts.iter().map(|p| alone(&m, p, n)).collect();
    let e = BatchEngine::start(Arc::clone(&m), engine_opts(3)).expect("engine");
    let rxs: Vec<_> = prompts
        .iter()
        .map(|p| {
            e.submit_channel(Request::greedy(p.clone(), n))
                .expect("submit")
                .1
        })
        .collect();
    for (i, rx) in rxs.iter().enumerate() {
        let (toks, done) = collect(rx);
        assert_eq!(toks, want[i], "prompt {i}");
        match done {
            Event::Done { reason, usage, .. } => {
                assert_eq!(reason, FinishReason::Length);
                assert_eq!(usage.prompt_tokens, prompts[i].len());
                assert_eq!(usage.completion_tokens, n);
            }
            other => panic!("prompt {i}: {other:?}"),
        }
    }
    let s = idle_stats(&e);
    assert_eq!(s.kv_blocks_used, 0, "{s:?}");
    assert_eq!(s.generated_tokens, (n * prompts.len()) as u64);
}

#[test]
fn padded_decode_steps_give_the_tokens_of_each_alone() {
    // Requests of different lengths end at different steps, so the decode batch shrinks
    // 5 -> 1 through buckets 6 (the cap), 4, 2 and 1; the padded rows change no real row's bits.
    let m = gemma();
    let prompts = [
        prompt(1, 5),
        prompt(2, 23),
        prompt(3, 40),
        prompt(4, 2),
        prompt(5, 17),
    ];
    let lens = [3usize, 9, 14, 20, 25];
    let want: Vec<Vec<u32>> = prompts
        .iter()
        .zip(lens)
        .map(|(p, n)| alone(&m, p, n))
        .collect();
    let opts = EngineOptions {
        step_padding: StepPadding::On,
        ..engine_opts(6)
    };
    let e = BatchEngine::start(Arc::clone(&m), opts).expect("engine");
    for round in 0..2 {
        let rxs: Vec<_> = prompts
            .iter()
            .zip(lens)
            .map(|(p, n)| {
                e.submit_channel(Request::greedy(p.clone(), n))
                    .expect("submit")
                    .1
            })
            .collect();
        for (i, rx) in rxs.iter().enumerate() {
            assert_eq!(collect(rx).0, want[i], "round {round}, prompt {i}");
        }
        let s = idle_stats(&e);
        assert_eq!(s.kv_blocks_used, 0, "{s:?}");
        // The padded rows' block comes on top of the pool.
        assert_eq!(s.kv_blocks_total, 6 * 128 / 16, "{s:?}");
        assert!(s.padded_steps > 0, "no step was padded: {s:?}");
    }
    // The CPU alone pads only when told to.
    let e = BatchEngine::start(Arc::clone(&m), engine_opts(6)).expect("engine");
    let rxs: Vec<_> = prompts
        .iter()
        .zip(lens)
        .map(|(p, n)| {
            e.submit_channel(Request::greedy(p.clone(), n))
                .expect("submit")
                .1
        })
        .collect();
    for (i, rx) in rxs.iter().enumerate() {
        assert_eq!(collect(rx).0, want[i], "unpadded, prompt {i}");
    }
    assert_eq!(idle_stats(&e).padded_steps, 0);
}

#[test]
fn stop_tokens_and_strings_end_a_request() {
    let m = gemma();
    let p = prompt(5, 9);
    let want = alone(&m, &p, 12);
    let e = BatchEngine::start(Arc::clone(&m), engine_opts(2)).expect("engine");
    // The fourth token as a stop token: three tokens come, then Done(Stop).
    let mut r = Request::greedy(p.clone(), 12);
    r.stop_tokens = vec![want[3]];
    let first = want.iter().position(|&t| t == want[3]).unwrap_or(3);
    let (_, rx) = e.submit_channel(r).expect("submit");
    let (toks, done) = collect(&rx);
    assert_eq!(toks, want[..first]);
    assert!(
        matches!(
            done,
            Event::Done {
                reason: FinishReason::Stop,
                ..
            }
        ),
        "{done:?}"
    );
    // A stop string made of the third token's text: the text before it and Done(Stop).
    let tok = e.tokenizer();
    let piece = |t: u32| String::from_utf8_lossy(&tok.token_to_piece_ext(t, 0, false)).into_owned();
    let mut r = Request::greedy(p.clone(), 12);
    let stop = piece(want[2]);
    r.stop_strings = vec![stop.clone()];
    let (_, rx) = e.submit_channel(r).expect("submit");
    let mut text = String::new();
    let done = loop {
        match rx.recv_timeout(Duration::from_secs(60)).expect("event") {
            Event::Token { text: t, .. } => text.push_str(&t),
            d => break d,
        }
    };
    let Event::Done {
        reason, text: tail, ..
    } = done
    else {
        panic!("{done:?}")
    };
    text.push_str(&tail);
    let full: String = want.iter().map(|&t| piece(t)).collect();
    let cut = full.find(&stop).expect("stop text occurs");
    assert_eq!(reason, FinishReason::Stop);
    assert_eq!(text, full[..cut]);
}

#[test]
fn cancel_ends_a_request_and_frees_its_cache() {
    let m = gemma();
    let e = BatchEngine::start(Arc::clone(&m), engine_opts(2)).expect("engine");
    let (h, rx) = e
        .submit_channel(Request::greedy(prompt(6, 30), 100))
        .expect("submit");
    let (_, rx2) = e
        .submit_channel(Request::greedy(prompt(7, 4), 6))
        .expect("submit");
    match rx
        .recv_timeout(Duration::from_secs(60))
        .expect("first token")
    {
        Event::Token { .. } => {}
        other => panic!("{other:?}"),
    }
    h.cancel();
    let (toks, done) = collect(&rx);
    assert!(toks.len() < 99);
    assert!(
        matches!(
            done,
            Event::Done {
                reason: FinishReason::Cancelled,
                ..
            }
        ),
        "{done:?}"
    );
    // The other request is untouched.
    let (toks2, _) = collect(&rx2);
    assert_eq!(toks2, alone(&m, &prompt(7, 4), 6));
    // A dropped receiver cancels too.
    let (_, rx3) = e
        .submit_channel(Request::greedy(prompt(8, 4), 100))
        .expect("submit");
    drop(rx3);
    let s = idle_stats(&e);
    assert_eq!(s.kv_blocks_used, 0, "{s:?}");
    e.shutdown();
    assert!(e.submit_channel(Request::greedy(prompt(8, 4), 1)).is_err());
}

#[test]
fn bad_requests_are_refused() {
    let m = gemma();
    let e = BatchEngine::start(Arc::clone(&m), engine_opts(2)).expect("engine");
    let err = |r: Request| e.submit_channel(r).expect_err("refused").to_string();
    assert!(err(Request::greedy(vec![], 4)).contains("empty"));
    assert!(err(Request::greedy(prompt(1, 129), 4)).contains("context"));
    assert!(err(Request::greedy(vec![1, 100_000], 4)).contains("vocabulary"));
    let mut small = engine_opts(1);
    small.kv_blocks = Some(2);
    let e2 = BatchEngine::start(Arc::clone(&m), small).expect("engine");
    let msg = e2
        .submit_channel(Request::greedy(prompt(1, 40), 4))
        .expect_err("too big for the pool")
        .to_string();
    assert!(msg.contains("never fit"), "{msg}");
    let mut bad = engine_opts(4);
    bad.step_tokens = 2;
    assert!(BatchEngine::start(Arc::clone(&m), bad).is_err());
    // The engine still serves after refusals.
    let (_, rx) = e
        .submit_channel(Request::greedy(prompt(2, 3), 2))
        .expect("submit");
    assert_eq!(collect(&rx).0.len(), 2);
}

/// Three prompts under a pool that holds less than half of what they need at the end, with
/// preempted caches kept as `swap` says; every request gives its tokens alone, and the pool and
/// the swap space are empty at the end.
fn preempted_resume(swap: SwapOptions, prefix_cache: bool) -> EngineStats {
    let m = gemma();
    let prompts = [prompt(9, 10), prompt(10, 14), prompt(11, 6)];
    let n = 24;
    let want: Vec<Vec<u32>> = prompts.iter().map(|p| alone(&m, p, n)).collect();
    // 12 blocks of 4 positions hold 48 of the 102 positions the three need at the end.
    let mut o = engine_opts(3);
    o.block_size = 4;
    o.kv_blocks = Some(12);
    o.swap = swap;
    o.prefix_cache = prefix_cache;
    let e = BatchEngine::start(Arc::clone(&m), o).expect("engine");
    let rxs: Vec<_> = prompts
        .iter()
        .map(|p| {
            e.submit_channel(Request::greedy(p.clone(), n))
                .expect("submit")
                .1
        })
        .collect();
    for (i, rx) in rxs.iter().enumerate() {
        let (toks, done) = collect(rx);
        assert_eq!(toks, want[i], "prompt {i}, {swap:?}");
        assert!(
            matches!(
                done,
                Event::Done {
                    reason: FinishReason::Length,
                    ..
                }
            ),
            "{done:?}"
        );
    }
    let s = idle_stats(&e);
    assert!(s.preemptions > 0, "{s:?}");
    assert_eq!((s.kv_blocks_used, s.swap_bytes), (0, 0), "{s:?}");
    s
}

#[test]
fn preempted_sequences_resume_with_identical_tokens() {
    let recompute = SwapOptions {
        host_bytes: 0,
        min_positions: 1,
    };
    let s = preempted_resume(recompute, false);
    assert_eq!(s.swapped_out, 0, "{s:?}");
}

#[test]
fn swapped_out_sequences_resume_with_identical_tokens() {
    let swap = SwapOptions {
        host_bytes: u64::MAX,
        min_positions: 1,
    };
    for prefix_cache in [false, true] {
        let s = preempted_resume(swap, prefix_cache);
        assert_eq!(s.swapped_out, s.preemptions, "{s:?}");
    }
    // Caches under 24 positions recompute, longer ones swap.
    let mixed = SwapOptions {
        host_bytes: u64::MAX,
        min_positions: 24,
    };
    let s = preempted_resume(mixed, false);
    assert!(s.swapped_out > 0 && s.swapped_out < s.preemptions, "{s:?}");
}

#[test]
fn shared_prompt_prefixes_are_computed_once() {
    let m = gemma();
    let mut o = engine_opts(2);
    o.prefix_cache = true;
    let e = BatchEngine::start(Arc::clone(&m), o).expect("engine");
    let head = prompt(12, 36);
    let a = [head.clone(), prompt(13, 4)].concat();
    let b = [head.clone(), prompt(14, 7)].concat();
    let n = 12;
    let (_, rx) = e
        .submit_channel(Request::greedy(a.clone(), n))
        .expect("submit");
    let (toks_a, _) = collect(&rx);
    let (_, rx) = e
        .submit_channel(Request::greedy(b.clone(), n))
        .expect("submit");
    let (toks_b, done) = collect(&rx);
    assert_eq!(toks_a, alone(&m, &a, n));
    assert_eq!(toks_b, alone(&m, &b, n));
    // The 32 prompt positions of the session's first 32-token chunk are shared (two blocks).
    match done {
        Event::Done { usage, .. } => assert_eq!(usage.cached_tokens, 32, "{usage:?}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(idle_stats(&e).kv_blocks_used, 0);
}

#[test]
fn embeddings_are_pooled_unit_vectors_and_leave_the_pool_empty() {
    let m = gemma();
    let e = BatchEngine::start(Arc::clone(&m), engine_opts(2)).expect("engine");
    // Running beside a request changes nothing.
    let (_, rx) = e
        .submit_channel(Request::greedy(prompt(15, 6), 8))
        .expect("submit");
    let t = prompt(16, 12);
    let mean = e.embed(t.clone(), Pooling::Mean).expect("embed");
    let last = e.embed(t.clone(), Pooling::Last).expect("embed");
    assert_eq!(mean.len(), m.config().n_embd);
    for v in [&mean, &last] {
        let n: f64 = v.iter().map(|x| (*x as f64).powi(2)).sum();
        assert!((n - 1.0).abs() < 1e-5, "norm {n}");
    }
    assert_ne!(mean, last);
    assert_eq!(e.embed(t.clone(), Pooling::Mean).expect("again"), mean);
    // A token's state does not depend on anything after it: a one-token text's state is the
    // first state of the longer text (up to the summation orders of one token against twelve).
    let one = e.embed(t[..1].to_vec(), Pooling::Last).expect("one token");
    let first = e.embed(t.clone(), Pooling::First).expect("first");
    let diff = one
        .iter()
        .zip(&first)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(diff < 1e-3, "max diff {diff}");
    assert!(e.embed(vec![], Pooling::Mean).is_err());
    assert!(e.embed(prompt(1, 33), Pooling::Mean).is_err());
    collect(&rx);
    assert_eq!(idle_stats(&e).kv_blocks_used, 0);
}

/// Allows only even token ids and completes after three tokens.
struct EvenThree(usize);

impl TokenConstraint for EvenThree {
    fn mask(&mut self, logits: &mut [f32]) {
        for (i, l) in logits.iter_mut().enumerate() {
            if i % 2 == 1 {
                *l = f32::NEG_INFINITY;
            }
        }
    }

    fn accept(&mut self, _token: u32) -> bool {
        self.0 += 1;
        self.0 < 3
    }
}

#[test]
fn logprobs_and_constraints() {
    let m = gemma();
    let e = BatchEngine::start(Arc::clone(&m), engine_opts(2)).expect("engine");
    let mut r = Request::greedy(prompt(17, 7), 5);
    r.logprobs = Some(3);
    let (_, rx) = e.submit_channel(r).expect("submit");
    let mut n = 0;
    loop {
        match rx.recv_timeout(Duration::from_secs(60)).expect("event") {
            Event::Token { id, logprob, .. } => {
                let lp = logprob.expect("logprob asked for");
                // Greedy: the chosen token is the most likely one.
                assert_eq!(lp.top.len(), 3);
                assert_eq!(lp.top[0].0, id);
                assert_eq!(lp.top[0].1, lp.logprob);
                assert!(lp.logprob <= 0.0 && lp.top[1].1 <= lp.top[0].1);
                n += 1;
            }
            Event::Done { .. } => break,
            Event::Error(err) => panic!("{err}"),
        }
    }
    assert_eq!(n, 5);
    let mut r = Request::greedy(prompt(18, 7), 10);
    r.constraint = Some(Box::new(EvenThree(0)));
    let (_, rx) = e.submit_channel(r).expect("submit");
    let (toks, done) = collect(&rx);
    assert_eq!(toks.len(), 3);
    assert!(toks.iter().all(|t| t % 2 == 0), "{toks:?}");
    assert!(
        matches!(
            done,
            Event::Done {
                reason: FinishReason::Stop,
                ..
            }
        ),
        "{done:?}"
    );
}

#[test]
fn q8_0_kv_requests_together_give_the_tokens_of_each_alone() {
    let m = gemma();
    let sopts = SessionOptions {
        kv_type: crate::arch::KvType::Q8_0,
        ..session_opts()
    };
    let prompts = [prompt(5, 9), prompt(6, 30), prompt(7, 3)];
    let n = 16;
    let want: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| alone_with(&m, &sopts, p, n))
        .collect();
    let mut o = engine_opts(3);
    o.session = sopts;
    let e = BatchEngine::start(Arc::clone(&m), o).expect("engine");
    assert_eq!(e.device_plan().kv.dtype, crate::arch::KvType::Q8_0);
    let rxs: Vec<_> = prompts
        .iter()
        .map(|p| {
            e.submit_channel(Request::greedy(p.clone(), n))
                .expect("submit")
                .1
        })
        .collect();
    for (i, rx) in rxs.iter().enumerate() {
        let (toks, _) = collect(rx);
        assert_eq!(toks, want[i], "request {i}");
    }
    // 34 bytes per 32 values against f16's 64: the pool takes 17/32 of the f16 pool's bytes.
    let p = e.device_plan().kv;
    let f16 = KvPlan::of(
        &crate::arch::KvCacheSpec {
            dtype: crate::arch::KvType::F16,
            n_ctx: p.positions,
        },
        m.config(),
    );
    assert_eq!(p.bytes * 32, f16.bytes * 17);
    let s = idle_stats(&e);
    assert_eq!(s.kv_blocks_used, 0);
}

#[test]
fn the_pool_holds_every_sequence_on_the_cpu_within_the_host_cap() {
    let m = gemma();
    let mut o = engine_opts(2);
    let e = BatchEngine::start(Arc::clone(&m), o.clone()).expect("engine");
    let kv = e.device_plan().kv;
    assert_eq!((kv.positions, kv.block_size), (2 * 128, Some(16)));
    let shown = e.device_plan().to_string();
    assert!(
        shown.contains("KV cache: 256 positions (16 blocks of 16)"),
        "{shown}"
    );
    assert_eq!(e.stats().kv_blocks_total, 16);
    e.shutdown();
    o.host_kv_limit = Some(kv.bytes - 1);
    match BatchEngine::start(m, o) {
        Err(ModelError::KvPool { bytes, limit, .. }) => assert!(bytes > limit),
        other => panic!("expected a KV pool error, got {other:?}"),
    }
}

/// The same 40-token prompt twice (blocks of 16): the second request shares the two full
/// blocks and the partly filled third one, computes only the last prompt token into a copy of
/// that block, and gives the tokens of the prompt alone; also while the first request is still
/// writing its own tokens into the shared block. The pool ends empty.
#[test]
fn a_repeated_prompt_shares_its_partial_block_copy_on_write() {
    let m = gemma();
    let mut o = engine_opts(2);
    o.prefix_cache = true;
    // One prompt chunk of 40 positions: every one of them is shareable.
    o.session.n_batch = 64;
    o.step_tokens = 64;
    let e = BatchEngine::start(Arc::clone(&m), o.clone()).expect("engine");
    let p = prompt(21, 40);
    let n = 12;
    let want = alone_with(&m, &o.session, &p, n);
    let run = |e: &BatchEngine| {
        let (_, rx) = e
            .submit_channel(Request::greedy(p.clone(), n))
            .expect("submit");
        rx
    };
    let cached = |done: Event| match done {
        Event::Done { usage, .. } => usage.cached_tokens,
        other => panic!("{other:?}"),
    };
    let (first, done) = collect(&run(&e));
    assert_eq!(first, want);
    assert_eq!(cached(done), 0);
    // After the first one ended: 2 full blocks and 7 of the third one's 8 positions.
    let (second, done) = collect(&run(&e));
    assert_eq!(second, want);
    assert_eq!(cached(done), 39);
    assert_eq!(idle_stats(&e).kv_blocks_used, 0);
    // Forked while running: a sampled request with the same prompt arrives once the first has
    // its first token (its prompt is cached) and writes other tokens than the first does into
    // its copy of the block both held; each gives the tokens it gives alone.
    let sampled = || Request {
        sampling: SamplerConfig {
            temperature: 1.5,
            seed: 3,
            ..SamplerConfig::greedy()
        },
        ..Request::greedy(p.clone(), n)
    };
    let plain = EngineOptions {
        prefix_cache: false,
        ..o.clone()
    };
    let reference = BatchEngine::start(Arc::clone(&m), plain).expect("engine");
    let (want2, _) = collect(&reference.submit_channel(sampled()).expect("submit").1);
    assert_ne!(want2, want, "the sampled run must write other rows");
    let rx1 = run(&e);
    let Event::Token { id, .. } = rx1.recv_timeout(Duration::from_secs(60)).expect("token") else {
        panic!("no first token");
    };
    let (_, rx2) = e.submit_channel(sampled()).expect("submit");
    let (rest, _) = collect(&rx1);
    let (toks2, done2) = collect(&rx2);
    assert_eq!([vec![id], rest].concat(), want);
    assert_eq!(toks2, want2);
    assert_eq!(cached(done2), 39);
    let s = idle_stats(&e);
    assert_eq!((s.kv_blocks_used, s.running, s.waiting), (0, 0, 0), "{s:?}");
}

#[test]
fn pooling_types_are_llama_cpps_numbers_and_names() {
    let from = |v| Pooling::from_gguf(v).expect("known pooling type");
    assert_eq!(from(0), Pooling::None);
    assert_eq!(from(1), Pooling::Mean);
    assert_eq!(from(2), Pooling::First);
    assert_eq!(from(3), Pooling::Last);
    // Rank needs a classifier head.
    assert!(Pooling::from_gguf(4).is_err());
    for (name, p) in [
        ("none", Pooling::None),
        ("mean", Pooling::Mean),
        ("cls", Pooling::First),
        ("last", Pooling::Last),
    ] {
        assert_eq!(name.parse::<Pooling>().expect("name"), p);
    }
    assert!("rank".parse::<Pooling>().is_err());
}
