//! AMD memory pools as the amdgpu kernel driver reports them in sysfs: VRAM and GTT (system memory
//! the GPU maps), so that an APU's usable memory is not mistaken for its small VRAM carve-out.
//!
//! The driver's files sit under each DRM node's `device/` folder (`mem_info_vram_total`,
//! `mem_info_vram_used`, `mem_info_gtt_total`, `mem_info_gtt_used`, bytes in decimal); the node is
//! the one whose `device` link names the GPU's PCI address. The DRM folder is a parameter so
//! tests run on a fake tree.

use std::fs;
use std::path::{Path, PathBuf};

/// Where Linux lists DRM nodes.
pub const SYS_DRM: &str = "/sys/class/drm";

/// A GPU's PCI address (`domain:bus:device`; the function is 0 for GPUs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PciAddress {
    /// PCI domain (segment).
    pub domain: u32,
    /// Bus number.
    pub bus: u32,
    /// Device (slot) number.
    pub device: u32,
}

impl PciAddress {
    /// Parses sysfs' `0000:c3:00.0` form.
    pub fn parse(s: &str) -> Option<PciAddress> {
        let mut parts = s.split(':');
        let domain = u32::from_str_radix(parts.next()?, 16).ok()?;
        let bus = u32::from_str_radix(parts.next()?, 16).ok()?;
        let dev_fn = parts.next()?;
        if parts.next().is_some() {
            return None;
        }
        let device = u32::from_str_radix(dev_fn.split('.').next()?, 16).ok()?;
        Some(PciAddress {
            domain,
            bus,
            device,
        })
    }
}

/// The driver's memory pools of one GPU, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemPools {
    /// Dedicated VRAM (on an APU, the carve-out the firmware reserves).
    pub vram_total: u64,
    /// VRAM in use.
    pub vram_used: u64,
    /// GTT: system memory the GPU can map.
    pub gtt_total: u64,
    /// GTT in use.
    pub gtt_used: u64,
}

impl MemPools {
    /// VRAM not in use.
    pub fn vram_free(&self) -> u64 {
        self.vram_total.saturating_sub(self.vram_used)
    }

    /// GTT not in use.
    pub fn gtt_free(&self) -> u64 {
        self.gtt_total.saturating_sub(self.gtt_used)
    }
}

/// The pools of the GPU at `pci`, from the first DRM node under `drm` (render nodes first) whose
/// device is that address and which has the VRAM and GTT files; `None` when there is none (not
/// amdgpu, no sysfs, a container without it).
pub fn read_pools(drm: &Path, pci: PciAddress) -> Option<MemPools> {
    let mut nodes: Vec<PathBuf> = fs::read_dir(drm)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| is_node(n, "renderD") || is_node(n, "card"))
        })
        .collect();
    // renderD* before card*, then by name, so the answer does not depend on directory order.
    nodes.sort_by_key(|p| {
        let name = p.file_name().map(|n| n.to_string_lossy().into_owned());
        (!name.as_deref().unwrap_or("").starts_with("renderD"), name)
    });
    nodes.into_iter().find_map(|node| {
        let dev = node.join("device");
        let target = fs::read_link(&dev).ok()?;
        let addr = PciAddress::parse(&target.file_name()?.to_string_lossy())?;
        if addr != pci {
            return None;
        }
        let read = |name: &str| -> Option<u64> {
            fs::read_to_string(dev.join(name)).ok()?.trim().parse().ok()
        };
        Some(MemPools {
            vram_total: read("mem_info_vram_total")?,
            vram_used: read("mem_info_vram_used")?,
            gtt_total: read("mem_info_gtt_total")?,
            gtt_used: read("mem_info_gtt_used")?,
        })
    })
}

/// `renderD128`, `card0`: the prefix and digits only (not `card0-DP-1`, a connector).
fn is_node(name: &str, prefix: &str) -> bool {
    name.strip_prefix(prefix)
        .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
}

/// The `(free, total)` bytes a device can hold, from the driver's `(free, total)` and, on AMD,
/// the pools: an integrated GPU (APU) also allocates from GTT, so its free GTT counts, unless the
/// driver's total already exceeds the VRAM pool (runtimes that report system memory themselves).
/// A discrete GPU keeps the driver's numbers: its GTT is host memory across PCIe, no place for
/// weights.
pub fn usable_memory(
    driver_free: u64,
    driver_total: u64,
    integrated: bool,
    pools: Option<&MemPools>,
) -> (u64, u64) {
    match pools {
        Some(p) if integrated && driver_total <= p.vram_total => (
            driver_free.saturating_add(p.gtt_free()),
            driver_total.saturating_add(p.gtt_total),
        ),
        _ => (driver_free, driver_total),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    /// A fake `/sys/class/drm` with the given nodes (name, PCI address, pool files or none).
    struct FakeSys {
        root: PathBuf,
    }

    impl FakeSys {
        fn new(test: &str) -> FakeSys {
            let root = std::env::temp_dir().join(format!(
                "rocmforge-fake-sysfs-{test}-{}",
                std::process::id()
            ));
            let _ = fs::remove_dir_all(&root);
            fs::create_dir_all(root.join("drm")).expect("create fake sysfs");
            FakeSys { root }
        }

        fn drm(&self) -> PathBuf {
            self.root.join("drm")
        }

        /// Adds the PCI device folder (with pool files when `pools` is given) and a DRM node
        /// linking to it.
        fn node(&self, name: &str, pci: &str, pools: Option<[u64; 4]>) {
            let dev = self.root.join("devices/pci0000:00").join(pci);
            fs::create_dir_all(&dev).expect("create fake device");
            if let Some([vt, vu, gt, gu]) = pools {
                for (f, v) in [
                    ("mem_info_vram_total", vt),
                    ("mem_info_vram_used", vu),
                    ("mem_info_gtt_total", gt),
                    ("mem_info_gtt_used", gu),
                ] {
                    fs::write(dev.join(f), format!("{v}\n")).expect("write pool file");
                }
            }
            let node = self.drm().join(name);
            fs::create_dir_all(&node).expect("create fake node");
            std::os::unix::fs::symlink(&dev, node.join("device")).expect("link device");
        }
    }

    impl Drop for FakeSys {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.root);
        }
    }

    fn addr(s: &str) -> PciAddress {
        PciAddress::parse(s).expect("valid address")
    }

    #[test]
    fn parses_sysfs_pci_addresses() {
        assert_eq!(
            PciAddress::parse("0000:c3:00.0"),
            Some(PciAddress {
                domain: 0,
                bus: 0xc3,
                device: 0
            })
        );
        assert_eq!(addr("0001:03:1f.1").device, 0x1f);
        for bad in ["", "c3:00.0", "0000:zz:00.0", "0000:03:00.0:1"] {
            assert_eq!(PciAddress::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn finds_the_pools_of_the_matching_render_node() {
        let sys = FakeSys::new("match");
        // A discrete GPU and an APU; connector folders and nodes without pools are skipped.
        sys.node("card0", "0000:03:00.0", Some([16 * GIB, GIB, 32 * GIB, 0]));
        sys.node(
            "renderD128",
            "0000:03:00.0",
            Some([16 * GIB, GIB, 32 * GIB, 0]),
        );
        sys.node(
            "renderD129",
            "0000:c3:00.0",
            Some([512 << 20, 100 << 20, 60 * GIB, 4 * GIB]),
        );
        sys.node("card1-DP-1", "0000:c3:00.0", None);
        sys.node("renderD130", "0000:07:00.0", None);
        let apu = read_pools(&sys.drm(), addr("0000:c3:00.0")).expect("the APU's pools");
        assert_eq!(apu.vram_total, 512 << 20);
        assert_eq!(apu.vram_free(), 412 << 20);
        assert_eq!(apu.gtt_free(), 56 * GIB);
        let dgpu = read_pools(&sys.drm(), addr("0000:03:00.0")).expect("the dGPU's pools");
        assert_eq!(dgpu.vram_free(), 15 * GIB);
        assert_eq!(read_pools(&sys.drm(), addr("0000:07:00.0")), None);
        assert_eq!(read_pools(&sys.drm(), addr("0000:99:00.0")), None);
        assert_eq!(
            read_pools(&sys.root.join("missing"), addr("0000:03:00.0")),
            None
        );
    }

    #[test]
    fn unreadable_pool_files_give_no_pools() {
        let sys = FakeSys::new("garbage");
        sys.node("renderD128", "0000:03:00.0", Some([1, 0, 1, 0]));
        let f = sys
            .root
            .join("devices/pci0000:00/0000:03:00.0/mem_info_gtt_used");
        fs::write(f, "lots\n").expect("overwrite");
        assert_eq!(read_pools(&sys.drm(), addr("0000:03:00.0")), None);
    }

    #[test]
    fn an_apu_counts_its_free_gtt_and_a_discrete_gpu_does_not() {
        let apu = MemPools {
            vram_total: 512 << 20,
            vram_used: 100 << 20,
            gtt_total: 60 * GIB,
            gtt_used: 4 * GIB,
        };
        // Driver reports only the carve-out: GTT is added.
        assert_eq!(
            usable_memory(412 << 20, 512 << 20, true, Some(&apu)),
            ((412 << 20) + 56 * GIB, (512 << 20) + 60 * GIB)
        );
        // A runtime that already reports system memory is taken as is.
        assert_eq!(
            usable_memory(50 * GIB, 64 * GIB, true, Some(&apu)),
            (50 * GIB, 64 * GIB)
        );
        let dgpu = MemPools {
            vram_total: 16 * GIB,
            vram_used: GIB,
            gtt_total: 32 * GIB,
            gtt_used: 0,
        };
        assert_eq!(
            usable_memory(15 * GIB, 16 * GIB, false, Some(&dgpu)),
            (15 * GIB, 16 * GIB)
        );
        assert_eq!(usable_memory(7, 8, true, None), (7, 8));
    }
}
