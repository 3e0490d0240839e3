//! Host-mapped outputs: a small output nothing else reads is written by its kernel into the
//! device's host-mapped buffer and read from there; everything else stays in the arena, and a
//! device without mapped memory keeps the arena for good.

mod common;

use std::sync::Arc;

use common::*;
use parking_lot::Mutex;
use rocmforge_ggml_graph::backend::{Buffer, BufferType, CpuDevice, Device, HostBufferType};
use rocmforge_ggml_graph::{CpuBackend, DType, Graph, GraphError, Result, Scheduler, TensorId};
use rocmforge_ggml_graph::{Executor, WeightBytes};

#[derive(Clone, Copy, PartialEq, Eq)]
enum Give {
    Mapped,
    Nothing,
    Failure,
}

/// Host memory that calls itself device memory, and may offer host-mapped buffers.
struct MappingType {
    give: Give,
    /// Sizes asked of `alloc_mapped`.
    asked: Mutex<Vec<usize>>,
}

impl BufferType for MappingType {
    fn name(&self) -> &str {
        "mapping"
    }
    fn alignment(&self) -> usize {
        64
    }
    fn alloc(&self, size: usize) -> Result<Box<dyn Buffer>> {
        HostBufferType.alloc(size)
    }
    fn is_host(&self) -> bool {
        false
    }
    fn alloc_mapped(&self, size: usize) -> Result<Option<Box<dyn Buffer>>> {
        self.asked.lock().push(size);
        match self.give {
            Give::Mapped => HostBufferType.alloc(size).map(Some),
            Give::Nothing => Ok(None),
            Give::Failure => Err(GraphError::Unsupported {
                backend: "mapping",
                op: "alloc_mapped",
                detail: "no page-locked memory left".into(),
            }),
        }
    }
}

/// A CPU device over [`MappingType`] buffers.
struct Mapping {
    inner: CpuDevice,
    bt: MappingType,
}

impl Mapping {
    fn new(give: Give) -> Arc<Self> {
        Arc::new(Self {
            inner: CpuDevice::new(Arc::new(CpuBackend::new(1).unwrap())),
            bt: MappingType {
                give,
                asked: Mutex::new(Vec::new()),
            },
        })
    }
    fn asked(&self) -> Vec<usize> {
        self.bt.asked.lock().clone()
    }
}

impl Device for Mapping {
    fn name(&self) -> &str {
        "mapping-cpu"
    }
    fn buffer_type(&self) -> &dyn BufferType {
        &self.bt
    }
    forward_device!(inner, compute);
}

/// A decode-step-like graph: logits of a normed input (an output nothing reads), a hidden
/// state that is both an output and read by a later node, and that node's result.
struct Step {
    g: Graph,
    x: TensorId,
    logits: TensorId,
    hidden: TensorId,
    top: TensorId,
}

fn step() -> Step {
    let mut g = Graph::new();
    let x = g.input("x", DType::F32, &[64, 1]).unwrap();
    let w = g.weight("w", DType::Q8_0, &[64, 96]).unwrap();
    let u = g.weight("u", DType::Q8_0, &[64, 64]).unwrap();
    let h = g.rms_norm(x, 1e-6).unwrap();
    let hidden = g.mul_mat(u, h).unwrap();
    let act = g.silu(hidden).unwrap();
    let logits = g.mul_mat(w, act).unwrap();
    let top = g.scale(act, 0.5).unwrap();
    g.mark_output(logits).unwrap();
    g.mark_output(hidden).unwrap();
    g.mark_output(top).unwrap();
    Step {
        g,
        x,
        logits,
        hidden,
        top,
    }
}

struct Data {
    w: Vec<u8>,
    u: Vec<u8>,
    x: Vec<u8>,
}

fn data() -> Data {
    let mut rng = Rng::new(41);
    Data {
        w: random_weights(&mut rng, DType::Q8_0, 64 * 96),
        u: random_weights(&mut rng, DType::Q8_0, 64 * 64),
        x: f32_bytes(&rng.vec(64)),
    }
}

fn reference(s: &Step, d: &Data) -> Executor {
    run(
        &s.g,
        &[
            ("w", DType::Q8_0, &[64, 96], d.w.clone()),
            ("u", DType::Q8_0, &[64, 64], d.u.clone()),
        ],
        &[(s.x, d.x.clone())],
    )
}

fn scheduler(dev: Arc<Mapping>, d: &Data) -> Scheduler {
    let mut sch = Scheduler::new(vec![dev as Arc<dyn Device>]).unwrap();
    sch.bind_weight(
        "w",
        DType::Q8_0,
        &[64, 96],
        WeightBytes::from_vec(d.w.clone()),
    )
    .unwrap();
    sch.bind_weight(
        "u",
        DType::Q8_0,
        &[64, 64],
        WeightBytes::from_vec(d.u.clone()),
    )
    .unwrap();
    sch
}

/// Three keyed runs (the second and third reuse the preparation) match the executor.
fn check_runs(sch: &mut Scheduler, s: &Step, d: &Data) {
    let ex = reference(s, d);
    for _ in 0..3 {
        sch.run_keyed(Some(7), &s.g, &[(s.x, &d.x)]).unwrap();
        for o in [s.logits, s.hidden, s.top] {
            let want = ex.output_f32(o).unwrap();
            assert_eq!(sch.output_f32(o).unwrap(), want);
            assert_eq!(sch.with_output_f32(o, <[f32]>::to_vec).unwrap(), want);
        }
    }
}

#[test]
fn unread_small_outputs_go_to_mapped_memory() {
    let (s, d) = (step(), data());
    let dev = Mapping::new(Give::Mapped);
    let mut sch = scheduler(dev.clone(), &d);
    check_runs(&mut sch, &s, &d);
    // The logits (96 f32) and `top` (64 f32) qualify, each rounded up to the planner's
    // alignment; `hidden` is read by silu and stays in the arena. One buffer, kept across runs.
    let asked = dev.asked();
    assert_eq!(asked.len(), 1, "{asked:?}");
    let align = rocmforge_ggml_graph::plan::ALIGN;
    assert_eq!(
        asked[0],
        384usize.div_ceil(align) * align + 256usize.div_ceil(align) * align
    );
}

#[test]
fn outputs_stay_in_the_arena_without_mapped_memory() {
    let (s, d) = (step(), data());
    for give in [Give::Nothing, Give::Failure] {
        let dev = Mapping::new(give);
        let mut sch = scheduler(dev.clone(), &d);
        check_runs(&mut sch, &s, &d);
        // Asked once; the device is not asked again for this graph or a new one.
        sch.run_keyed(Some(8), &s.g, &[(s.x, &d.x)]).unwrap();
        assert_eq!(dev.asked().len(), 1);
    }
    // Turned off: never asked.
    let dev = Mapping::new(Give::Mapped);
    let mut sch = scheduler(dev.clone(), &d);
    sch.set_mapped_outputs(false);
    check_runs(&mut sch, &s, &d);
    assert!(dev.asked().is_empty());
}
