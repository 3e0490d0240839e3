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
    /// Where the header comes from.
    source: Source,
}

/// Where a target's header comes from.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Source {
    /// `/usr/include`, from the Debian package named in the target.
    Debian,
    /// The AMD toolchain `cargo xtask setup` unpacks ([`crate::amd_toolchain`]): headers of
    /// newer ROCm packages than Debian 12 has (hipBLAS).
    AmdToolchain,
    /// NCCL's `nccl.h`, from a pinned PyPI wheel ([`NCCL_WHEEL`]) unpacked under `target/`
    /// (Debian has no NCCL); its `cuda_runtime.h` include comes from `/usr/include`.
    NcclWheel,
}

/// The PyPI wheel whose `nccl.h` the NCCL bindings come from (RCCL keeps the same C API).
const NCCL_WHEEL: (&str, &str) = ("nvidia-nccl-cu13", "2.32.3");
/// The header's path inside the wheel.
const NCCL_MEMBER: &str = "nvidia/nccl/include/nccl.h";

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
    "hipDeviceCanAccessPeer",
    "hipDeviceEnablePeerAccess",
    "hipMemcpyPeerAsync",
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
    "cuDeviceCanAccessPeer",
    "cuCtxEnablePeerAccess",
    "cuMemcpyPeerAsync",
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

const HIPBLAS_FUNCTIONS: &[&str] = &[
    "hipblasCreate",
    "hipblasDestroy",
    "hipblasSetStream",
    "hipblasSetPointerMode",
    "hipblasSgemm",
    "hipblasGemmEx",
    "hipblasGemmStridedBatchedEx",
];

const HIPBLAS_TYPES: &[&str] = &[
    "hipblasStatus_t",
    "hipblasOperation_t",
    "hipblasPointerMode_t",
    "hipblasGemmAlgo_t",
    "hipblasDatatype_t",
];

const NCCL_FUNCTIONS: &[&str] = &[
    "ncclGetVersion",
    "ncclGetUniqueId",
    "ncclCommInitRank",
    "ncclCommInitAll",
    "ncclCommDestroy",
    "ncclCommAbort",
    "ncclCommGetAsyncError",
    "ncclCommCount",
    "ncclCommUserRank",
    "ncclGetErrorString",
    "ncclAllReduce",
    "ncclAllGather",
    "ncclSend",
    "ncclRecv",
    "ncclGroupStart",
    "ncclGroupEnd",
];

const NCCL_TYPES: &[&str] = &[
    "ncclResult_t",
    "ncclDataType_t",
    "ncclRedOp_t",
    "ncclUniqueId",
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
        source: Source::Debian,
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
        source: Source::Debian,
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
        source: Source::Debian,
    },
    Target {
        file: "hipblas.rs",
        header: "hipblas/hipblas.h",
        library: "HipblasLib",
        package: "libhipblas-dev",
        // Without HIPBLAS_V2 the 2.x headers declare the `*GemmEx` calls with
        // `hipblasDatatype_t`; 3.x passes `hipDataType` values through the same C `int`
        // parameters, which `hipblas_abi` picks by the loaded library's major version.
        clang_args: &["-D__HIP_PLATFORM_AMD__"],
        functions: HIPBLAS_FUNCTIONS,
        types: HIPBLAS_TYPES,
        version_macros: &[
            "hipblasVersionMajor",
            "hipblasVersionMinor",
            "hipblasVersionPatch",
        ],
        source: Source::AmdToolchain,
    },
    Target {
        file: "nccl.rs",
        header: "nccl.h",
        library: "NcclLib",
        package: NCCL_WHEEL.0,
        clang_args: &[],
        functions: NCCL_FUNCTIONS,
        types: NCCL_TYPES,
        version_macros: &["NCCL_MAJOR", "NCCL_MINOR", "NCCL_PATCH"],
        source: Source::NcclWheel,
    },
];

fn sys_dir() -> PathBuf {
    workspace_root().join("hip-ffi/src/sys")
}

/// The directory holding `t`'s header.
fn include_dir(t: &Target) -> PathBuf {
    match t.source {
        Source::Debian => PathBuf::from(INCLUDE_DIR),
        Source::NcclWheel => workspace_root().join("target/nccl-include"),
        Source::AmdToolchain => crate::amd_toolchain::dir().join("root/usr/include"),
    }
}

/// Unpacks `nccl.h` from the pinned wheel into `target/nccl-include` unless it is there.
fn ensure_nccl_header(t: &Target) -> Result<()> {
    let dir = include_dir(t);
    let header = dir.join(t.header);
    if header.exists() {
        return Ok(());
    }
    let (package, version) = NCCL_WHEEL;
    let (meta_url, meta) = crate::pypi::package_json(package)?;
    let url = meta["releases"][version]
        .as_array()
        .and_then(|files| {
            files
                .iter()
                .filter(|f| f["packagetype"] == "bdist_wheel")
                .find(|f| f["filename"].as_str().is_some_and(|n| n.contains("x86_64")))
                .and_then(|f| f["url"].as_str())
        })
        .ok_or_else(|| format!("{meta_url}: no x86_64 wheel of {package} {version}"))?;
    let url = crate::pypi::resolve(&meta_url, url);
    eprintln!("bindgen: downloading {url} for {NCCL_MEMBER}");
    let wheel = crate::pypi::download(&url)?;
    let mut zip = zip::ZipArchive::new(std::io::Cursor::new(wheel))
        .map_err(|e| format!("{package} {version}: not a wheel: {e}"))?;
    let mut member = zip
        .by_name(NCCL_MEMBER)
        .map_err(|e| format!("{package} {version}: {NCCL_MEMBER}: {e}"))?;
    let mut text = Vec::new();
    std::io::Read::read_to_end(&mut member, &mut text)
        .map_err(|e| format!("{package} {version}: {NCCL_MEMBER}: {e}"))?;
    fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    fs::write(&header, text).map_err(|e| format!("{}: {e}", header.display()))?;
    Ok(())
}

/// Why regeneration is impossible here, or `None` when headers and libclang are present. The
/// NCCL header is fetched on demand, so it is no prerequisite.
pub fn missing_prerequisites() -> Option<String> {
    for t in TARGETS.iter().filter(|t| t.source == Source::Debian) {
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
        if t.source == Source::AmdToolchain && crate::amd_toolchain::find().is_none() {
            let why = format!(
                "the AMD toolchain (hipBLAS's headers) is not in {}: run `cargo xtask setup`",
                crate::amd_toolchain::dir().display()
            );
            if check {
                println!("bindgen: {} not checked ({why})", t.file);
                continue;
            }
            return Err(why);
        }
        if t.source == Source::NcclWheel {
            if check && !include_dir(t).join(t.header).exists() {
                // A check never downloads the 300 MB wheel (CI runs it).
                println!(
                    "bindgen: {} not checked (run `cargo xtask bindgen` to fetch nccl.h)",
                    t.file
                );
                continue;
            }
            ensure_nccl_header(t)?;
        }
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
    let header = include_dir(t).join(t.header);
    let mut b = bindgen::Builder::default()
        .header(header.to_string_lossy())
        .clang_arg(format!("-I{}", include_dir(t).display()))
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
    let header_text = fs::read_to_string(include_dir(t).join(version_header(t)))
        .map_err(|e| format!("reading version header for {}: {e}", t.file))?;
    let versions: Vec<String> = t
        .version_macros
        .iter()
        .map(|m| format!("{m}={}", macro_value(&header_text, m).unwrap_or("?")))
        .collect();
    let (inc, from, pv) = match t.source {
        Source::Debian => (INCLUDE_DIR, "Debian package", package_version(t.package)),
        Source::NcclWheel => (
            NCCL_MEMBER.trim_end_matches("/nccl.h"),
            "PyPI wheel",
            NCCL_WHEEL.1.to_owned(),
        ),
        Source::AmdToolchain => (
            "<amd-toolchain>/root/usr/include",
            "Debian sid package",
            crate::amd_toolchain::find()
                .and_then(|tc| {
                    tc.version.lines().find_map(|l| {
                        l.strip_prefix(t.package)
                            .and_then(|v| v.strip_prefix(' '))
                            .map(str::to_owned)
                    })
                })
                .unwrap_or_else(|| "(version unknown)".into()),
        ),
    };
    Ok(format!(
        "// @generated by `cargo xtask bindgen` (bindgen {bg}); do not edit.\n\
         // Header: {inc}/{h} from {from} {pkg} {pv}; {vers}.\n\
         // Allowlist: hip-ffi's API plus the enums it maps (see xtask/src/bindgen.rs).\n\n",
        bg = BINDGEN_VERSION,
        h = t.header,
        pkg = t.package,
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
        "hipblas.rs" => "hipblas/hipblas-version.h",
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
