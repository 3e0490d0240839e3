//! GPU tests: run for real where a GPU exists (the GPU machine sets ROCMFORGE_REQUIRE_GPU=1 so a
//! missing GPU fails there), print "skipped: <reason>" elsewhere. Serial, on one shared device,
//! with a leak check after each test (`rocmforge_gpu_mem::testing::with_gpu`).

use common::table::{synthetic_tensor, tensor_table};
use rocmforge_gpu_mem::testing::with_gpu;
use rocmforge_gpu_mem::*;
use serial_test::serial;

mod common {
    pub mod table;
}

const PTX: &[u8] = include_bytes!("data/test_kernels.ptx");

/// True where the checked-in PTX test kernels run (NVIDIA); elsewhere prints why the test skips.
fn ptx_runs(dev: &Device) -> bool {
    let nvidia = dev.info().platform == Platform::Nvidia;
    if !nvidia {
        println!(
            "skipped: the checked-in test kernels are PTX (NVIDIA); platform is {}",
            dev.info().platform
        );
    }
    nvidia
}

/// A stream and the checked-in test kernels, where they run (see [`ptx_runs`]).
fn ptx_stream_and_module(dev: &Device) -> Option<(Stream, Module)> {
    ptx_runs(dev).then(|| (Stream::new(dev).unwrap(), Module::load(dev, PTX).unwrap()))
}

#[test]
#[serial]
fn discovery_lists_the_device() {
    with_gpu(|dev| {
        assert!(gpu_available());
        let list = devices().expect("devices");
        assert!(!list.is_empty());
        let info = &list[0];
        assert!(info.total_bytes > 0 && info.free_bytes <= info.total_bytes);
        assert!(info.compute_units > 0);
        assert!(info.warp_size == 32 || info.warp_size == 64);
        assert!(
            info.arch.starts_with("sm_") || info.arch.starts_with("gfx"),
            "{}",
            info.arch
        );
        let s = summary();
        assert!(s.contains(&info.name), "{s}");
        println!(
            "{s}budget: {} bytes, platform {}",
            dev.budget().limit(),
            dev.info().platform
        );
    });
}

#[test]
#[serial]
fn write_read_roundtrip_and_subrange_reads() {
    with_gpu(|dev| {
        let stream = Stream::new(dev).unwrap();
        let host: Vec<u32> = (0..10_000).collect();
        let mut buf = DeviceBuffer::<u32>::new(dev, host.len(), "roundtrip").unwrap();
        stream.write(&host, &mut buf.view_mut()).unwrap();
        assert_eq!(stream.read_to_vec(&buf.view()).unwrap(), host);
        // A sub-range is no whole allocation: it is read through the staging path.
        let sub = buf.slice(1234..5678).unwrap();
        assert!(!sub.is_whole_allocation());
        assert_eq!(stream.read_to_vec(&sub).unwrap(), host[1234..5678]);
        // Writing a sub-range leaves the rest alone.
        let patch = vec![7u32; 100];
        stream
            .write(&patch, &mut buf.slice_mut(500..600).unwrap())
            .unwrap();
        let back = stream.read_to_vec(&buf.view()).unwrap();
        assert_eq!(&back[500..600], &patch[..]);
        assert_eq!(&back[..500], &host[..500]);
        assert_eq!(&back[600..], &host[600..]);
        assert!(buf.slice(9_000..10_001).is_err());
        assert!(matches!(
            stream.write(&patch, &mut buf.slice_mut(0..99).unwrap()),
            Err(GpuError::LengthMismatch { .. })
        ));
    });
}

#[test]
#[serial]
fn memset_and_device_copies() {
    with_gpu(|dev| {
        let stream = Stream::new(dev).unwrap();
        let mut a = DeviceBuffer::<u8>::new(dev, 4096, "a").unwrap();
        let mut b = DeviceBuffer::<u8>::new(dev, 4096, "b").unwrap();
        stream.memset(&mut a.view_mut(), 0xab).unwrap();
        stream.memset(&mut b.view_mut(), 0).unwrap();
        stream
            .copy(
                &a.slice(0..1000).unwrap(),
                &mut b.slice_mut(96..1096).unwrap(),
            )
            .unwrap();
        let back = stream.read_to_vec(&b.view()).unwrap();
        assert!(back[..96].iter().all(|&x| x == 0));
        assert!(back[96..1096].iter().all(|&x| x == 0xab));
        assert!(back[1096..].iter().all(|&x| x == 0));
    });
}

#[test]
#[serial]
fn events_time_a_copy_and_order_two_streams() {
    with_gpu(|dev| {
        let s1 = Stream::new(dev).unwrap();
        let s2 = Stream::new(dev).unwrap();
        let n = 16 << 20; // 64 MiB of f32
        let mut pinned = PinnedHostBuffer::<f32>::new(dev, n).unwrap();
        for (i, x) in pinned.as_mut_slice().unwrap().iter_mut().enumerate() {
            *x = i as f32;
        }
        let mut dst = DeviceBuffer::<f32>::new(dev, n, "timed copy").unwrap();
        let start = Event::new(dev, true).unwrap();
        let stop = Event::new(dev, true).unwrap();
        start.record(&s1).unwrap();
        s1.write_pinned(&mut pinned, 0, &mut dst.view_mut())
            .unwrap();
        stop.record(&s1).unwrap();
        // s2 reads the buffer only after s1's copy, ordered by an event, not by a device sync.
        s2.wait_event(&stop).unwrap();
        let mut back = PinnedHostBuffer::<f32>::new(dev, n).unwrap();
        s2.read_pinned(&dst.view(), &mut back).unwrap();
        let got = back.as_slice().unwrap();
        assert_eq!(got[n - 1], (n - 1) as f32);
        assert_eq!(got[12345], 12345.0);
        let ms = start.elapsed_ms(&stop).unwrap();
        assert!(ms > 0.0, "elapsed {ms} ms");
        println!(
            "event-timed 64 MiB pinned H2D: {ms:.3} ms ({:.1} GB/s)",
            (n * 4) as f64 / ms as f64 / 1e6
        );
        assert!(stop.query().unwrap());
        assert!(s2.query().unwrap());
    });
}

#[test]
#[serial]
fn copy_bandwidth_is_measured_and_returns_its_memory() {
    with_gpu(|dev| {
        let before = dev.tracker().live_bytes();
        let bw = bandwidth::copy_bandwidth(dev, 256 << 20, 5).unwrap();
        // Any GPU copies device memory at more than 10 GB/s and less than 100 TB/s; outside
        // that the timing or the byte count is wrong.
        assert!(bw.is_finite() && bw > 10e9 && bw < 100e12, "{bw} B/s");
        println!("device-to-device copy: {:.0} GB/s", bw / 1e9);
        assert_eq!(dev.tracker().live_bytes(), before);
        let err = bandwidth::copy_bandwidth(dev, 0, 5).unwrap_err();
        assert!(matches!(err, GpuError::InvalidArgument(_)), "{err}");
    });
}

#[test]
#[serial]
fn kernels_launch_and_graphs_replay() {
    with_gpu(|dev| {
        let Some((stream, module)) = ptx_stream_and_module(dev) else {
            return;
        };
        let iota = module.function("iota_scaled").unwrap();
        let add = module.function("add_one").unwrap();
        assert!(module.function("no_such_kernel").is_err());
        let n = 100_000u32;
        let mut buf = DeviceBuffer::<f32>::new(dev, n as usize, "kernel out").unwrap();
        let grid = [n.div_ceil(256), 1, 1];
        let mut args = KernelArgs::new();
        args.push_view_mut(&mut buf.view_mut()).push(0.5f32).push(n);
        // SAFETY: iota_scaled(float*, float, unsigned) with a buffer of n floats.
        unsafe {
            stream
                .launch(&iota, grid, [256, 1, 1], 0, &mut args)
                .unwrap()
        };
        let back = stream.read_to_vec(&buf.view()).unwrap();
        assert!(back.iter().enumerate().all(|(i, &x)| x == 0.5 * i as f32));

        let mut add_args = KernelArgs::new();
        add_args.push_view_mut(&mut buf.view_mut()).push(n);
        // add_one(float*, unsigned): checked launches record their memory in the capture.
        let params = [ParamKind::Ptr, ParamKind::I32];
        let add_checked = |s: &Stream, b: &DeviceBuffer<f32>| {
            // SAFETY: add_one(float*, int) over the n floats of the buffer, whose parameters these
            // are.
            unsafe {
                s.launch_checked(
                    &add,
                    "add_one",
                    &params,
                    grid,
                    [256, 1, 1],
                    0,
                    &[
                        KernelArg::Mem(MemRange::of_buffer(b)),
                        KernelArg::I32(n as i32),
                    ],
                )
            }
        };
        let graph = stream
            .capture(|s| {
                add_checked(s, &buf)?;
                add_checked(s, &buf)
            })
            .unwrap();
        for _ in 0..3 {
            graph.launch(&stream).unwrap();
        }
        // A raw launch's memory is unknown: such a capture is refused.
        let raw = stream.capture(|s| {
            // SAFETY: add_one(float*, unsigned) on the same n-float buffer (captured, never run).
            unsafe { s.launch(&add, grid, [256, 1, 1], 0, &mut add_args) }
        });
        assert!(raw.is_err(), "a capture with a raw launch was accepted");
        // A replay after an allocation it uses was freed is refused, not run.
        let tmp = DeviceBuffer::<f32>::new(dev, n as usize, "freed after capture").unwrap();
        let g2 = stream.capture(|s| add_checked(s, &tmp)).unwrap();
        g2.launch(&stream).unwrap();
        stream.synchronize().unwrap();
        drop(tmp);
        assert!(g2.launch(&stream).is_err(), "replay over freed memory ran");
        let back = stream.read_to_vec(&buf.view()).unwrap();
        assert!(
            back.iter()
                .enumerate()
                .all(|(i, &x)| x == 0.5 * i as f32 + 6.0),
            "{:?}",
            &back[..4]
        );
    });
}

fn cpu_gemm(m: usize, n: usize, k: usize, a: &[f32], b: &[f32]) -> Vec<f32> {
    // Column-major: C[i + j*m] = sum_p A[i + p*m] * B[p + j*k].
    let mut c = vec![0f32; m * n];
    for j in 0..n {
        for i in 0..m {
            c[i + j * m] = (0..k).map(|p| a[i + p * m] * b[p + j * k]).sum();
        }
    }
    c
}

fn close(a: &[f32], b: &[f32], tol: f32) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| (x - y).abs() <= tol * (1.0 + y.abs()))
}

#[test]
#[serial]
fn blas_gemms_match_the_cpu() {
    with_gpu(|dev| {
        let stream = Stream::new(dev).unwrap();
        let blas = Blas::new(&stream).unwrap();
        let (m, n, k) = (33, 17, 40);
        let a: Vec<f32> = (0..m * k)
            .map(|i| ((i * 7 % 13) as f32 - 6.0) / 8.0)
            .collect();
        let b: Vec<f32> = (0..k * n)
            .map(|i| ((i * 5 % 11) as f32 - 5.0) / 4.0)
            .collect();
        let want = cpu_gemm(m, n, k, &a, &b);
        let shape = GemmShape {
            trans_a: Op::N,
            trans_b: Op::N,
            m,
            n,
            k,
            lda: m,
            ldb: k,
            ldc: m,
        };
        let mut da = DeviceBuffer::<f32>::new(dev, a.len(), "A").unwrap();
        let mut db = DeviceBuffer::<f32>::new(dev, b.len(), "B").unwrap();
        let mut dc = DeviceBuffer::<f32>::new(dev, m * n, "C").unwrap();
        stream.write(&a, &mut da.view_mut()).unwrap();
        stream.write(&b, &mut db.view_mut()).unwrap();
        blas.sgemm(&shape, 1.0, &da.view(), &db.view(), 0.0, &mut dc.view_mut())
            .unwrap();
        assert!(close(&stream.read_to_vec(&dc.view()).unwrap(), &want, 1e-4));

        // f16 operands (exact: the inputs are multiples of 1/8 and 1/4), f32 output.
        let ah: Vec<half::f16> = a.iter().map(|&x| half::f16::from_f32(x)).collect();
        let bh: Vec<half::f16> = b.iter().map(|&x| half::f16::from_f32(x)).collect();
        let mut dah = DeviceBuffer::<half::f16>::new(dev, a.len(), "Ah").unwrap();
        let mut dbh = DeviceBuffer::<half::f16>::new(dev, b.len(), "Bh").unwrap();
        stream.write(&ah, &mut dah.view_mut()).unwrap();
        stream.write(&bh, &mut dbh.view_mut()).unwrap();
        blas.gemm_ex(
            &shape,
            1.0,
            &dah.view(),
            &dbh.view(),
            0.0,
            &mut dc.view_mut(),
        )
        .unwrap();
        assert!(close(&stream.read_to_vec(&dc.view()).unwrap(), &want, 1e-3));

        // Strided-batched bf16: batch 3, matrix i scaled by (i + 1) through B.
        let batch = 3;
        let abf: Vec<half::bf16> = (0..batch)
            .flat_map(|_| a.iter().map(|&x| half::bf16::from_f32(x)))
            .collect();
        let bbf: Vec<half::bf16> = (0..batch)
            .flat_map(|i| {
                b.iter()
                    .map(move |&x| half::bf16::from_f32(x * (i + 1) as f32))
            })
            .collect();
        let mut dab = DeviceBuffer::<half::bf16>::new(dev, abf.len(), "Abf").unwrap();
        let mut dbb = DeviceBuffer::<half::bf16>::new(dev, bbf.len(), "Bbf").unwrap();
        let mut dcb = DeviceBuffer::<f32>::new(dev, m * n * batch, "Cb").unwrap();
        stream.write(&abf, &mut dab.view_mut()).unwrap();
        stream.write(&bbf, &mut dbb.view_mut()).unwrap();
        blas.gemm_strided_batched_ex(
            &shape,
            1.0,
            &dab.view(),
            m * k,
            &dbb.view(),
            k * n,
            0.0,
            &mut dcb.view_mut(),
            m * n,
            batch,
        )
        .unwrap();
        let got = stream.read_to_vec(&dcb.view()).unwrap();
        for i in 0..batch {
            let w: Vec<f32> = want.iter().map(|x| x * (i + 1) as f32).collect();
            assert!(
                close(&got[i * m * n..(i + 1) * m * n], &w, 1e-2),
                "batch {i}"
            );
        }
        // Too-small operands are refused before any BLAS call.
        let bad = GemmShape {
            m: m + 1,
            lda: m + 1,
            ldc: m + 1,
            ..shape
        };
        assert!(blas
            .sgemm(&bad, 1.0, &da.view(), &db.view(), 0.0, &mut dc.view_mut())
            .is_err());
    });
}

#[test]
#[serial]
fn budget_refuses_before_the_driver() {
    with_gpu(|dev| {
        let calls = dev.allocation_calls();
        let too_big = (dev.budget().available() / 4 + 1) as usize * 4;
        let e = DeviceBuffer::<f32>::new(dev, too_big, "too big").unwrap_err();
        assert!(matches!(e, GpuError::BudgetExceeded { .. }), "{e}");
        assert_eq!(
            dev.allocation_calls(),
            calls,
            "no driver call for a refused allocation"
        );

        let small = Device::open_with(
            0,
            BudgetConfig {
                fraction: 1.0,
                reserve_bytes: u64::MAX,
            },
        )
        .unwrap();
        assert_eq!(small.budget().limit(), 0);
        let calls = small.allocation_calls();
        let e = DeviceBuffer::<u32>::new(&small, 1000, "kv").unwrap_err();
        assert!(e.is_out_of_memory(), "{e}");
        assert_eq!(small.allocation_calls(), calls);
        small.check_errors().unwrap();
    });
}

#[test]
#[serial]
fn arena_upload_of_the_model_tensor_table() {
    with_gpu(|dev| {
        let (source, table) = match tensor_table() {
            Ok(t) => t,
            Err(why) => {
                println!("skipped: no tensor table ({why})");
                return;
            }
        };
        let data: Vec<Vec<u8>> = table
            .iter()
            .enumerate()
            .map(|(i, (_, b))| synthetic_tensor(i, *b))
            .collect();
        let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
        let calls = dev.allocation_calls();
        let mut up = WeightUploader::new(dev, 8 << 20).unwrap();
        let staging_calls = dev.allocation_calls() - calls;
        let t0 = std::time::Instant::now();
        let (arena, slots) = up.upload_bytes(&refs, 1 << 30, "model weights").unwrap();
        let secs = t0.elapsed().as_secs_f64();
        let arena_calls = dev.allocation_calls() - calls - staging_calls;
        assert_eq!(arena_calls as usize, arena.chunk_count());
        assert!(
            arena.chunk_count() <= 2,
            "{} chunks for {} tensors",
            arena.chunk_count(),
            table.len()
        );
        let stream = Stream::new(dev).unwrap();
        for (i, slot) in slots.iter().enumerate() {
            let view = arena.view::<u8>(slot).unwrap();
            assert_eq!(
                stream.read_to_vec(&view).unwrap(),
                data[i],
                "tensor {}",
                table[i].0
            );
        }
        let total: u64 = table.iter().map(|t| t.1).sum();
        println!(
            "arena upload of {} tensors ({total} bytes, from {source}): {} driver allocation(s), {:.1} ms, all read back equal",
            table.len(),
            arena_calls,
            secs * 1e3
        );
    });
}

#[test]
#[serial]
fn drops_record_no_errors_and_leaks_are_reported() {
    with_gpu(|dev| {
        let buf = DeviceBuffer::<u8>::new(dev, 1 << 20, "deliberately held").unwrap();
        let report = dev.leak_report();
        assert!(
            report.entries.iter().any(|e| e.tag == "deliberately held"),
            "{report}"
        );
        drop(buf);
        assert!(!dev
            .leak_report()
            .entries
            .iter()
            .any(|e| e.tag == "deliberately held"));
        dev.check_errors().unwrap();
    });
}

/// Small writes queued from the stream's pinned ring behind a long device copy (so ring blocks
/// come round again while their copies are still pending and must be waited for), each from
/// the same reused host slice; then staged reads (whole, sub-range, chunked past the read
/// buffer's largest size) see every write in order.
#[test]
#[serial]
fn queued_writes_and_staged_reads_keep_order() {
    use rocmforge_gpu_mem::host_io::{QUEUED_WRITE_MAX, READ_CHUNK, WRITE_RING};
    with_gpu(|dev| {
        let stream = Stream::new(dev).unwrap();
        let n = 1usize << 16;
        let mut buf = DeviceBuffer::<u32>::new(dev, n, "queued writes").unwrap();
        stream.memset(&mut buf.view_mut(), 0).unwrap();
        // Keep the stream busy for milliseconds: 12 x 256 MiB device copies queued ahead of the
        // writes, so the ring comes round while its first blocks' copies are still queued.
        let big = 64usize << 20;
        let a = DeviceBuffer::<u32>::new(dev, big, "busy src").unwrap();
        let mut b = DeviceBuffer::<u32>::new(dev, big, "busy dst").unwrap();
        for _ in 0..12 {
            stream.copy(&a.view(), &mut b.view_mut()).unwrap();
        }
        let mut want = vec![0u32; n];
        // Pairs of words go through the pinned ring, single aligned words as stream value
        // writes, and a word at an unaligned offset through the ring again.
        let mut pair = [0u8; 8];
        let writes = 40 * WRITE_RING;
        for w in 0..writes {
            let i = (w * 131) % 1000 * 2;
            let v = (w as u32 + 1) * 3;
            pair[..4].copy_from_slice(&v.to_le_bytes());
            pair[4..].copy_from_slice(&(!v).to_le_bytes());
            let dst = MemRange::of_buffer(&buf).sub(i * 4, 8).unwrap();
            stream.queue_write_range(&pair, dst).unwrap();
            want[i] = v;
            want[i + 1] = !v;
        }
        let words = 3 * WRITE_RING;
        for w in 0..words {
            let i = 2100 + (w * 7) % 50;
            let v = 0x0101_0101 * (w as u32 + 1);
            let dst = MemRange::of_buffer(&buf).sub(i * 4, 4).unwrap();
            stream.queue_write_range(&v.to_le_bytes(), dst).unwrap();
            want[i] = v;
        }
        let odd = MemRange::of_buffer(&buf).sub(2200 * 4 + 2, 4).unwrap();
        stream.queue_write_range(&[1, 2, 3, 4], odd).unwrap();
        bytemuck::cast_slice_mut::<u32, u8>(&mut want)[2200 * 4 + 2..2200 * 4 + 6]
            .copy_from_slice(&[1, 2, 3, 4]);
        // Batches of words (one driver call where the device batches): later words of a batch
        // and later batches win over earlier writes to the same word; 300 words span two of
        // the driver's 256-operation calls.
        let word = |i: usize| MemRange::of_buffer(&buf).sub(i * 4, 4).unwrap();
        let batch: Vec<(MemRange<'_>, u32)> = (0..300usize)
            .map(|k| (word(2300 + k % 280), 0xABC0_0000 + k as u32))
            .collect();
        stream.queue_write_words(&batch).unwrap();
        for k in 0..300usize {
            want[2300 + k % 280] = 0xABC0_0000 + k as u32;
        }
        stream
            .queue_write_words(&[(word(2301), 7), (word(2100), 8)])
            .unwrap();
        (want[2301], want[2100]) = (7, 8);
        stream.queue_write_words(&[]).unwrap();
        // Anything but aligned words is refused with nothing queued.
        let two = MemRange::of_buffer(&buf).sub(2400 * 4, 8).unwrap();
        assert!(stream
            .queue_write_words(&[(word(2400), 1), (two, 2)])
            .is_err());
        assert!(stream.queue_write_words(&[(odd, 3)]).is_err());
        assert_eq!(stream.queued_writes(), (writes + words + 1 + 302) as u64);
        // Past the largest queued size: the blocking path.
        let large: Vec<u32> = (0..QUEUED_WRITE_MAX as u32 / 4 + 1).collect();
        let dst = MemRange::of_buffer(&buf)
            .sub(4000 * 4, large.len() * 4)
            .unwrap();
        stream
            .queue_write_range(bytemuck::cast_slice(&large), dst)
            .unwrap();
        want[4000..4000 + large.len()].copy_from_slice(&large);
        assert_eq!(stream.queued_writes(), (writes + words + 1 + 302) as u64);
        let mut back = vec![0u32; n];
        stream.read_staged(&buf.view(), &mut back).unwrap();
        assert_eq!(back, want);
        let mut part = vec![0u32; 100];
        stream
            .read_staged(&buf.slice(950..1050).unwrap(), &mut part)
            .unwrap();
        assert_eq!(part, want[950..1050]);
        // A read larger than the read buffer's largest size goes in chunks, staged.
        let host: Vec<u32> = (0..(READ_CHUNK / 4) * 2 + 7)
            .map(|i| i as u32 ^ 0x5a5a)
            .collect();
        let mut c = DeviceBuffer::<u32>::new(dev, host.len(), "chunked").unwrap();
        stream.write(&host, &mut c.view_mut()).unwrap();
        let mut all = vec![0u32; host.len()];
        stream.read_staged(&c.view(), &mut all).unwrap();
        assert!(all == host, "chunked read differs");
        assert_eq!(stream.read_buffer_bytes(), READ_CHUNK);
        // Reads handed over in the pinned buffer: whole, from an offset, empty, and past the
        // buffer's largest size (through a vector).
        let pinned = stream
            .read_pinned_with(&buf.view(), |v| v.to_vec())
            .unwrap();
        assert_eq!(pinned, want);
        let pinned = stream
            .read_pinned_with(&buf.slice(950..1050).unwrap(), |v| v.to_vec())
            .unwrap();
        assert_eq!(pinned, want[950..1050]);
        let empty = stream
            .read_pinned_with(&buf.slice(7..7).unwrap(), |v| v.len())
            .unwrap();
        assert_eq!(empty, 0);
        let pinned = stream.read_pinned_with(&c.view(), |v| v == host).unwrap();
        assert!(pinned, "pinned read past the chunk size differs");
        // The closure may read from the same stream (it runs without the stream's lock).
        let nested = stream
            .read_pinned_with(&buf.slice(0..10).unwrap(), |outer| {
                let inner = stream
                    .read_pinned_with(&buf.slice(10..20).unwrap(), <[u32]>::to_vec)
                    .unwrap();
                [outer, &inner].concat()
            })
            .unwrap();
        assert_eq!(nested, want[..20]);
        assert!(matches!(
            stream.read_staged(&buf.view(), &mut part),
            Err(GpuError::LengthMismatch { .. })
        ));
        let wrong = MemRange::of_buffer(&buf).sub(0, 8).unwrap();
        assert!(stream.queue_write_range(&[0u8; 4], wrong).is_err());
    });
}

#[test]
#[serial]
fn kernels_write_mapped_host_memory_in_place() {
    with_gpu(|dev| {
        let Some((stream, module)) = ptx_stream_and_module(dev) else {
            return;
        };
        let iota = module.function("iota_scaled").unwrap();
        let add = module.function("add_one").unwrap();
        let n = 50_000usize;
        let mapped = MappedHostBuffer::new(dev, 4 * n + 64).unwrap();
        assert_eq!(mapped.len(), 4 * n + 64);
        mapped
            .read_with(&stream, 0, mapped.len(), |b| {
                assert!(b.iter().all(|&x| x == 0))
            })
            .unwrap();
        let grid = [(n as u32).div_ceil(256), 1, 1];
        // iota_scaled(float*, float, unsigned) into the buffer from byte 64 on.
        let out = mapped.range().sub(64, 4 * n).unwrap();
        // SAFETY: iota_scaled(float*, float, int) writes n floats, the length of `out`.
        unsafe {
            stream
                .launch_checked(
                    &iota,
                    "iota_scaled",
                    &[ParamKind::Ptr, ParamKind::F32, ParamKind::I32],
                    grid,
                    [256, 1, 1],
                    0,
                    &[
                        KernelArg::Mem(out),
                        KernelArg::F32(0.25),
                        KernelArg::I32(n as i32),
                    ],
                )
                .unwrap()
        };
        let want: Vec<f32> = (0..n).map(|i| 0.25 * i as f32).collect();
        let got = mapped
            .read_with(&stream, 64, 4 * n, |b| {
                bytemuck::cast_slice::<u8, f32>(b).to_vec()
            })
            .unwrap();
        assert_eq!(got, want);
        // Host writes reach the next kernel, and a captured launch on the buffer replays.
        let ones: Vec<f32> = vec![1.0; n];
        mapped
            .write(&stream, 64, bytemuck::cast_slice(&ones))
            .unwrap();
        let add_one = |s: &Stream| {
            // SAFETY: add_one(float*, int) over the n floats of `out`.
            unsafe {
                s.launch_checked(
                    &add,
                    "add_one",
                    &[ParamKind::Ptr, ParamKind::I32],
                    grid,
                    [256, 1, 1],
                    0,
                    &[KernelArg::Mem(out), KernelArg::I32(n as i32)],
                )
            }
        };
        let graph = stream.capture(add_one).unwrap();
        for _ in 0..3 {
            graph.launch(&stream).unwrap();
        }
        let all_four = mapped
            .read_with(&stream, 64, 4 * n, |b| {
                bytemuck::cast_slice::<u8, f32>(b).iter().all(|&x| x == 4.0)
            })
            .unwrap();
        assert!(all_four, "three replays of add_one after writing ones");
        // Ranges past the end are refused; an empty read is fine.
        assert!(matches!(
            mapped.read_with(&stream, 60, 4 * n + 8, |_| ()),
            Err(GpuError::OutOfBounds { .. })
        ));
        assert!(mapped.write(&stream, 4 * n + 61, &[0u8; 4]).is_err());
        assert_eq!(mapped.read_with(&stream, 7, 0, <[u8]>::len).unwrap(), 0);
        // Once the buffer is gone, a replay writing it is refused.
        drop(mapped);
        assert!(
            graph.launch(&stream).is_err(),
            "replay over a freed mapped buffer ran"
        );
        stream.synchronize().unwrap();
    });
}

const PTX_SM90: &[u8] = include_bytes!("data/test_kernels_sm90.ptx");

#[test]
#[serial]
fn early_launches_still_run_in_stream_order() {
    with_gpu(|dev| {
        let stream = Stream::new(dev).unwrap();
        assert!(!stream.early_launch(), "early launches are opt-in");
        if !stream.set_early_launch(true) {
            println!("skipped: this device cannot launch kernels early (needs NVIDIA 9.0+)");
            return;
        }
        let module = Module::load(dev, PTX_SM90).unwrap();
        let add = module.function("add_one_waiting").unwrap();
        // Many blocks, so that a launch that did not wait would overlap its predecessor's
        // read-modify-writes and lose increments.
        let n = 1u32 << 22;
        let mut buf = DeviceBuffer::<f32>::new(dev, n as usize, "early launches").unwrap();
        stream.memset(&mut buf.view_mut(), 0).unwrap();
        let params = [ParamKind::Ptr, ParamKind::I32];
        let add_once = |s: &Stream| {
            // SAFETY: add_one_waiting(float*, int) over the n floats of the buffer.
            unsafe {
                s.launch_checked(
                    &add,
                    "add_one_waiting",
                    &params,
                    [n.div_ceil(256), 1, 1],
                    [256, 1, 1],
                    0,
                    &[
                        KernelArg::Mem(MemRange::of_buffer(&buf)),
                        KernelArg::I32(n as i32),
                    ],
                )
            }
        };
        for _ in 0..100 {
            add_once(&stream).unwrap();
        }
        // Captured early launches keep their order too.
        let graph = stream
            .capture(|s| (0..50).try_for_each(|_| add_once(s)))
            .unwrap();
        graph.launch(&stream).unwrap();
        graph.launch(&stream).unwrap();
        let back = stream.read_to_vec(&buf.view()).unwrap();
        let wrong = back.iter().filter(|&&x| x != 200.0).count();
        assert_eq!(wrong, 0, "{wrong} of {n} values lost increments");
        assert!(!stream.set_early_launch(false) && !stream.early_launch());
    });
}

const PTX_COOP: &[u8] = include_bytes!("data/test_kernels_coop.ptx");

/// What `coop_rounds` (tests/data/test_kernels_coop.cu) adds to `out[b]` in one launch of
/// `blocks` blocks with `shared_words` words of shared memory per block and `rounds` rounds.
fn coop_rounds_expected(blocks: u32, shared_words: u32, rounds: u32) -> Vec<u32> {
    let slot = |b: u32, r: u32| {
        (1..shared_words).fold(0u32, |acc, i| {
            acc.wrapping_add(
                b.wrapping_mul(0x9E37_79B1)
                    .wrapping_add(r.wrapping_mul(0x85EB_CA77))
                    .wrapping_add(i),
            )
        })
    };
    (0..blocks)
        .map(|b| (0..rounds).fold(0u32, |acc, r| acc.wrapping_add(slot((b + 1) % blocks, r))))
        .collect()
}

/// A persistent-kernel shape: one block per multiprocessor, nearly all of its shared memory
/// opted in, blocks meeting at grid barriers. Checks the opt-in and occupancy calls, the
/// co-residency check, plain, captured and early cooperative launches.
#[test]
#[serial]
fn cooperative_launches_meet_at_grid_barriers() {
    with_gpu(|dev| {
        if !ptx_runs(dev) {
            return;
        }
        let attr = |a| dev.attribute(a).expect("device attribute") as u32;
        assert_eq!(attr(DeviceAttribute::CooperativeLaunch), 1);
        let sms = dev.info().compute_units as u32;
        let plain = attr(DeviceAttribute::MaxSharedMemoryPerBlock);
        let optin = attr(DeviceAttribute::MaxSharedMemoryPerBlockOptin);
        println!("{sms} multiprocessors; shared memory per block {plain} bytes, {optin} opted in");
        assert!(optin > plain, "opt-in {optin} <= default {plain}");

        let module = Module::load(dev, PTX_COOP).unwrap();
        let f = module.function("coop_rounds").unwrap();
        let threads = 256u32;
        // The kernel has no static shared memory: all of the opt-in limit is dynamic.
        let shared = optin;
        let before = f.max_active_blocks_per_sm(threads, shared).unwrap();
        assert_eq!(before, 0, "{shared} bytes fit a block before opting in");
        assert!(f.max_active_blocks_per_sm(threads, 1024).unwrap() >= 2);
        f.set_max_dynamic_shared(shared).unwrap();
        assert_eq!(f.max_active_blocks_per_sm(threads, shared).unwrap(), 1);
        assert!(f.set_max_dynamic_shared(optin + 1).is_err());
        // The refused request left the earlier one in place.
        assert_eq!(f.max_active_blocks_per_sm(threads, shared).unwrap(), 1);

        let stream = Stream::new(dev).unwrap();
        let n = sms as usize;
        let mut slots = DeviceBuffer::<u32>::new(dev, n, "coop slots").unwrap();
        let mut out = DeviceBuffer::<u32>::new(dev, n, "coop out").unwrap();
        let mut counter = DeviceBuffer::<u32>::new(dev, 1, "coop barrier").unwrap();
        stream.memset(&mut slots.view_mut(), 0).unwrap();
        stream.memset(&mut out.view_mut(), 0).unwrap();
        stream.memset(&mut counter.view_mut(), 0).unwrap();
        let (words, rounds) = (shared / 4, 5u32);
        let params = [
            ParamKind::Ptr,
            ParamKind::Ptr,
            ParamKind::Ptr,
            ParamKind::I32,
            ParamKind::I32,
        ];
        let launch = |s: &Stream, f: &Function<'_>, name: &str, grid: u32| {
            // SAFETY: coop_rounds and coop_rounds_smem take (slots, out, counter, words, rounds):
            // one slot and one output word per block (grid <= n), one barrier counter, `words` of
            // the `shared` bytes.
            unsafe {
                s.launch_checked_cooperative(
                    f,
                    name,
                    &params,
                    [grid, 1, 1],
                    [threads, 1, 1],
                    shared,
                    &[
                        KernelArg::Mem(MemRange::of_buffer(&slots)),
                        KernelArg::Mem(MemRange::of_buffer(&out)),
                        KernelArg::Mem(MemRange::of_buffer(&counter)),
                        KernelArg::I32(words as i32),
                        KernelArg::I32(rounds as i32),
                    ],
                    &[],
                )
            }
        };
        launch(&stream, &f, "coop_rounds", sms).unwrap();
        // One block more than fits is refused before anything is queued.
        match launch(&stream, &f, "coop_rounds", sms + 1) {
            Err(GpuError::CooperativeGridTooLarge {
                kernel,
                blocks,
                per_sm,
                multiprocessors,
            }) => {
                assert_eq!(kernel, "coop_rounds");
                assert_eq!(
                    (blocks, per_sm, multiprocessors),
                    (u64::from(sms) + 1, 1, sms)
                );
            }
            other => panic!("expected CooperativeGridTooLarge, got {other:?}"),
        }
        // The launch reaches the driver as a cooperative one: bypassing the check above, the
        // driver itself refuses the grid (zero rounds: no barrier waits, should it run anyway).
        let mut values = [
            slots.ptr().0,
            out.ptr().0,
            counter.ptr().0,
            u64::from(words),
            0,
        ];
        let mut ptrs: Vec<*mut std::ffi::c_void> = values
            .iter_mut()
            .map(|v| std::ptr::from_mut(v).cast())
            .collect();
        // SAFETY: coop_rounds(unsigned*, unsigned*, unsigned*, unsigned, unsigned): three live
        // buffers of this device and two 32-bit values (the low words of little-endian u64s);
        // `values` outlives the call, which copies them.
        let refused = unsafe {
            dev.api().launch_kernel_cooperative(
                f.handle(),
                [sms + 1, 1, 1],
                [threads, 1, 1],
                shared,
                stream.handle(),
                ptrs.as_mut_ptr(),
                false,
            )
        };
        let code = refused
            .as_ref()
            .err()
            .and_then(|e| e.as_hip())
            .map(|e| e.code);
        assert_eq!(
            code,
            Some(hip_ffi::error::code::COOPERATIVE_LAUNCH_TOO_LARGE),
            "{refused:?}"
        );
        // Argument checks come first, as for plain checked launches.
        // SAFETY: refused before anything is queued (no arguments for five parameters).
        let no_args = unsafe {
            stream.launch_checked_cooperative(
                &f,
                "coop_rounds",
                &params,
                [sms, 1, 1],
                [threads, 1, 1],
                shared,
                &[],
                &[],
            )
        };
        assert!(matches!(no_args, Err(GpuError::InvalidArgument(_))));
        // Captured cooperative launches replay.
        let graph = stream
            .capture(|s| launch(s, &f, "coop_rounds", sms))
            .unwrap();
        graph.launch(&stream).unwrap();
        graph.launch(&stream).unwrap();
        let mut launches = 3;

        // Early cooperative launches, where the device has them.
        if stream.set_early_launch(true) {
            let m90 = Module::load(dev, PTX_SM90).unwrap();
            let w = m90.function("coop_rounds_waiting").unwrap();
            w.set_max_dynamic_shared(shared).unwrap();
            for _ in 0..3 {
                launch(&stream, &w, "coop_rounds_waiting", sms).unwrap();
            }
            let graph = stream
                .capture(|s| {
                    launch(s, &w, "coop_rounds_waiting", sms)?;
                    launch(s, &w, "coop_rounds_waiting", sms)
                })
                .unwrap();
            graph.launch(&stream).unwrap();
            launches += 5;
            stream.set_early_launch(false);
        } else {
            println!("early cooperative launches not checked: this device has no early launch");
        }

        let once = coop_rounds_expected(sms, words, rounds);
        let want: Vec<u32> = once.iter().map(|x| x.wrapping_mul(launches)).collect();
        let got = stream.read_to_vec(&out.view()).unwrap();
        let wrong = got.iter().zip(&want).filter(|(g, w)| g != w).count();
        assert_eq!(
            wrong, 0,
            "{wrong} of {sms} blocks summed wrongly: {got:?} != {want:?}"
        );
        let arrivals = stream.read_to_vec(&counter.view()).unwrap()[0];
        assert_eq!(arrivals, launches * rounds * 2 * sms);

        // What the co-residency check costs a launch (one occupancy query).
        let t = std::time::Instant::now();
        for _ in 0..1000 {
            f.max_active_blocks_per_sm(threads, shared).unwrap();
        }
        println!(
            "{launches} cooperative launches of {sms} blocks x {shared} bytes of shared memory \
             correct; one occupancy query takes {:.2} us",
            t.elapsed().as_secs_f64() * 1e3
        );
    });
}

// ---- Several GPUs (skipped below two; `ROCMFORGE_REQUIRE_GPUS=2` makes that a failure) ----

/// NCCL/RCCL as the machine has it, or `None` after printing why the test skips.
fn collectives(dev: &Device) -> Option<std::sync::Arc<hip_ffi::Nccl>> {
    testing::or_skip(rocmforge_gpu_mem::comm::load_library(
        dev,
        &NcclOptions::default(),
    ))
}

#[test]
#[serial]
fn peer_copy_round_trip_between_two_gpus() {
    let Some(devs) = testing::gpus_or_skip(2) else {
        return;
    };
    let (a, b) = (&devs[0], &devs[1]);
    let direct = a.enable_peer_access(b).expect("peer access 0 -> 1");
    b.enable_peer_access(a).expect("peer access 1 -> 0");
    println!("peer access 0 <-> 1: {direct}");
    let n = 1 << 20;
    let host: Vec<f32> = (0..n).map(|i| i as f32 * 0.5 - 7.0).collect();
    let sa = Stream::new(a).unwrap();
    let sb = Stream::new(b).unwrap();
    let mut x = DeviceBuffer::<f32>::new(a, n, "peer src").unwrap();
    let mut y = DeviceBuffer::<f32>::new(b, n, "peer dst").unwrap();
    let mut z = DeviceBuffer::<f32>::new(a, n, "peer back").unwrap();
    sa.write(&host, &mut x.view_mut()).unwrap();
    sa.synchronize().unwrap();
    // a -> b on b's stream, then b -> a on a's stream after b's work is done.
    sb.copy_peer(&x.view(), &mut y.view_mut()).unwrap();
    let done = sb.record_event().unwrap();
    sa.wait_event(&done).unwrap();
    sa.copy_peer(&y.view(), &mut z.view_mut()).unwrap();
    assert_eq!(sb.read_to_vec(&y.view()).unwrap(), host);
    assert_eq!(sa.read_to_vec(&z.view()).unwrap(), host);
    // A stream of neither device is refused.
    let mut w = DeviceBuffer::<f32>::new(b, n, "peer other").unwrap();
    let err = sa
        .copy_peer(&y.view(), &mut w.view_mut())
        .expect_err("a stream of neither device");
    assert!(matches!(err, GpuError::WrongDevice { .. }), "{err}");
}

#[test]
#[serial]
fn all_reduce_all_gather_and_send_recv_across_two_gpus() {
    let Some(devs) = testing::gpus_or_skip(2) else {
        return;
    };
    let Some(nccl) = collectives(&devs[0]) else {
        return;
    };
    println!("{} {}", nccl.library_name(), nccl.version_string().unwrap());
    let comms = Communicator::init_all(&nccl, &devs).expect("comm init all");
    assert_eq!((comms[1].rank(), comms[1].ranks()), (1, 2));
    let streams: Vec<Stream> = devs.iter().map(|d| Stream::new(d).unwrap()).collect();
    let n = 4097;
    let vals = |r: usize| -> Vec<f32> {
        (0..n)
            .map(|i| (i % 97) as f32 + 1000.0 * r as f32)
            .collect()
    };
    // f32 sum, in place.
    let mut bufs: Vec<DeviceBuffer<f32>> = devs
        .iter()
        .map(|d| DeviceBuffer::new(d, n, "allreduce").unwrap())
        .collect();
    for (r, b) in bufs.iter_mut().enumerate() {
        streams[r].write(&vals(r), &mut b.view_mut()).unwrap();
    }
    grouped(&nccl, || {
        for (r, b) in bufs.iter_mut().enumerate() {
            comms[r].all_reduce_in_place(&mut b.view_mut(), ReduceOp::Sum, &streams[r])?;
        }
        Ok(())
    })
    .expect("all-reduce");
    let want: Vec<f32> = (0..n).map(|i| 2.0 * (i % 97) as f32 + 1000.0).collect();
    for (r, b) in bufs.iter().enumerate() {
        assert_eq!(streams[r].read_to_vec(&b.view()).unwrap(), want, "rank {r}");
    }
    // f16 sum: small integers are exact in half precision.
    let mut hb: Vec<DeviceBuffer<half::f16>> = devs
        .iter()
        .map(|d| DeviceBuffer::new(d, n, "allreduce f16").unwrap())
        .collect();
    for (r, b) in hb.iter_mut().enumerate() {
        let v: Vec<half::f16> = (0..n)
            .map(|i| half::f16::from_f32(((i + r) % 13) as f32))
            .collect();
        streams[r].write(&v, &mut b.view_mut()).unwrap();
    }
    grouped(&nccl, || {
        for (r, b) in hb.iter_mut().enumerate() {
            comms[r].all_reduce_in_place(&mut b.view_mut(), ReduceOp::Sum, &streams[r])?;
        }
        Ok(())
    })
    .expect("all-reduce f16");
    let want16: Vec<f32> = (0..n).map(|i| ((i % 13) + ((i + 1) % 13)) as f32).collect();
    for (r, b) in hb.iter().enumerate() {
        let got: Vec<f32> = streams[r]
            .read_to_vec(&b.view())
            .unwrap()
            .iter()
            .map(|h| h.to_f32())
            .collect();
        assert_eq!(got, want16, "rank {r}");
    }
    // All-gather: rank order.
    let mut gathered: Vec<DeviceBuffer<f32>> = devs
        .iter()
        .map(|d| DeviceBuffer::new(d, 2 * n, "gather").unwrap())
        .collect();
    let srcs: Vec<DeviceBuffer<f32>> = devs
        .iter()
        .enumerate()
        .map(|(r, d)| {
            let mut b = DeviceBuffer::new(d, n, "gather src").unwrap();
            streams[r].write(&vals(r), &mut b.view_mut()).unwrap();
            b
        })
        .collect();
    grouped(&nccl, || {
        for (r, g) in gathered.iter_mut().enumerate() {
            comms[r].all_gather(&srcs[r].view(), &mut g.view_mut(), &streams[r])?;
        }
        Ok(())
    })
    .expect("all-gather");
    let mut want_g = vals(0);
    want_g.extend(vals(1));
    for (r, g) in gathered.iter().enumerate() {
        assert_eq!(
            streams[r].read_to_vec(&g.view()).unwrap(),
            want_g,
            "rank {r}"
        );
    }
    // Send rank 0's vector to rank 1.
    let mut dst = DeviceBuffer::<f32>::new(&devs[1], n, "recv").unwrap();
    grouped(&nccl, || {
        comms[0].send(&srcs[0].view(), 1, &streams[0])?;
        comms[1].recv(&mut dst.view_mut(), 0, &streams[1])
    })
    .expect("send/recv");
    assert_eq!(streams[1].read_to_vec(&dst.view()).unwrap(), vals(0));
    for c in &comms {
        c.check().expect("no asynchronous error");
    }
    // Wrong-device streams and bad peers are refused before any call.
    let mut b0 = DeviceBuffer::<f32>::new(&devs[0], 4, "x").unwrap();
    assert!(comms[0]
        .all_reduce_in_place(&mut b0.view_mut(), ReduceOp::Sum, &streams[1])
        .is_err());
    assert!(comms[0].send(&b0.view(), 0, &streams[0]).is_err());
    for s in &streams {
        s.synchronize().unwrap();
    }
    drop(comms);
    for d in &devs {
        assert!(d.take_errors().is_empty());
    }
}
