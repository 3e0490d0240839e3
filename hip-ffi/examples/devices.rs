//! What the GPU runtime sees: the provider the process picked (and the library it opened), the
//! driver version, and each device's architecture, memory and the attributes rocmforge reads;
//! or why there is no GPU.
//!
//! `cargo run -p rocmforge-hip-ffi --example devices` (`ROCMFORGE_PLATFORM=amd|nvidia|cpu` chooses).

use rocmforge_hip_ffi::DeviceAttribute as A;

fn main() -> Result<(), rocmforge_hip_ffi::Error> {
    let api = match rocmforge_hip_ffi::runtime() {
        Ok(api) => api,
        Err(e) => {
            println!("no GPU: {e}");
            return Ok(());
        }
    };
    println!(
        "{} provider, driver {}, libraries {}",
        api.platform().name(),
        api.driver_version()?,
        api.library_names().join(", ")
    );
    for d in 0..api.device_count()? {
        api.set_device(d)?;
        let (free, total) = api.mem_get_info()?;
        println!(
            "device {d}: {} ({}), {:.1} of {:.1} GiB free",
            api.device_name(d)?,
            api.device_arch(d)?,
            free as f64 / (1u64 << 30) as f64,
            total as f64 / (1u64 << 30) as f64
        );
        for attr in [
            A::MultiprocessorCount,
            A::WarpSize,
            A::MaxThreadsPerBlock,
            A::MaxSharedMemoryPerBlock,
            A::MaxSharedMemoryPerBlockOptin,
            A::L2CacheBytes,
            A::ClockRateKhz,
            A::MemoryClockRateKhz,
            A::MemoryBusWidthBits,
            A::CooperativeLaunch,
            A::PciBusId,
        ] {
            match api.device_attribute(attr, d) {
                Ok(v) => println!("  {attr:?}: {v}"),
                Err(e) => println!("  {attr:?}: {e}"),
            }
        }
    }
    Ok(())
}
