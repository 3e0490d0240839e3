//! Several devices of one process: direct (peer) access between them and copies from one
//! device's memory to another's, queued on a stream like any copy.

use bytemuck::Pod;

use crate::buffer::{DeviceView, DeviceViewMut};
use crate::device::Device;
use crate::error::{GpuError, Result};
use crate::stream::Stream;

impl Device {
    /// Whether this device can reach `peer`'s memory directly (NVLink, xGMI or PCIe).
    pub fn can_access_peer(&self, peer: &Device) -> Result<bool> {
        if self.ordinal() == peer.ordinal() {
            return Ok(true);
        }
        Ok(self
            .api()
            .device_can_access_peer(self.ordinal(), peer.ordinal())?)
    }

    /// Lets this device reach `peer`'s memory directly, where the hardware allows it; returns
    /// whether access is on (copies between devices work either way, staged by the driver
    /// when it is off).
    pub fn enable_peer_access(&self, peer: &Device) -> Result<bool> {
        if self.ordinal() == peer.ordinal() {
            return Ok(true);
        }
        if !self.can_access_peer(peer)? {
            return Ok(false);
        }
        self.bind()?;
        self.api().enable_peer_access(peer.ordinal())?;
        Ok(true)
    }
}

/// Enables peer access between every ordered pair of `devices` that the hardware allows;
/// returns the pairs `(from, to)` (ordinals) left without it.
pub fn enable_all_peers(devices: &[Device]) -> Result<Vec<(i32, i32)>> {
    let mut without = Vec::new();
    for a in devices {
        for b in devices {
            if a.ordinal() != b.ordinal() && !a.enable_peer_access(b)? {
                without.push((a.ordinal(), b.ordinal()));
            }
        }
    }
    Ok(without)
}

impl Stream {
    /// Queues a copy between views on two devices (one of them this stream's). The source must
    /// be complete before the stream reaches the copy: order it with an event recorded on the
    /// stream that wrote it ([`Stream::wait_event`]) or a synchronize.
    pub fn copy_peer<T: Pod>(
        &self,
        src: &DeviceView<'_, T>,
        dst: &mut DeviceViewMut<'_, T>,
    ) -> Result<()> {
        let (s, d, own) = (src.device, dst.device, self.device());
        if s.ordinal() != own.ordinal() && d.ordinal() != own.ordinal() {
            return Err(GpuError::WrongDevice {
                what: "peer copy stream",
                expected: d.ordinal(),
                found: own.ordinal(),
            });
        }
        if src.len != dst.len {
            return Err(GpuError::LengthMismatch {
                src: src.len,
                dst: dst.len,
            });
        }
        if src.len == 0 {
            return Ok(());
        }
        self.note_unknown("a peer copy");
        own.bind()?;
        // SAFETY: both are checked views of equal size on the devices named; a shared and an
        // exclusive borrow cannot alias the same owner.
        unsafe {
            own.api().memcpy_peer_async(
                dst.ptr,
                d.ordinal(),
                src.ptr,
                s.ordinal(),
                src.byte_len() as usize,
                self.handle(),
            )
        }?;
        Ok(())
    }
}
