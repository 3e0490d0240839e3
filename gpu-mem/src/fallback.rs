//! A buffer that lives on the device when the budget allows and in host memory otherwise, with
//! one read/write API; each fallback is counted on the device.

use bytemuck::Pod;

use crate::buffer::DeviceBuffer;
use crate::device::Device;
use crate::error::{GpuError, Result};
use crate::stream::Stream;

/// Device or host storage behind one API.
#[derive(Debug)]
pub enum FallbackBuffer<T: Pod> {
    Device(DeviceBuffer<T>),
    Host(Vec<T>),
}

impl<T: Pod> FallbackBuffer<T> {
    /// `len` zeroed elements on the device, or in host memory when the device budget or the
    /// driver refuses for lack of memory (other errors are returned).
    pub fn new(device: &Device, stream: &Stream, len: usize, tag: &str) -> Result<Self> {
        match DeviceBuffer::new(device, len, tag) {
            Ok(mut b) => {
                stream.memset(&mut b.view_mut(), 0)?;
                Ok(FallbackBuffer::Device(b))
            }
            Err(e) if e.is_out_of_memory() => {
                tracing::info!(tag, len, "device memory refused, using host memory: {e}");
                device.note_fallback();
                Ok(FallbackBuffer::Host(vec![T::zeroed(); len]))
            }
            Err(e) => Err(e),
        }
    }

    /// True when the data lives on the device.
    pub fn is_device(&self) -> bool {
        matches!(self, FallbackBuffer::Device(_))
    }

    /// Element count.
    pub fn len(&self) -> usize {
        match self {
            FallbackBuffer::Device(b) => b.len(),
            FallbackBuffer::Host(v) => v.len(),
        }
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Overwrites the contents.
    pub fn write(&mut self, stream: &Stream, src: &[T]) -> Result<()> {
        match self {
            FallbackBuffer::Device(b) => stream.write(src, &mut b.view_mut()),
            FallbackBuffer::Host(v) => {
                if v.len() != src.len() {
                    return Err(GpuError::LengthMismatch {
                        src: src.len(),
                        dst: v.len(),
                    });
                }
                v.copy_from_slice(src);
                Ok(())
            }
        }
    }

    /// Reads the contents.
    pub fn read(&self, stream: &Stream) -> Result<Vec<T>> {
        match self {
            FallbackBuffer::Device(b) => stream.read_to_vec(&b.view()),
            FallbackBuffer::Host(v) => Ok(v.clone()),
        }
    }
}
