//! Device discovery and the `Device` handle: the provider, the ordinal, the memory budget and
//! tracker every device allocation goes through, and the log of errors raised in `Drop`.

use std::fmt::Write as _;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use hip_ffi::{DeviceAttribute, DevicePtr, HipApi, Platform};
use parking_lot::Mutex;

use crate::amd_memory::{read_pools, usable_memory, MemPools, PciAddress, SYS_DRM};
use crate::budget::{Budget, BudgetConfig, LeakReport, Tracker};
use crate::error::{GpuError, Result};
use crate::pool::{Accounted, RawAllocator};

/// What discovery reports about one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The device index on its platform.
    pub ordinal: i32,
    /// AMD (HIP) or NVIDIA (CUDA driver).
    pub platform: Platform,
    /// The marketing name the driver reports.
    pub name: String,
    /// `gfx90a`, `sm_90`, ...
    pub arch: String,
    /// Compute units (AMD) or streaming multiprocessors (NVIDIA).
    pub compute_units: i32,
    /// Threads per wavefront or warp.
    pub warp_size: i32,
    /// Memory the device can hold, in bytes: the driver's total, plus the GTT pool on an AMD APU
    /// whose driver reports only its VRAM carve-out ([`crate::amd_memory::usable_memory`]).
    pub total_bytes: u64,
    /// Of [`total_bytes`](Self::total_bytes), what was free when discovery ran: this is what the
    /// memory budget, the fit estimate and the automatic layer split start from.
    pub free_bytes: u64,
    /// Whether the GPU is integrated with the CPU (an APU sharing system memory).
    pub integrated: bool,
    /// AMD: the amdgpu driver's VRAM and GTT pools (sysfs), when readable.
    pub pools: Option<MemPools>,
}

fn query_info(api: &dyn HipApi, ordinal: i32) -> Result<DeviceInfo> {
    api.set_device(ordinal)?;
    let (driver_free, _) = api.mem_get_info()?;
    let driver_total = api.device_total_mem(ordinal)?;
    let platform = api.platform();
    // A runtime that does not know the attribute leaves the device discrete, as it was before.
    let integrated = api
        .device_attribute(DeviceAttribute::Integrated, ordinal)
        .is_ok_and(|v| v != 0);
    let pools = if platform == Platform::Amd {
        pci_address(api, ordinal).and_then(|pci| read_pools(Path::new(SYS_DRM), pci))
    } else {
        None
    };
    let (free_bytes, total_bytes) =
        usable_memory(driver_free, driver_total, integrated, pools.as_ref());
    Ok(DeviceInfo {
        ordinal,
        platform,
        name: api.device_name(ordinal)?,
        arch: api.device_arch(ordinal)?,
        compute_units: api.device_attribute(DeviceAttribute::MultiprocessorCount, ordinal)?,
        warp_size: api.device_attribute(DeviceAttribute::WarpSize, ordinal)?,
        total_bytes,
        free_bytes,
        integrated,
        pools,
    })
}

/// The device's PCI address, when the runtime reports it (a failed query only costs the pools).
fn pci_address(api: &dyn HipApi, ordinal: i32) -> Option<PciAddress> {
    let get = |a| {
        api.device_attribute(a, ordinal)
            .ok()
            .and_then(|v| u32::try_from(v).ok())
    };
    Some(PciAddress {
        domain: get(DeviceAttribute::PciDomainId)?,
        bus: get(DeviceAttribute::PciBusId)?,
        device: get(DeviceAttribute::PciDeviceId)?,
    })
}

/// Every device of the selected provider (an error says why there is none).
pub fn devices() -> Result<Vec<DeviceInfo>> {
    let api = hip_ffi::runtime()?;
    let n = api.device_count()?;
    (0..n).map(|d| query_info(api, d)).collect()
}

static AVAILABLE: OnceLock<std::result::Result<(), String>> = OnceLock::new();

fn availability() -> &'static std::result::Result<(), String> {
    AVAILABLE.get_or_init(|| match devices() {
        Ok(d) if !d.is_empty() => Ok(()),
        Ok(_) => Err("the GPU provider lists no device".into()),
        Err(e) => Err(e.to_string()),
    })
}

/// Whether a usable GPU exists (decided once per process; never panics).
pub fn gpu_available() -> bool {
    availability().is_ok()
}

/// Why no GPU is usable, or `None` when one is.
pub fn gpu_unavailable_reason() -> Option<String> {
    availability().as_ref().err().cloned()
}

/// A human-readable summary of the devices (for `rocmforge devices`).
pub fn summary() -> String {
    let mut s = String::new();
    match devices() {
        Ok(list) if !list.is_empty() => {
            let api = hip_ffi::runtime().ok();
            let libs = api
                .map(|a| a.library_names().join(", "))
                .unwrap_or_default();
            let _ = writeln!(s, "platform: {} ({libs})", list[0].platform);
            for d in &list {
                let _ = writeln!(
                    s,
                    "  [{}] {} ({}{}): {} compute units, warp {}, {:.1} GiB total, {:.1} GiB free",
                    d.ordinal,
                    d.name,
                    d.arch,
                    if d.integrated { ", integrated" } else { "" },
                    d.compute_units,
                    d.warp_size,
                    gib(d.total_bytes),
                    gib(d.free_bytes)
                );
                if let Some(p) = &d.pools {
                    let _ = writeln!(
                        s,
                        "      VRAM {:.1} GiB, {:.1} GiB free; GTT {:.1} GiB, {:.1} GiB free{}",
                        gib(p.vram_total),
                        gib(p.vram_free()),
                        gib(p.gtt_total),
                        gib(p.gtt_free()),
                        if d.integrated && d.total_bytes > p.vram_total {
                            " (usable by this APU: counted above)"
                        } else {
                            ""
                        }
                    );
                }
            }
        }
        Ok(_) => s.push_str("no GPU: the provider lists no device; using the CPU\n"),
        Err(e) => {
            let _ = writeln!(s, "no GPU ({e}); using the CPU");
        }
    }
    s
}

/// Prints [`summary`] to standard output.
pub fn print_summary() {
    print!("{}", summary());
}

fn gib(b: u64) -> f64 {
    b as f64 / (1u64 << 30) as f64
}

/// Readable bytes past the end of every device allocation. Quantized blocks are only 2-byte
/// aligned, so mat-vec kernels load a row's last bytes with the 4- or 16-byte word that holds
/// them and may read up to 15 bytes past the row (ggml pads its GPU buffers for the same
/// reason); the slack keeps those reads inside the allocation for the last tensor too.
pub const ALLOC_TAIL_SLACK: usize = 16;

/// Raw device memory: `malloc`/`free` of the provider on one device.
pub(crate) struct DeviceRaw {
    api: &'static dyn HipApi,
    ordinal: i32,
    calls: AtomicU64,
    errors: Arc<Mutex<Vec<String>>>,
}

impl RawAllocator for DeviceRaw {
    fn allocate(&self, bytes: u64, tag: &str) -> Result<u64> {
        self.api.set_device(self.ordinal)?;
        let n = usize::try_from(bytes)
            .map_err(|_| GpuError::InvalidArgument(format!("{bytes} bytes exceed usize")))?;
        let padded = n.checked_add(ALLOC_TAIL_SLACK).ok_or_else(|| {
            GpuError::InvalidArgument(format!("{bytes} bytes plus the tail slack exceed usize"))
        })?;
        let p = self
            .api
            .malloc(padded)
            .map_err(|e| crate::error::alloc_err(tag, bytes, e))?;
        self.calls.fetch_add(1, Ordering::Relaxed);
        Ok(p.0)
    }

    fn deallocate(&self, addr: u64, _bytes: u64) {
        let r = self.api.set_device(self.ordinal).and_then(|()| {
            // SAFETY: `addr` came from `allocate` (the RawAllocator contract) and its owner has
            // finished with it; callers order their stream work before releasing memory.
            unsafe { self.api.free(DevicePtr(addr)) }
        });
        if let Err(e) = r {
            self.errors.lock().push(e.to_string());
        }
    }

    fn allocation_calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }
}

pub(crate) struct DeviceInner {
    pub(crate) api: &'static dyn HipApi,
    pub(crate) ordinal: i32,
    pub(crate) raw: Arc<Accounted<DeviceRaw>>,
    errors: Arc<Mutex<Vec<String>>>,
    info: DeviceInfo,
}

/// One GPU: cheap to clone, shared by everything allocated on it.
#[derive(Clone)]
pub struct Device {
    pub(crate) inner: Arc<DeviceInner>,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("ordinal", &self.inner.ordinal)
            .field("name", &self.inner.info.name)
            .finish()
    }
}

impl Device {
    /// Opens device `ordinal` of the selected provider with the inference budget preset.
    pub fn open(ordinal: i32) -> Result<Device> {
        Self::open_with(ordinal, BudgetConfig::inference())
    }

    /// Opens a device with a budget from its free memory and `config`.
    pub fn open_with(ordinal: i32, config: BudgetConfig) -> Result<Device> {
        let api = hip_ffi::runtime()?;
        let info = query_info(api, ordinal)?;
        let budget = Arc::new(Budget::from_free(info.free_bytes, config));
        let errors = Arc::new(Mutex::new(Vec::new()));
        let raw = DeviceRaw {
            api,
            ordinal,
            calls: AtomicU64::new(0),
            errors: errors.clone(),
        };
        let raw = Arc::new(Accounted::new(
            Arc::new(raw),
            budget,
            Arc::new(Tracker::default()),
        ));
        Ok(Device {
            inner: Arc::new(DeviceInner {
                api,
                ordinal,
                raw,
                errors,
                info,
            }),
        })
    }

    /// The provider.
    pub fn api(&self) -> &'static dyn HipApi {
        self.inner.api
    }

    /// The ordinal.
    pub fn ordinal(&self) -> i32 {
        self.inner.ordinal
    }

    /// Discovery data taken when the device was opened.
    pub fn info(&self) -> &DeviceInfo {
        &self.inner.info
    }

    /// One integer attribute, queried now (for what discovery does not keep, such as the L2
    /// cache size benchmarks size their working sets by).
    pub fn attribute(&self, attr: DeviceAttribute) -> Result<i32> {
        Ok(self.inner.api.device_attribute(attr, self.inner.ordinal)?)
    }

    /// Makes this device current for the calling thread (cached, cheap).
    pub fn bind(&self) -> Result<()> {
        Ok(self.inner.api.set_device(self.inner.ordinal)?)
    }

    /// `(free, total)` bytes now.
    pub fn mem_info(&self) -> Result<(u64, u64)> {
        self.bind()?;
        Ok(self.inner.api.mem_get_info()?)
    }

    /// The budget every allocation on this device is checked against.
    pub fn budget(&self) -> &Arc<Budget> {
        self.inner.raw.budget()
    }

    /// The tracker of live device allocations.
    pub fn tracker(&self) -> &Arc<Tracker> {
        self.inner.raw.tracker()
    }

    /// Live allocations now.
    pub fn leak_report(&self) -> LeakReport {
        self.tracker().report()
    }

    /// The budgeted, tracked raw allocator of this device (for pools).
    pub fn allocator(&self) -> Arc<dyn RawAllocator> {
        self.inner.raw.clone()
    }

    /// Number of driver allocation calls made on this device so far.
    pub fn allocation_calls(&self) -> u64 {
        self.inner.raw.allocation_calls()
    }

    /// Records an error raised where it cannot be returned (`Drop`).
    pub(crate) fn record_error(&self, what: &str, e: impl std::fmt::Display) {
        tracing::warn!("{what}: {e}");
        self.inner.errors.lock().push(format!("{what}: {e}"));
    }

    /// Takes the errors recorded by `Drop` implementations.
    pub fn take_errors(&self) -> Vec<String> {
        std::mem::take(&mut *self.inner.errors.lock())
    }

    /// `Err` with every error recorded since the last check.
    pub fn check_errors(&self) -> Result<()> {
        let errors = self.take_errors();
        if errors.is_empty() {
            Ok(())
        } else {
            Err(GpuError::Deferred(errors))
        }
    }

    pub(crate) fn same(&self, other: &Device) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    pub(crate) fn expect_same(&self, other: &Device, what: &'static str) -> Result<()> {
        if self.same(other) {
            Ok(())
        } else {
            Err(GpuError::WrongDevice {
                what,
                expected: self.ordinal(),
                found: other.ordinal(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Discovery is total: with a GPU it lists devices, without one every entry point answers
    /// with the same reason instead of panicking.
    #[test]
    fn discovery_without_panics() {
        let available = gpu_available();
        assert_eq!(available, gpu_available(), "cached");
        let s = summary();
        match gpu_unavailable_reason() {
            None => {
                assert!(available);
                assert!(s.starts_with("platform:"), "{s}");
                assert!(!devices().expect("devices").is_empty());
            }
            Some(why) => {
                assert!(!available);
                assert!(s.starts_with("no GPU"), "{s}");
                let e = Device::open(0).expect_err("no GPU to open");
                assert!(matches!(e, GpuError::Ffi(_)), "{e}");
                crate::testing::skip::<()>(format_args!("no GPU ({why})"));
            }
        }
    }

    /// Attributes queried later agree with what discovery recorded; the L2 size is plausible.
    #[test]
    fn attributes_agree_with_discovery() {
        let Some(dev) = crate::testing::gpu_or_skip() else {
            return;
        };
        let attr = |a| dev.attribute(a).expect("device attribute");
        let info = dev.info();
        assert_eq!(
            attr(DeviceAttribute::MultiprocessorCount),
            info.compute_units
        );
        assert_eq!(attr(DeviceAttribute::WarpSize), info.warp_size);
        // From a few MiB (RDNA) to a few hundred MiB (data-centre parts).
        let l2 = attr(DeviceAttribute::L2CacheBytes);
        assert!((64 << 10..1 << 30).contains(&l2), "L2 {l2} bytes");
    }
}
