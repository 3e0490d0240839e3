//! Host traffic of the HIP backend's buffers through the graph's `Buffer` trait: small writes
//! queued from pinned memory without waiting, reads through the stream's reusable pinned buffer
//! (growing it, chunking reads past its largest size, staging weight-arena slots), and keyed
//! decode-style scheduler runs whose inputs change every step while the graph is replayed.
//! Without a GPU (or built kernels) each test prints why it skipped; `ROCMFORGE_REQUIRE_GPU=1`
//! makes that a failure.

use std::sync::Arc;

use gpu_mem::host_io::{QUEUED_WRITE_MAX, READ_CHUNK};

use super::{f32_bytes, hip};
use crate::backend::{CpuDevice, Device};
use crate::cpu::CpuBackend;
use crate::exec::WeightBytes;
use crate::graph::Graph;
use crate::sched::Scheduler;
use crate::tensor::{DType, TensorId};

/// Binds the f32 `values` as weight `name` of shape `dims`.
fn bind_f32(s: &mut Scheduler, name: &str, dims: &[usize], values: &[f32]) {
    s.bind_weight(
        name,
        DType::F32,
        dims,
        WeightBytes::from_vec(f32_bytes(values)),
    )
    .unwrap_or_else(|e| panic!("bind {name}: {e}"));
}

fn pattern(pass: u32, i: usize) -> u32 {
    (pass.wrapping_mul(0x9e37_79b9) ^ (i as u32).wrapping_mul(0x85eb_ca6b)).rotate_left(pass % 31)
}

/// Thousands of tiny writes, each from the same reused host slice, then writes that grow a
/// ring block and one large blocking write, overlapping each other: one read must see every
/// write, in order (the last write of a byte wins).
#[test]
fn queued_small_writes_then_one_read_see_every_write_in_order() {
    let Some(h) = hip() else { return };
    let n = 1usize << 18; // u32 elements: 1 MiB
    let buf = h.buffer_type().alloc(n * 4).expect("alloc");
    let mut want = vec![0u32; n];
    let before = h.queued_writes();
    let mut one = [0u8; 4];
    let mut small = 0u64;
    for pass in 0..3u32 {
        // Strided so each pass touches scattered words and later passes overwrite earlier ones.
        for i in (pass as usize..n).step_by(97) {
            let v = pattern(pass, i);
            one.copy_from_slice(&v.to_le_bytes());
            buf.write(i * 4, &one).expect("small write");
            want[i] = v;
            small += 1;
        }
    }
    assert_eq!(
        h.queued_writes() - before,
        small,
        "every 4-byte write was queued"
    );
    // A write of the largest queued size grows a ring block; then one past it blocks.
    let big: Vec<u32> = (0..QUEUED_WRITE_MAX / 4).map(|i| pattern(7, i)).collect();
    buf.write(4 * 1000, bytemuck::cast_slice(&big))
        .expect("largest queued write");
    want[1000..1000 + big.len()].copy_from_slice(&big);
    assert_eq!(h.queued_writes() - before, small + 1);
    let blocking: Vec<u32> = (0..QUEUED_WRITE_MAX / 4 + 1)
        .map(|i| pattern(8, i))
        .collect();
    buf.write(4 * 20_000, bytemuck::cast_slice(&blocking))
        .expect("blocking write");
    want[20_000..20_000 + blocking.len()].copy_from_slice(&blocking);
    assert_eq!(
        h.queued_writes() - before,
        small + 1,
        "a large write blocks"
    );
    // Small writes queued right after the blocking one, over the same words.
    for i in 20_000..20_050 {
        let v = pattern(9, i);
        buf.write(i * 4, &v.to_le_bytes()).expect("small write");
        want[i] = v;
    }
    let mut back = vec![0u32; n];
    buf.read(0, bytemuck::cast_slice_mut(&mut back))
        .expect("read");
    let bad = back.iter().zip(&want).position(|(a, b)| a != b);
    assert_eq!(bad, None, "first wrong word");
    // Reads of parts of the buffer are sub-allocation views (staged on the device).
    let mut part = vec![0u32; 333];
    buf.read(4 * 777, bytemuck::cast_slice_mut(&mut part))
        .expect("part");
    assert_eq!(part, want[777..777 + 333]);
    let mut odd = vec![0u8; 5];
    buf.read(4 * 1000 + 3, &mut odd).expect("odd read");
    let want_bytes: &[u8] = bytemuck::cast_slice(&want);
    assert_eq!(odd, want_bytes[4 * 1000 + 3..4 * 1000 + 8]);
    assert!(buf.read(n * 4 - 2, &mut [0u8; 4]).is_err());
    assert!(buf.write(n * 4 - 2, &[0u8; 4]).is_err());
}

/// The pinned read buffer starts small, grows to fit a larger read (to a power of two), reads
/// past its largest size go through it in chunks, and it never shrinks; reads of weight-arena
/// slots (sub-allocations of one arena) come back exact, and writes to them land.
#[test]
fn reads_grow_the_pinned_buffer_chunk_large_reads_and_stage_arena_slots() {
    let Some(h) = hip() else { return };
    let n = (READ_CHUNK * 5 / 2) / 4 + 3; // u32 elements: 2.5 chunks and a bit
    let host: Vec<u32> = (0..n).map(|i| pattern(1, i)).collect();
    let buf = h.buffer_type().alloc(n * 4).expect("alloc");
    buf.write(0, bytemuck::cast_slice(&host)).expect("write");
    assert_eq!(h.read_buffer_bytes(), 0);
    let mut few = [0u32; 4];
    buf.read(4 * 10, bytemuck::cast_slice_mut(&mut few))
        .expect("small read");
    assert_eq!(few, host[10..14]);
    let first = h.read_buffer_bytes();
    assert!(first >= 16, "read buffer {first} bytes");
    let mut mib = vec![0u32; (1 << 18) + 5];
    buf.read(4 * 12_345, bytemuck::cast_slice_mut(&mut mib))
        .expect("1 MiB read");
    assert_eq!(mib, host[12_345..12_345 + mib.len()]);
    let grown = h.read_buffer_bytes();
    assert_eq!(grown, (mib.len() * 4).next_power_of_two(), "grown to fit");
    let mut all = vec![0u32; n];
    buf.read(0, bytemuck::cast_slice_mut(&mut all))
        .expect("whole read");
    let bad = all.iter().zip(&host).position(|(a, b)| a != b);
    assert_eq!(bad, None, "first wrong word of the chunked read");
    assert_eq!(h.read_buffer_bytes(), READ_CHUNK, "capped at one chunk");
    buf.read(4 * 10, bytemuck::cast_slice_mut(&mut few))
        .expect("small read again");
    assert_eq!(few, host[10..14]);
    assert_eq!(h.read_buffer_bytes(), READ_CHUNK, "never shrinks");

    let sizes = [1000usize, 3, 70_001, 4096];
    let tensors: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(t, &s)| (0..s).map(|i| (pattern(t as u32, i) >> 8) as u8).collect())
        .collect();
    let refs: Vec<&[u8]> = tensors.iter().map(Vec::as_slice).collect();
    let slots = h
        .buffer_type()
        .alloc_weights(&refs, &mut |_| {})
        .expect("weights");
    for (t, (slot, data)) in slots.iter().zip(&tensors).enumerate() {
        let mut back = vec![0u8; data.len()];
        slot.read(0, &mut back).expect("slot read");
        assert_eq!(&back, data, "slot {t}");
        if data.len() > 10 {
            let mut mid = vec![0u8; data.len() - 10];
            slot.read(7, &mut mid).expect("slot part");
            assert_eq!(mid, data[7..data.len() - 3], "slot {t} part");
        }
        // Slots take writes too (a KV cache's layers are slots of one arena).
        let flipped = [!data[0]];
        slot.write(0, &flipped).expect("slot write");
        let mut first = [0u8; 1];
        slot.read(0, &mut first).expect("slot read after write");
        assert_eq!(first, flipped, "slot {t} after a write");
    }
}

/// Decode-style steps: one keyed graph (embedding row of the step's token, a product with an
/// output matrix, plus a per-step bias input) run again and again with new inputs, captured and
/// replayed on the GPU. Every step's inputs are queued without waiting, and every step's output
/// must be that step's (a stale input would give another row) and match the CPU. The GPU's
/// output is written into host-mapped memory by its kernel, and equals the output of a
/// scheduler keeping it in device memory.
#[test]
fn keyed_decode_steps_queue_their_inputs_and_read_the_right_outputs() {
    let Some(h) = hip() else { return };
    let (k, vocab, n_out) = (64usize, 300usize, 3000usize);
    let mut g = Graph::new();
    let emb = g.weight("emb", DType::F32, &[k, vocab]).expect("emb");
    let w = g.weight("out", DType::F32, &[k, n_out]).expect("out");
    let ids = g.input("ids", DType::I32, &[1]).expect("ids");
    let bias = g.input("bias", DType::F32, &[n_out]).expect("bias");
    let x = g.get_rows(emb, ids).expect("get_rows");
    let y = g.mul_mat(w, x).expect("mul_mat");
    let y = g.reshape(y, &[n_out]).expect("reshape");
    let z = g.add(y, bias).expect("add");
    g.mark_output(z).expect("out");
    let emb_v: Vec<f32> = (0..k * vocab)
        .map(|i| (pattern(2, i) % 2001) as f32 / 1000.0 - 1.0)
        .collect();
    let w_v: Vec<f32> = (0..k * n_out)
        .map(|i| (pattern(3, i) % 2001) as f32 / 1000.0 - 1.0)
        .collect();
    let cpu: Arc<dyn Device> = Arc::new(CpuDevice::new(Arc::new(
        CpuBackend::new(2).expect("cpu backend"),
    )));
    let mut scheds = [
        Scheduler::new(vec![h.clone() as Arc<dyn Device>, cpu.clone()]).expect("gpu scheduler"),
        Scheduler::new(vec![cpu.clone()]).expect("cpu scheduler"),
        Scheduler::new(vec![h.clone() as Arc<dyn Device>, cpu]).expect("gpu scheduler"),
    ];
    scheds[2].set_mapped_outputs(false);
    for s in &mut scheds {
        s.set_graph_capture(true);
        bind_f32(s, "emb", &[k, vocab], &emb_v);
        bind_f32(s, "out", &[k, n_out], &w_v);
    }
    // The embedding (75 KiB) and output matrix are larger than a queued write: uploaded with
    // blocking writes, so only the steps' inputs count below.
    let steps = 12;
    let before = h.queued_writes();
    let mut prev: Option<Vec<f32>> = None;
    for step in 0..steps {
        let tok = [(step * 7 % vocab) as i32];
        let b: Vec<f32> = (0..n_out)
            .map(|i| (step * n_out + i) as f32 * 1e-4)
            .collect();
        let inputs: [(TensorId, &[u8]); 2] = [
            (ids, bytemuck::cast_slice(&tok)),
            (bias, bytemuck::cast_slice(&b)),
        ];
        let mut outs = Vec::new();
        for s in &mut scheds {
            s.run_keyed(Some(1), &g, &inputs).expect("run");
            let out = s.output_f32(z).expect("output");
            // The GPU's values seen in its pinned read buffer, the CPU's in place.
            let seen = s
                .with_output_f32(z, <[f32]>::to_vec)
                .expect("output in place");
            assert_eq!(seen, out, "step {step}: output read in place differs");
            outs.push(out);
        }
        let (gpu, want) = (&outs[0], &outs[1]);
        assert_eq!(gpu.len(), n_out);
        assert_eq!(
            &outs[2], gpu,
            "step {step}: mapped and device-memory outputs differ"
        );
        let (mut e, mut d) = (0f64, 0f64);
        for (a, b) in gpu.iter().zip(want) {
            e += f64::from(a - b).powi(2);
            d += f64::from(*b).powi(2);
        }
        let nmse = e / d.max(1e-30);
        assert!(nmse < 1e-3, "step {step}: NMSE {nmse:.3e} against the CPU");
        if let Some(p) = &prev {
            assert_ne!(p, gpu, "step {step} returned the previous step's output");
        }
        prev = Some(gpu.clone());
    }
    let sc = scheds[0].last_schedule().expect("schedule");
    assert!(
        sc.splits.iter().all(|(d, _)| *d == 0) && sc.copies.is_empty(),
        "every node runs on the GPU: {sc:?}"
    );
    assert_eq!(
        h.queued_writes() - before,
        2 * 2 * steps as u64,
        "both inputs of every step of both GPU schedulers were queued"
    );
    assert!(scheds[0].has_captured_graph(), "the steps were replayed");
    assert!(scheds[2].has_captured_graph(), "the steps were replayed");
    assert_eq!(
        scheds[0].usage()[0].mapped,
        (4 * n_out).next_multiple_of(crate::plan::ALIGN) as u64
    );
    assert_eq!(scheds[2].usage()[0].mapped, 0);

    // A replay left unread (not waited for), then a larger graph whose arena replaces the one
    // the replay uses, then the keyed step again (captured anew): all must come out right.
    let mut g2 = Graph::new();
    let emb2 = g2.weight("emb", DType::F32, &[k, vocab]).expect("emb");
    let w2 = g2.weight("out", DType::F32, &[k, n_out]).expect("out");
    let ids2 = g2.input("ids", DType::I32, &[64]).expect("ids");
    let x2 = g2.get_rows(emb2, ids2).expect("get_rows");
    let y2 = g2.mul_mat(w2, x2).expect("mul_mat");
    g2.mark_output(y2).expect("out");
    let toks: Vec<i32> = (0..64).map(|i| (i * 13 % vocab) as i32).collect();
    let tok = [5i32];
    let b = vec![0.25f32; n_out];
    let step_inputs: [(TensorId, &[u8]); 2] = [
        (ids, bytemuck::cast_slice(&tok)),
        (bias, bytemuck::cast_slice(&b)),
    ];
    let mut outs = Vec::new();
    for s in &mut scheds[..2] {
        s.run_keyed(Some(1), &g, &step_inputs).expect("unread step");
        s.run(&g2, &[(ids2, bytemuck::cast_slice(&toks))])
            .expect("larger graph");
        outs.push(s.output_f32(y2).expect("larger output"));
        for _ in 0..3 {
            s.run_keyed(Some(1), &g, &step_inputs).expect("step again");
        }
        outs.push(s.output_f32(z).expect("step output"));
    }
    for (i, (a, b)) in outs[..2].iter().zip(&outs[2..]).enumerate() {
        assert_eq!(a.len(), b.len());
        let (mut e, mut d) = (0f64, 0f64);
        for (x, y) in a.iter().zip(b) {
            e += f64::from(x - y).powi(2);
            d += f64::from(*y).powi(2);
        }
        assert!(e / d.max(1e-30) < 1e-3, "output {i} after the arena grew");
    }
}

/// A keyed step whose inputs are all single aligned words (a decode step's token id and
/// position): they go to the device as one queued batch per step, replayed graph and all, and
/// every step's output is that step's rows.
#[test]
fn word_inputs_of_a_step_are_queued_together() {
    let Some(h) = hip() else { return };
    let (k, vocab) = (64usize, 50usize);
    let mut g = Graph::new();
    let emb = g.weight("emb", DType::F32, &[k, vocab]).expect("emb");
    let a = g.input("a", DType::I32, &[1]).expect("a");
    let b = g.input("b", DType::I32, &[1]).expect("b");
    let ra = g.get_rows(emb, a).expect("rows a");
    let rb = g.get_rows(emb, b).expect("rows b");
    let z = g.add(ra, rb).expect("add");
    g.mark_output(z).expect("out");
    let emb_v: Vec<f32> = (0..k * vocab).map(|i| i as f32).collect();
    let mut s = Scheduler::new(vec![h.clone() as Arc<dyn Device>]).expect("gpu scheduler");
    s.set_graph_capture(true);
    bind_f32(&mut s, "emb", &[k, vocab], &emb_v);
    // The first run uploads the embedding (small enough to be a queued write): count after it.
    let mut before = 0;
    let steps = 8;
    for step in 0..steps {
        if step == 1 {
            before = h.queued_writes();
        }
        let (ia, ib) = (step % vocab, (3 * step + 1) % vocab);
        let (ta, tb) = ([ia as i32], [ib as i32]);
        s.run_keyed(
            Some(3),
            &g,
            &[
                (a, bytemuck::cast_slice(&ta)),
                (b, bytemuck::cast_slice(&tb)),
            ],
        )
        .expect("run");
        let got = s.output_f32(z).expect("output");
        let want: Vec<f32> = (0..k)
            .map(|i| emb_v[ia * k + i] + emb_v[ib * k + i])
            .collect();
        assert_eq!(got, want, "step {step}");
    }
    assert_eq!(h.queued_writes() - before, 2 * (steps - 1) as u64);
    assert!(s.has_captured_graph(), "the steps were replayed");
}
