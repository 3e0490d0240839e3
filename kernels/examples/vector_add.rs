//! Adds two vectors on the GPU with the `binary_f32` kernel, through `gpu-mem`'s safe API:
//! allocate, upload, load the embedded code object, launch with checked arguments, read back and
//! compare with the CPU. Prints why it skips where there is no GPU or no built kernels.
//!
//! `cargo run -p rocmforge-kernels --example vector_add [N]`

use gpu_mem::{Device, DeviceBuffer, KernelArg, MemRange, ParamKind, Stream};
use rocmforge_kernels::{binary, KernelId, Param};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n: usize = match std::env::args().nth(1) {
        Some(s) => s
            .parse()
            .map_err(|e| format!("N must be a count ({s:?}: {e})"))?,
        None => 1 << 20,
    };
    let dev = match Device::open(0) {
        Ok(dev) => dev,
        Err(e) => {
            println!("skipped: no GPU ({e})");
            return Ok(());
        }
    };
    if !rocmforge_kernels::built() {
        println!("skipped: kernels not built (run `cargo xtask kernels`)");
        return Ok(());
    }
    let arch = dev.info().arch.clone();
    // `sm_86` for NVIDIA, a `gfx` name for AMD.
    let target = match arch.strip_prefix("sm_").and_then(|v| v.parse::<u32>().ok()) {
        Some(v) => rocmforge_kernels::Device::Nvidia {
            major: v / 10,
            minor: v % 10,
        },
        None => rocmforge_kernels::Device::Amd(arch.clone()),
    };

    let a: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let b: Vec<f32> = (0..n).map(|i| 0.5 * i as f32).collect();
    let stream = Stream::new(&dev)?;
    let mut da = DeviceBuffer::<f32>::new(&dev, n, "vector_add a")?;
    let mut db = DeviceBuffer::<f32>::new(&dev, n, "vector_add b")?;
    let dy = DeviceBuffer::<f32>::new(&dev, n, "vector_add y")?;
    stream.write(&a, &mut da.view_mut())?;
    stream.write(&b, &mut db.view_mut())?;

    let k = KernelId::BinaryF32;
    let image = rocmforge_kernels::image(k.module(), &target)?;
    let module = gpu_mem::Module::load(&dev, image.bytes)?;
    let function = module.function(k.name())?;
    // The kernel's parameter table, so gpu-mem checks every argument's kind before launching.
    let params: Vec<ParamKind> = k
        .params()
        .iter()
        .map(|p| match p {
            Param::Ptr => ParamKind::Ptr,
            Param::I32 => ParamKind::I32,
            Param::I64 => ParamKind::I64,
            Param::F32 => ParamKind::F32,
            Param::Attn => ParamKind::Bytes(size_of::<rocmforge_kernels::AttnParams>()),
            Param::Stack => ParamKind::Bytes(size_of::<rocmforge_kernels::StackParams>()),
            Param::Peer => ParamKind::Bytes(size_of::<rocmforge_kernels::PeerReduceParams>()),
        })
        .collect();
    let ncols = i32::try_from(n).map_err(|_| "N must fit in an i32")?;
    // One row of `n` values, b broadcast from one row of the same width.
    let args = [
        KernelArg::Mem(MemRange::of_buffer(&da)),
        KernelArg::Mem(MemRange::of_buffer(&db)),
        KernelArg::Mem(MemRange::of_buffer(&dy)),
        KernelArg::I32(ncols),
        KernelArg::I32(1),
        KernelArg::I64(n as i64),
        KernelArg::I64(n as i64),
        KernelArg::I64(n as i64),
        KernelArg::I32(1),
        KernelArg::I32(ncols),
        KernelArg::I32(binary::ADD),
    ];
    let block = 256u32;
    let grid = (n as u32).div_ceil(block);
    // SAFETY: `binary_f32` reads `a` and `b` and writes `y` at `ncols * nrows` = `n` elements,
    // which is what each buffer holds; the kinds are checked against the kernel's table.
    unsafe {
        stream.launch_checked(
            &function,
            k.name(),
            &params,
            [grid, 1, 1],
            [block, 1, 1],
            0,
            &args,
        )?
    };
    let y = stream.read_to_vec(&dy.view())?;
    let wrong = (0..n).filter(|&i| y[i] != a[i] + b[i]).count();
    dev.check_errors()?;
    println!(
        "{} on {} ({arch}): {n} sums, {wrong} wrong",
        k.name(),
        dev.info().name
    );
    if wrong > 0 {
        return Err(format!("{wrong} of {n} sums differ from the CPU's").into());
    }
    Ok(())
}
