//! Latency of a tensor split's all-reduce between the GPUs of one process: every visible GPU is a
//! rank with its own scheduler (as `--split-mode tensor` runs them), each replaying a captured
//! graph of 64 chained in-place all-reduces of 4096 floats (an 8B decode step's: two per layer,
//! one token's hidden state), with the collective library for every message and with the
//! one-shot peer all-reduce. Needs 2 or more GPUs. Run:
//! `NCCL_NVLS_ENABLE=0 cargo bench -p rocmforge-ggml-graph --features hip --bench all_reduce`;
//! `ALL_REDUCE_FLOATS=4096,32768` picks the message sizes.

use std::sync::Arc;
use std::time::Instant;

use rocmforge_ggml_graph::hip::{device_count, HipCollective, HipDevice};
use rocmforge_ggml_graph::{
    AllReduceKind, Collective, CollectiveOptions, DType, Device, Graph, Scheduler, TensorId,
};

/// All-reduces per step.
const CHAIN: usize = 64;
/// Timed steps per measurement (after the first run, the capture's and a warm-up replay).
const STEPS: usize = 200;

/// Every rank's graph: the input summed over the ranks `CHAIN` times in a row (each sum doubles
/// on two ranks: 2^64 stays finite in f32).
fn chain(n: usize) -> (Graph, TensorId, TensorId) {
    let mut g = Graph::new();
    let x = g.input("x", DType::F32, &[n]).expect("input");
    let mut y = x;
    for _ in 0..CHAIN {
        y = g.all_reduce(&[y]).expect("all_reduce");
    }
    g.mark_output(y).expect("output");
    (g, x, y)
}

/// Microseconds per all-reduce of `n` floats with collectives `kind` over `gpus`, or why not.
fn measure(
    gpus: &[Arc<HipDevice>],
    kind: AllReduceKind,
    n: usize,
) -> Result<(f64, String), String> {
    let opts = CollectiveOptions {
        all_reduce: kind,
        ..CollectiveOptions::default()
    };
    let colls = HipCollective::per_rank(gpus, &opts).map_err(|e| e.to_string())?;
    let name = colls[0].name().to_owned();
    let mut ranks: Vec<Scheduler> = gpus
        .iter()
        .zip(colls)
        .map(|(h, c)| {
            let mut s = Scheduler::new(vec![h.clone() as Arc<dyn Device>]).expect("scheduler");
            s.set_collective(Some(Arc::new(c) as Arc<dyn Collective>));
            s
        })
        .collect();
    let (g, x, y) = chain(n);
    let xb: Vec<u8> = (0..n)
        .flat_map(|i| (1e-6 * (i % 97) as f32).to_le_bytes())
        .collect();
    let key = Some(1);
    // The first run and the capture: a thread per rank (each waits on the others).
    for _ in 0..2 {
        std::thread::scope(|sc| {
            let hs: Vec<_> = ranks
                .iter_mut()
                .map(|s| {
                    let (g, xb) = (&g, &xb);
                    sc.spawn(move || s.run_keyed(key, g, &[(x, xb)]).map_err(|e| e.to_string()))
                })
                .collect();
            hs.into_iter()
                .try_for_each(|h| h.join().expect("rank thread"))
        })?;
    }
    let step = |ranks: &mut [Scheduler]| -> Result<(), String> {
        for s in ranks.iter_mut() {
            s.run_keyed(key, &g, &[(x, &xb)])
                .map_err(|e| e.to_string())?;
        }
        for s in ranks.iter() {
            s.output_f32(y).map_err(|e| e.to_string())?;
        }
        Ok(())
    };
    step(&mut ranks)?;
    if !ranks.iter().all(|s| s.has_captured_graph()) {
        return Err("no captured graph".into());
    }
    let start = Instant::now();
    for _ in 0..STEPS {
        step(&mut ranks)?;
    }
    let per = start.elapsed().as_secs_f64() / (STEPS * CHAIN) as f64;
    Ok((per * 1e6, name))
}

fn main() {
    let n = device_count();
    if n < 2 {
        println!("all_reduce: skipped, {n} GPU(s) (2 or more needed)");
        return;
    }
    let gpus: Vec<Arc<HipDevice>> = (0..n)
        .map(|i| Arc::new(HipDevice::new(i as i32).expect("GPU")))
        .collect();
    let sizes: Vec<usize> = std::env::var("ALL_REDUCE_FLOATS")
        .ok()
        .map(|v| v.split(',').filter_map(|s| s.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![4096, 4096 * 8, 4096 * 16]);
    println!("{n} GPUs, {CHAIN} chained all-reduces per replayed step, {STEPS} steps");
    for &floats in &sizes {
        for kind in [AllReduceKind::Nccl, AllReduceKind::Peer] {
            match measure(&gpus, kind, floats) {
                Ok((us, name)) => println!(
                    "{floats:>7} floats ({:>4} KiB) {kind:?}: {us:6.2} us per all-reduce ({name})",
                    floats * 4 / 1024
                ),
                Err(e) => println!("{floats:>7} floats {kind:?}: {e}"),
            }
        }
    }
}
