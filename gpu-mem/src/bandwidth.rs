//! The device's memory bandwidth measured on the device: the reference that memory-bound work
//! (a decode step reads every weight once) is judged against.

use crate::error::{GpuError, Result};
use crate::{Device, DeviceBuffer, Event, Stream};

/// Device-to-device copy bandwidth in bytes per second, counting both the bytes read and the
/// bytes written: `reps` copies of `bytes` on a stream of its own, timed by events after one
/// untimed copy (first touch of the pages, clocks ramping up). The two buffers are allocated
/// through the device's budget and freed before it returns. A copy well above the L2 cache
/// (hundreds of MiB) measures device memory rather than the cache.
pub fn copy_bandwidth(device: &Device, bytes: usize, reps: u32) -> Result<f64> {
    if bytes == 0 || reps == 0 {
        return Err(GpuError::InvalidArgument(format!(
            "copy bandwidth over {bytes} bytes and {reps} copies: both must be positive"
        )));
    }
    let src = DeviceBuffer::<u8>::new(device, bytes, "bandwidth source")?;
    let mut dst = DeviceBuffer::<u8>::new(device, bytes, "bandwidth destination")?;
    let stream = Stream::new(device)?;
    let (start, end) = (Event::new(device, true)?, Event::new(device, true)?);
    stream.copy(&src.view(), &mut dst.view_mut())?;
    start.record(&stream)?;
    for _ in 0..reps {
        stream.copy(&src.view(), &mut dst.view_mut())?;
    }
    end.record(&stream)?;
    end.synchronize()?;
    let ms = f64::from(start.elapsed_ms(&end)?);
    if ms.is_nan() || ms <= 0.0 {
        return Err(GpuError::InvalidArgument(format!(
            "{reps} copies of {bytes} bytes timed at {ms} ms"
        )));
    }
    Ok(2.0 * bytes as f64 * f64::from(reps) / (ms * 1e-3))
}
