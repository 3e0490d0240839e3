//! The multi-device scheduler: places each node on the first device that supports it, keeps
//! weights uploaded once per device, copies tensors that cross devices, and runs the graph.
//!
//! Placement: compute nodes go to the first device (in priority order) whose `supports_op`
//! accepts them; views, `cpy` and `set_rows` run where their storage lives; input and persistent
//! leaves live on the device of their first consumer. An optional [`PlacementRule`] names the
//! device of weights and persistent leaves (a layer split such as llama.cpp's `-ngl`): nodes that
//! read a placed leaf run on its device and the nodes in between follow their operands. Every device gets one arena laid out by the
//! [`crate::plan`] planner plus slots for copies of tensors produced elsewhere. A copy is made
//! right before its first reader on the other device and is refreshed after its source is
//! rewritten; between two GPUs it goes device to device ([`crate::backend::Buffer::copy_from`]),
//! so a model split over several GPUs by layer passes its activations GPU to GPU.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use crate::backend::{Buffer, BufferType, Captured, Collective, Device, GroupNode, Stream};
use crate::error::{GraphError, Result};
use crate::exec::WeightBytes;
use crate::graph::Graph;
use crate::plan::{plan_grouped, ALIGN};
use crate::tensor::{DType, Leaf, Op, Tensor, TensorId};

mod group;
mod memory;
mod output;
use group::possible_groups;
use memory::mapped_outputs;

/// Where each node runs and which copies the run needs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Schedule {
    /// Device index per node (`None` for nodes not needed).
    pub device_of: Vec<Option<usize>>,
    /// Runs of consecutive launched nodes on one device, in execution order.
    pub splits: Vec<(usize, Vec<TensorId>)>,
    /// `(storage root, device)` pairs that need a copy on a device other than the root's home.
    pub copies: Vec<(TensorId, usize)>,
    /// Per node: true for an [`Op::AllReduce`] whose operands a [`Collective`] sums in place
    /// on their devices (no copies); the node then reads its own device's operand, the sum.
    pub collective: Vec<bool>,
}

/// Operands a node reads (the written destination of `cpy`/`set_rows` excluded).
fn read_srcs(t: &Tensor) -> impl Iterator<Item = (usize, TensorId)> + '_ {
    let skip = match t.op {
        Op::Cpy => Some(1),
        Op::SetRows => Some(0),
        _ => None,
    };
    t.src
        .iter()
        .copied()
        .enumerate()
        .filter(move |(i, _)| Some(*i) != skip)
}

fn launches(t: &Tensor) -> bool {
    !matches!(t.op, Op::Leaf(_) | Op::View)
}

/// Maps the name of a weight or persistent leaf to the device (index into the scheduler's
/// devices) that holds it; `None` leaves the choice to the scheduler.
pub type PlacementRule = Arc<dyn Fn(&str) -> Option<usize> + Send + Sync>;

/// The activation arena a scheduler plans for `graph` run as one device's launches (every
/// device's arena is the whole graph's peak, copy slots aside): the memory planner with the
/// operands of every launch group a device may take kept alive together, as `run` plans it.
pub fn planned_peak(graph: &Graph) -> usize {
    let needed = crate::plan::needed_nodes(graph);
    let ids: Vec<TensorId> = (graph.tensors().iter().enumerate())
        .filter(|&(i, t)| needed[i] && launches(t))
        .map(|(i, _)| TensorId::from_index(i))
        .collect();
    let groups: Vec<Vec<TensorId>> = possible_groups(graph, &ids)
        .into_iter()
        .map(|(_, g)| g)
        .collect();
    plan_grouped(graph, &groups).peak
}

/// Places `graph`'s nodes on `devices` (priority order). `persistent_home` pins persistent
/// buffers that already exist.
pub fn schedule(
    graph: &Graph,
    devices: &[Arc<dyn Device>],
    persistent_home: &HashMap<String, usize>,
) -> Result<Schedule> {
    schedule_with(graph, devices, persistent_home, None)
}

/// The device each node prefers under `rule`: a node that reads a placed weight or persistent
/// leaf goes where that leaf lives; any other node follows its most recently computed operand,
/// so the norms, residual adds and attention of a layer stay with the layer's weights.
fn preferences(graph: &Graph, n_devices: usize, rule: &PlacementRule) -> Vec<Option<usize>> {
    let nodes = graph.tensors();
    let mut pref: Vec<Option<usize>> = vec![None; nodes.len()];
    for (i, t) in nodes.iter().enumerate() {
        pref[i] = match t.op {
            Op::Leaf(Leaf::Weight | Leaf::Persistent) => rule(&t.name).filter(|&d| d < n_devices),
            Op::Leaf(_) => None,
            _ if t.op.is_alias() => pref[graph.storage_root(TensorId::from_index(i)).0.index()],
            _ => {
                let mut pinned = None;
                let mut latest: Option<(usize, usize)> = None;
                for &s in &t.src {
                    let r = graph.storage_root(s).0.index();
                    if matches!(nodes[r].op, Op::Leaf(Leaf::Weight | Leaf::Persistent)) {
                        pinned = pinned.or(pref[r]);
                    } else if let Some(d) = pref[s.index()] {
                        if latest.is_none_or(|(j, _)| s.index() > j) {
                            latest = Some((s.index(), d));
                        }
                    }
                }
                pinned.or(latest.map(|(_, d)| d))
            }
        };
    }
    pref
}

/// [`schedule`] with an optional placement rule for weights and persistent leaves (for example
/// "layer `i`'s weights and KV cache on the GPU"); nodes a preferred device does not support
/// go to the first device that does.
pub fn schedule_with(
    graph: &Graph,
    devices: &[Arc<dyn Device>],
    persistent_home: &HashMap<String, usize>,
    rule: Option<&PlacementRule>,
) -> Result<Schedule> {
    schedule_reducing(graph, devices, persistent_home, rule, None)
}

/// [`schedule_with`] where `collective` sums the operands of [`Op::AllReduce`] nodes that lie
/// one on each of its devices, one of them the node's own: such operands get no copies.
fn schedule_reducing(
    graph: &Graph,
    devices: &[Arc<dyn Device>],
    persistent_home: &HashMap<String, usize>,
    rule: Option<&PlacementRule>,
    collective: Option<&dyn Collective>,
) -> Result<Schedule> {
    let n = graph.len();
    let needed = crate::plan::needed_nodes(graph);
    let nodes = graph.tensors();
    let srcs_of =
        |t: &Tensor| -> Vec<&Tensor> { t.src.iter().map(|s| &nodes[s.index()]).collect() };
    let first_supporting = |t: &Tensor| devices.iter().position(|d| d.supports_op(t, &srcs_of(t)));
    let pref = match rule {
        Some(r) => preferences(graph, devices.len(), r),
        None => vec![None; n],
    };
    // The first launched reader of each storage root.
    let mut first_reader: Vec<Option<usize>> = vec![None; n];
    for j in 0..n {
        if needed[j] && launches(&nodes[j]) {
            for &s in &nodes[j].src {
                let r = graph.storage_root(s).0.index();
                first_reader[r].get_or_insert(j);
            }
        }
    }
    let mut dev = vec![None; n];
    // 1. Computing nodes that own their result.
    for i in 0..n {
        let t = &nodes[i];
        if needed[i] && launches(t) && !t.op.is_alias() {
            let srcs = srcs_of(t);
            let preferred = pref[i].filter(|&d| devices[d].supports_op(t, &srcs));
            dev[i] = Some(
                preferred
                    .or_else(|| devices.iter().position(|d| d.supports_op(t, &srcs)))
                    .ok_or_else(|| no_device(t))?,
            );
        }
    }
    // 2. Leaves: where the rule puts them, else the device of their first launched reader.
    for i in 0..n {
        if !needed[i] || !matches!(nodes[i].op, Op::Leaf(_)) {
            continue;
        }
        if let Some(&d) = persistent_home
            .get(&nodes[i].name)
            .filter(|_| nodes[i].op == Op::Leaf(Leaf::Persistent))
        {
            dev[i] = Some(d);
            continue;
        }
        if let Some(d) = pref[i] {
            dev[i] = Some(d);
            continue;
        }
        dev[i] = Some(match first_reader[i] {
            Some(j) if nodes[j].op.is_alias() => first_supporting(&nodes[j]).unwrap_or(0),
            Some(j) => dev[j].unwrap_or(0),
            None => 0,
        });
    }
    // 3. Aliases run where their storage lives.
    for i in 0..n {
        let t = &nodes[i];
        if needed[i] && t.op.is_alias() {
            let home = dev[graph.storage_root(TensorId::from_index(i)).0.index()].unwrap_or(0);
            if t.op != Op::View && !devices[home].supports_op(t, &srcs_of(t)) {
                return Err(no_device(t));
            }
            dev[i] = Some(home);
        }
    }
    let mut splits: Vec<(usize, Vec<TensorId>)> = Vec::new();
    let mut copies = Vec::new();
    let mut seen = HashSet::new();
    let mut reduced = vec![false; n];
    for i in 0..n {
        let t = &nodes[i];
        if !needed[i] || !launches(t) {
            continue;
        }
        let d = dev[i].unwrap_or(0);
        if let (Op::AllReduce, Some(c)) = (&t.op, collective) {
            let homes: Vec<usize> = t
                .src
                .iter()
                .map(|&s| dev[graph.storage_root(s).0.index()].unwrap_or(0))
                .collect();
            let mut distinct = homes.clone();
            distinct.sort_unstable();
            distinct.dedup();
            // One operand: a rank of a communicator whose other ranks are other processes.
            reduced[i] = !homes.is_empty()
                && distinct.len() == homes.len()
                && homes.contains(&d)
                && c.spans(&distinct);
        }
        for (_, s) in read_srcs(t).filter(|_| !reduced[i]) {
            let r = graph.storage_root(s).0;
            let weight = nodes[r.index()].op == Op::Leaf(Leaf::Weight);
            if !weight && dev[r.index()] != Some(d) && seen.insert((r, d)) {
                copies.push((r, d));
            }
        }
        match splits.last_mut() {
            Some((sd, v)) if *sd == d => v.push(TensorId::from_index(i)),
            _ => splits.push((d, vec![TensorId::from_index(i)])),
        }
    }
    Ok(Schedule {
        device_of: dev,
        splits,
        copies,
        collective: reduced,
    })
}

/// Stores the copy of weight `name` on device `d` of `n_dev`.
fn put_uploaded(
    map: &mut HashMap<String, Vec<Option<Box<dyn Buffer>>>>,
    n_dev: usize,
    name: &str,
    d: usize,
    b: Box<dyn Buffer>,
) {
    if !map.contains_key(name) {
        map.insert(name.to_string(), (0..n_dev).map(|_| None).collect());
    }
    if let Some(slot) = map.get_mut(name).and_then(|v| v.get_mut(d)) {
        *slot = Some(b);
    }
}

fn no_device(t: &Tensor) -> GraphError {
    GraphError::Unsupported {
        backend: "scheduler",
        op: t.op.name(),
        detail: format!("no device supports `{}`", t.name),
    }
}

struct Persistent {
    dtype: DType,
    ne: [usize; 4],
    device: usize,
    buf: Box<dyn Buffer>,
}

/// A buffer of `size` bytes for `what` on `device`; running out of memory there (the host's
/// allocator, a GPU's budget or driver) is an [`GraphError::OutOfMemory`] naming both.
fn alloc_for(device: &Arc<dyn Device>, size: usize, what: &str) -> Result<Box<dyn Buffer>> {
    let bt = device.buffer_type();
    bt.alloc(size).map_err(|e| name_oom(e, bt, what, size))
}

/// [`alloc_for`] of buffers that live together ([`BufferType::alloc_many`]).
fn alloc_many_for(
    device: &Arc<dyn Device>,
    sizes: &[usize],
    what: &str,
) -> Result<Vec<Box<dyn Buffer>>> {
    let bt = device.buffer_type();
    let total = sizes.iter().fold(0usize, |a, &s| a.saturating_add(s));
    bt.alloc_many(sizes)
        .map_err(|e| name_oom(e, bt, what, total))
}

/// An out-of-memory error of `bt` named after `what` it was for.
fn name_oom(e: GraphError, bt: &dyn BufferType, what: &str, bytes: usize) -> GraphError {
    match e {
        GraphError::OutOfMemory { bytes, .. } => GraphError::OutOfMemory {
            what: format!("{what} ({} memory)", bt.name()),
            bytes,
        },
        e if e.is_out_of_memory() => GraphError::OutOfMemory {
            what: format!("{what} ({} memory: {e})", bt.name()),
            bytes,
        },
        e => e,
    }
}

/// Runs graphs over several devices; the multi-device counterpart of [`crate::Executor`].
pub struct Scheduler {
    devices: Vec<Arc<dyn Device>>,
    streams: Vec<Box<dyn Stream>>,
    weights: HashMap<String, (DType, [usize; 4], WeightBytes)>,
    /// Weight copies by name, one slot per device.
    uploaded: HashMap<String, Vec<Option<Box<dyn Buffer>>>>,
    persistent: HashMap<String, Persistent>,
    arenas: Vec<Option<Box<dyn Buffer>>>,
    /// Per device: the host-mapped buffer of the outputs its kernels write in place.
    mapped: Vec<Option<Box<dyn Buffer>>>,
    /// Per device: whether outputs may go to host-mapped memory (false once the device had
    /// none to give, or when turned off).
    map_outputs: Vec<bool>,
    last: Option<LastRun>,
    /// Preparations of recent keyed runs, the most recent last (at most [`PLANS`]): graphs that
    /// take turns (a decode step's batch sizes, prompt chunks) each keep their memory plan and
    /// captured launches.
    prepared: Vec<Prepared>,
    /// Runs that replayed captured launches.
    replays: u64,
    copies_made: usize,
    placement: Option<PlacementRule>,
    /// Sums the operands of [`Op::AllReduce`] nodes in place across devices (see
    /// [`Scheduler::set_collective`]).
    collective: Option<Arc<dyn Collective>>,
    /// Whether repeated keyed runs on one device are captured and replayed (see
    /// [`Scheduler::set_graph_capture`]).
    capture: bool,
}

/// How a [`Scheduler`] runs graphs; both defaults are the fast path, the alternatives exist for
/// comparisons (results are the same either way).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SchedulerOptions {
    /// Capture repeated keyed runs on one device and replay them (see
    /// [`Scheduler::set_graph_capture`]).
    pub graph_capture: bool,
    /// Let kernels write small final outputs to host-mapped memory (see
    /// [`Scheduler::set_mapped_outputs`]).
    pub mapped_outputs: bool,
}

impl Default for SchedulerOptions {
    fn default() -> Self {
        Self {
            graph_capture: true,
            mapped_outputs: true,
        }
    }
}

/// Capture attempts per prepared graph before it stays on plain launches.
const CAPTURE_TRIES: u8 = 2;

/// Keyed preparations a scheduler keeps: enough for a batching engine's decode buckets
/// (13 batch sizes up to 128 sequences) beside a few prompt chunks' graphs.
const PLANS: usize = 16;

impl Drop for Scheduler {
    fn drop(&mut self) {
        // The last replay may still run on memory freed with the scheduler's buffers.
        for s in &self.streams {
            if let Err(e) = s.synchronize() {
                tracing::warn!("scheduler: stream sync before freeing buffers failed: {e}");
            }
        }
    }
}

/// Where an output of the last run lives.
enum OutLoc {
    /// In device `device`'s arena at `offset`.
    Arena { device: usize, offset: usize },
    /// In device `device`'s host-mapped output buffer at `offset`.
    Mapped { device: usize, offset: usize },
    /// In a persistent buffer, at `offset`.
    Persistent { name: String, offset: usize },
    /// In the copy of a weight on `device`, at `offset`.
    Weight {
        name: String,
        device: usize,
        offset: usize,
    },
}

/// What the last run leaves readable: its schedule and its outputs (not the whole graph, which
/// would be cloned on every run).
struct LastRun {
    sched: Arc<Schedule>,
    outputs: Vec<(TensorId, Tensor, OutLoc)>,
}

/// What a run derives from its graph alone, kept for the next run with the same key.
struct Prepared {
    key: u64,
    n_nodes: usize,
    sched: Arc<Schedule>,
    /// Arena offset per node (the memory plan).
    offsets: Vec<Option<usize>>,
    /// Copy slot per `(storage root, device)`: `slot[root * n_dev + device]`.
    slot: Vec<Option<usize>>,
    /// Arena bytes per device.
    arena_size: Vec<usize>,
    /// Offset per storage root written in its device's host-mapped output buffer instead of
    /// the arena ([`mapped_outputs`]).
    mapped: Vec<Option<usize>>,
    /// Host-mapped output bytes per device.
    mapped_size: Vec<usize>,
    /// Needed input leaves.
    inputs: Vec<usize>,
    /// The device running every launched node when there are no cross-device copies (the
    /// condition for capturing the run).
    single_device: Option<usize>,
    /// The captured launches of this graph (valid while the arena and persistent buffers stay).
    captured: Option<Box<dyn Captured>>,
    /// Failed capture attempts.
    capture_failures: u8,
    /// Per node: the length of the launch group starting there ([`group::group_run`]; 1 for none),
    /// found once per graph.
    runs: Vec<usize>,
}

/// Bytes a scheduler holds on one device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceUsage {
    /// Weight copies.
    pub weights: u64,
    /// Persistent buffers (KV cache).
    pub persistent: u64,
    /// The activation arena (planned intermediates plus cross-device copies).
    pub arena: u64,
    /// Host-mapped memory the device's kernels write outputs into (host memory, not the
    /// device's).
    pub mapped: u64,
}

impl Scheduler {
    /// A scheduler over `devices`, highest priority first, with the default options.
    pub fn new(devices: Vec<Arc<dyn Device>>) -> Result<Self> {
        Self::with_options(devices, SchedulerOptions::default())
    }

    /// [`Scheduler::new`] with `opts`.
    pub fn with_options(devices: Vec<Arc<dyn Device>>, opts: SchedulerOptions) -> Result<Self> {
        let streams = devices
            .iter()
            .map(|d| d.new_stream())
            .collect::<Result<Vec<_>>>()?;
        let arenas = devices.iter().map(|_| None).collect();
        Ok(Self {
            mapped: devices.iter().map(|_| None).collect(),
            map_outputs: vec![opts.mapped_outputs; devices.len()],
            devices,
            streams,
            weights: HashMap::new(),
            uploaded: HashMap::new(),
            persistent: HashMap::new(),
            arenas,
            last: None,
            prepared: Vec::new(),
            replays: 0,
            copies_made: 0,
            placement: None,
            collective: None,
            capture: opts.graph_capture,
        })
    }

    /// Turns capture of repeated keyed runs on or off (initially
    /// [`SchedulerOptions::graph_capture`]). A keyed graph whose launches all run on one device,
    /// with no cross-device copies, is captured on its second run (the first one sizes every
    /// scratch buffer) and replayed on later runs with the same key: inputs are written before
    /// the replay and outputs read after it, so a decode step costs one graph launch instead of
    /// one launch per node.
    pub fn set_graph_capture(&mut self, on: bool) {
        self.capture = on;
        for p in &mut self.prepared {
            p.captured = None;
            p.capture_failures = 0;
        }
    }

    /// Drops every captured run (their launches point into a buffer about to be freed).
    fn drop_captures(&mut self) {
        for p in &mut self.prepared {
            p.captured = None;
        }
    }

    /// Runs so far that replayed captured launches instead of launching node by node.
    pub fn replays(&self) -> u64 {
        self.replays
    }

    /// Turns host-mapped outputs on or off (initially [`SchedulerOptions::mapped_outputs`]): a
    /// small output that nothing in the graph reads, computed on a device with host-mapped
    /// memory, is written there by its kernel, so reading it after the run waits for no
    /// device-to-host copy (a decode step's logits). Applies to graphs prepared from now on.
    pub fn set_mapped_outputs(&mut self, on: bool) {
        self.map_outputs.fill(on);
        self.prepared.clear();
    }

    /// True when a run of `graph` under `key` would replay a capture: its launches queued at
    /// once, with no host wait (and none on other ranks' collectives).
    pub fn would_replay(&self, key: Option<u64>, graph: &Graph) -> bool {
        let Some(k) = key.filter(|_| self.capture) else {
            return false;
        };
        (self.prepared.iter())
            .any(|p| p.key == k && p.n_nodes == graph.len() && p.captured.is_some())
    }

    /// True when the last keyed run's graph is held captured.
    pub fn has_captured_graph(&self) -> bool {
        self.prepared.last().is_some_and(|p| p.captured.is_some())
    }

    /// The devices, highest priority first.
    pub fn devices(&self) -> &[Arc<dyn Device>] {
        &self.devices
    }

    /// Places weights and persistent leaves by name (see [`schedule_with`]); applies to
    /// persistent buffers created from now on.
    pub fn set_placement(&mut self, rule: PlacementRule) {
        self.placement = Some(rule);
        self.prepared.clear();
    }

    /// Runs [`Op::AllReduce`] nodes through `collective` where their operands lie on devices it
    /// covers (see [`Collective`]); `None`: their operands are copied to the node's device and
    /// summed there. Applies to graphs prepared from now on.
    pub fn set_collective(&mut self, collective: Option<Arc<dyn Collective>>) {
        self.collective = collective;
        self.prepared.clear();
    }

    /// Uploads every bound weight that the placement rule puts on a device, one
    /// [`crate::backend::BufferType::alloc_weights`] call per device (a device arena instead of one allocation
    /// per tensor), so no run uploads them lazily. `progress(done, total)` reports bytes.
    pub fn upload_placed_weights(&mut self, progress: &mut dyn FnMut(u64, u64)) -> Result<()> {
        let Some(rule) = self.placement.clone() else {
            return Ok(());
        };
        let nd = self.devices.len();
        let mut per_device: Vec<Vec<String>> = vec![Vec::new(); self.devices.len()];
        let mut names: Vec<&String> = self.weights.keys().collect();
        names.sort();
        for name in names {
            if let Some(d) = rule(name).filter(|&d| d < self.devices.len()) {
                if self.uploaded_buf(name, d).is_none() {
                    per_device[d].push(name.clone());
                }
            }
        }
        let total: u64 = per_device
            .iter()
            .flatten()
            .filter_map(|n| self.weights.get(n))
            .map(|(_, _, b)| b.bytes().len() as u64)
            .sum();
        let mut base = 0u64;
        for (d, names) in per_device.into_iter().enumerate() {
            if names.is_empty() {
                continue;
            }
            let mut held: Vec<WeightBytes> = Vec::with_capacity(names.len());
            for n in &names {
                let (_, _, b) = self
                    .weights
                    .get(n)
                    .ok_or_else(|| GraphError::UnboundWeight(n.clone()))?;
                held.push(b.clone());
            }
            let bytes: u64 = held.iter().map(|b| b.bytes().len() as u64).sum();
            let bt = self.devices[d].buffer_type();
            // A host device reads the weights where they are (the mapped file): a copy would
            // hold them in host memory twice.
            let bufs = match bt.bind_weights(&held) {
                Some(b) => b,
                None => {
                    let datas: Vec<&[u8]> = held.iter().map(WeightBytes::bytes).collect();
                    bt.alloc_weights(&datas, &mut |done| progress(base + done, total))?
                }
            };
            if bufs.len() != names.len() {
                return Err(GraphError::Unsupported {
                    backend: "scheduler",
                    op: "upload",
                    detail: format!(
                        "{} returned {} weight buffers for {} tensors",
                        self.devices[d].name(),
                        bufs.len(),
                        names.len()
                    ),
                });
            }
            for (n, b) in names.into_iter().zip(bufs) {
                put_uploaded(&mut self.uploaded, nd, &n, d, b);
            }
            base += bytes;
        }
        progress(total, total);
        Ok(())
    }

    /// Bytes held per device (weights, persistent buffers, activation arena, mapped outputs).
    pub fn usage(&self) -> Vec<DeviceUsage> {
        let mut u = vec![DeviceUsage::default(); self.devices.len()];
        for copies in self.uploaded.values() {
            for (d, b) in copies.iter().enumerate() {
                if let Some(b) = b {
                    u[d].weights += b.size() as u64;
                }
            }
        }
        for p in self.persistent.values() {
            u[p.device].persistent += p.buf.size() as u64;
        }
        for (d, a) in self.arenas.iter().enumerate() {
            u[d].arena = a.as_ref().map_or(0, |b| b.size() as u64);
        }
        for (d, m) in self.mapped.iter().enumerate() {
            u[d].mapped = m.as_ref().map_or(0, |b| b.size() as u64);
        }
        u
    }

    /// Binds weight bytes by name; each device that needs them gets one upload, kept across runs.
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
        if bytes.bytes().len() != expected {
            return Err(GraphError::Size {
                name: name.into(),
                dtype,
                ne,
                expected,
                got: bytes.bytes().len(),
            });
        }
        self.uploaded.remove(name);
        self.prepared.clear();
        self.weights.insert(name.to_string(), (dtype, ne, bytes));
        Ok(())
    }

    /// Copies made between devices so far (each one a read from one device and a write to another).
    pub fn copies_made(&self) -> usize {
        self.copies_made
    }

    /// The schedule of the last run.
    pub fn last_schedule(&self) -> Option<&Schedule> {
        self.last.as_ref().map(|l| l.sched.as_ref())
    }

    /// The persistent buffers created so far (a KV cache's layers): name, element type and
    /// dims, by name.
    pub fn persistent_leaves(&self) -> Vec<(String, DType, [usize; 4])> {
        let mut v: Vec<_> = self
            .persistent
            .iter()
            .map(|(n, p)| (n.clone(), p.dtype, p.ne))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    fn persistent_buf(&self, name: &str) -> Result<&dyn Buffer> {
        self.persistent
            .get(name)
            .map(|p| p.buf.as_ref())
            .ok_or_else(|| GraphError::UnboundWeight(name.to_string()))
    }

    /// Copies `out.len()` bytes of the persistent buffer `name` from byte `offset` to the host,
    /// after the work queued before on its device (a preempted sequence's KV rows).
    pub fn read_persistent(&self, name: &str, offset: usize, out: &mut [u8]) -> Result<()> {
        self.persistent_buf(name)?.read(offset, out)
    }

    /// Writes `data` into the persistent buffer `name` at byte `offset`, ordered before the
    /// next run's work on its device.
    pub fn write_persistent(&self, name: &str, offset: usize, data: &[u8]) -> Result<()> {
        self.persistent_buf(name)?.write(offset, data)
    }

    fn uploaded_buf(&self, name: &str, d: usize) -> Option<&dyn Buffer> {
        self.uploaded
            .get(name)
            .and_then(|v| v.get(d))
            .and_then(|b| b.as_deref())
    }

    /// Grows each device's arena to fit `graph` (a worst-case graph, such as a full batch at the
    /// end of the context), so that later runs allocate no arena.
    pub fn reserve(&mut self, graph: &Graph) -> Result<()> {
        let prep = self.prepare(0, graph)?;
        for d in 0..self.devices.len() {
            let have = self.arenas[d].as_ref().map_or(0, |b| b.size());
            if have < prep.arena_size[d] {
                // Captured launches point into the old arena.
                self.drop_captures();
                self.streams[d].synchronize()?;
                self.arenas[d] = None;
                self.arenas[d] = Some(alloc_for(
                    &self.devices[d],
                    prep.arena_size[d],
                    "the activation arena",
                )?);
            }
        }
        Ok(())
    }

    /// Runs `graph` with dense `inputs`; outputs stay readable until the next run.
    pub fn run(&mut self, graph: &Graph, inputs: &[(TensorId, &[u8])]) -> Result<()> {
        self.run_keyed(None, graph, inputs)
    }

    /// [`Scheduler::run`] for graphs that repeat: a run whose `key` equals the previous keyed
    /// run's reuses that run's schedule, memory plan and copy slots, and skips the weight and
    /// persistent-buffer checks (done when the key was first seen). The caller promises that
    /// equal keys come with identical graphs (for example decode steps whose KV length is padded
    /// to a bucket); only the inputs change.
    pub fn run_keyed(
        &mut self,
        key: Option<u64>,
        graph: &Graph,
        inputs: &[(TensorId, &[u8])],
    ) -> Result<()> {
        // An unkeyed run leaves the keyed runs' preparations in place.
        let cached = key
            .and_then(|k| {
                (self.prepared.iter()).position(|p| p.key == k && p.n_nodes == graph.len())
            })
            .map(|i| self.prepared.remove(i));
        let hit = cached.is_some();
        let mut prep = match cached {
            Some(p) => p,
            None => self.prepare(key.unwrap_or(0), graph)?,
        };
        for d in 0..self.devices.len() {
            let have = self.arenas[d].as_ref().map_or(0, |b| b.size());
            if have < prep.arena_size[d] {
                // Captured launches point into the old arena: drop them before freeing it.
                prep.captured = None;
                self.drop_captures();
                // A replay is not waited for: finish it before freeing the memory it uses.
                self.streams[d].synchronize()?;
                self.arenas[d] = None;
                self.arenas[d] = Some(alloc_for(
                    &self.devices[d],
                    prep.arena_size[d],
                    "the activation arena",
                )?);
            }
        }
        self.ensure_mapped(&mut prep)?;
        let nodes = graph.tensors();
        if !hit {
            self.bind_leaves(graph, &prep.sched)?;
        }
        // Inputs, written where their first reader runs: checked first, then each device's
        // written together (one queued batch on a GPU).
        let mut writes: Vec<Vec<(usize, &[u8])>> = vec![Vec::new(); self.devices.len()];
        for &i in &prep.inputs {
            let t = &nodes[i];
            let id = TensorId::from_index(i);
            let data = inputs
                .iter()
                .find(|(x, _)| *x == id)
                .map(|(_, b)| *b)
                .ok_or_else(|| GraphError::MissingInput(t.name.clone()))?;
            if data.len() != t.dense_bytes() {
                return Err(GraphError::Size {
                    name: t.name.clone(),
                    dtype: t.dtype,
                    ne: t.ne,
                    expected: t.dense_bytes(),
                    got: data.len(),
                });
            }
            let d = prep.sched.device_of[i].unwrap_or(0);
            if self.arenas[d].is_none() {
                return Err(GraphError::MissingInput(t.name.clone()));
            }
            writes[d].push((prep.offsets[i].unwrap_or(0), data));
        }
        for (d, w) in writes.iter().enumerate().filter(|(_, w)| !w.is_empty()) {
            self.arena(d)?.write_batch(w)?;
        }
        let result = match prep.single_device {
            Some(d) if hit && self.capture => self.execute_captured(graph, &mut prep, d),
            _ => self.execute(graph, &prep),
        };
        // A repeated keyed run has the outputs of the run before it (same preparation).
        let same_outputs =
            hit && (self.last.as_ref()).is_some_and(|l| Arc::ptr_eq(&l.sched, &prep.sched));
        if result.is_ok() && !same_outputs {
            let mut outputs = Vec::with_capacity(graph.outputs().len());
            for &o in graph.outputs() {
                let (r, off) = graph.storage_root(o);
                let root = &nodes[r.index()];
                let home = prep.sched.device_of[r.index()].unwrap_or(0);
                let loc = match root.op {
                    Op::Leaf(Leaf::Persistent) => OutLoc::Persistent {
                        name: root.name.clone(),
                        offset: off,
                    },
                    Op::Leaf(Leaf::Weight) => OutLoc::Weight {
                        name: root.name.clone(),
                        device: home,
                        offset: off,
                    },
                    _ => match prep.mapped[r.index()] {
                        Some(m) => OutLoc::Mapped {
                            device: home,
                            offset: m + off,
                        },
                        None => OutLoc::Arena {
                            device: home,
                            offset: prep.offsets[r.index()].unwrap_or(0) + off,
                        },
                    },
                };
                outputs.push((o, nodes[o.index()].clone(), loc));
            }
            self.last = Some(LastRun {
                sched: Arc::clone(&prep.sched),
                outputs,
            });
        } else if result.is_err() {
            self.last = None;
        }
        if key.is_some() && result.is_ok() {
            if self.prepared.len() == PLANS {
                self.prepared.remove(0);
            }
            self.prepared.push(prep);
        }
        result
    }

    /// Schedule, memory plan, copy slots and arena sizes of `graph`.
    fn prepare(&self, key: u64, graph: &Graph) -> Result<Prepared> {
        let homes: HashMap<String, usize> = self
            .persistent
            .iter()
            .map(|(k, p)| (k.clone(), p.device))
            .collect();
        let sched = schedule_reducing(
            graph,
            &self.devices,
            &homes,
            self.placement.as_ref(),
            self.collective.as_deref(),
        )?;
        let nodes = graph.tensors();
        // Any run the launches may offer as one group shares its operands' lifetimes.
        let mut runs = vec![1; nodes.len()];
        let mut groups = Vec::new();
        for (_, ids) in &sched.splits {
            for (j, ids_j) in possible_groups(graph, ids) {
                runs[ids[j].index()] = ids_j.len();
                groups.push(ids_j);
            }
        }
        let p = plan_grouped(graph, &groups);
        // Copy slots after the planned arena, per device: `slot[root * n_dev + device]`.
        let nd = self.devices.len();
        let mut arena_size = vec![p.peak; nd];
        let mut slot: Vec<Option<usize>> = vec![None; nodes.len() * nd];
        for &(r, d) in &sched.copies {
            slot[r.index() * nd + d] = Some(arena_size[d]);
            arena_size[d] += nodes[r.index()].extent().div_ceil(ALIGN) * ALIGN;
        }
        let inputs = (0..nodes.len())
            .filter(|&i| sched.device_of[i].is_some() && nodes[i].op == Op::Leaf(Leaf::Input))
            .collect();
        let maps = |d: usize| self.map_outputs[d] && !self.devices[d].buffer_type().is_host();
        let (mapped, mapped_size) = mapped_outputs(graph, &sched, nd, maps);
        // Collectives are captured only where the collective allows it (one rank, its other
        // ranks replaying their own captures).
        let capturable = !sched.collective.contains(&true)
            || self.collective.as_ref().is_some_and(|c| c.capturable());
        let single_device = match sched.splits.as_slice() {
            [(d, _)] if sched.copies.is_empty() && capturable => Some(*d),
            _ => None,
        };
        Ok(Prepared {
            key,
            n_nodes: nodes.len(),
            sched: Arc::new(sched),
            offsets: p.offset,
            slot,
            arena_size,
            mapped,
            mapped_size,
            inputs,
            single_device,
            captured: None,
            capture_failures: 0,
            runs,
        })
    }

    /// Uploads the weights each device reads (once per device) and creates persistent buffers.
    fn bind_leaves(&mut self, graph: &Graph, sched: &Schedule) -> Result<()> {
        let nodes = graph.tensors();
        let nd = self.devices.len();
        // Devices that read each weight (through views), in one pass over the nodes.
        let mut weight_users: HashMap<usize, Vec<usize>> = HashMap::new();
        for (j, t) in nodes.iter().enumerate() {
            let Some(d) = sched.device_of[j].filter(|_| launches(t)) else {
                continue;
            };
            for (_, s) in read_srcs(t) {
                let r = graph.storage_root(s).0.index();
                if nodes[r].op == Op::Leaf(Leaf::Weight) {
                    let users = weight_users.entry(r).or_default();
                    if !users.contains(&d) {
                        users.push(d);
                    }
                }
            }
        }
        let mut new_persistent: Vec<Vec<usize>> = vec![Vec::new(); nd];
        for (i, t) in nodes.iter().enumerate() {
            let Some(d) = sched.device_of[i] else {
                continue;
            };
            match t.op {
                Op::Leaf(Leaf::Weight) => {
                    let (dt, ne, bytes) = self
                        .weights
                        .get(&t.name)
                        .ok_or_else(|| GraphError::UnboundWeight(t.name.clone()))?;
                    if *dt != t.dtype || *ne != t.ne {
                        return Err(GraphError::Mismatch {
                            name: t.name.clone(),
                            bound: format!("{dt} {ne:?}"),
                            declared: format!("{} {:?}", t.dtype, t.ne),
                        });
                    }
                    let mut users = weight_users.remove(&i).unwrap_or_default();
                    if !users.contains(&d) {
                        users.push(d);
                    }
                    for u in users {
                        if self.uploaded_buf(&t.name, u).is_none() {
                            let buf = alloc_for(&self.devices[u], bytes.bytes().len(), &t.name)?;
                            buf.write(0, bytes.bytes())?;
                            put_uploaded(&mut self.uploaded, nd, &t.name, u, buf);
                        }
                    }
                }
                Op::Leaf(Leaf::Persistent) => match self.persistent.get(&t.name) {
                    Some(pb) if pb.dtype != t.dtype || pb.ne != t.ne => {
                        return Err(GraphError::Mismatch {
                            name: t.name.clone(),
                            bound: format!("{} {:?}", pb.dtype, pb.ne),
                            declared: format!("{} {:?}", t.dtype, t.ne),
                        })
                    }
                    Some(_) => {}
                    None => new_persistent[d].push(i),
                },
                _ => {}
            }
        }
        // The persistent leaves new to each device (a KV cache's layers) in one allocation.
        for (d, leaves) in new_persistent.into_iter().enumerate() {
            if leaves.is_empty() {
                continue;
            }
            let sizes: Vec<usize> = leaves.iter().map(|&i| nodes[i].dense_bytes()).collect();
            let what = format!(
                "{} persistent buffers such as `{}`",
                leaves.len(),
                nodes[leaves[0]].name
            );
            let bufs = alloc_many_for(&self.devices[d], &sizes, &what)?;
            for (i, buf) in leaves.into_iter().zip(bufs) {
                let t = &nodes[i];
                self.persistent.insert(
                    t.name.clone(),
                    Persistent {
                        dtype: t.dtype,
                        ne: t.ne,
                        device: d,
                        buf,
                    },
                );
            }
        }
        Ok(())
    }

    /// Runs a graph whose launches all go to device `d` by replaying its capture, capturing
    /// it first when there is none yet; plain launches when the device cannot capture.
    fn execute_captured(&mut self, graph: &Graph, prep: &mut Prepared, d: usize) -> Result<()> {
        if prep.captured.is_none() && prep.capture_failures < CAPTURE_TRIES {
            if self.devices[d].begin_capture()? {
                let launched = self.launch_nodes(graph, prep);
                let captured = self.devices[d].end_capture();
                match (launched, captured) {
                    (Ok(()), Ok(c)) => prep.captured = Some(c),
                    (Err(e), _) | (_, Err(e)) => {
                        tracing::debug!("scheduler: graph capture failed, plain launches: {e}");
                        prep.capture_failures += 1;
                    }
                }
            } else {
                prep.capture_failures = CAPTURE_TRIES;
            }
        }
        match &prep.captured {
            // No wait here: the device's reads of the outputs (and the next run's input writes
            // and launches) are queued behind the replay on the same stream, and copies to
            // other devices synchronize first (`copy_in`).
            Some(c) => {
                if prep.sched.collective.contains(&true) {
                    if let Some(coll) = &self.collective {
                        coll.status()?;
                        c.replay()?;
                        coll.replayed()?;
                    }
                } else {
                    c.replay()?;
                }
                self.replays += 1;
                Ok(())
            }
            None => self.execute(graph, prep),
        }
    }

    /// Launches the scheduled nodes, copying tensors across devices on demand, and waits.
    fn execute(&mut self, graph: &Graph, prep: &Prepared) -> Result<()> {
        self.launch_nodes(graph, prep)?;
        for s in &self.streams {
            s.synchronize()?;
        }
        if let Some(c) = &self.collective {
            c.settled();
        }
        Ok(())
    }

    /// Queues the scheduled nodes, copying tensors across devices on demand (a graph without
    /// copies queues launches only, which a capture can record). Runs of `mul_mat` nodes reading
    /// the same activations (the q, k and v projections), and pairs of ropes or KV writes, are offered
    /// to the device as one group.
    fn launch_nodes(&mut self, graph: &Graph, prep: &Prepared) -> Result<()> {
        let nodes = graph.tensors();
        let nd = self.devices.len();
        let sched = prep.sched.as_ref();
        let mut valid = vec![false; nodes.len() * nd];
        let mut staging = Vec::new();
        for (d, ids) in &sched.splits {
            let d = *d;
            let mut j = 0;
            while j < ids.len() {
                let run = prep.runs[ids[j].index()].clamp(1, ids.len() - j);
                for &id in &ids[j..j + run] {
                    self.copy_in(graph, prep, &mut valid, &mut staging, id, d)?;
                }
                let mut grouped = 0;
                if run >= 2 {
                    let mut group = Vec::with_capacity(run);
                    for &id in &ids[j..j + run] {
                        let t = &nodes[id.index()];
                        let mut srcs = Vec::with_capacity(t.src.len());
                        for (_, s) in read_srcs(t) {
                            srcs.push(self.mem(graph, prep, s, d)?);
                        }
                        let dst = self.mem(graph, prep, id, d)?;
                        group.push(GroupNode {
                            tensor: t,
                            dst,
                            srcs,
                        });
                    }
                    grouped = self.devices[d].launch_group(self.streams[d].as_ref(), &group)?;
                }
                for &id in &ids[j..j + grouped] {
                    // Rewritten roots: copies of them elsewhere are stale.
                    for r in graph.written_roots(id) {
                        valid[r.index() * nd..(r.index() + 1) * nd].fill(false);
                    }
                }
                // A device that took only part of the run (or none) sees the rest offered again.
                let done = grouped.max(1);
                for &id in &ids[j + grouped..j + done] {
                    let t = &nodes[id.index()];
                    if sched.collective.get(id.index()).copied().unwrap_or(false) {
                        self.all_reduce(graph, prep, &mut valid, id, d)?;
                        continue;
                    }
                    let mut mems = Vec::with_capacity(t.src.len());
                    for (_, s) in read_srcs(t) {
                        mems.push(self.mem(graph, prep, s, d)?);
                    }
                    let dst = self.mem(graph, prep, id, d)?;
                    self.devices[d].launch(self.streams[d].as_ref(), t, dst, &mems)?;
                    for r in graph.written_roots(id) {
                        valid[r.index() * nd..(r.index() + 1) * nd].fill(false);
                    }
                }
                j += done;
            }
        }
        Ok(())
    }

    /// Queues the collective sum of all-reduce node `id`'s operands in place on their devices,
    /// then the node on device `d` over the operand there (which holds the sum).
    fn all_reduce(
        &self,
        graph: &Graph,
        prep: &Prepared,
        valid: &mut [bool],
        id: TensorId,
        d: usize,
    ) -> Result<()> {
        let nodes = graph.tensors();
        let nd = self.devices.len();
        let t = &nodes[id.index()];
        let coll = self
            .collective
            .as_ref()
            .ok_or_else(|| GraphError::Unsupported {
                backend: "scheduler",
                op: t.op.name(),
                detail: format!("`{}` was scheduled for a collective, none is set", t.name),
            })?;
        let mut parts = Vec::with_capacity(t.src.len());
        let mut local = None;
        for &s in &t.src {
            let r = graph.storage_root(s).0;
            let home = prep.sched.device_of[r.index()].unwrap_or(0);
            let m = self.mem(graph, prep, s, home)?;
            if home == d {
                local = Some(m);
            }
            parts.push((home, m));
            // Rewritten in place: copies of it elsewhere are stale.
            valid[r.index() * nd..(r.index() + 1) * nd].fill(false);
        }
        let local = local.ok_or_else(|| GraphError::Unsupported {
            backend: "scheduler",
            op: t.op.name(),
            detail: format!("`{}` runs on a device without an operand", t.name),
        })?;
        coll.all_reduce(&parts)?;
        let dst = self.mem(graph, prep, id, d)?;
        self.devices[d].launch(self.streams[d].as_ref(), t, dst, &[local])
    }

    /// Copies the operands of node `id` that live on another device into device `d`'s arena,
    /// unless a valid copy is there already.
    fn copy_in(
        &mut self,
        graph: &Graph,
        prep: &Prepared,
        valid: &mut [bool],
        staging: &mut Vec<u8>,
        id: TensorId,
        d: usize,
    ) -> Result<()> {
        let nodes = graph.tensors();
        let nd = self.devices.len();
        let sched = prep.sched.as_ref();
        for (_, s) in read_srcs(&nodes[id.index()]) {
            let r = graph.storage_root(s).0;
            if let Some(off) = prep.slot[r.index() * nd + d] {
                if !std::mem::replace(&mut valid[r.index() * nd + d], true) {
                    let home = sched.device_of[r.index()].unwrap_or(0);
                    let (src_buf, src_off) = self.home_of(graph, prep, r, home)?;
                    let len = nodes[r.index()].extent();
                    self.streams[home].synchronize()?;
                    // Directly where the buffers can (GPU to GPU, host to host), else staged.
                    if !self.arena(d)?.copy_from(off, src_buf, src_off, len)? {
                        staging.resize(len, 0);
                        src_buf.read(src_off, staging)?;
                        self.arena(d)?.write(off, staging)?;
                    }
                    self.copies_made += 1;
                }
            }
        }
        Ok(())
    }
}
