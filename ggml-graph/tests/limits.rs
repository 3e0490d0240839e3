//! Sizes past what memory can hold: a shape whose byte size overflows is refused when the graph
//! is built, and a buffer the host cannot give is an `OutOfMemory` error naming it, not an abort.

use ggml_graph::{CpuBackend, DType, Executor, Graph, GraphError};

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
