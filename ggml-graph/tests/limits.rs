//! Sizes past what memory can hold: a shape whose byte size overflows is refused when the graph
//! is built, and a buffer the host cannot give is an `OutOfMemory` error naming it, not an abort.

use rocmforge_ggml_graph::{CpuBackend, DType, Executor, Graph, GraphError};

#[test]
fn unaddressable_shapes_are_refused_at_build_time() {
    let mut g = Graph::new();
    let e = g
        .persistent("cache_k.0", DType::F16, &[1 << 40, 1 << 30])
        .expect_err("2^71 bytes");
    assert!(matches!(e, GraphError::Shape { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(
        msg.contains("cache_k.0") && msg.contains("too large"),
        "{msg}"
    );
    assert!(!msg.contains("(0 bytes)"), "{msg}");
}

#[test]
fn a_buffer_the_host_cannot_give_is_an_error() {
    let mut g = Graph::new();
    // 2^60 bytes: addressable, but no machine has them.
    let p = g
        .persistent("cache_v.3", DType::F32, &[1 << 30, 1 << 28])
        .expect("addressable");
    g.mark_output(p).expect("output");
    let mut exec = Executor::new(CpuBackend::new(1).expect("backend"));
    let e = exec.run(&g, &[]).expect_err("2^60 bytes");
    assert!(
        matches!(&e, GraphError::OutOfMemory { what, bytes } if what == "cache_v.3" && *bytes == 1 << 60),
        "{e:?}"
    );
    assert!(e.to_string().contains("out of memory"), "{e}");
}

#[test]
fn the_scheduler_names_what_it_could_not_allocate() {
    use std::sync::Arc;

    use rocmforge_ggml_graph::backend::{CpuDevice, Device};
    use rocmforge_ggml_graph::Scheduler;

    let mut g = Graph::new();
    let p = g
        .persistent("cache_v.3", DType::F32, &[1 << 30, 1 << 28])
        .expect("addressable");
    g.mark_output(p).expect("output");
    let cpu = Arc::new(CpuBackend::new(1).expect("backend"));
    let devices: Vec<Arc<dyn Device>> = vec![Arc::new(CpuDevice::new(cpu))];
    let mut s = Scheduler::new(devices).expect("scheduler");
    let e = s.run(&g, &[]).expect_err("2^60 bytes");
    assert!(e.is_out_of_memory(), "{e:?}");
    assert!(
        matches!(&e, GraphError::OutOfMemory { what, bytes } if what.contains("cache_v.3") && *bytes == 1 << 60),
        "{e:?}"
    );
}

/// Resident memory of this process in bytes (Linux).
#[cfg(target_os = "linux")]
fn rss() -> u64 {
    let s = std::fs::read_to_string("/proc/self/statm").expect("statm");
    let pages: u64 = s
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .expect("resident pages");
    pages * 4096
}

/// A long context's KV cache is mostly never written: its zero pages must not be touched (and
/// so made resident) when it is allocated, only when rows are written.
#[cfg(target_os = "linux")]
#[test]
fn a_large_cache_costs_memory_only_as_it_is_written() {
    let mut g = Graph::new();
    // 1 GiB of cache; the graph reads one row of it.
    let cache = g
        .persistent("cache_k.0", DType::F32, &[1024, 256 * 1024])
        .expect("cache");
    let row = g.view(cache, &[1024], &[], 0).expect("row");
    let out = g.scale(row, 1.0).expect("read");
    g.mark_output(out).expect("output");
    let mut exec = Executor::new(CpuBackend::new(1).expect("backend"));
    let before = rss();
    exec.run(&g, &[]).expect("run");
    let grown = rss().saturating_sub(before);
    assert!(grown < 256 << 20, "{grown} bytes became resident");
    assert_eq!(
        exec.persistent_bytes("cache_k.0").map(<[u8]>::len),
        Some(1 << 30)
    );
}
