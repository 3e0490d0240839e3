//! Loaded code objects and their kernels, plus the argument packer for launches.

use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::marker::PhantomData;

use bytemuck::Pod;
use hip_ffi::{FunctionHandle, ModuleHandle};
use parking_lot::Mutex;

use crate::buffer::{DeviceView, DeviceViewMut};
use crate::device::Device;
use crate::error::{GpuError, Result};

/// A code object loaded on a device (AMD: HSACO; NVIDIA: cubin, fatbin or PTX), unloaded on drop.
pub struct Module {
    device: Device,
    handle: ModuleHandle,
    /// Kernels looked up so far (a launch path asks for the same few names over and over).
    functions: Mutex<HashMap<String, FunctionHandle>>,
}

impl std::fmt::Debug for Module {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Module")
            .field("device", &self.device.ordinal())
            .finish()
    }
}

impl Module {
    /// Loads a code object. PTX text is NUL-terminated here when it is not already, as the
    /// driver requires.
    pub fn load(device: &Device, image: &[u8]) -> Result<Module> {
        device.bind()?;
        let looks_like_ptx = image.starts_with(b"//") || image.starts_with(b".version");
        let owned;
        let image = if looks_like_ptx && image.last() != Some(&0) {
            owned = [image, &[0u8]].concat();
            &owned[..]
        } else {
            image
        };
        // SAFETY: the driver validates the image and returns an error for a malformed one; the
        // slice lives for the duration of the call.
        let handle = unsafe { device.api().module_load_data(image) }?;
        Ok(Module {
            device: device.clone(),
            handle,
            functions: Mutex::new(HashMap::new()),
        })
    }

    /// Looks up a kernel by name.
    pub fn function(&self, name: &str) -> Result<Function<'_>> {
        let cached = self.functions.lock().get(name).copied();
        let handle = match cached {
            Some(h) => h,
            None => {
                let c = CString::new(name).map_err(|_| {
                    GpuError::InvalidArgument(format!("kernel name {name:?} contains NUL"))
                })?;
                self.device.bind()?;
                // SAFETY: the module is live for `self`'s life.
                let h = unsafe { self.device.api().module_get_function(self.handle, &c) }?;
                self.functions.lock().insert(name.to_owned(), h);
                h
            }
        };
        Ok(Function {
            device: &self.device,
            handle,
            _m: PhantomData,
        })
    }

    /// The device.
    pub fn device(&self) -> &Device {
        &self.device
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        // SAFETY: functions borrow the module, so none is alive; launches queued earlier keep
        // the code alive in the driver until they finish.
        if let Err(e) = unsafe { self.device.api().module_unload(self.handle) } {
            self.device.record_error("hipModuleUnload", e);
        }
    }
}

/// A kernel of a loaded module.
#[derive(Clone, Copy)]
pub struct Function<'m> {
    device: &'m Device,
    handle: FunctionHandle,
    _m: PhantomData<&'m Module>,
}

impl std::fmt::Debug for Function<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Function").finish()
    }
}

impl Function<'_> {
    /// The raw handle.
    pub fn handle(&self) -> FunctionHandle {
        self.handle
    }

    /// The device.
    pub fn device(&self) -> &Device {
        self.device
    }

    /// Lets launches of this kernel use up to `bytes` of dynamic shared memory per block.
    /// NVIDIA requires this above 48 KiB, up to
    /// [`DeviceAttribute::MaxSharedMemoryPerBlockOptin`](hip_ffi::DeviceAttribute) less the
    /// kernel's static shared memory; AMD has no opt-in and only checks `bytes` against the
    /// device's shared memory per block. The setting belongs to the kernel and lasts as long
    /// as its module.
    pub fn set_max_dynamic_shared(&self, bytes: u32) -> Result<()> {
        self.device.bind()?;
        // SAFETY: the function belongs to a module of this device that `self` borrows, so it is
        // live; the device was made current above.
        Ok(unsafe {
            self.device
                .api()
                .function_set_max_dynamic_shared(self.handle, bytes)
        }?)
    }

    /// How many blocks of `block_threads` threads with `shared_mem_bytes` of dynamic shared
    /// memory each fit on one multiprocessor (compute unit) at once; 0 when not even one does
    /// (above the kernel's dynamic shared memory limit, say).
    pub fn max_active_blocks_per_sm(
        &self,
        block_threads: u32,
        shared_mem_bytes: u32,
    ) -> Result<u32> {
        self.device.bind()?;
        // SAFETY: as in `set_max_dynamic_shared`.
        Ok(unsafe {
            self.device.api().occupancy_max_blocks_per_sm(
                self.handle,
                block_threads,
                shared_mem_bytes,
            )
        }?)
    }
}

/// Kernel arguments, packed by value in order (device pointers as 64-bit addresses), all in one
/// word buffer (a launch allocates once, not once per argument).
#[derive(Debug, Default)]
pub struct KernelArgs {
    words: Vec<u64>,
    /// First word of each argument.
    starts: Vec<usize>,
    error: Option<String>,
}

impl KernelArgs {
    /// No arguments yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends a plain value (`int`, `float`, a POD struct up to 8-byte alignment).
    pub fn push<T: Pod>(&mut self, value: T) -> &mut Self {
        if std::mem::align_of::<T>() > 8 {
            self.error = Some(format!(
                "argument {} has alignment {} (at most 8 is supported)",
                self.starts.len(),
                std::mem::align_of::<T>()
            ));
            return self;
        }
        self.push_bytes(bytemuck::bytes_of(&value))
    }

    /// Appends a struct passed by value, given as its bytes (layouts of at most 8-byte
    /// alignment, like [`KernelArgs::push`]).
    pub fn push_bytes(&mut self, bytes: &[u8]) -> &mut Self {
        let start = self.words.len();
        self.words.resize(start + bytes.len().div_ceil(8).max(1), 0);
        bytemuck::cast_slice_mut::<u64, u8>(&mut self.words[start..])[..bytes.len()]
            .copy_from_slice(bytes);
        self.starts.push(start);
        self
    }

    /// Appends a read-only buffer's device address.
    pub fn push_view<T: Pod>(&mut self, view: &DeviceView<'_, T>) -> &mut Self {
        self.push(view.ptr().0)
    }

    /// Appends a writable buffer's device address.
    pub fn push_view_mut<T: Pod>(&mut self, view: &mut DeviceViewMut<'_, T>) -> &mut Self {
        self.push(view.ptr().0)
    }

    /// Number of arguments.
    pub fn len(&self) -> usize {
        self.starts.len()
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.starts.is_empty()
    }

    /// One pointer per argument, as `hipModuleLaunchKernel` takes them.
    pub(crate) fn pointers(&mut self) -> Result<Vec<*mut c_void>> {
        if let Some(e) = &self.error {
            return Err(GpuError::InvalidArgument(e.clone()));
        }
        // The buffer is not resized while the pointers are in use (`&mut self` is held).
        let base = self.words.as_mut_ptr();
        Ok(self
            .starts
            .iter()
            .map(|&s| base.wrapping_add(s).cast::<c_void>())
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_are_packed_by_value() {
        let mut a = KernelArgs::new();
        a.push(7u32).push(1.5f32).push(0x1234_5678_9abc_u64);
        let mut p = a.pointers().unwrap();
        assert_eq!(p.len(), 3);
        // SAFETY: each pointer addresses the boxed words of its argument.
        unsafe {
            assert_eq!(*(p[0] as *const u32), 7);
            assert_eq!(*(p[1] as *const f32), 1.5);
            assert_eq!(*(p[2] as *const u64), 0x1234_5678_9abc);
        }
        p.clear();
    }

    #[test]
    fn overaligned_arguments_are_refused() {
        #[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
        #[repr(C, align(16))]
        struct Wide([u64; 2]);
        let mut a = KernelArgs::new();
        a.push(Wide([1, 2]));
        assert!(a.pointers().is_err());
    }
}
