//! Transfer benchmarks: H2D/D2H bandwidth, pageable vs pinned (the pinned figure is the link's
//! measured peak), a decode step's host traffic (two tiny input writes and a 1 MiB logits read
//! of part of an arena) through the blocking pageable calls vs the stream's pinned staging, and
//! a model's weights uploaded into one arena vs one allocation per tensor.
//! Run: `cargo bench -p rocmforge-gpu-mem --bench transfer` (prints "skipped: <reason>" without a GPU).

use std::time::Instant;

use rocmforge_gpu_mem::testing::gpu_or_skip;
use rocmforge_gpu_mem::*;
use table::{synthetic_tensor, tensor_table};

#[path = "../tests/common/table.rs"]
mod table;

const REPS: usize = 7;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn time(mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    f()?; // warm-up
    let mut t = Vec::with_capacity(REPS);
    for _ in 0..REPS {
        let s = Instant::now();
        f()?;
        t.push(s.elapsed().as_secs_f64());
    }
    Ok(median(t))
}

fn bandwidth(dev: &Device) -> Result<()> {
    let bytes = 256usize << 20;
    let stream = Stream::new(dev)?;
    let mut dbuf = DeviceBuffer::<u8>::new(dev, bytes, "bench bandwidth")?;
    let pageable: Vec<u8> = (0..bytes).map(|i| i as u8).collect();
    let mut pageable_back = vec![0u8; bytes];
    let mut pinned = PinnedHostBuffer::<u8>::new(dev, bytes)?;
    pinned.as_mut_slice()?.copy_from_slice(&pageable);
    let mut pinned_back = PinnedHostBuffer::<u8>::new(dev, bytes)?;

    let h2d_pageable = time(|| stream.write(&pageable, &mut dbuf.view_mut()))?;
    let h2d_pinned = time(|| {
        stream.write_pinned(&mut pinned, 0, &mut dbuf.view_mut())?;
        stream.synchronize()
    })?;
    let d2h_pageable = time(|| stream.read(&dbuf.view(), &mut pageable_back))?;
    let d2h_pinned = time(|| {
        stream.read_pinned(&dbuf.view(), &mut pinned_back)?;
        pinned_back.as_slice().map(|_| ())
    })?;
    assert_eq!(pageable_back, pageable, "D2H pageable contents");
    assert_eq!(
        pinned_back.as_slice()?,
        &pageable[..],
        "D2H pinned contents"
    );

    let gbs = |s: f64| bytes as f64 / s / 1e9;
    println!(
        "transfer bandwidth, {} MiB per copy, median of {REPS} (wall clock incl. sync):",
        bytes >> 20
    );
    println!(
        "  H2D pageable {:7.2} GB/s  pinned {:7.2} GB/s  pageable/pinned {:.2}x",
        gbs(h2d_pageable),
        gbs(h2d_pinned),
        h2d_pinned / h2d_pageable
    );
    println!(
        "  D2H pageable {:7.2} GB/s  pinned {:7.2} GB/s  pageable/pinned {:.2}x",
        gbs(d2h_pageable),
        gbs(d2h_pinned),
        d2h_pinned / d2h_pageable
    );
    println!("  (pinned = the link's measured peak in this run)");
    Ok(())
}

/// A decode step's host traffic, as the graph scheduler makes it: token id and position written
/// (4 bytes each) into an arena, then 1 MiB of logits read back from a sub-range of it into a
/// new vector. Blocking pageable calls (`write_range` + `read`) vs pinned staging
/// (`queue_write_range` + `read_staged`); microseconds per step, median of REPS x STEPS.
fn decode_step_io(dev: &Device) -> Result<()> {
    const STEPS: usize = 200;
    let stream = Stream::new(dev)?;
    let logits = 1usize << 18; // f32 values: 1 MiB, Gemma 3's vocabulary
    let mut arena = DeviceBuffer::<u8>::new(dev, (4 << 20) + 4 * logits, "bench arena")?;
    stream.memset(&mut arena.view_mut(), 0x3f)?;
    let whole = MemRange::of_buffer(&arena);
    let (ids, pos) = (whole.sub(256, 4)?, whole.sub(512, 4)?);
    let out = whole.sub(4 << 20, 4 * logits)?.view::<f32>()?;
    let step = |staged: bool, t: usize| -> Result<Vec<f32>> {
        let tok = (t as u32).to_le_bytes();
        let mut v = vec![0f32; logits];
        if staged {
            stream.queue_write_range(&tok, ids)?;
            stream.queue_write_range(&tok, pos)?;
            stream.read_staged(&out, &mut v)?;
        } else {
            stream.write_range(&tok, ids)?;
            stream.write_range(&tok, pos)?;
            stream.read(&out, &mut v)?;
        }
        Ok(v)
    };
    let per_step = |staged: bool| {
        time(|| {
            for t in 0..STEPS {
                std::hint::black_box(step(staged, t)?);
            }
            Ok(())
        })
        .map(|s| s / STEPS as f64 * 1e6)
    };
    let blocking = per_step(false)?;
    let staged = per_step(true)?;
    assert!(
        step(false, 1)? == step(true, 1)?,
        "the two paths read different logits"
    );
    println!(
        "decode-step host traffic (2 x 4-byte writes + 1 MiB staged read), median of {REPS} x {STEPS}:"
    );
    println!(
        "  blocking pageable {blocking:8.1} us/step  pinned staging {staged:8.1} us/step  \
         speedup {:.2}x",
        blocking / staged
    );
    Ok(())
}

fn model_upload(dev: &Device) -> Result<()> {
    let (source, table) = match tensor_table() {
        Ok(t) => t,
        Err(why) => {
            println!("model upload: skipped: no tensor table ({why})");
            return Ok(());
        }
    };
    let data: Vec<Vec<u8>> = table
        .iter()
        .enumerate()
        .map(|(i, (_, b))| synthetic_tensor(i, *b))
        .collect();
    let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
    let total: u64 = table.iter().map(|t| t.1).sum();

    // One arena, uploaded through double-buffered pinned staging on a second stream.
    let mut arena_times = Vec::new();
    let mut arena_calls = 0;
    let mut up = WeightUploader::new(dev, 16 << 20)?;
    for _ in 0..3 {
        let c0 = dev.allocation_calls();
        let t = Instant::now();
        let (arena, _slots) = up.upload_bytes(&refs, 1 << 30, "bench arena")?;
        arena_times.push(t.elapsed().as_secs_f64());
        arena_calls = dev.allocation_calls() - c0;
        drop(arena);
    }
    // One allocation and one pageable copy per tensor.
    let stream = Stream::new(dev)?;
    let mut per_times = Vec::new();
    let mut per_calls = 0;
    for _ in 0..3 {
        let c0 = dev.allocation_calls();
        let t = Instant::now();
        let mut bufs = Vec::with_capacity(refs.len());
        for r in &refs {
            let mut b = DeviceBuffer::<u8>::new(dev, r.len(), "bench per-tensor")?;
            stream.write(r, &mut b.view_mut())?;
            bufs.push(b);
        }
        per_times.push(t.elapsed().as_secs_f64());
        per_calls = dev.allocation_calls() - c0;
        drop(bufs);
    }
    let (ta, tp) = (median(arena_times), median(per_times));
    println!(
        "model upload: {} tensors, {:.1} MiB (table from {source}), median of 3:",
        table.len(),
        total as f64 / (1 << 20) as f64
    );
    println!(
        "  arena + pinned staging: {:8.2} ms, {arena_calls} allocation call(s), {:.2} GB/s",
        ta * 1e3,
        total as f64 / ta / 1e9
    );
    println!(
        "  one alloc per tensor:   {:8.2} ms, {per_calls} allocation call(s), {:.2} GB/s",
        tp * 1e3,
        total as f64 / tp / 1e9
    );
    println!(
        "  arena speedup {:.2}x, allocation calls {per_calls} -> {arena_calls}",
        tp / ta
    );
    Ok(())
}

fn main() {
    let Some(dev) = gpu_or_skip() else {
        return;
    };
    println!(
        "device: {} ({}, {})",
        dev.info().name,
        dev.info().arch,
        dev.info().platform
    );
    let run = || -> Result<()> {
        bandwidth(&dev)?;
        decode_step_io(&dev)?;
        model_upload(&dev)
    };
    if let Err(e) = run() {
        eprintln!("benchmark failed: {e}");
        std::process::exit(1);
    }
    if let Err(e) = dev.check_errors() {
        eprintln!("{e}");
        std::process::exit(1);
    }
}
