//! Mixture-of-experts models end to end on the CPU, on tiny synthetic Mixtral and Qwen3-MoE
//! files (`rocmforge synth --preset tiny-moe`): they load and validate, requests decoded
//! together in the batching engine give the greedy tokens `generate` gives for each alone, and
//! the greedy tokens equal llama.cpp's on the same files (pinned from
//! `scripts/compare_moe_llama.sh`).

mod engine_support;

use std::path::PathBuf;
use std::sync::Arc;

use rocmforge_model::batch::{BatchEngine, EngineOptions};
use rocmforge_model::placement::DeviceChoice;
use rocmforge_model::session::SessionOptions;
use rocmforge_model::synth::SynthOptions;
use rocmforge_model::text::TextModel;

use engine_support::{greedy_alone, greedy_together};

/// Writes `tiny-moe` for `arch` with `ftype` weights (seed 42, built-in vocabulary) and loads it.
fn synth(arch: &str, ftype: &str) -> TextModel {
    let dir = std::env::temp_dir().join(format!("rocmforge-moe-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path: PathBuf = dir.join(format!("{arch}-{ftype}.gguf"));
    let o = SynthOptions::parse(arch, "tiny-moe", ftype, 42).expect("options");
    rocmforge_model::synth::write(&o, None, &path).expect("write");
    TextModel::load(&path, |_, _| {}).expect("load")
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

fn alone(tm: &TextModel, prompt: &[u32], n: usize) -> Vec<u32> {
    greedy_alone(tm, &session_opts(), prompt, n)
}

fn prompt(seed: u32, n: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (seed * 31 + i * 7) % 250 + 3)
        .collect()
}

#[test]
fn moe_requests_together_give_the_tokens_of_each_alone() {
    for (arch, ftype) in [("mixtral", "q4_k_m"), ("qwen3moe", "q8_0")] {
        let tm = synth(arch, ftype);
        let moe = tm.model().config().moe.expect("experts");
        assert_eq!((moe.n_expert, moe.n_used), (8, 2));
        let prompts = [prompt(1, 5), prompt(2, 23), prompt(3, 40)];
        let n = 12;
        let want: Vec<Vec<u32>> = prompts.iter().map(|p| alone(&tm, p, n)).collect();
        let opts = EngineOptions {
            session: session_opts(),
            max_seqs: 3,
            n_ctx_per_seq: 128,
            block_size: 16,
            kv_blocks: None,
            host_kv_limit: None,
            step_tokens: 32,
            prefix_cache: false,
            exact: true,
            swap: Default::default(),
            step_padding: Default::default(),
        };
        let e = BatchEngine::start(Arc::new(tm.model().clone()), opts).expect("engine");
        assert_eq!(greedy_together(&e, &prompts, n, arch), want, "{arch}");
    }
}

/// Greedy tokens of `tiny-moe` files (seed 42, built-in vocabulary) after BOS and the prompt
/// text, as llama.cpp's CPU build (llama-completion `--temp 0 -fa off -t 2`, from
/// `scripts/compare_moe_llama.sh`) generates them: its raw output bytes, which are the token ids
/// of the byte-level vocabulary.
const LLAMA_CPP_GREEDY: &[(&str, &str, &[u32])] = &[
    (
        "mixtral",
        "q4_k_m",
        &[
            48, 48, 48, 48, 48, 48, 48, 48, 48, 48, 48, 48, 48, 48, 48, 48, 48, 48, 48, 163, 163,
            163, 163, 163, 163, 163, 163, 163, 163, 163, 163, 163,
        ],
    ),
    (
        "mixtral",
        "q8_0",
        &[
            48, 48, 48, 48, 48, 48, 48, 48, 48, 48, 48, 48, 48, 48, 48, 48, 48, 48, 48, 163, 163,
            163, 163, 163, 163, 163, 163, 163, 163, 163, 163, 163,
        ],
    ),
    (
        "qwen3moe",
        "q4_k_m",
        &[
            48, 122, 96, 48, 48, 122, 96, 48, 122, 48, 48, 164, 48, 48, 48, 48, 122, 48, 122, 48,
            122, 48, 48, 122, 48, 164, 48, 164, 48, 164, 48, 164,
        ],
    ),
    (
        "qwen3moe",
        "q8_0",
        &[
            48, 122, 96, 48, 122, 173, 96, 48, 122, 48, 48, 164, 48, 48, 48, 48, 122, 48, 122, 48,
            48, 48, 48, 48, 48, 164, 48, 48, 48, 164, 48, 48,
        ],
    ),
];

#[test]
fn moe_greedy_tokens_equal_llama_cpp() {
    let text = "The quick brown fox jumps over the lazy dog";
    let mut got_all = Vec::new();
    for (arch, ftype) in [
        ("mixtral", "q4_k_m"),
        ("mixtral", "q8_0"),
        ("qwen3moe", "q4_k_m"),
        ("qwen3moe", "q8_0"),
    ] {
        let tm = synth(arch, ftype);
        let p = tm.encode(text, true).expect("encode");
        got_all.push((arch, ftype, alone(&tm, &p, 32)));
    }
    for (arch, ftype, got) in &got_all {
        let want = LLAMA_CPP_GREEDY
            .iter()
            .find(|(a, f, _)| a == arch && f == ftype)
            .map(|(_, _, t)| *t);
        assert_eq!(Some(&got[..]), want, "{arch} {ftype}; all: {got_all:?}");
    }
}

/// Every expert layer's weighted sum of its experts' outputs, plus the residual, becomes one
/// `moe_sum` node in the graphs the CPU runs (the optimizer's fusion of the `mul`, the chain of
/// `add`s and the residual `add`), for a decode step and a prompt, in all three expert
/// architectures.
#[test]
fn expert_sums_are_fused_in_every_layer() {
    use rocmforge_model::arch::{build_forward, BatchSpec, KvCacheSpec, KvType, LogitsMode};
    for arch in ["mixtral", "qwen3moe", "gpt-oss"] {
        let tm = synth(arch, "q8_0");
        let m = tm.model();
        let cfg = m.config();
        let kv = KvCacheSpec {
            dtype: KvType::F16,
            n_ctx: 64,
        };
        for n_tok in [1, 7] {
            let batch = BatchSpec {
                n_tok,
                n_past: 0,
                logits: LogitsMode::Last,
            };
            let mut fg = build_forward(cfg, m.weights(), &kv, batch).expect("forward graph");
            ggml_graph::opt::optimize(&mut fg.graph);
            let (g, _) = ggml_graph::opt::eliminate_dead(&fg.graph);
            let sums: Vec<_> = g
                .tensors()
                .iter()
                .filter(|t| t.op.name() == "moe_sum")
                .collect();
            assert_eq!(
                sums.len(),
                cfg.n_layer,
                "{arch} n_tok={n_tok}: moe_sum nodes"
            );
            // Each with the layer's residual added in the same node.
            assert!(
                sums.iter().all(|t| t.src.len() == 3),
                "{arch} n_tok={n_tok}: a residual add was left out"
            );
        }
    }
}
