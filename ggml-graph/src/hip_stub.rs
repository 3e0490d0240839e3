//! The HIP backend's names in a build without the `hip` feature: opening a device reports that
//! this build has no HIP support, so code above the graph compiles the same way in both builds
//! and treats "no HIP" like "no GPU".

use crate::backend::{BufferType, Device, Stream, TensorMem};
use crate::error::{GraphError, Result};
use crate::tensor::Tensor;

pub use crate::hip_options::{CollectiveOptions, HipOptions, StackKernel};

// The workspace arithmetic is the backend's own, and needs no GPU.
#[path = "hip/workspace.rs"]
mod workspace;
pub use workspace::Workspace;

/// No value: a device never opens in this build.
#[derive(Clone, Copy)]
enum Never {}

/// A GPU as a graph [`Device`]; never opens in this build.
#[derive(Clone)]
pub struct HipDevice {
    never: Never,
}

impl HipDevice {
    /// Fails: this build has no HIP backend.
    pub fn new(ordinal: i32) -> Result<Self> {
        Self::with_options(ordinal, HipOptions::default())
    }

    /// Fails: this build has no HIP backend.
    pub fn with_options(ordinal: i32, opts: HipOptions) -> Result<Self> {
        let _ = (ordinal, opts);
        Err(GraphError::Unsupported {
            backend: "hip",
            op: "open",
            detail: "not compiled with HIP (the `hip` feature of ggml-graph)".into(),
        })
    }

    /// See the HIP build's `set_stack`.
    pub fn set_stack(&self, on: bool) -> bool {
        let _ = on;
        match self.never {}
    }

    /// See the HIP build's `budget_available`.
    pub fn budget_available(&self) -> u64 {
        match self.never {}
    }

    /// See the HIP build's `cap_budget`.
    pub fn cap_budget(&self, bytes: u64) {
        let _ = bytes;
        match self.never {}
    }

    /// See the HIP build's `allocated_bytes`.
    pub fn allocated_bytes(&self) -> u64 {
        match self.never {}
    }

    /// See the HIP build's `allocated_by_tag`.
    pub fn allocated_by_tag(&self) -> Vec<(String, u64)> {
        match self.never {}
    }

    /// See the HIP build's `runtime_bytes`.
    pub fn runtime_bytes(&self) -> u64 {
        match self.never {}
    }

    /// See the HIP build's `placeable_bytes`.
    pub fn placeable_bytes(&self) -> u64 {
        match self.never {}
    }

    /// See the HIP build's `runtime_bytes_now`.
    pub fn runtime_bytes_now(&self) -> Option<u64> {
        match self.never {}
    }

    /// See the HIP build's `multiprocessors`.
    pub fn multiprocessors(&self) -> usize {
        match self.never {}
    }

    /// See the HIP build's `ordinal`.
    pub fn ordinal(&self) -> i32 {
        match self.never {}
    }

    /// See the HIP build's `enable_peer_access`.
    pub fn enable_peer_access(&self, peer: &HipDevice) -> Result<bool> {
        let _ = peer;
        match self.never {}
    }

    /// See the HIP build's `copy_bandwidth`.
    pub fn copy_bandwidth(&self, bytes: usize, reps: u32) -> Result<f64> {
        let _ = (bytes, reps);
        match self.never {}
    }
}

impl Device for HipDevice {
    fn name(&self) -> &str {
        match self.never {}
    }
    fn buffer_type(&self) -> &dyn BufferType {
        match self.never {}
    }
    fn supports_op(&self, _t: &Tensor, _srcs: &[&Tensor]) -> bool {
        match self.never {}
    }
    fn new_stream(&self) -> Result<Box<dyn Stream>> {
        match self.never {}
    }
    fn launch(
        &self,
        _stream: &dyn Stream,
        _t: &Tensor,
        _dst: TensorMem<'_>,
        _srcs: &[TensorMem<'_>],
    ) -> Result<()> {
        match self.never {}
    }
}

/// A communicator over several GPUs; never made in this build.
#[derive(Debug)]
pub struct HipCollective {
    never: Never,
}

impl std::fmt::Debug for Never {
    fn fmt(&self, _f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {}
    }
}

impl HipCollective {
    /// Fails: this build has no HIP backend.
    pub fn new(
        gpus: &[(usize, std::sync::Arc<HipDevice>)],
        opts: &crate::hip_options::CollectiveOptions,
    ) -> Result<Self> {
        let _ = (gpus, opts);
        Err(GraphError::Unsupported {
            backend: "hip",
            op: "collective",
            detail: "not compiled with HIP (the `hip` feature of ggml-graph)".into(),
        })
    }

    /// Fails: this build has no HIP backend.
    pub fn for_rank(
        gpu: (usize, std::sync::Arc<HipDevice>),
        rank: usize,
        world: usize,
        opts: &crate::hip_options::CollectiveOptions,
        exchange: &mut crate::hip_options::IdExchange<'_>,
    ) -> Result<Self> {
        let _ = (gpu, rank, world, exchange);
        Self::new(&[], opts)
    }

    /// Fails: this build has no HIP backend.
    pub fn per_rank(
        gpus: &[std::sync::Arc<HipDevice>],
        opts: &crate::hip_options::CollectiveOptions,
    ) -> Result<Vec<Self>> {
        let _ = gpus;
        Self::new(&[], opts).map(|c| vec![c])
    }

    /// See the HIP build's `check`.
    pub fn check(&self) -> Result<()> {
        match self.never {}
    }

    /// See the HIP build's `abort`.
    pub fn abort(&self, why: String) {
        let _ = why;
        match self.never {}
    }

    /// See the HIP build's `watch`.
    pub fn watch(self: &std::sync::Arc<Self>, timeout: std::time::Duration) {
        let _ = timeout;
        match self.never {}
    }
}

impl crate::backend::Collective for HipCollective {
    fn name(&self) -> &str {
        match self.never {}
    }
    fn spans(&self, _devices: &[usize]) -> bool {
        match self.never {}
    }
    fn all_reduce(&self, _parts: &[(usize, TensorMem<'_>)]) -> Result<()> {
        match self.never {}
    }
}

/// GPUs of the selected platform: none in this build.
pub fn device_count() -> usize {
    0
}

/// `decode_stack` launches so far: none in this build.
#[cfg(feature = "testing")]
pub fn stack_launches() -> usize {
    0
}

/// Biased expert launches so far: none in this build.
#[cfg(feature = "testing")]
pub fn expert_bias_launches() -> usize {
    0
}

/// Gated expert launches so far: none in this build.
#[cfg(feature = "testing")]
pub fn expert_gate_up_launches() -> usize {
    0
}

/// Portable decode stack launches so far: none in this build.
#[cfg(feature = "testing")]
pub fn stack_portable_launches() -> usize {
    0
}

/// Split-attention decode stack launches so far: none in this build.
#[cfg(feature = "testing")]
pub fn stack_split_launches() -> usize {
    0
}

/// `head_q6_k` launches so far: none in this build.
#[cfg(feature = "testing")]
pub fn head_launches() -> usize {
    0
}

/// `mmq_*` tile-kernel launches so far: none in this build.
#[cfg(feature = "testing")]
pub fn mmq_launches() -> usize {
    0
}
