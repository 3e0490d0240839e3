//! The environment variables the `rocmforge` CLI reads: one table with each variable's meaning
//! and default (printed by `rocmforge env`), and the one place that reads them. Libraries read
//! no environment; the CLI turns these into option structs ([`SessionOptions`], the HIP
//! backend's and the scheduler's options, the platform choice).
//!
//! Variables marked `dev` exist to compare a fused or grouped GPU path with the plain one
//! (numerics or speed); a build reads them only with the `dev` feature of the `model` crate.

use crate::error::ModelError;
use crate::session::SessionOptions;

/// One environment variable of the CLI.
pub(super) struct Var {
    pub(super) name: &'static str,
    /// The value used when the variable is unset.
    pub(super) default: &'static str,
    pub(super) meaning: &'static str,
    /// Read only by builds with the `dev` feature (A/B comparisons).
    pub(super) dev: bool,
}

const fn var(name: &'static str, default: &'static str, meaning: &'static str) -> Var {
    Var {
        name,
        default,
        meaning,
        dev: false,
    }
}

const fn dev(name: &'static str, meaning: &'static str) -> Var {
    Var {
        name,
        default: "1",
        meaning,
        dev: true,
    }
}

pub(super) const LOG: &str = "ROCMFORGE_LOG";
/// Read by `cache_dir` (shared with xtask, so it reads the variable itself).
const CACHE: &str = "ROCMFORGE_CACHE";
const PLATFORM: &str = hip_ffi::PLATFORM_VAR;
const GPU_MEM_LIMIT: &str = "ROCMFORGE_GPU_MEM_LIMIT";
const NCCL: &str = "ROCMFORGE_NCCL";
const TP_COLLECTIVE: &str = "ROCMFORGE_TP_COLLECTIVE";
/// The vendors' own install-prefix variables, read as their tools read them.
const ROCM_PATH: &str = "ROCM_PATH";
const CUDA_PATH: &str = "CUDA_PATH";
/// The server's bearer key (`serve`, `bench-serve`).
pub const API_KEY: &str = "ROCMFORGE_API_KEY";
const GPU_STACK: &str = "ROCMFORGE_GPU_STACK";
const GPU_GRAPH: &str = "ROCMFORGE_GPU_GRAPH";
const MAPPED_OUTPUTS: &str = "ROCMFORGE_MAPPED_OUTPUTS";
const PROFILE: &str = "ROCMFORGE_PROFILE";
const GPU_FUSE: &str = "ROCMFORGE_GPU_FUSE";
const GPU_GROUP: &str = "ROCMFORGE_GPU_GROUP";
const GPU_ATTN_DEC: &str = "ROCMFORGE_GPU_ATTN_DEC";
const GPU_QKV_ROPE: &str = "ROCMFORGE_GPU_QKV_ROPE";
const GPU_EARLY: &str = "ROCMFORGE_GPU_EARLY";

/// Every variable the CLI reads.
pub(super) const VARS: &[Var] = &[
    var(
        LOG,
        "warn",
        "log filter (tracing's EnvFilter syntax): rocmforge=debug (every layer; one: rocmforge_model=debug), rocmforge::profile=info",
    ),
    var(
        CACHE,
        "$XDG_CACHE_HOME/rocmforge/models",
        "folder of the default model (falls back to ~/.cache/rocmforge/models)",
    ),
    var(
        PLATFORM,
        "auto",
        "GPU platform: amd, nvidia, cpu (no GPU) or auto (AMD, then NVIDIA)",
    ),
    var(
        GPU_MEM_LIMIT,
        "none",
        "caps the GPU memory used (bytes, or with a K/M/G suffix); --gpu-mem-limit wins",
    ),
    var(
        NCCL,
        "search",
        "the NCCL/RCCL library file to load first (else the loader path, ROCm's lib folder, pip's nvidia-nccl-cu13/-cu12)",
    ),
    var(
        TP_COLLECTIVE,
        "1",
        "0: --split-mode tensor sums the GPUs' partial results by peer copies to the main GPU instead of NCCL/RCCL all-reduces; nccl: NCCL/RCCL for every all-reduce; peer: the one-shot peer all-reduce for small messages (up to 256 KiB) of ranks in one process (failing where it cannot work); 1 or auto: peer where it works, else NCCL/RCCL",
    ),
    var(
        ROCM_PATH,
        "none",
        "ROCm's install prefix: its lib folder is searched for HIP, hipBLAS and RCCL before /opt/rocm/lib",
    ),
    var(
        CUDA_PATH,
        "none",
        "CUDA's install prefix: its lib64 folder is searched for cuBLAS and NCCL after the loader path",
    ),
    var(
        API_KEY,
        "none",
        "serve: the bearer key requests must carry; bench-serve: the key it sends (--api-key wins)",
    ),
    var(
        GPU_STACK,
        "1",
        "0: no persistent decode stack (as --no-gpu-stack); native, short, split, portable: its kernel (as --gpu-stack)",
    ),
    var(
        GPU_GRAPH,
        "1",
        "0: no capture and replay of GPU decode steps as graphs (same results, more host time)",
    ),
    var(
        MAPPED_OUTPUTS,
        "1",
        "0: logits stay in device memory and are copied back, instead of written to host-mapped memory",
    ),
    var(
        PROFILE,
        "0",
        "1: times every GPU node; the table is logged at exit (ROCMFORGE_LOG=rocmforge::profile=info)",
    ),
    dev(
        GPU_FUSE,
        "0: GPU graphs keep the plain ops instead of the optimizer's fused nodes",
    ),
    dev(
        GPU_GROUP,
        "0: no launch groups (q/k/v mat-vecs, rope/cache-write and norm chains launch one by one)",
    ),
    dev(
        GPU_ATTN_DEC,
        "0: few-token attention takes the split-key kernel instead of the one-launch decode kernel",
    ),
    dev(
        GPU_QKV_ROPE,
        "0: the q/k/v mat-vec leaves the ropes and cache writes to their own launch",
    ),
    dev(
        GPU_EARLY,
        "0: no early kernel launches (a kernel starting while the one before it finishes)",
    ),
];

/// The value of `name` when it is in the table and this build reads it.
pub fn get(name: &str) -> Option<String> {
    let v = VARS.iter().find(|v| v.name == name)?;
    if v.dev && !cfg!(feature = "dev") {
        return None;
    }
    std::env::var(v.name).ok()
}

/// An on/off switch of the table: off only when set to `off_value`.
fn on_unless(name: &str, off_value: &str) -> bool {
    get(name).is_none_or(|v| v != off_value)
}

/// The GPU memory cap from the environment (unset: none).
pub(super) fn gpu_mem_limit() -> Option<String> {
    get(GPU_MEM_LIMIT)
}

/// Where to look for the collective library (`ROCMFORGE_NCCL` first, when set).
pub(super) fn nccl_options() -> gpu_mem::NcclOptions {
    gpu_mem::NcclOptions {
        library: get(NCCL).filter(|v| !v.is_empty()).map(Into::into),
        dirs: install_dirs(),
        skip_python: false,
    }
}

/// How a tensor split sums its partials: where to find NCCL/RCCL, or not to use it.
pub(super) fn collective_options() -> ggml_graph::CollectiveOptions {
    let dirs = install_dirs();
    let all_reduce = match get(TP_COLLECTIVE).as_deref() {
        None | Some("0" | "1") => ggml_graph::AllReduceKind::Auto,
        Some(v) => v.parse().unwrap_or_else(|e| {
            tracing::warn!("{TP_COLLECTIVE}: {e}; auto");
            ggml_graph::AllReduceKind::Auto
        }),
    };
    ggml_graph::CollectiveOptions {
        off: !on_unless(TP_COLLECTIVE, "0"),
        all_reduce,
        library: get(NCCL).filter(|v| !v.is_empty()).map(Into::into),
        rocm: dirs.rocm,
        cuda: dirs.cuda,
    }
}

/// The vendors' install prefixes (`ROCM_PATH`, `CUDA_PATH`; unset or empty: none).
fn install_dirs() -> hip_ffi::InstallDirs {
    let dir = |name| get(name).filter(|v| !v.is_empty()).map(Into::into);
    hip_ffi::InstallDirs {
        rocm: dir(ROCM_PATH),
        cuda: dir(CUDA_PATH),
    }
}

/// Applies the table to `opts` (which holds the defaults and the command-line flags).
pub(super) fn apply(opts: &mut SessionOptions) {
    opts.gpu_stack &= on_unless(GPU_STACK, "0");
    opts.hip.stack = on_unless(GPU_STACK, "0");
    // The flag, where given, wins.
    if opts.hip.stack_kernel == ggml_graph::StackKernel::Auto {
        if let Some(k) = get(GPU_STACK).and_then(|v| v.parse().ok()) {
            opts.hip.stack_kernel = k;
        }
    }
    opts.scheduler.graph_capture = on_unless(GPU_GRAPH, "0");
    opts.scheduler.mapped_outputs = on_unless(MAPPED_OUTPUTS, "0");
    opts.hip.profile = get(PROFILE).is_some_and(|v| v == "1");
    opts.gpu_fuse = on_unless(GPU_FUSE, "0");
    opts.hip.group = on_unless(GPU_GROUP, "0");
    opts.hip.attn_dec = on_unless(GPU_ATTN_DEC, "0");
    opts.hip.qkv_rope = on_unless(GPU_QKV_ROPE, "0");
    opts.hip.early_launch = on_unless(GPU_EARLY, "0");
}

/// Passes the platform choice and the vendors' install prefixes down to `hip-ffi` (before
/// anything opens a GPU).
pub(super) fn choose_platform() -> Result<(), ModelError> {
    let choice = hip_ffi::parse_choice(get(PLATFORM).as_deref())
        .map_err(|e| ModelError::InvalidArgument(e.to_string()))?;
    hip_ffi::set_options(hip_ffi::RuntimeOptions {
        choice,
        dirs: install_dirs(),
    });
    Ok(())
}

/// The table as `rocmforge env` prints it, with the values set now.
pub(super) fn table() -> String {
    let mut out = String::from(
        "Environment variables read by rocmforge (dev: read only by builds with the `dev` feature)\n\n",
    );
    let width = VARS.iter().map(|v| v.name.len()).max().unwrap_or(0);
    for v in VARS {
        let tag = if v.dev { " [dev]" } else { "" };
        out.push_str(&format!(
            "{:width$}  default {}{tag}\n{:width$}  {}\n",
            v.name, v.default, "", v.meaning
        ));
        if let Ok(now) = std::env::var(v.name) {
            let read = if v.dev && !cfg!(feature = "dev") {
                " (ignored by this build)"
            } else {
                ""
            };
            out.push_str(&format!("{:width$}  set now: {now}{read}\n", ""));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_variable_is_listed_once_with_a_meaning() {
        let mut names: Vec<&str> = VARS.iter().map(|v| v.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), VARS.len());
        let vendors = [ROCM_PATH, CUDA_PATH];
        assert!(VARS.iter().all(|v| {
            (v.name.starts_with("ROCMFORGE_") || vendors.contains(&v.name)) && !v.meaning.is_empty()
        }));
        let t = table();
        assert!(VARS.iter().all(|v| t.contains(v.name)), "{t}");
    }

    #[test]
    fn unset_variables_keep_the_option_defaults() {
        // The vendors' variables do not reach the session options.
        if VARS
            .iter()
            .any(|v| v.name.starts_with("ROCMFORGE_") && std::env::var_os(v.name).is_some())
        {
            return;
        }
        let mut o = SessionOptions::default();
        apply(&mut o);
        assert_eq!(o, SessionOptions::default());
    }
}
