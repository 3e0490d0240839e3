//! `cargo xtask bindgen`: regenerates hip-ffi's checked-in `sys` bindings from the installed HIP,
//! CUDA driver and cuBLAS headers, or (`--check`) verifies the checked-in files still match them.
//!
//! The bindings are generated as run-time loaded tables (bindgen's `dynamic_library_name`), so
//! hip-ffi links against nothing and a normal build needs neither headers nor libclang.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{workspace_root, Result};

/// One generated binding file: which header, which symbols, which loader struct.
struct Target {
    /// File name under `hip-ffi/src/sys/`.
    file: &'static str,
    /// The umbrella header, relative to the include directory.
    header: &'static str,
    /// Name of the generated loader struct.
    library: &'static str,
    /// Debian package that ships the header (its version is stamped into the output).
    package: &'static str,
    /// Extra clang arguments.
    clang_args: &'static [&'static str],
    /// Functions kept; the types they use come along.
    functions: &'static [&'static str],
    /// Extra types and enums kept (enums the API maps, neighbours the stack will want).
    types: &'static [&'static str],
    /// Version macros read from the headers for the stamp.
    version_macros: &'static [&'static str],
}

const INCLUDE_DIR: &str = "/usr/include";

const HIP_FUNCTIONS: &[&str] = &[
    "hipInit",
    "hipDriverGetVersion",
    "hipRuntimeGetVersion",
    "hipGetDeviceCount",
    "hipSetDevice",
    "hipGetDevice",
    "hipDeviceGetName",
    "hipDeviceGetAttribute",
    "hipDeviceTotalMem",
    "hipDeviceGetPCIBusId",
    "hipMemGetInfo",
    "hipMalloc",
    "hipFree",
    "hipHostMalloc",
    "hipHostFree",
    "hipHostGetDevicePointer",
    "hipMemcpyAsync",
    "hipMemcpyHtoDAsync",
    "hipMemcpyDtoHAsync",
    "hipMemcpyDtoDAsync",
    "hipMemsetAsync",
    "hipMemsetD8Async",
    "hipStreamWriteValue32",
    "hipStreamCreateWithFlags",
    "hipStreamDestroy",
    "hipStreamSynchronize",
    "hipStreamQuery",
    "hipStreamWaitEvent",
    "hipEventCreateWithFlags",
    "hipEventRecord",
    "hipEventSynchronize",
    "hipEventQuery",
    "hipEventElapsedTime",
    "hipEventDestroy",
    "hipModuleLoadData",
    "hipModuleUnload",
    "hipModuleGetFunction",
    "hipModuleLaunchKernel",
    "hipModuleOccupancyMaxActiveBlocksPerMultiprocessor",
    "hipStreamBeginCapture",
    "hipStreamEndCapture",
    "hipGraphInstantiate",
    "hipGraphLaunch",
    "hipGraphDestroy",
    "hipGraphExecDestroy",
    "hipGetErrorString",
    "hipGetErrorName",
];

const HIP_TYPES: &[&str] = &[
    "hipError_t",
    "hipDeviceAttribute_t",
    "hipMemcpyKind",
    "hipStreamCaptureMode",
];

const CUDA_FUNCTIONS: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetName",
    "cuDeviceGetAttribute",
    "cuDeviceTotalMem_v2",
    "cuDeviceGetPCIBusId",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxSetCurrent",
    "cuCtxGetCurrent",
    "cuMemGetInfo_v2",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemAllocHost_v2",
    "cuMemFreeHost",
    "cuMemHostGetDevicePointer_v2",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyDtoHAsync_v2",
    "cuMemcpyDtoDAsync_v2",
    "cuMemsetD8Async",
    "cuStreamWriteValue32_v2",
    "cuStreamBatchMemOp_v2",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamSynchronize",
    "cuStreamQuery",
    "cuStreamWaitEvent",
    "cuEventCreate",
    "cuEventRecord",
    "cuEventSynchronize",
    "cuEventQuery",
    "cuEventElapsedTime",
    "cuEventDestroy_v2",
    "cuModuleLoadData",
    "cuModuleUnload",
    "cuModuleGetFunction",
    "cuFuncSetAttribute",
    "cuOccupancyMaxActiveBlocksPerMultiprocessor",
    "cuLaunchKernel",
    "cuLaunchKernelEx",
    "cuStreamBeginCapture_v2",
    "cuStreamEndCapture",
    "cuGraphInstantiateWithFlags",
    "cuGraphLaunch",
    "cuGraphDestroy",
    "cuGraphExecDestroy",
    "cuGetErrorString",
    "cuGetErrorName",
];

const CUDA_TYPES: &[&str] = &[
    "cudaError_enum",
    "CUdevice_attribute_enum",
    "CUstreamCaptureMode_enum",
    "CUstream_flags_enum",
    "CUevent_flags_enum",
    "CUlaunchAttributeID_enum",
    "CUfunction_attribute_enum",
    "CUstreamBatchMemOpType_enum",
];

const CUBLAS_FUNCTIONS: &[&str] = &[
    "cublasCreate_v2",
    "cublasDestroy_v2",
    "cublasGetVersion_v2",
    "cublasSetStream_v2",
    "cublasSetPointerMode_v2",
    "cublasSetMathMode",
    "cublasGetStatusString",
    "cublasSgemm_v2",
    "cublasGemmEx",
    "cublasGemmStridedBatchedEx",
];

const CUBLAS_TYPES: &[&str] = &[
    "cublasStatus_t",
    "cublasOperation_t",
    "cublasPointerMode_t",
    "cublasMath_t",
    "cublasComputeType_t",
    "cublasGemmAlgo_t",
    "cudaDataType_t",
];

const TARGETS: &[Target] = &[
    Target {
        file: "hip.rs",
        header: "hip/hip_runtime_api.h",
        library: "HipLib",
        package: "libamdhip64-dev",
        clang_args: &["-D__HIP_PLATFORM_AMD__"],
        functions: HIP_FUNCTIONS,
        types: HIP_TYPES,
        version_macros: &[
            "HIP_VERSION_MAJOR",
            "HIP_VERSION_MINOR",
            "HIP_VERSION_PATCH",
        ],
    },
    Target {
        file: "cuda.rs",
        header: "cuda.h",
        library: "CudaLib",
        package: "nvidia-cuda-dev",
        clang_args: &[],
        functions: CUDA_FUNCTIONS,
        types: CUDA_TYPES,
        version_macros: &["CUDA_VERSION"],
    },
    Target {
        file: "cublas.rs",
        header: "cublas_v2.h",
        library: "CublasLib",
        package: "nvidia-cuda-dev",
        clang_args: &[],
        functions: CUBLAS_FUNCTIONS,
        types: CUBLAS_TYPES,
        version_macros: &["CUBLAS_VER_MAJOR", "CUBLAS_VER_MINOR", "CUBLAS_VER_PATCH"],
    },
];

fn sys_dir() -> PathBuf {
    workspace_root().join("hip-ffi/src/sys")
}

/// Why regeneration is impossible here, or `None` when headers and libclang are present.
pub fn missing_prerequisites() -> Option<String> {
    for t in TARGETS {
        let h = Path::new(INCLUDE_DIR).join(t.header);
        if !h.exists() {
            return Some(format!(
                "{} not found (install {} with `cargo xtask setup`)",
                h.display(),
                t.package
            ));
        }
    }
    if !clang_sys_finds_libclang() {
        return Some("libclang not found (install libclang-dev with `cargo xtask setup`)".into());
    }
    None
}

fn clang_sys_finds_libclang() -> bool {
    if let Ok(p) = std::env::var("LIBCLANG_PATH") {
        return Path::new(&p).exists();
    }
    [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib",
    ]
    .iter()
    .filter_map(|d| fs::read_dir(d).ok())
    .flat_map(|rd| rd.flatten())
    .any(|e| e.file_name().to_string_lossy().starts_with("libclang"))
        || Path::new("/usr/lib/llvm-14/lib/libclang.so").exists()
}

/// `cargo xtask bindgen [--check]`.
pub fn run(args: &[String]) -> Result<()> {
    let check = match args {
        [] => false,
        [a] if a == "--check" => true,
        _ => return Err("usage: cargo xtask bindgen [--check]".into()),
    };
    if let Some(why) = missing_prerequisites() {
        return Err(why);
    }
    let mut stale = Vec::new();
    for t in TARGETS {
        let text = generate(t)?;
        let path = sys_dir().join(t.file);
        if check {
            let old = fs::read_to_string(&path).unwrap_or_default();
            if old != text {
                stale.push(path.display().to_string());
            }
        } else {
            fs::write(&path, &text).map_err(|e| format!("{}: {e}", path.display()))?;
            println!("bindgen: wrote {} ({} bytes)", path.display(), text.len());
        }
    }
    if stale.is_empty() {
        if check {
            println!("bindgen: checked-in bindings match the installed headers");
        }
        Ok(())
    } else {
        Err(format!(
            "checked-in bindings differ from the installed headers: {} (run `cargo xtask bindgen`)",
            stale.join(", ")
        ))
    }
}

fn generate(t: &Target) -> Result<String> {
    let header = Path::new(INCLUDE_DIR).join(t.header);
    let mut b = bindgen::Builder::default()
        .header(header.to_string_lossy())
        .clang_arg(format!("-I{INCLUDE_DIR}"))
        .clang_args(t.clang_args.iter().copied())
        .dynamic_library_name(t.library)
        .dynamic_link_require_all(true)
        .wrap_unsafe_ops(true)
        .default_enum_style(bindgen::EnumVariation::ModuleConsts)
        .derive_default(false)
        .derive_debug(true)
        .layout_tests(false)
        .generate_comments(false)
        .merge_extern_blocks(true)
        .allowlist_recursively(true);
    for f in t.functions {
        b = b.allowlist_function(format!("^{f}$"));
    }
    for ty in t.types {
        b = b.allowlist_type(format!("^{ty}$"));
    }
    let bindings = b
        .generate()
        .map_err(|e| format!("bindgen failed on {}: {e}", header.display()))?;
    let body = bindings.to_string();
    Ok(format!("{}{body}", stamp(t)?))
}

fn stamp(t: &Target) -> Result<String> {
    let header_text = fs::read_to_string(Path::new(INCLUDE_DIR).join(version_header(t)))
        .map_err(|e| format!("reading version header for {}: {e}", t.file))?;
    let versions: Vec<String> = t
        .version_macros
        .iter()
        .map(|m| format!("{m}={}", macro_value(&header_text, m).unwrap_or("?")))
        .collect();
    Ok(format!(
        "// @generated by `cargo xtask bindgen` (bindgen {bg}); do not edit.\n\
         // Header: {inc}/{h} from Debian package {pkg} {pv}; {vers}.\n\
         // Allowlist: hip-ffi's API plus the enums it maps (see xtask/src/bindgen.rs).\n\n",
        bg = BINDGEN_VERSION,
        inc = INCLUDE_DIR,
        h = t.header,
        pkg = t.package,
        pv = package_version(t.package),
        vers = versions.join(", "),
    ))
}

/// The bindgen release pinned in xtask/Cargo.toml (kept in the stamp so a diff after an upgrade
/// explains itself).
const BINDGEN_VERSION: &str = "0.72";

fn version_header(t: &Target) -> &'static str {
    match t.file {
        "hip.rs" => "hip/hip_version.h",
        "cublas.rs" => "cublas_api.h",
        _ => t.header,
    }
}

fn macro_value<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    text.lines().find_map(|l| {
        let rest = l.trim_start().strip_prefix("#define")?.trim_start();
        let rest = rest.strip_prefix(name)?;
        if !rest.starts_with(char::is_whitespace) {
            return None;
        }
        rest.split_whitespace().next()
    })
}

fn package_version(package: &str) -> String {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Version}", package])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "(version unknown)".into())
}
