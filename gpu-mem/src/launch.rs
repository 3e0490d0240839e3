//! Checked kernel launches: device-memory arguments that can only be made from live `gpu-mem`
//! memory ([`MemRange`]), a kernel's declared parameter list ([`ParamKind`]), and
//! [`Stream::launch_checked`], which matches the arguments against that list before launching.
//!
//! Design choices:
//! - The parameter list comes from the kernel's owner (rocmforge's `kernels` crate keeps one per
//!   kernel, tested against the HIP sources), so a launch site cannot pass an `int` where the
//!   kernel reads a pointer, or one argument too few.
//! - A [`MemRange`] borrows the memory it describes (buffer, view, arena slot) for its lifetime
//!   and belongs to one device; sub-ranges are bounds-checked. Which bytes inside a range a
//!   kernel touches is the kernel's documented contract with its caller (the launch code sizes
//!   ranges from the same shapes it passes as integers).
//! - Writes and BLAS calls on ranges go through typed views made from them ([`MemRange::view`]),
//!   so graph backends never build raw pointers themselves.

use std::marker::PhantomData;

use bytemuck::Pod;
use hip_ffi::DevicePtr;

use crate::buffer::{DeviceBuffer, DeviceView, DeviceViewMut};
use crate::device::Device;
use crate::error::{GpuError, Result};
use crate::module::{Function, KernelArgs};
use crate::stream::Stream;

/// One kernel parameter, as the kernel's source declares it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamKind {
    /// A device pointer (`T*`); [`KernelArg::Null`] where the kernel accepts null.
    Ptr,
    /// `int`.
    I32,
    /// `long long`.
    I64,
    /// `float`.
    F32,
    /// A struct passed by value, of this many bytes.
    Bytes(usize),
}

/// A byte range of device memory borrowed from a live `gpu-mem` allocation of one device.
#[derive(Clone, Copy, Debug)]
pub struct MemRange<'a> {
    pub(crate) device: &'a Device,
    pub(crate) ptr: DevicePtr,
    pub(crate) bytes: usize,
    _mem: PhantomData<&'a ()>,
}

impl<'a> MemRange<'a> {
    /// The whole buffer.
    pub fn of_buffer<T: Pod>(b: &'a DeviceBuffer<T>) -> Self {
        Self {
            device: b.device(),
            ptr: b.ptr(),
            bytes: b.len() * std::mem::size_of::<T>(),
            _mem: PhantomData,
        }
    }

    /// The memory a view covers.
    pub fn of_view<T: Pod>(v: &DeviceView<'a, T>) -> Self {
        Self {
            device: v.device,
            ptr: v.ptr,
            bytes: v.len * std::mem::size_of::<T>(),
            _mem: PhantomData,
        }
    }

    /// The memory a mutable view covers.
    pub fn of_view_mut<T: Pod>(v: &DeviceViewMut<'a, T>) -> Self {
        Self {
            device: v.device,
            ptr: v.ptr,
            bytes: v.len * std::mem::size_of::<T>(),
            _mem: PhantomData,
        }
    }

    /// Bytes `offset..offset + bytes` of this range.
    pub fn sub(self, offset: usize, bytes: usize) -> Result<Self> {
        if offset.checked_add(bytes).is_none_or(|e| e > self.bytes) {
            return Err(GpuError::OutOfBounds {
                start: offset as u64,
                end: (offset as u64).saturating_add(bytes as u64),
                len: self.bytes as u64,
            });
        }
        Ok(Self {
            ptr: DevicePtr(self.ptr.0 + offset as u64),
            bytes,
            ..self
        })
    }

    /// Device address of the first byte (for cache keys and overlap tests, not for launches).
    pub fn addr(&self) -> u64 {
        self.ptr.0
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.bytes
    }

    /// True for an empty range.
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    /// The device the memory belongs to.
    pub fn device(&self) -> &'a Device {
        self.device
    }

    fn elems<T: Pod>(&self) -> Result<usize> {
        let size = std::mem::size_of::<T>();
        if size == 0 || self.bytes % size != 0 || self.ptr.0 % std::mem::align_of::<T>() as u64 != 0
        {
            return Err(GpuError::InvalidArgument(format!(
                "{} bytes at {:#x} are not a whole, aligned array of {}-byte elements",
                self.bytes, self.ptr.0, size
            )));
        }
        Ok(self.bytes / size)
    }

    /// The range as `len / size_of::<T>()` elements (alignment and size checked).
    pub fn view<T: Pod>(self) -> Result<DeviceView<'a, T>> {
        let n = self.elems::<T>()?;
        // SAFETY: the range was made from live memory of `device` that stays borrowed for 'a,
        // and covers n elements of T (checked above).
        Ok(unsafe { DeviceView::from_raw(self.device, self.ptr, n, false) })
    }

    /// The range as a writable view (device memory is written by queued work, never through
    /// host references, so a range may be viewed mutably while kernels also read it).
    pub fn view_mut<T: Pod>(self) -> Result<DeviceViewMut<'a, T>> {
        let n = self.elems::<T>()?;
        // SAFETY: as in `view`.
        Ok(unsafe { DeviceViewMut::from_raw(self.device, self.ptr, n, false) })
    }
}

/// One kernel argument.
#[derive(Clone, Copy, Debug)]
pub enum KernelArg<'a> {
    /// Device memory, for a [`ParamKind::Ptr`] parameter.
    Mem(MemRange<'a>),
    /// A null pointer, for a [`ParamKind::Ptr`] parameter the kernel documents as optional.
    Null,
    /// An `int`.
    I32(i32),
    /// A `long long`.
    I64(i64),
    /// A `float`.
    F32(f32),
    /// A struct's bytes, for a [`ParamKind::Bytes`] parameter of the same size (8-byte aligned
    /// layouts at most).
    Bytes(&'a [u8]),
}

impl<'a> From<MemRange<'a>> for KernelArg<'a> {
    fn from(m: MemRange<'a>) -> Self {
        KernelArg::Mem(m)
    }
}

/// `None` is a null pointer.
impl<'a> From<Option<MemRange<'a>>> for KernelArg<'a> {
    fn from(m: Option<MemRange<'a>>) -> Self {
        m.map_or(KernelArg::Null, KernelArg::Mem)
    }
}

impl From<i32> for KernelArg<'_> {
    fn from(v: i32) -> Self {
        KernelArg::I32(v)
    }
}

impl From<i64> for KernelArg<'_> {
    fn from(v: i64) -> Self {
        KernelArg::I64(v)
    }
}

impl From<f32> for KernelArg<'_> {
    fn from(v: f32) -> Self {
        KernelArg::F32(v)
    }
}

impl KernelArg<'_> {
    fn matches(&self, p: ParamKind) -> bool {
        matches!(
            (self, p),
            (KernelArg::Mem(_) | KernelArg::Null, ParamKind::Ptr)
                | (KernelArg::I32(_), ParamKind::I32)
                | (KernelArg::I64(_), ParamKind::I64)
                | (KernelArg::F32(_), ParamKind::F32)
        ) || matches!((self, p), (KernelArg::Bytes(b), ParamKind::Bytes(n)) if b.len() == n)
    }
}

impl Stream {
    /// Copies host bytes into `dst` (same length) and waits for the copy.
    pub fn write_range(&self, src: &[u8], dst: MemRange<'_>) -> Result<()> {
        self.note_unknown("a memory copy");
        self.device().expect_same(dst.device, "copy destination")?;
        if src.len() != dst.bytes {
            return Err(GpuError::LengthMismatch {
                src: src.len(),
                dst: dst.bytes,
            });
        }
        if src.is_empty() {
            return Ok(());
        }
        self.device().bind()?;
        // SAFETY: `src` stays borrowed until the synchronize below; `dst` is live device memory
        // of exactly that many bytes on this stream's device (checked).
        unsafe {
            self.device().api().memcpy_htod_async(
                dst.ptr,
                src.as_ptr().cast(),
                src.len(),
                self.handle(),
            )?;
        }
        self.synchronize()
    }
}

/// Largest block (threads) any supported GPU runs.
const MAX_BLOCK_THREADS: u64 = 1024;
/// Largest grid y/z dimension.
const MAX_GRID_YZ: u32 = 65_535;

impl Stream {
    /// Queues `function` with `args` after checking them against its parameter list `params`:
    /// the same count, each argument of its parameter's kind, all memory on this stream's
    /// device, and a non-empty grid and block within the hardware's limits.
    #[allow(clippy::too_many_arguments, reason = "a launch's own parameters")]
    pub fn launch_checked(
        &self,
        function: &Function<'_>,
        name: &str,
        params: &[ParamKind],
        grid: [u32; 3],
        block: [u32; 3],
        shared_mem_bytes: u32,
        args: &[KernelArg<'_>],
    ) -> Result<()> {
        if args.len() != params.len() {
            return Err(GpuError::InvalidArgument(format!(
                "{name}: {} arguments for {} parameters",
                args.len(),
                params.len()
            )));
        }
        let mut packed = KernelArgs::new();
        for (i, (a, &p)) in args.iter().zip(params).enumerate() {
            if !a.matches(p) {
                return Err(GpuError::InvalidArgument(format!(
                    "{name}: argument {i} is {a:?}, the kernel declares {p:?}"
                )));
            }
            match *a {
                KernelArg::Mem(m) => {
                    self.device().expect_same(m.device, "kernel argument")?;
                    packed.push(m.ptr.0);
                }
                KernelArg::Null => {
                    packed.push(0u64);
                }
                KernelArg::I32(v) => {
                    packed.push(v);
                }
                KernelArg::I64(v) => {
                    packed.push(v);
                }
                KernelArg::F32(v) => {
                    packed.push(v);
                }
                KernelArg::Bytes(b) => {
                    packed.push_bytes(b);
                }
            }
        }
        let threads = block.iter().map(|&d| u64::from(d)).product::<u64>();
        if grid.contains(&0)
            || threads == 0
            || threads > MAX_BLOCK_THREADS
            || grid[1] > MAX_GRID_YZ
            || grid[2] > MAX_GRID_YZ
        {
            return Err(GpuError::InvalidArgument(format!(
                "{name}: grid {grid:?} x block {block:?} is empty or beyond the hardware limits"
            )));
        }
        // A capture keeps the memory its launches use, for the replay's liveness check.
        self.note_use(args.iter().filter_map(|a| match a {
            KernelArg::Mem(m) => Some((m.ptr.0, m.bytes as u64)),
            _ => None,
        }));
        // SAFETY: the arguments match the kernel's declared parameters in number, order and
        // kind (checked above); every pointer is null where the kernel accepts it, or memory of
        // this device borrowed from a live allocation for the duration of this call, and queued
        // frees in gpu-mem are ordered after work already queued on the device's streams.
        unsafe { self.launch_unrecorded(function, grid, block, shared_mem_bytes, &mut packed) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argument_kinds_match_parameters() {
        assert!(KernelArg::I32(1).matches(ParamKind::I32));
        assert!(!KernelArg::I32(1).matches(ParamKind::I64));
        assert!(KernelArg::Null.matches(ParamKind::Ptr));
        assert!(!KernelArg::F32(0.0).matches(ParamKind::Ptr));
        assert!(KernelArg::Bytes(&[0; 8]).matches(ParamKind::Bytes(8)));
        assert!(!KernelArg::Bytes(&[0; 4]).matches(ParamKind::Bytes(8)));
    }
}
