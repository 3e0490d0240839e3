//! The executor: binds weights, owns persistent buffers and the planned arena, and runs graphs on
//! the CPU backend.
//!
//! An executor lives as long as the model: weights are bound once by name (zero-copy), persistent
//! buffers (the KV cache) are created on first use and keep their contents, and the arena grows to
//! the largest graph seen (call [`Executor::reserve`] with a worst-case graph to size it once).
//! Graphs may be rebuilt for every step; planning is linear in the node count.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use crate::cpu::{self, CpuBackend, SrcView};
use crate::error::{GraphError, Result};
use crate::graph::Graph;
use crate::plan::{plan, Plan};
use crate::tensor::{DType, Leaf, Op, Tensor, TensorId};

/// Zeroed host storage whose bytes start on a 64-byte boundary (a cache line; the planner's
/// offsets keep every tensor there).
#[derive(Default)]
pub(crate) struct Lines {
    raw: Vec<u8>,
    start: usize,
    len: usize,
}

impl Lines {
    /// The bytes (a multiple of 64).
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.raw[self.start..self.start + self.len]
    }

    /// The bytes, writable.
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.raw[self.start..self.start + self.len]
    }

    /// Size in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

/// `bytes` of zeroed, 64-byte aligned storage for `what`; failing to get it is an
/// [`GraphError::OutOfMemory`], never an abort. The bytes are asked for with byte alignment,
/// which the system allocator serves from `calloc`: a large buffer (a long context's KV cache)
/// comes as fresh zero pages and costs memory only as it is written, where a cache-line aligned
/// request would be zeroed by hand, page by page, before the first use.
pub(crate) fn lines(bytes: usize, what: &str) -> Result<Lines> {
    let oom = || GraphError::OutOfMemory {
        what: what.to_owned(),
        bytes,
    };
    let len = bytes.div_ceil(64).checked_mul(64).ok_or_else(oom)?;
    let raw = bytemuck::allocation::try_zeroed_vec::<u8>(len.checked_add(63).ok_or_else(oom)?)
        .map_err(|()| oom())?;
    let start = raw.as_ptr().align_offset(64).min(63);
    Ok(Lines { raw, start, len })
}

/// Read-only bytes of a weight: a shared owner (a mmap, a `Vec<u8>`...) and a byte range in it.
#[derive(Clone)]
pub struct WeightBytes {
    owner: Arc<dyn AsRef<[u8]> + Send + Sync>,
    range: Range<usize>,
}

impl WeightBytes {
    /// `range` of `owner`'s bytes (e.g. a tensor's data inside a mmap'd GGUF file).
    pub fn new(owner: Arc<dyn AsRef<[u8]> + Send + Sync>, range: Range<usize>) -> Result<Self> {
        let len = (*owner).as_ref().len();
        if range.start > range.end || range.end > len {
            return Err(GraphError::Size {
                name: "weight range".into(),
                dtype: DType::I8,
                ne: [len, 1, 1, 1],
                expected: range.end,
                got: len,
            });
        }
        Ok(Self { owner, range })
    }

    /// Owned bytes.
    pub fn from_vec(v: Vec<u8>) -> Self {
        let range = 0..v.len();
        Self {
            owner: Arc::new(v),
            range,
        }
    }

    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        &(*self.owner).as_ref()[self.range.clone()]
    }

    /// Bytes `range` of these bytes, sharing the owner (a slice of a tensor without a copy).
    pub fn sub(&self, range: Range<usize>) -> Result<Self> {
        let len = self.range.len();
        if range.start > range.end || range.end > len {
            return Err(GraphError::Size {
                name: "weight sub-range".into(),
                dtype: DType::I8,
                ne: [len, 1, 1, 1],
                expected: range.end,
                got: len,
            });
        }
        Ok(Self {
            owner: Arc::clone(&self.owner),
            range: self.range.start + range.start..self.range.start + range.end,
        })
    }
}

struct Bound {
    dtype: DType,
    ne: [usize; 4],
    bytes: WeightBytes,
}

struct PersistentBuf {
    dtype: DType,
    ne: [usize; 4],
    pool: usize,
}

/// Where a tensor's first byte lives during a run.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Loc {
    Pool { pool: usize, off: usize },
    Weight { idx: usize, off: usize },
}

/// Runs graphs on the CPU backend; see the crate docs for an example.
pub struct Executor {
    backend: CpuBackend,
    weights: HashMap<String, Bound>,
    persistent: HashMap<String, PersistentBuf>,
    /// Pool 0 is the arena; the others are persistent buffers.
    pools: Vec<Lines>,
    outputs: HashMap<TensorId, (Tensor, Loc)>,
    last_plan: Plan,
}

impl Executor {
    /// An executor with an empty arena.
    pub fn new(backend: CpuBackend) -> Self {
        Self {
            backend,
            weights: HashMap::new(),
            persistent: HashMap::new(),
            pools: vec![Lines::default()],
            outputs: HashMap::new(),
            last_plan: Plan::default(),
        }
    }

    /// The backend.
    pub fn backend(&self) -> &CpuBackend {
        &self.backend
    }

    /// Binds `bytes` to the weight leaves named `name` (checked against `dtype` and shape `ne`).
    pub fn bind_weight(
        &mut self,
        name: &str,
        dtype: DType,
        shape: &[usize],
        bytes: WeightBytes,
    ) -> Result<()> {
        let ne = crate::tensor::shape4(shape).ok_or_else(|| {
            crate::error::shape_err("bind_weight", format!("`{name}`: bad shape {shape:?}"))
        })?;
        let expected = crate::tensor::row_bytes(dtype, ne[0]) * ne[1] * ne[2] * ne[3];
        if bytes.bytes().len() != expected || ne[0] % dtype.block_size() != 0 {
            return Err(GraphError::Size {
                name: name.into(),
                dtype,
                ne,
                expected,
                got: bytes.bytes().len(),
            });
        }
        self.weights
            .insert(name.to_string(), Bound { dtype, ne, bytes });
        Ok(())
    }

    /// Grows the arena to fit `graph` (a worst-case graph), so later runs do not allocate.
    pub fn reserve(&mut self, graph: &Graph) -> Result<usize> {
        let p = plan(graph);
        if self.pools[0].len() < p.peak {
            // Free the old arena first: both at once may not fit.
            self.pools[0] = Lines::default();
            self.pools[0] = lines(p.peak, "the activation arena")?;
        }
        Ok(p.peak)
    }

    /// Arena size in bytes.
    pub fn arena_bytes(&self) -> usize {
        self.pools[0].len()
    }

    /// The plan of the last run.
    pub fn last_plan(&self) -> &Plan {
        &self.last_plan
    }

    /// Contents of a persistent buffer (zeroed until written).
    pub fn persistent_bytes(&self, name: &str) -> Option<&[u8]> {
        let p = self.persistent.get(name)?;
        let len = crate::tensor::row_bytes(p.dtype, p.ne[0]) * p.ne[1] * p.ne[2] * p.ne[3];
        Some(&self.pools[p.pool].bytes()[..len])
    }

    /// Sets every persistent buffer to zero (e.g. a new conversation).
    pub fn clear_persistent(&mut self) {
        for p in self.persistent.values() {
            self.pools[p.pool].bytes_mut().fill(0);
        }
    }

    fn resolve_leaves(
        &mut self,
        graph: &Graph,
        weight_list: &mut Vec<WeightBytes>,
    ) -> Result<Vec<Option<Loc>>> {
        let mut locs = vec![None; graph.len()];
        for (i, t) in graph.tensors().iter().enumerate() {
            match t.op {
                Op::Leaf(Leaf::Weight) => {
                    let b = self
                        .weights
                        .get(&t.name)
                        .ok_or_else(|| GraphError::UnboundWeight(t.name.clone()))?;
                    if b.dtype != t.dtype || b.ne != t.ne {
                        return Err(GraphError::Mismatch {
                            name: t.name.clone(),
                            bound: format!("{} {:?}", b.dtype, b.ne),
                            declared: format!("{} {:?}", t.dtype, t.ne),
                        });
                    }
                    locs[i] = Some(Loc::Weight {
                        idx: weight_list.len(),
                        off: 0,
                    });
                    weight_list.push(b.bytes.clone());
                }
                Op::Leaf(Leaf::Persistent) => {
                    let pool = match self.persistent.get(&t.name) {
                        Some(p) if p.dtype == t.dtype && p.ne == t.ne => p.pool,
                        Some(p) => {
                            return Err(GraphError::Mismatch {
                                name: t.name.clone(),
                                bound: format!("{} {:?}", p.dtype, p.ne),
                                declared: format!("{} {:?}", t.dtype, t.ne),
                            })
                        }
                        None => {
                            self.pools.push(lines(t.dense_bytes(), &t.name)?);
                            let pool = self.pools.len() - 1;
                            self.persistent.insert(
                                t.name.clone(),
                                PersistentBuf {
                                    dtype: t.dtype,
                                    ne: t.ne,
                                    pool,
                                },
                            );
                            pool
                        }
                    };
                    locs[i] = Some(Loc::Pool { pool, off: 0 });
                }
                _ => {}
            }
        }
        Ok(locs)
    }

    /// Runs `graph` with `inputs` (dense bytes for every needed input leaf). Outputs stay readable
    /// until the next run.
    pub fn run(&mut self, graph: &Graph, inputs: &[(TensorId, &[u8])]) -> Result<()> {
        let p = plan(graph);
        let mut weight_list = Vec::new();
        let mut locs = self.resolve_leaves(graph, &mut weight_list)?;
        if self.pools[0].len() < p.peak {
            tracing::debug!(bytes = p.peak, "growing arena");
            self.pools[0] = Lines::default();
            self.pools[0] = lines(p.peak, "the activation arena")?;
        }
        for i in 0..graph.len() {
            if let Some(off) = p.offset[i] {
                locs[i] = Some(Loc::Pool { pool: 0, off });
            } else if let Some((parent, off)) = graph.tensors()[i].view_of {
                locs[i] = locs[parent.index()].map(|l| match l {
                    Loc::Pool { pool, off: o } => Loc::Pool { pool, off: o + off },
                    Loc::Weight { idx, off: o } => Loc::Weight { idx, off: o + off },
                });
            }
        }
        // Copy inputs in.
        for (i, t) in graph.tensors().iter().enumerate() {
            if t.op != Op::Leaf(Leaf::Input) || !p.needed[i] {
                continue;
            }
            let id = TensorId(i as u32);
            let data = inputs
                .iter()
                .find(|(x, _)| *x == id)
                .map(|(_, d)| *d)
                .ok_or_else(|| GraphError::MissingInput(t.name.clone()))?;
            let need = t.dense_bytes();
            if data.len() != need {
                return Err(GraphError::Size {
                    name: t.name.clone(),
                    dtype: t.dtype,
                    ne: t.ne,
                    expected: need,
                    got: data.len(),
                });
            }
            let off = p.offset[i].unwrap_or(0);
            self.pools[0].bytes_mut()[off..off + need].copy_from_slice(data);
        }
        let weights: Vec<&[u8]> = weight_list.iter().map(|w| w.bytes()).collect();
        let backend = &self.backend;
        let pools = &mut self.pools;
        backend.install(|| -> Result<()> {
            for (i, t) in graph.tensors().iter().enumerate() {
                if !p.needed[i] || matches!(t.op, Op::Leaf(_) | Op::View) {
                    continue;
                }
                let out_loc = match locs[i] {
                    Some(Loc::Pool { pool, off }) => (pool, off),
                    _ => {
                        return Err(GraphError::Misaligned(format!(
                            "{} has no writable storage",
                            t.name
                        )))
                    }
                };
                let mut srcs = Vec::with_capacity(t.src.len());
                // The destination of cpy/set_rows is written, not read.
                let skip = match t.op {
                    Op::Cpy => Some(1),
                    Op::SetRows => Some(0),
                    _ => None,
                };
                for (si, &s) in t.src.iter().enumerate() {
                    if Some(si) == skip {
                        continue;
                    }
                    let st = &graph.tensors()[s.index()];
                    let loc = locs[s.index()].ok_or(GraphError::BadId(s))?;
                    srcs.push((st, loc));
                }
                with_io(
                    crate::plan::in_place_op(&t.op),
                    pools,
                    &weights,
                    out_loc,
                    t.extent(),
                    &srcs,
                    |out, views| cpu::compute(backend, t, out, views),
                )?;
            }
            Ok(())
        })?;
        self.outputs.clear();
        for &o in graph.outputs() {
            if let Some(l) = locs[o.index()] {
                self.outputs
                    .insert(o, (graph.tensors()[o.index()].clone(), l));
            }
        }
        self.last_plan = p;
        Ok(())
    }

    fn output_bytes(&self, id: TensorId) -> Result<(&Tensor, &[u8])> {
        let (t, loc) = self
            .outputs
            .get(&id)
            .ok_or_else(|| GraphError::NotOutput(format!("{id:?}")))?;
        let bytes = match *loc {
            Loc::Pool { pool, off } => &self.pools[pool].bytes()[off..off + t.extent()],
            Loc::Weight { .. } => return Err(GraphError::NotOutput(t.name.clone())),
        };
        Ok((t, bytes))
    }

    /// An output of the last run as f32 values in logical (row-major) order.
    pub fn output_f32(&self, id: TensorId) -> Result<Vec<f32>> {
        let (t, bytes) = self.output_bytes(id)?;
        let mut v = vec![0.0; t.nelements()];
        cpu::gather_f32(t, bytes, &mut v)?;
        Ok(v)
    }

    /// Hands `f` an output of the last run as f32 values in logical order, in place where the
    /// output is dense f32.
    pub fn with_output_f32<R>(&self, id: TensorId, f: impl FnOnce(&[f32]) -> R) -> Result<R> {
        let (t, bytes) = self.output_bytes(id)?;
        cpu::with_f32(t, bytes, f)
    }

    /// Like [`Executor::output_f32`], into a caller buffer of exactly `nelements` values.
    pub fn output_into(&self, id: TensorId, dst: &mut [f32]) -> Result<()> {
        let (t, bytes) = self.output_bytes(id)?;
        if dst.len() != t.nelements() {
            return Err(GraphError::Size {
                name: t.name.clone(),
                dtype: t.dtype,
                ne: t.ne,
                expected: t.nelements() * 4,
                got: dst.len() * 4,
            });
        }
        cpu::gather_f32(t, bytes, dst)
    }

    /// An I32 output of the last run (e.g. argmax), in logical order.
    pub fn output_i32(&self, id: TensorId) -> Result<Vec<i32>> {
        let (t, bytes) = self.output_bytes(id)?;
        if t.dtype != DType::I32 || !t.is_contiguous() {
            return Err(GraphError::Mismatch {
                name: t.name.clone(),
                bound: format!("{}", t.dtype),
                declared: "contiguous i32".into(),
            });
        }
        Ok(bytes
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }
}

/// Splits storage so that the output range is writable while the inputs are readable, then calls
/// `f`. Inputs overlapping the output are rejected (the planner never places them so).
/// Storage the executors split into output and inputs: an owned vector or a locked one.
pub(crate) trait Pool {
    fn bytes(&self) -> &[u8];
    fn bytes_mut(&mut self) -> &mut [u8];
}

impl Pool for Lines {
    fn bytes(&self) -> &[u8] {
        Lines::bytes(self)
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        Lines::bytes_mut(self)
    }
}

impl Pool for parking_lot::MutexGuard<'_, Lines> {
    fn bytes(&self) -> &[u8] {
        Lines::bytes(self)
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        Lines::bytes_mut(self)
    }
}

pub(crate) fn with_io<P: Pool, R>(
    inplace_capable: bool,
    pools: &mut [P],
    weights: &[&[u8]],
    (pool, start): (usize, usize),
    len: usize,
    srcs: &[(&Tensor, Loc)],
    f: impl FnOnce(&mut [u8], &[SrcView<'_>]) -> Result<R>,
) -> Result<R> {
    // Only the first operand of an in-place capable op may share the output's bytes.
    let mut first = true;
    let (left, rest) = pools.split_at_mut(pool);
    let (mid, right) = rest
        .split_first_mut()
        .ok_or_else(|| GraphError::Misaligned("bad pool".into()))?;
    let bytes: &mut [u8] = mid.bytes_mut();
    let (before, rest) = bytes.split_at_mut(start);
    let (out, after) = rest.split_at_mut(len);
    let (before, after): (&[u8], &[u8]) = (before, after);
    let mut views = Vec::with_capacity(srcs.len());
    for &(t, loc) in srcs {
        let inplace_ok = std::mem::take(&mut first) && inplace_capable;
        let n = t.extent();
        let data: &[u8] = match loc {
            Loc::Weight { idx, off } => &weights[idx][off..off + n],
            Loc::Pool { pool: q, off } if q < pool => &left[q].bytes()[off..off + n],
            Loc::Pool { pool: q, off } if q > pool => &right[q - pool - 1].bytes()[off..off + n],
            Loc::Pool { off, .. } => {
                if off + n <= start {
                    &before[off..off + n]
                } else if off >= start + len {
                    &after[off - start - len..off - start - len + n]
                } else if n == 0 {
                    &[]
                } else if off == start && n == len && inplace_ok {
                    views.push(SrcView {
                        t,
                        data: &[],
                        aliased: true,
                    });
                    continue;
                } else {
                    return Err(GraphError::Unsupported {
                        backend: "cpu",
                        op: "io",
                        detail: format!("input `{}` overlaps the output", t.name),
                    });
                }
            }
        };
        views.push(SrcView {
            t,
            data,
            aliased: false,
        });
    }
    f(out, &views)
}
