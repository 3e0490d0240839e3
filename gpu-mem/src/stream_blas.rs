//! A stream that owns the one BLAS handle bound to it, for holders that need both for their
//! whole life (a graph backend's device state) without a borrow between two of their fields.

use std::mem::ManuallyDrop;
use std::ptr::NonNull;

use crate::blas::Blas;
use crate::device::Device;
use crate::error::Result;
use crate::stream::Stream;

/// A new stream of a device and a BLAS handle queued on it, dropped handle first.
pub struct StreamBlas {
    /// Borrows `*stream`; declared first and dropped by hand before it.
    blas: ManuallyDrop<Blas<'static>>,
    /// From `Box::into_raw`, so its address stays put when `StreamBlas` moves; freed in `drop`.
    stream: NonNull<Stream>,
}

// SAFETY: `StreamBlas` owns the stream behind the pointer exactly as a `Box<Stream>` would and
// hands out only shared borrows of it; `Stream` and `Blas` are themselves `Send + Sync`.
unsafe impl Send for StreamBlas {}
// SAFETY: as above.
unsafe impl Sync for StreamBlas {}

impl std::fmt::Debug for StreamBlas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamBlas").finish()
    }
}

impl StreamBlas {
    /// Creates a stream on `device` and a BLAS handle bound to it.
    pub fn new(device: &Device) -> Result<StreamBlas> {
        let stream = NonNull::from(Box::leak(Box::new(Stream::new(device)?)));
        // SAFETY: the stream lives in a heap allocation that this struct owns and frees only in
        // `drop`, after the BLAS handle; the `'static` borrow never leaves this struct except
        // shortened to a borrow of `self` (`blas`).
        let static_ref: &'static Stream = unsafe { stream.as_ref() };
        match Blas::new(static_ref) {
            Ok(blas) => Ok(StreamBlas {
                blas: ManuallyDrop::new(blas),
                stream,
            }),
            Err(e) => {
                // SAFETY: nothing borrows the stream any more (the handle was not created).
                drop(unsafe { Box::from_raw(stream.as_ptr()) });
                Err(e)
            }
        }
    }

    /// The stream.
    pub fn stream(&self) -> &Stream {
        // SAFETY: the stream is alive until `drop` (see `new`).
        unsafe { self.stream.as_ref() }
    }

    /// The BLAS handle bound to [`StreamBlas::stream`].
    pub fn blas<'a>(&'a self) -> &'a Blas<'a> {
        &self.blas
    }
}

impl Drop for StreamBlas {
    fn drop(&mut self) {
        // SAFETY: each field is dropped exactly once, here, the handle (which borrows the
        // stream) before the stream; neither is used afterwards.
        unsafe {
            ManuallyDrop::drop(&mut self.blas);
            drop(Box::from_raw(self.stream.as_ptr()));
        }
    }
}
