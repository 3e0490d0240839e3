//! `bench` (llama-bench-style throughput table) and `perplexity` (llama-perplexity's method).

use std::path::PathBuf;
use std::time::Instant;

use clap::Args;

use super::ModelArgs;
use crate::arch::LogitsMode;
use crate::error::ModelError;
use crate::perplexity::{perplexity as run_ppl, PplOptions};
use crate::sampling::Rng;
use crate::session::Session;

/// `bench` arguments.
#[derive(Args, Debug)]
pub(super) struct BenchArgs {
    #[command(flatten)]
    m: ModelArgs,
    /// Prompt lengths to test (comma-separated; 0 skips).
    #[arg(
        short = 'p',
        long = "n-prompt",
        value_delimiter = ',',
        default_value = "512"
    )]
    n_prompt: Vec<usize>,
    /// Generation lengths to test (comma-separated; 0 skips).
    #[arg(
        short = 'n',
        long = "n-gen",
        value_delimiter = ',',
        default_value = "128"
    )]
    n_gen: Vec<usize>,
    /// Repetitions per test.
    #[arg(short = 'r', long, default_value_t = 5)]
    reps: usize,
}

/// `perplexity` arguments.
#[derive(Args, Debug)]
pub(super) struct PplArgs {
    #[command(flatten)]
    m: ModelArgs,
    /// The text file.
    #[arg(short = 'f', long)]
    file: PathBuf,
    /// Evaluate at most this many chunks.
    #[arg(long)]
    chunks: Option<usize>,
}

/// llama.cpp's name for a `general.file_type` value (as llama-bench prints it).
fn file_type_name(ft: u32) -> &'static str {
    match ft {
        0 => "all F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K - Medium",
        11 => "Q3_K - Small",
        12 => "Q3_K - Medium",
        13 => "Q3_K - Large",
        14 => "Q4_K - Small",
        15 => "Q4_K - Medium",
        16 => "Q5_K - Small",
        17 => "Q5_K - Medium",
        18 => "Q6_K",
        32 => "BF16",
        _ => "",
    }
}

fn mean_sd(xs: &[f64]) -> (f64, f64) {
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    if xs.len() < 2 {
        return (mean, 0.0);
    }
    let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (mean, var.sqrt())
}

fn random_tokens(rng: &mut Rng, n: usize, n_vocab: usize) -> Vec<u32> {
    (0..n)
        .map(|_| (rng.next_u64() % n_vocab as u64) as u32)
        .collect()
}

/// Tokens per second of one run: `pp` feeds `n` tokens as one batch, `tg` feeds them one at a
/// time, both on an empty context (as llama-bench does).
fn run_once(
    session: &mut Session,
    rng: &mut Rng,
    n_vocab: usize,
    n: usize,
    gen: bool,
) -> Result<f64, ModelError> {
    session.reset();
    let toks = random_tokens(rng, n, n_vocab);
    let t0 = Instant::now();
    if gen {
        // As llama-bench: each step's logits reach host memory, unread.
        for &t in &toks {
            session.eval_with(&[t], LogitsMode::Last, |_| ())?;
        }
    } else {
        session.eval_with(&toks, LogitsMode::Last, |_| ())?;
    }
    Ok(n as f64 / t0.elapsed().as_secs_f64())
}

pub(super) fn bench(a: &BenchArgs) -> Result<(), ModelError> {
    let tm = a.m.load()?;
    let cfg = tm.model().config().clone();
    let mut opts = a.m.session_options(&tm)?;
    let longest = a
        .n_prompt
        .iter()
        .chain(&a.n_gen)
        .copied()
        .max()
        .unwrap_or(0);
    opts.n_ctx = opts.n_ctx.max(longest).min(cfg.n_ctx_train);
    opts.n_batch = opts
        .n_batch
        .max(a.n_prompt.iter().copied().max().unwrap_or(1));
    let mut session = a.m.session(&tm, &opts)?;
    let threads = session.n_threads();
    let backend = if session.device_plan().uses_gpu() {
        "HIP"
    } else {
        "CPU"
    };
    let file = tm.model().file();
    let size: u64 = file.tensors().iter().map(|t| t.size).sum();
    let params: u64 = file.tensors().iter().map(|t| t.n_elements()).sum();
    let md = file.metadata();
    let name = format!(
        "{} {} {}",
        cfg.arch.name(),
        md.get_str_opt("general.size_label")
            .ok()
            .flatten()
            .unwrap_or(""),
        md.get_u32_opt("general.file_type")
            .ok()
            .flatten()
            .map(file_type_name)
            .unwrap_or("")
    );
    println!(
        "| model                          |       size |     params | backend    | threads |            test |                  t/s |"
    );
    println!(
        "| ------------------------------ | ---------: | ---------: | ---------- | ------: | --------------: | -------------------: |"
    );
    let mut rng = Rng::new(1234);
    let tests: Vec<(usize, bool)> = a
        .n_prompt
        .iter()
        .filter(|&&n| n > 0)
        .map(|&n| (n, false))
        .chain(a.n_gen.iter().filter(|&&n| n > 0).map(|&n| (n, true)))
        .collect();
    for (n, gen) in tests {
        // One untimed warm-up run, as llama-bench does: the whole prompt for pp (a shorter batch
        // would leave the first timed run to build and allocate the n-token graph, its GEMM
        // workspaces and kernels), a few tokens for tg (every step has the same shapes).
        let warm = if gen { n.min(16) } else { n };
        run_once(&mut session, &mut rng, cfg.n_vocab, warm, gen)?;
        let mut speeds = Vec::with_capacity(a.reps);
        for _ in 0..a.reps.max(1) {
            speeds.push(run_once(&mut session, &mut rng, cfg.n_vocab, n, gen)?);
        }
        let (mean, sd) = mean_sd(&speeds);
        let test = format!("{}{}", if gen { "tg" } else { "pp" }, n);
        println!(
            "| {:<30} | {:>6.2} MiB | {:>8.2} M | {:<10} | {:>7} | {:>15} | {:>11.2} ± {:>6.2} |",
            name,
            size as f64 / (1024.0 * 1024.0),
            params as f64 / 1e6,
            backend,
            threads,
            test,
            mean,
            sd
        );
    }
    let st = session.stats();
    tracing::info!(
        build_s = st.build_s,
        run_s = st.run_s,
        passes = st.passes,
        "graph build vs run time"
    );
    eprintln!(
        "graph build {:.3} ms/pass, run {:.3} ms/pass over {} passes",
        st.build_s * 1e3 / st.passes.max(1) as f64,
        st.run_s * 1e3 / st.passes.max(1) as f64,
        st.passes
    );
    Ok(())
}

pub(super) fn perplexity(a: &PplArgs) -> Result<(), ModelError> {
    let text = std::fs::read_to_string(&a.file).map_err(|e| ModelError::Io {
        path: a.file.clone(),
        source: e,
    })?;
    let tm = a.m.load()?;
    // As llama-perplexity: BOS per the metadata, special-token text left as plain text.
    let tokens = tm.tokenizer().encode(&text, true, false);
    let mut opts = a.m.session_options(&tm)?;
    opts.n_batch = opts.n_batch.max(opts.n_ctx);
    let mut session = a.m.session(&tm, &opts)?;
    let popts = PplOptions {
        n_ctx: session.n_ctx(),
        max_chunks: a.chunks,
        bos: tm.bos_for_chunks(),
    };
    let r = run_ppl(&mut session, &tokens, &popts, |i, n, ppl| {
        eprintln!("[{}/{}] {:.4}", i + 1, n, ppl);
    })?;
    println!(
        "perplexity: {:.4} over {} chunks of {} tokens ({} tokens scored)",
        r.ppl, r.chunks, popts.n_ctx, r.scored
    );
    Ok(())
}
