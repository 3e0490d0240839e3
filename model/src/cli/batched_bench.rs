//! `batched-bench`: throughput of the batching engine with many sequences at once, with the flags
//! and table of llama.cpp's `llama-batched-bench`.

use std::sync::Arc;
use std::time::Instant;

use clap::Args;

use super::ModelArgs;
use crate::batch::{BatchEngine, EngineOptions, EngineStats, Event, Request, StepPadding};
use crate::error::ModelError;
use crate::sampling::Rng;

/// `batched-bench` arguments (`-npp`, `-ntg`, `-npl` are accepted as in llama.cpp).
#[derive(Args, Debug)]
pub struct BatchedBenchArgs {
    #[command(flatten)]
    m: ModelArgs,
    /// Prompt lengths (comma-separated).
    #[arg(long = "npp", value_delimiter = ',', default_value = "128")]
    npp: Vec<usize>,
    /// Tokens generated per sequence (comma-separated).
    #[arg(long = "ntg", value_delimiter = ',', default_value = "128")]
    ntg: Vec<usize>,
    /// Parallel sequences (comma-separated; at most 4096).
    #[arg(long = "npl", value_delimiter = ',', default_value = "1,2,4,8")]
    npl: Vec<usize>,
    /// Positions per KV block.
    #[arg(long, default_value_t = 16)]
    block_size: usize,
    /// Sum each step's mat-muls in the batched order of the whole step (faster on the CPU for
    /// K-quant weights) instead of each sequence's own order (bit-exact with one sequence alone).
    #[arg(long)]
    batched_order: bool,
    /// Pad decode steps to 1, 2, 4, 6, 8, 12, 16, 24... sequences: `auto` (where a GPU runs
    /// layers), `on`, `off`.
    #[arg(long, default_value = "auto")]
    step_padding: StepPadding,
    /// Launch every GPU step node by node instead of replaying the captured launches of an
    /// earlier step of the same shape (as `ROCMFORGE_GPU_GRAPH=0`; same results).
    #[arg(long)]
    no_graph_capture: bool,
}

/// One row of the table.
struct Row {
    t_pp: f64,
    t_tg: f64,
    /// The engine's counters over the prompt phase and the generation phase (as of the steps
    /// published by then).
    pp: EngineStats,
    tg: EngineStats,
}

/// `b - a` of the cumulative counters.
fn delta(a: &EngineStats, b: &EngineStats) -> EngineStats {
    EngineStats {
        steps: b.steps - a.steps,
        replayed_steps: b.replayed_steps - a.replayed_steps,
        padded_steps: b.padded_steps - a.padded_steps,
        build_us: b.build_us - a.build_us,
        run_us: b.run_us - a.run_us,
        output_us: b.output_us - a.output_us,
        sample_us: b.sample_us - a.sample_us,
        ..*b
    }
}

/// Host time per step of `s` (milliseconds), as the four parts the engine counts.
fn per_step_line(s: &EngineStats) -> String {
    let per_step = |us: u64| us as f64 / 1e3 / s.steps.max(1) as f64;
    format!(
        "graph build {:.3} ms, inputs + launch {:.3} ms, logits wait {:.3} ms, sampling \
         {:.3} ms",
        per_step(s.build_us),
        per_step(s.run_us),
        per_step(s.output_us),
        per_step(s.sample_us)
    )
}

/// Runs `b` sequences of `pp` random prompt tokens and `tg` generated tokens each: the prompt
/// phase lasts until every sequence has its first token (sampled from the prompt's logits, as
/// llama-batched-bench does), the generation phase until every sequence has `tg` more.
fn run_one(
    e: &BatchEngine,
    rng: &mut Rng,
    n_vocab: usize,
    pp: usize,
    tg: usize,
    b: usize,
) -> Result<Row, ModelError> {
    let before = e.stats();
    let t0 = Instant::now();
    let mut rxs = Vec::with_capacity(b);
    for _ in 0..b {
        let prompt: Vec<u32> = (0..pp)
            .map(|_| (rng.next_u64() % n_vocab as u64) as u32)
            .collect();
        rxs.push(e.submit_channel(Request::greedy(prompt, tg + 1))?.1);
    }
    let closed = || ModelError::Device("the engine stopped mid-benchmark".into());
    let first = |rx: &std::sync::mpsc::Receiver<Event>| -> Result<(), ModelError> {
        match rx.recv().map_err(|_| closed())? {
            Event::Token { .. } => Ok(()),
            Event::Error(e) => Err(e),
            Event::Done { .. } => Err(ModelError::Device("a sequence ended early".into())),
        }
    };
    for rx in &rxs {
        first(rx)?;
    }
    let t_pp = t0.elapsed().as_secs_f64();
    // The engine publishes its counters after the step that emitted the first tokens; wait for
    // that (briefly: the events are already here) so the step lands in the prompt phase.
    let published = Instant::now();
    let at_tg = loop {
        let s = e.stats();
        if s.generated_tokens >= before.generated_tokens + b as u64
            || published.elapsed() > std::time::Duration::from_secs(1)
        {
            break s;
        }
        std::thread::sleep(std::time::Duration::from_micros(100));
    };
    for rx in &rxs {
        loop {
            match rx.recv().map_err(|_| closed())? {
                Event::Token { .. } => {}
                Event::Done { .. } => break,
                Event::Error(e) => return Err(e),
            }
        }
    }
    let t_tg = t0.elapsed().as_secs_f64() - t_pp;
    Ok(Row {
        t_pp,
        t_tg,
        pp: delta(&before, &at_tg),
        tg: delta(&at_tg, &e.stats()),
    })
}

/// Most positions per KV block `--block-size` takes.
const MAX_BLOCK_SIZE: usize = 1 << 16;
/// Most parallel sequences `-npl` takes (far beyond what fits any GPU's KV cache at useful
/// lengths; a typo cannot ask for billions).
const MAX_PARALLEL: usize = 4096;

/// Refuses lists and sizes no run can use, before the model is loaded: a test needs a prompt
/// and a sequence, and the totals must stay countable.
fn check_args(a: &BatchedBenchArgs, n_ctx_train: usize) -> Result<(), ModelError> {
    let bad = |m: String| Err(ModelError::InvalidArgument(m));
    if a.block_size == 0 || a.block_size > MAX_BLOCK_SIZE {
        return bad(format!(
            "--block-size {}: give 1 to {MAX_BLOCK_SIZE} positions per block",
            a.block_size
        ));
    }
    let over = |flag: &str, v: &[usize], max: usize| {
        v.iter()
            .find(|&&n| n > max)
            .map(|n| format!("{flag} {n}: at most {max}"))
    };
    let too_large = over("-npp", &a.npp, n_ctx_train)
        .or_else(|| over("-ntg", &a.ntg, n_ctx_train))
        .or_else(|| over("-npl", &a.npl, MAX_PARALLEL));
    if let Some(m) = too_large {
        return bad(format!(
            "{m} (the model's context is {n_ctx_train} positions)"
        ));
    }
    if !a.npp.iter().any(|&n| n > 0) || !a.npl.iter().any(|&n| n > 0) {
        return bad("-npp and -npl need at least one value above 0".into());
    }
    Ok(())
}

pub(super) fn batched_bench(a: &BatchedBenchArgs) -> Result<(), ModelError> {
    let tm = a.m.load()?;
    let model = Arc::new(tm.model().clone());
    check_args(a, model.config().n_ctx_train)?;
    let mut session = a.m.session_options(&tm)?;
    session.scheduler.graph_capture &= !a.no_graph_capture;
    let max_b = a.npl.iter().copied().max().unwrap_or(1).max(1);
    let longest =
        a.npp.iter().max().copied().unwrap_or(0) + a.ntg.iter().max().copied().unwrap_or(0) + 1;
    let n_ctx_per_seq = longest.min(model.config().n_ctx_train);
    // As llama-batched-bench, `-c` is the context of all sequences together.
    let kv_blocks =
        a.m.ctx
            .map(|c| c.div_ceil(a.block_size))
            .unwrap_or(max_b * n_ctx_per_seq.div_ceil(a.block_size));
    session.n_ctx = 0;
    let opts = EngineOptions {
        session: session.clone(),
        max_seqs: max_b,
        n_ctx_per_seq,
        block_size: a.block_size,
        kv_blocks: Some(kv_blocks),
        host_kv_limit: None,
        step_tokens: session.n_batch.max(max_b),
        prefix_cache: false,
        exact: !a.batched_order,
        swap: Default::default(),
        step_padding: a.step_padding,
    };
    let e = BatchEngine::start(Arc::clone(&model), opts)?;
    eprintln!("{}", e.device_plan());
    println!(
        "\nmain: n_kv_max = {}, n_batch = {}, block_size = {}, n_threads = {}\n",
        kv_blocks * a.block_size,
        session.n_batch.max(max_b),
        a.block_size,
        session.n_threads
    );
    println!(
        "|    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |      T s |    S t/s |"
    );
    println!(
        "|-------|--------|------|--------|----------|----------|----------|----------|----------|----------|"
    );
    let n_vocab = model.config().n_vocab;
    let mut rng = Rng::new(1234);
    let mut decode = Vec::new();
    let mut phases = Vec::new();
    // One short warm-up request: page faults and first-pass allocations are not measured.
    run_one(
        &e,
        &mut rng,
        n_vocab,
        8.min(n_ctx_per_seq.saturating_sub(2)).max(1),
        1,
        1,
    )?;
    let mut rows = 0usize;
    for &pp in &a.npp {
        for &tg in &a.ntg {
            for &b in &a.npl {
                let n_kv = b * (pp + tg);
                if pp == 0 || b == 0 || n_kv > kv_blocks * a.block_size {
                    continue;
                }
                let r = run_one(&e, &mut rng, n_vocab, pp, tg, b)?;
                rows += 1;
                let t = r.t_pp + r.t_tg;
                decode.push((pp, tg, b, (b * tg) as f64 / r.t_tg));
                phases.push((pp, tg, b, r.pp, r.tg));
                println!(
                    "| {pp:5} | {tg:6} | {b:4} | {n_kv:6} | {:8.3} | {:8.2} | {:8.3} | {:8.2} | {t:8.3} | {:8.2} |",
                    r.t_pp,
                    (b * pp) as f64 / r.t_pp,
                    r.t_tg,
                    (b * tg) as f64 / r.t_tg,
                    n_kv as f64 / t
                );
            }
        }
    }
    if rows > 0 {
        report_bandwidth(&e, tm.model().file(), &decode)?;
    }
    let s = e.stats();
    e.shutdown();
    if rows == 0 {
        return Err(ModelError::InvalidArgument(format!(
            "no -npp/-ntg/-npl combination fits the KV cache of {} positions (B x (PP + TG) \
             must fit; -c sets it)",
            kv_blocks * a.block_size
        )));
    }
    eprintln!(
        "\n{} forward steps, {} preemptions ({} swapped to host memory); S_TG counts the TG \
         tokens each sequence makes after its first (which the prompt phase samples)",
        s.steps, s.preemptions, s.swapped_out
    );
    eprintln!("host time per step: {}", per_step_line(&s));
    // The generation phase alone (decode steps): a replayed step's launch is one call and its
    // GPU time shows in the logits wait; a step launched node by node waits for its work in
    // "inputs + launch".
    for (pp, tg, b, p, t) in &phases {
        eprintln!(
            "PP {pp} TG {tg} B {b}, prompt: {} steps, {}",
            p.steps,
            per_step_line(p)
        );
        eprintln!(
            "PP {pp} TG {tg} B {b}, generation: {} steps ({} replayed, {} padded), {}",
            t.steps,
            t.replayed_steps,
            t.padded_steps,
            per_step_line(t)
        );
    }
    Ok(())
}

/// Prints each row's aggregate decode speed against the bandwidth limit of one step: a step
/// reads every weight once whatever the batch, so `S_TG / B` steps per second read `S_TG / B`
/// times the weight bytes of a token; the limit is the GPU's device-to-device copy bandwidth
/// (measured now) over those bytes. Only when every layer and the output head are on the GPU.
fn report_bandwidth(
    e: &BatchEngine,
    file: &gguf::GgufFile,
    decode: &[(usize, usize, usize, f64)],
) -> Result<(), ModelError> {
    let split = &e.device_plan().split;
    if !split.output_on_gpu() || split.gpu_layers() < split.n_layer {
        eprintln!("bandwidth: not measured, the model is not all on the GPU");
        return Ok(());
    }
    let Some(bw) = e.gpu_copy_bandwidth() else {
        eprintln!("bandwidth: not measured, the engine runs on the CPU");
        return Ok(());
    };
    let bw = bw?;
    let bytes = super::bench::weight_bytes_per_token(file) as f64;
    let limit = bw / bytes;
    println!(
        "\nbandwidth limit: {limit:.1} steps/s ({:.3} GB of weights per step over the {:.0} GB/s \
         device-to-device copy bandwidth measured now)",
        bytes / 1e9,
        bw / 1e9
    );
    for &(pp, tg, b, s_tg) in decode {
        let steps = s_tg / b as f64;
        println!(
            "PP {pp} TG {tg} B {b}: S_TG {s_tg:.2} t/s = {steps:.1} steps/s, {:.1}% of the \
             bandwidth limit ({:.0} GB/s of weights)",
            100.0 * steps / limit,
            steps * bytes / 1e9
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::{check_args, BatchedBenchArgs};

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        a: BatchedBenchArgs,
    }

    fn args(v: &[&str]) -> BatchedBenchArgs {
        let argv = ["batched-bench"].iter().chain(v).copied();
        Cli::try_parse_from(argv).expect("parse").a
    }

    #[test]
    fn lists_and_sizes_no_run_can_use_are_refused() {
        assert!(check_args(&args(&[]), 2048).is_ok());
        for (v, words) in [
            (
                &["--npp", "0", "--ntg", "0", "--npl", "0"][..],
                "at least one value above 0",
            ),
            (&["--block-size", "0"], "--block-size 0"),
            (&["--npp", "99999999"], "-npp 99999999: at most 2048"),
            (&["--ntg", "18446744073709551615"], "at most 2048"),
            (&["--npl", "100000"], "-npl 100000: at most 4096"),
        ] {
            let e = check_args(&args(v), 2048).expect_err("refused");
            assert!(e.to_string().contains(words), "{v:?}: {e}");
        }
    }
}
