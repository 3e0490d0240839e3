//! The batching engine on the real Gemma 3 270M (when `ROCMFORGE_TEST_MODEL` is set): prompts
//! decoded together, with a shared prefix and under a pool small enough to preempt, give each
//! the greedy tokens `generate` gives for it alone, bit for bit on the CPU.

mod engine_support;

use std::sync::Arc;
use std::time::Duration;

use rocmforge_model::batch::{BatchEngine, EngineOptions};
use rocmforge_model::placement::DeviceChoice;
use rocmforge_model::session::SessionOptions;
use rocmforge_model::text::TextModel;
use serial_test::serial;

use engine_support::{greedy_alone, greedy_together};

fn load() -> Option<TextModel> {
    let Some(path) = std::env::var_os("ROCMFORGE_TEST_MODEL") else {
        println!("skipped: ROCMFORGE_TEST_MODEL not set");
        return None;
    };
    Some(TextModel::load(&path, |_, _| {}).expect("load the test model"))
}

fn session_opts() -> SessionOptions {
    SessionOptions {
        n_ctx: 256,
        n_batch: 64,
        n_threads: 2,
        device: DeviceChoice::Cpu,
        ..SessionOptions::default()
    }
}

fn alone(tm: &TextModel, prompt: &[u32], n: usize) -> Vec<u32> {
    greedy_alone(tm, &session_opts(), prompt, n)
}

#[test]
#[serial]
fn gemma_prompts_together_give_their_tokens_alone() {
    let Some(tm) = load() else {
        return;
    };
    let texts = [
        "The capital of France is",
        "Here is a short poem about the sea:\n",
        "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
        "The capital of France is Paris. The capital of Germany is Berlin. The capital of Italy is",
    ];
    let prompts: Vec<Vec<u32>> = texts
        .iter()
        .map(|t| tm.encode(t, true).expect("encode"))
        .collect();
    let n = 16;
    let want: Vec<Vec<u32>> = prompts.iter().map(|p| alone(&tm, p, n)).collect();
    let model = Arc::new(tm.model().clone());
    // A pool of 6 blocks of 16 positions: less than the four sequences need at once (10), so
    // some are preempted and recomputed.
    let opts = EngineOptions {
        session: session_opts(),
        max_seqs: 4,
        n_ctx_per_seq: 256,
        block_size: 16,
        kv_blocks: Some(6),
        host_kv_limit: None,
        step_tokens: 64,
        prefix_cache: true,
        exact: true,
        swap: Default::default(),
        step_padding: Default::default(),
    };
    let e = BatchEngine::start(model, opts).expect("engine");
    let got = greedy_together(&e, &prompts, n, "gemma");
    for (i, (got, want)) in got.iter().zip(&want).enumerate() {
        assert_eq!(got, want, "prompt {i}: {:?}", texts[i]);
    }
    let t0 = std::time::Instant::now();
    let s = loop {
        let s = e.stats();
        if s.running == 0 || t0.elapsed() > Duration::from_secs(30) {
            break s;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    println!("engine stats: {s:?}");
    assert_eq!(s.kv_blocks_used, 0, "{s:?}");
    assert!(s.preemptions > 0, "{s:?}");
}
