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
pub struct BenchArgs {
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
    /// Context depths (comma-separated): each test runs after this many random tokens are in
    /// the context (filled once per depth, untimed), as llama-bench's `-d`.
    #[arg(
        short = 'd',
        long = "n-depth",
        value_delimiter = ',',
        default_value = "0"
    )]
    n_depth: Vec<usize>,
    /// Repetitions per test.
    #[arg(short = 'r', long, default_value_t = 5)]
    reps: usize,
    /// After the table, each generation test's speed as a share of the bandwidth limit: the
    /// GPU's device-to-device copy bandwidth (measured then, with up to 2 GiB of its memory) over
    /// the weight bytes a token reads. Only when every layer and the output head are on the GPU.
    #[arg(long)]
    bandwidth: bool,
}

/// `perplexity` arguments.
#[derive(Args, Debug)]
pub struct PplArgs {
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

/// Weight bytes one decode step reads: every tensor of the file once, except the token
/// embedding table, of which it reads one row per token (all of it when the output head is tied
/// to the table, as in Gemma), and the stacks of expert matrices (`*_exps.*`, `[.., n_expert]`),
/// of which it reads the `expert_used_count` experts a token chose.
pub(super) fn weight_bytes_per_token(file: &gguf::GgufFile) -> u64 {
    let tied = file.tensor("output.weight").is_none();
    let used = file.arch_u32_opt("expert_used_count").ok().flatten();
    file.tensors()
        .iter()
        .map(|t| match (t.dims.get(1), t.dims.last(), used) {
            (Some(&rows), ..) if t.name == "token_embd.weight" && !tied && rows > 0 => {
                t.size / rows
            }
            (_, Some(&n_expert), Some(used))
                if t.name.contains("_exps.") && n_expert > 0 && u64::from(used) <= n_expert =>
            {
                t.size / n_expert * u64::from(used)
            }
            _ => t.size,
        })
        .sum()
}

/// Prints each generation test's speed against the bandwidth limit (see `BenchArgs::bandwidth`).
fn report_bandwidth(
    session: &Session,
    file: &gguf::GgufFile,
    gen: &[(usize, f64)],
) -> Result<(), ModelError> {
    let split = &session.device_plan().split;
    if !split.output_on_gpu() || split.gpu_layers() < split.n_layer {
        eprintln!(
            "bandwidth: not measured, the model is not all on the GPU ({} of {} layers{})",
            split.gpu_layers(),
            split.n_layer,
            if split.output_on_gpu() {
                ", output head"
            } else {
                ", output head on the CPU"
            }
        );
        return Ok(());
    }
    let Some(bw) = session.gpu_copy_bandwidth() else {
        eprintln!("bandwidth: not measured, the session runs on the CPU");
        return Ok(());
    };
    let bw = bw?;
    let bytes = weight_bytes_per_token(file) as f64;
    let limit = bw / bytes;
    println!(
        "bandwidth limit: {:.1} t/s ({:.3} GB of weights per token over the {:.0} GB/s device-to-device copy bandwidth measured now)",
        limit,
        bytes / 1e9,
        bw / 1e9
    );
    for &(n, tps) in gen {
        println!(
            "tg{n}: {tps:.2} t/s, {:.1}% of the bandwidth limit ({:.0} GB/s of weights)",
            100.0 * tps / limit,
            tps * bytes / 1e9
        );
    }
    Ok(())
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
/// time, both after the first `depth` positions of the context (as llama-bench does; the
/// session already holds them, see [`fill_depth`]).
fn run_once(
    session: &mut Session,
    rng: &mut Rng,
    n_vocab: usize,
    n: usize,
    gen: bool,
    depth: usize,
) -> Result<f64, ModelError> {
    session.truncate(depth);
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

/// Fills the context with `depth` random tokens (in prompt batches), untimed.
fn fill_depth(
    session: &mut Session,
    rng: &mut Rng,
    n_vocab: usize,
    depth: usize,
) -> Result<(), ModelError> {
    session.reset();
    if depth > 0 {
        let toks = random_tokens(rng, depth, n_vocab);
        session.eval_with(&toks, LogitsMode::Last, |_| ())?;
    }
    Ok(())
}

/// Most repetitions `-r` takes: llama-bench's default is 5; a typo must not ask for days.
const MAX_REPS: usize = 1000;

/// Refuses counts no run can use, before the model is loaded.
fn check_args(a: &BenchArgs) -> Result<(), ModelError> {
    if !(1..=MAX_REPS).contains(&a.reps) {
        return Err(ModelError::InvalidArgument(format!(
            "-r {}: give 1 to {MAX_REPS} repetitions per test",
            a.reps
        )));
    }
    if !a.n_prompt.iter().chain(&a.n_gen).any(|&n| n > 0) {
        return Err(ModelError::InvalidArgument(
            "-p and -n are all 0: give at least one prompt or generation length above 0".into(),
        ));
    }
    Ok(())
}

pub(super) fn bench(a: &BenchArgs) -> Result<(), ModelError> {
    check_args(a)?;
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
    let deepest = a.n_depth.iter().copied().max().unwrap_or(0);
    // Saturating: two counts near usize::MAX must not wrap into a small, accepted one.
    let needed = longest.saturating_add(deepest);
    opts.n_ctx = opts.n_ctx.max(needed).min(cfg.n_ctx_train);
    // Refused before any work: a test longer than the context would first make its tokens
    // (gigabytes for a mistyped count) and only then find the context full.
    if needed > opts.n_ctx {
        return Err(ModelError::InvalidArgument(format!(
            "a test of {longest} tokens does not fit the context of {} positions after a depth \
             of {deepest} (the model's maximum is {})",
            opts.n_ctx, cfg.n_ctx_train
        )));
    }
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
    let mut gen_speeds = Vec::new();
    for &depth in &a.n_depth {
        fill_depth(&mut session, &mut rng, cfg.n_vocab, depth)?;
        for &(n, gen) in &tests {
            // One untimed warm-up run, as llama-bench does: the whole prompt for pp (a shorter batch
            // would leave the first timed run to build and allocate the n-token graph, its GEMM
            // workspaces and kernels), a few tokens for tg (every step has the same shapes).
            let warm = if gen { n.min(16) } else { n };
            run_once(&mut session, &mut rng, cfg.n_vocab, warm, gen, depth)?;
            let mut speeds = Vec::new();
            for _ in 0..a.reps {
                speeds.push(run_once(
                    &mut session,
                    &mut rng,
                    cfg.n_vocab,
                    n,
                    gen,
                    depth,
                )?);
            }
            let (mean, sd) = mean_sd(&speeds);
            if gen && depth == 0 {
                gen_speeds.push((n, mean));
            }
            let mut test = format!("{}{}", if gen { "tg" } else { "pp" }, n);
            if depth > 0 {
                test = format!("{test} @ d{depth}");
            }
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
    }
    if a.bandwidth {
        report_bandwidth(&session, file, &gen_speeds)?;
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
    // Argument mistakes are reported before minutes of loading, in the library's words.
    let min = crate::perplexity::MIN_WINDOW;
    if a.m.ctx.is_some_and(|c| c != 0 && c < min) {
        return Err(ModelError::InvalidArgument(format!(
            "-c {}: a perplexity window needs at least {min} tokens (half of it is context, \
             half is scored)",
            a.m.ctx.unwrap_or(0)
        )));
    }
    if a.chunks == Some(0) {
        return Err(ModelError::InvalidArgument(
            "--chunks 0 evaluates nothing: give at least 1, or leave it out for the whole text"
                .into(),
        ));
    }
    let text = std::fs::read_to_string(&a.file).map_err(|e| ModelError::Io {
        path: a.file.clone(),
        source: e,
    })?;
    let tm = a.m.load()?;
    // As llama-perplexity: BOS per the metadata, special-token text left as plain text.
    let tokens = tm.tokenizer().encode(&text, true, false);
    // Windows run in batches of -b tokens: memory holds one batch's logits at a time.
    let opts = a.m.session_options(&tm)?;
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

#[cfg(test)]
mod tests {
    use super::weight_bytes_per_token;

    /// A tiny synthetic model of `arch` (written to the temp dir) and its file.
    fn tiny(arch: &str) -> gguf::GgufFile {
        let path = std::env::temp_dir().join(format!(
            "rocmforge-bench-{arch}-{}.gguf",
            std::process::id()
        ));
        crate::synth::write_model(arch, &path, 3).expect("write synthetic model");
        let file = gguf::GgufFile::open(&path).expect("open synthetic model");
        let _ = std::fs::remove_file(&path);
        file
    }

    #[test]
    fn a_token_reads_one_embedding_row_unless_the_head_is_tied() {
        let llama = tiny("llama");
        let all: u64 = llama.tensors().iter().map(|t| t.size).sum();
        let embd = llama.tensor("token_embd.weight").expect("embedding");
        assert!(llama.tensor("output.weight").is_some());
        let row = embd.size / embd.dims[1];
        assert_eq!(weight_bytes_per_token(&llama), all - embd.size + row);

        // Gemma's head is the embedding table itself: every byte is read.
        let gemma = tiny("gemma3");
        assert!(gemma.tensor("output.weight").is_none());
        let all: u64 = gemma.tensors().iter().map(|t| t.size).sum();
        assert_eq!(weight_bytes_per_token(&gemma), all);
    }

    /// A token reads the experts it uses of each `_exps` stack (2 of 8 in `tiny-moe`).
    #[test]
    fn a_token_reads_only_its_experts() {
        let path =
            std::env::temp_dir().join(format!("rocmforge-bench-moe-{}.gguf", std::process::id()));
        let o =
            crate::synth::SynthOptions::parse("qwen3moe", "tiny-moe", "q8_0", 3).expect("options");
        crate::synth::write(&o, None, &path).expect("write synthetic model");
        let file = gguf::GgufFile::open(&path).expect("open synthetic model");
        let _ = std::fs::remove_file(&path);
        let (mut dense, mut experts) = (0, 0);
        for t in file.tensors() {
            if t.name.contains("_exps.") {
                assert_eq!(t.dims.last(), Some(&8), "{}", t.name);
                experts += t.size;
            } else if t.name == "token_embd.weight" {
                dense += t.size / t.dims[1];
            } else {
                dense += t.size;
            }
        }
        assert!(experts > 0);
        assert_eq!(weight_bytes_per_token(&file), dense + experts / 4);
    }

    #[test]
    fn counts_no_run_can_use_are_refused_before_loading() {
        use clap::Parser;

        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            a: super::BenchArgs,
        }
        for (args, words) in [
            (&["-r", "0"][..], "-r 0: give 1 to 1000"),
            (
                &["-r", "18446744073709551615"],
                "-r 18446744073709551615: give 1 to 1000",
            ),
            (
                &["-p", "0", "-n", "0"],
                "at least one prompt or generation length",
            ),
        ] {
            let argv = ["bench", "-m", "/nonexistent"].iter().chain(args);
            let a = Cli::try_parse_from(argv).expect("parse").a;
            let e = super::bench(&a).expect_err("refused");
            assert!(
                matches!(e, crate::error::ModelError::InvalidArgument(_)),
                "{args:?}: {e:?}"
            );
            assert!(e.to_string().contains(words), "{args:?}: {e}");
        }
    }

    #[test]
    fn a_test_longer_than_the_context_is_refused_before_it_runs() {
        use clap::Parser;

        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            a: super::BenchArgs,
        }
        let path =
            std::env::temp_dir().join(format!("rocmforge-bench-long-{}.gguf", std::process::id()));
        crate::synth::write_model("llama", &path, 3).expect("write synthetic model");
        let m = path.to_str().expect("utf-8 path");
        // A mistyped count: refused at once, not after making a billion prompt tokens.
        let argv = ["bench", "-m", m, "-p", "999999999", "-n", "1", "-t", "1"];
        let a = Cli::try_parse_from(argv).expect("parse").a;
        let e = super::bench(&a).expect_err("longer than the context");
        // A depth and a length whose sum wraps around: refused, not wrapped into a small one.
        let argv = ["bench", "-m", m, "-p", "2", "-n", "0", "-t", "1"];
        let depth = ["-d", "18446744073709551615"];
        let a = Cli::try_parse_from(argv.iter().chain(&depth))
            .expect("parse")
            .a;
        let wrapped = super::bench(&a).expect_err("wrapping depth");
        let _ = std::fs::remove_file(&path);
        let msg = e.to_string();
        assert!(msg.contains("999999999 tokens does not fit"), "{msg}");
        assert!(msg.contains("maximum is 2048"), "{msg}");
        let msg = wrapped.to_string();
        assert!(msg.contains("depth of 18446744073709551615"), "{msg}");
    }
}
