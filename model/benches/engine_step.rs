//! Host time of the batching engine's step graphs, the part that does not depend on the
//! backend: building a paged forward graph, the optimizer passes, and the scheduler's
//! preparation (placement, launch groups, memory plan), for decode steps of the Llama-3-8B
//! shape (Q4_K_M types, metadata only: no weights are written or read) at B = 1, 8, 32, 128
//! sequences, and for a step that mixes a 128-token prompt chunk into a decode batch of 8.
//! Every stage is what a step pays when its graph is not reused; the engine pays it once per
//! shape it keeps (see `batch::paged`).
//!
//! `cargo bench -p rocmforge-model --bench engine_step` (`ENGINE_STEP_PRESET=qwen3-8b`,
//! `ENGINE_STEP_RUNS=5` pick another preset and the repetitions; the best run is printed).

use std::sync::Arc;
use std::time::Instant;

use ggml_graph::backend::Device;
use ggml_graph::{DummyDevice, Op, Scheduler};
use rocmforge_model::arch::{build_paged_forward, KvType, PagedBatch, PagedKvSpec};
use rocmforge_model::synth::{layout, SynthOptions};

/// Positions per sequence (batched-bench's `-npp 128 -ntg 32`, plus one).
const N_CTX: usize = 161;
const BLOCK: usize = 16;

fn best_ms(runs: usize, mut f: impl FnMut()) -> f64 {
    let mut best = f64::INFINITY;
    for _ in 0..runs {
        let t = Instant::now();
        f();
        best = best.min(t.elapsed().as_secs_f64() * 1e3);
    }
    best
}

fn main() {
    let preset = std::env::var("ENGINE_STEP_PRESET").unwrap_or_else(|_| "llama3-8b".into());
    let runs: usize = std::env::var("ENGINE_STEP_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5)
        .max(1);
    let arch = if preset.starts_with("qwen3") {
        "qwen3"
    } else {
        "llama"
    };
    let o = SynthOptions::parse(arch, &preset, "q4_k_m", 1).expect("synthetic options");
    let (cfg, weights) = layout(&o, None).expect("model layout");
    let max_b = 128;
    let spec = PagedKvSpec {
        dtype: KvType::F16,
        n_blocks: max_b * N_CTX.div_ceil(BLOCK),
        block_size: BLOCK,
        max_blocks: N_CTX.div_ceil(BLOCK),
    };
    let dev: Arc<dyn Device> = Arc::new(DummyDevice::new("dummy", |_| true));
    let mut sched = Scheduler::new(vec![dev]).expect("scheduler");
    let decode = |b: usize| PagedBatch {
        n_tok: b,
        n_seqs: b,
        n_out: b,
        hidden: false,
        n_copy: 0,
    };
    let mut steps: Vec<(String, PagedBatch)> = [1, 8, 32, 128]
        .iter()
        .map(|&b| (format!("decode B={b}"), decode(b)))
        .collect();
    steps.push((
        "8 decodes + 128-token prompt chunk".into(),
        PagedBatch {
            n_tok: 8 + 128,
            n_seqs: 9,
            n_out: 9,
            hidden: false,
            n_copy: 0,
        },
    ));
    // The arena for the largest step once, so the timed preparations allocate nothing.
    let mut worst = build_paged_forward(&cfg, &weights, &spec, decode(max_b))
        .expect("graph")
        .graph;
    ggml_graph::opt::optimize(&mut worst);
    sched.reserve(&worst).expect("reserve");
    println!(
        "{preset} ({} layers, n_embd {}, vocab {}), Q4_K_M, KV {} blocks of {BLOCK}; best of {runs}",
        cfg.n_layer, cfg.n_embd, cfg.n_vocab, spec.n_blocks
    );
    println!(
        "{:<36} {:>6} {:>9} {:>9} {:>9} {:>9}",
        "step", "nodes", "build ms", "opt ms", "prep ms", "total ms"
    );
    for (name, batch) in steps {
        let build = best_ms(runs, || {
            std::hint::black_box(build_paged_forward(&cfg, &weights, &spec, batch).expect("graph"));
        });
        let g = build_paged_forward(&cfg, &weights, &spec, batch)
            .expect("graph")
            .graph;
        // The GPU engine's passes: the optimizer, Gemma's query scale folded into the
        // attention, whole decode layers fused where a device takes them.
        let opt = best_ms(runs, || {
            let mut h = g.clone();
            ggml_graph::opt::optimize(&mut h);
            ggml_graph::opt::fold_query_scale(&mut h);
            ggml_graph::opt::fuse_decode_layers(&mut h, &|_, _| true);
            std::hint::black_box(h);
        });
        let clone = best_ms(runs, || {
            std::hint::black_box(g.clone());
        });
        let mut h = g.clone();
        ggml_graph::opt::optimize(&mut h);
        ggml_graph::opt::fold_query_scale(&mut h);
        ggml_graph::opt::fuse_decode_layers(&mut h, &|_, _| true);
        let prep = best_ms(runs, || sched.reserve(&h).expect("prepare"));
        let needed = ggml_graph::plan::needed_nodes(&h);
        let launched = (h.tensors().iter().zip(&needed))
            .filter(|(t, &n)| n && !matches!(t.op, Op::Leaf(_) | Op::View))
            .count();
        let opt = (opt - clone).max(0.0);
        println!(
            "{name:<36} {launched:>6} {build:>9.3} {opt:>9.3} {prep:>9.3} {:>9.3}",
            build + opt + prep
        );
    }
}
