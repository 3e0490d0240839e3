//! Checked kernel launches: device-memory arguments that can only be made from live `gpu-mem`
//! memory ([`MemRange`]), a kernel's declared parameter list ([`ParamKind`]), and
//! [`Stream::launch_checked`], which matches the arguments against that list before launching
//! (and [`Stream::launch_checked_cooperative`], which also checks that the grid fits the device
//! at once).
//!
//! The checks catch the mistakes a launch site can make in the host's terms (argument count and
//! kinds, foreign or dead memory, impossible grids); they cannot see what the kernel does with
//! its arguments. Which bytes a kernel reads and writes follows from its integer arguments and
//! grid, so the launches stay `unsafe`: the caller promises that every range covers what the
//! kernel reaches for the arguments given, and that the parameter list is the kernel's own.
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
use crate::stream::{LaunchMode, Stream};

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

    /// `bytes` of `device` memory at `ptr` (the caller's allocation, borrowed for `'a`).
    pub(crate) fn from_parts(device: &'a Device, ptr: DevicePtr, bytes: usize) -> Self {
        Self {
            device,
            ptr,
            bytes,
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

/// Checks a launch of kernel `name` against its parameter list `params` (the same count, each
/// argument of its parameter's kind, memory vetted by `same_device`) and the launch shape (a
/// non-empty grid and block within the hardware's limits), and packs the arguments.
fn check_and_pack(
    name: &str,
    params: &[ParamKind],
    grid: [u32; 3],
    block: [u32; 3],
    args: &[KernelArg<'_>],
    same_device: impl Fn(&Device) -> Result<()>,
) -> Result<KernelArgs> {
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
                same_device(m.device)?;
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
    let threads = volume(block);
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
    Ok(packed)
}

/// Blocks in a grid or threads in a block (saturating: three `u32` can overflow a `u64`).
fn volume(dims: [u32; 3]) -> u64 {
    dims.iter()
        .fold(1u64, |acc, &d| acc.saturating_mul(u64::from(d)))
}

/// A cooperative grid must be resident at once: at most `per_sm` blocks on each of
/// `multiprocessors`.
fn check_co_resident(name: &str, grid: [u32; 3], per_sm: u32, multiprocessors: u32) -> Result<()> {
    let blocks = volume(grid);
    if blocks <= u64::from(per_sm) * u64::from(multiprocessors) {
        return Ok(());
    }
    Err(GpuError::CooperativeGridTooLarge {
        kernel: name.to_owned(),
        blocks,
        per_sm,
        multiprocessors,
    })
}

/// The device memory `(address, bytes)` a launch's arguments use.
fn mem_ranges<'a>(args: &'a [KernelArg<'_>]) -> impl Iterator<Item = (u64, u64)> + 'a {
    args.iter().filter_map(|a| match a {
        KernelArg::Mem(m) => Some((m.ptr.0, m.bytes as u64)),
        _ => None,
    })
}

impl Stream {
    /// Queues `function` with `args` after checking them against its parameter list `params`:
    /// the same count, each argument of its parameter's kind, all memory on this stream's
    /// device, and a non-empty grid and block within the hardware's limits.
    ///
    /// # Safety
    /// - `params` is `function`'s parameter list as its source declares it (in order, with the
    ///   sizes of by-value structs), and a [`KernelArg::Bytes`] argument holds a valid value of
    ///   the struct the kernel reads (any pointers inside it address live memory of this
    ///   device that outlives the queued work).
    /// - For the integer arguments, grid and block given, the kernel reads and writes only
    ///   inside the [`MemRange`]s passed (and never through a [`KernelArg::Null`] it does not
    ///   document as optional), and kernels that write a range do not race with other queued
    ///   work on it.
    /// - `shared_mem_bytes` is within what `function` may use on this device.
    #[allow(clippy::too_many_arguments, reason = "a launch's own parameters")]
    pub unsafe fn launch_checked(
        &self,
        function: &Function<'_>,
        name: &str,
        params: &[ParamKind],
        grid: [u32; 3],
        block: [u32; 3],
        shared_mem_bytes: u32,
        args: &[KernelArg<'_>],
    ) -> Result<()> {
        let mut packed = check_and_pack(name, params, grid, block, args, |d| {
            self.device().expect_same(d, "kernel argument")
        })?;
        // A capture keeps the memory its launches use, for the replay's liveness check.
        self.note_use(mem_ranges(args));
        // SAFETY: the arguments match `params` in number, order and kind (checked above), and
        // `params` is the kernel's own list (the caller's promise); every pointer is memory of
        // this device borrowed from a live allocation for the duration of this call (queued
        // frees in gpu-mem are ordered after work already queued on the device's streams), and
        // the kernel stays inside it for these arguments (the caller's promise).
        unsafe {
            self.launch_unrecorded(
                function,
                grid,
                block,
                shared_mem_bytes,
                &mut packed,
                LaunchMode::Plain,
            )
        }
    }

    /// [`Stream::launch_checked`] as a cooperative launch: all blocks of the grid are resident
    /// at once, so they may wait for each other (a grid barrier). Besides the argument checks,
    /// the grid must fit the device at once (blocks <= [`Function::max_active_blocks_per_sm`]
    /// for this block and shared memory x multiprocessors), else
    /// [`GpuError::CooperativeGridTooLarge`] names the kernel and nothing is queued. Kernels
    /// above 48 KiB of dynamic shared memory need [`Function::set_max_dynamic_shared`] first.
    /// Follows [`Stream::set_early_launch`] like any launch, and records its memory in a
    /// capture like [`Stream::launch_checked`]. `uses` is memory the kernel reaches through
    /// pointers inside by-value struct arguments ([`KernelArg::Bytes`]): checked to be on this
    /// device and recorded in a capture as the pointer arguments are. Not supported by the AMD
    /// provider (HIP 5.2 has no cooperative launch of module kernels): an error there.
    ///
    /// # Safety
    /// As for [`Stream::launch_checked`], with `uses` covering all memory the kernel reaches
    /// through pointers inside its by-value arguments.
    #[allow(clippy::too_many_arguments, reason = "a launch's own parameters")]
    pub unsafe fn launch_checked_cooperative(
        &self,
        function: &Function<'_>,
        name: &str,
        params: &[ParamKind],
        grid: [u32; 3],
        block: [u32; 3],
        shared_mem_bytes: u32,
        args: &[KernelArg<'_>],
        uses: &[MemRange<'_>],
    ) -> Result<()> {
        let mut packed = check_and_pack(name, params, grid, block, args, |d| {
            self.device().expect_same(d, "kernel argument")
        })?;
        self.device().expect_same(function.device(), "kernel")?;
        for m in uses {
            self.device()
                .expect_same(m.device, "memory a kernel argument points to")?;
        }
        // At most 1024 threads (checked above).
        let threads = volume(block) as u32;
        let per_sm = function.max_active_blocks_per_sm(threads, shared_mem_bytes)?;
        let multiprocessors = u32::try_from(self.device().info().compute_units).unwrap_or(0);
        check_co_resident(name, grid, per_sm, multiprocessors)?;
        self.note_use(mem_ranges(args));
        self.note_use(uses.iter().map(|m| (m.ptr.0, m.bytes as u64)));
        // SAFETY: as in `launch_checked`, with the pointers inside by-value arguments on this
        // device (checked) and within `uses` (the caller's promise); the driver refuses a grid
        // that cannot be resident at once rather than running part of it.
        unsafe {
            self.launch_unrecorded(
                function,
                grid,
                block,
                shared_mem_bytes,
                &mut packed,
                LaunchMode::Cooperative,
            )
        }
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

    /// Memory arguments need a device, so the host-side checks use the other kinds; a device
    /// check that is never reached panics.
    fn no_memory(_: &Device) -> Result<()> {
        panic!("no memory argument here")
    }

    fn invalid(r: Result<KernelArgs>) -> String {
        match r {
            Err(GpuError::InvalidArgument(why)) => why,
            other => panic!("expected an invalid-argument error, got {other:?}"),
        }
    }

    #[test]
    fn checked_arguments_are_packed_in_order() {
        let params = [
            ParamKind::Ptr,
            ParamKind::I32,
            ParamKind::I64,
            ParamKind::F32,
            ParamKind::Bytes(12),
        ];
        let blob = [7u8; 12];
        let args = [
            KernelArg::Null,
            KernelArg::I32(-3),
            KernelArg::I64(1 << 40),
            KernelArg::F32(2.5),
            KernelArg::Bytes(&blob),
        ];
        let mut packed =
            check_and_pack("k", &params, [4, 2, 1], [128, 2, 1], &args, no_memory).unwrap();
        let p = packed.pointers().unwrap();
        assert_eq!(p.len(), 5);
        // SAFETY: each pointer addresses the packed words of its argument, of its type.
        unsafe {
            assert_eq!(*(p[0] as *const u64), 0);
            assert_eq!(*(p[1] as *const i32), -3);
            assert_eq!(*(p[2] as *const i64), 1 << 40);
            assert_eq!(*(p[3] as *const f32), 2.5);
            assert_eq!(std::slice::from_raw_parts(p[4] as *const u8, 12), &blob);
        }
        assert_eq!(mem_ranges(&args).count(), 0);
    }

    #[test]
    fn checked_arguments_refuse_wrong_counts_kinds_and_shapes() {
        let params = [ParamKind::Ptr, ParamKind::I32];
        let ok = [KernelArg::Null, KernelArg::I32(1)];
        let launch = |args: &[KernelArg<'_>], grid, block| {
            check_and_pack("my_kernel", &params, grid, block, args, no_memory)
        };
        let why = invalid(launch(&ok[..1], [1, 1, 1], [32, 1, 1]));
        assert!(
            why.contains("my_kernel: 1 arguments for 2 parameters"),
            "{why}"
        );
        let why = invalid(launch(
            &[KernelArg::I32(0), KernelArg::I32(1)],
            [1, 1, 1],
            [32, 1, 1],
        ));
        assert!(why.contains("my_kernel: argument 0"), "{why}");
        let why = invalid(launch(
            &[KernelArg::Null, KernelArg::I64(1)],
            [1, 1, 1],
            [32, 1, 1],
        ));
        assert!(why.contains("argument 1") && why.contains("I32"), "{why}");
        for (grid, block) in [
            ([0, 1, 1], [32, 1, 1]),
            ([1, 1, 1], [0, 1, 1]),
            ([1, 1, 1], [1025, 1, 1]),
            ([1, 1, 1], [32, 32, 2]),
            ([1, 65_536, 1], [32, 1, 1]),
            ([1, 1, 65_536], [32, 1, 1]),
        ] {
            let why = invalid(launch(&ok, grid, block));
            assert!(
                why.contains("beyond the hardware limits"),
                "{grid:?} {block:?}: {why}"
            );
        }
        assert!(launch(&ok, [u32::MAX, 65_535, 65_535], [1024, 1, 1]).is_ok());
        assert!(launch(&ok, [1, 1, 1], [32, 32, 1]).is_ok());
        // A block whose thread count overflows 64 bits is refused, not a panic.
        let why = invalid(launch(&ok, [1, 1, 1], [u32::MAX, u32::MAX, u32::MAX]));
        assert!(why.contains("beyond the hardware limits"), "{why}");
    }

    #[test]
    fn cooperative_grids_must_fit_the_device_at_once() {
        // One block per multiprocessor on 132 multiprocessors (a persistent kernel on an H100).
        assert!(check_co_resident("persist", [132, 1, 1], 1, 132).is_ok());
        assert!(check_co_resident("persist", [66, 2, 1], 1, 132).is_ok());
        assert!(check_co_resident("persist", [1, 1, 1], 4, 1).is_ok());
        match check_co_resident("persist", [133, 1, 1], 1, 132) {
            Err(GpuError::CooperativeGridTooLarge {
                kernel,
                blocks,
                per_sm,
                multiprocessors,
            }) => {
                assert_eq!(kernel, "persist");
                assert_eq!((blocks, per_sm, multiprocessors), (133, 1, 132));
            }
            other => panic!("expected CooperativeGridTooLarge, got {other:?}"),
        }
        // Blocks multiply across dimensions, without overflow.
        let e = check_co_resident("big", [u32::MAX, u32::MAX, 2], u32::MAX, u32::MAX - 1)
            .expect_err("2 (2^32 - 1)^2 blocks exceed (2^32 - 1)(2^32 - 2)");
        let text = e.to_string();
        assert!(text.starts_with("big: a cooperative grid of"), "{text}");
        assert!(!text.contains("not even one block"), "{text}");
        // No block fits at all (shared memory above the kernel's limit): the message says why.
        let e = check_co_resident("persist", [1, 1, 1], 0, 132).expect_err("nothing fits");
        let text = e.to_string();
        assert!(
            text.contains("at most 0 per multiprocessor on 132 multiprocessors")
                && text.contains("set_max_dynamic_shared"),
            "{text}"
        );
    }
}
