#![doc = include_str!("../README.md")]
#![warn(missing_docs)]
//!
//! ## Design choices
//! - RAII for every handle; `Drop` never panics: failures are recorded on the [`Device`] and
//!   reported by [`Device::check_errors`].
//! - Owned buffers mirror `Vec` ([`DeviceBuffer`]), views mirror slices ([`DeviceView`],
//!   [`DeviceViewMut`]) with checked offset arithmetic and lifetimes tied to the owner.
//! - Synchronisation is stream-ordered only: streams and events are waited for, never the device.
//! - Every device allocation goes through a [`Budget`] (typed error before any driver call) and
//!   a [`Tracker`] (leak reports). Weights go into a few large arena allocations (activations
//!   into the arena the graph planner sizes, above this layer). Pool logic runs over addresses
//!   only and is tested over host memory.
//! - Reads from a sub-allocation stage through a whole allocation (plain D2H from sub-buffer
//!   offsets failed on ROCm).
//! - Each stream keeps pinned host staging for small, frequent transfers ([`host_io`]): reads
//!   through one reusable pinned buffer, small writes queued from a ring of pinned blocks.
//! - Several devices: peer access and peer copies ([`peer`]); collectives over NCCL/RCCL through a
//!   [`Communicator`] bound to one device, its calls queued on that device's streams ([`comm`]).
//! - A result the host reads after every step can live in mapped page-locked memory
//!   ([`MappedHostBuffer`]) that kernels write directly, so no copy follows the kernel.

pub mod amd_memory;
pub mod bandwidth;
pub mod blas;
pub mod budget;
pub mod buffer;
pub mod comm;
pub mod device;
pub mod error;
pub mod host_io;
pub mod launch;
pub mod mapped;
pub mod module;
pub mod peer;
pub mod pool;
pub mod stream;
pub mod stream_blas;
#[cfg(feature = "testing")]
pub mod testing;
pub mod upload;

pub use blas::{Blas, GemmElem, GemmShape};
pub use budget::{Budget, BudgetConfig, LeakReport, Pressure, Tracker};
pub use buffer::{DeviceBuffer, DeviceView, DeviceViewMut, PinnedHostBuffer};
pub use comm::{grouped, CollElem, Communicator};
pub use device::{
    devices, gpu_available, gpu_unavailable_reason, print_summary, summary, Device, DeviceInfo,
};
pub use error::{GpuError, Result};
pub use hip_ffi::{CollType, DeviceAttribute, NcclOptions, Op, Platform, ReduceOp, UniqueId};
pub use launch::{KernelArg, MemRange, ParamKind};
pub use mapped::MappedHostBuffer;
pub use module::{Function, KernelArgs, Module};
pub use peer::enable_all_peers;
pub use pool::{Lease, Pool, PoolStats, RawAllocator, WeightArena};
pub use stream::{Event, Graph, GraphExec, Stream};
pub use stream_blas::StreamBlas;
pub use upload::{DeviceArena, WeightUploader};
