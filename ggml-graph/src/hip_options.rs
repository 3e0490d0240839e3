//! The switches of the HIP backend, a plain struct so that callers (the CLI's environment table,
//! tests, benchmarks) choose them and the backend reads no environment.

/// How a HIP device runs its nodes, fixed when it opens. Every default is the fast path; the
/// alternatives exist to tell a fused or grouped kernel's numerics and speed from the plain
/// kernels' (A/B comparisons), and to time nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HipOptions {
    /// Launch groups: the q/k/v mat-vecs in one kernel, rope/cache-write and norm chains, whole
    /// decode layers; false launches node by node.
    pub group: bool,
    /// Few-token attention as the one-launch decode kernel; false takes the split-key kernel.
    pub attn_dec: bool,
    /// The q/k/v mat-vec rotates and stores its rows itself; false leaves that to the rope launch.
    pub qkv_rope: bool,
    /// The persistent decode stack may run where the device can (sessions still turn it on with
    /// `set_stack`); false vetoes it.
    pub stack: bool,
    /// Which kernel runs the persistent decode stack.
    pub stack_kernel: StackKernel,
    /// Kernels may start while the one before them finishes, where every module's code waits
    /// for its predecessors first.
    pub early_launch: bool,
    /// Per-node GPU times, logged when the device closes; graph capture is off while profiling.
    pub profile: bool,
}

impl Default for HipOptions {
    fn default() -> Self {
        Self {
            group: true,
            attn_dec: true,
            qkv_rope: true,
            stack: true,
            stack_kernel: StackKernel::Auto,
            early_launch: true,
            profile: false,
        }
    }
}

/// The kernel of the persistent decode stack: the NVIDIA-specific `decode_stack` (cp.async
/// weight ring; NVIDIA compute capability 8.0 and later), with its long-context form
/// `decode_stack_split` (attention by KV head and share of its keys) from
/// `kernels::STACK_SPLIT_MIN_KV` cache positions on, or the portable `decode_stack_portable`
/// (AMD, and NVIDIA as its proxy).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StackKernel {
    /// `decode_stack` (or `decode_stack_split` by KV length) where the device runs it, else the
    /// portable kernel (AMD).
    Auto,
    /// `decode_stack` (or `decode_stack_split` by KV length) only: no stack where the device
    /// cannot run it.
    Native,
    /// `decode_stack` at every KV length (to time it against the split one); NVIDIA only, as
    /// `Native`.
    Short,
    /// `decode_stack_split` at every KV length (to check and time it on short contexts too);
    /// NVIDIA only, as `Native`.
    Split,
    /// The portable kernel on every device, NVIDIA included (to check and time it there).
    Portable,
}

impl std::str::FromStr for StackKernel {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "native" => Ok(Self::Native),
            "short" => Ok(Self::Short),
            "split" => Ok(Self::Split),
            "portable" => Ok(Self::Portable),
            _ => Err(format!(
                "unknown decode stack kernel {s:?} (expected auto, native, short, split or \
                 portable)"
            )),
        }
    }
}

/// How a tensor split sums its GPUs' partial results: through the platform's collective library
/// (NCCL on NVIDIA, RCCL on AMD, loaded at run time) where it loads, else by peer copies to the
/// main GPU. Where to look for the library is the caller's choice (the CLI reads
/// `ROCMFORGE_NCCL`, `ROCM_PATH` and `CUDA_PATH`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CollectiveOptions {
    /// Sum by peer copies even where the library loads (for comparisons).
    pub off: bool,
    /// Which all-reduce small messages take where every rank is in this process.
    pub all_reduce: AllReduceKind,
    /// A library file to try before the usual places.
    pub library: Option<std::path::PathBuf>,
    /// ROCm's install prefix (RCCL in `<it>/lib`).
    pub rocm: Option<std::path::PathBuf>,
    /// CUDA's install prefix (NCCL in `<it>/lib64`).
    pub cuda: Option<std::path::PathBuf>,
}

/// Which all-reduce the ranks of a collective made in one process use for small messages (a
/// decode step's hidden states). Bigger messages, and ranks in other processes, always go
/// through the collective library.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AllReduceKind {
    /// The one-shot peer all-reduce where every pair of GPUs reaches the other's memory (and
    /// the platform has it), the collective library otherwise.
    #[default]
    Auto,
    /// The collective library for every message.
    Nccl,
    /// The one-shot peer all-reduce; making the collective fails where it cannot work.
    Peer,
}

impl std::str::FromStr for AllReduceKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "nccl" | "rccl" => Ok(Self::Nccl),
            "peer" => Ok(Self::Peer),
            _ => Err(format!(
                "unknown all-reduce {s:?} (expected auto, nccl or peer)"
            )),
        }
    }
}

/// Device bytes the runtime takes after the open, during the first passes, that neither the
/// open's measurement nor the allocator sees (as far as measured: the code the libraries load
/// at first use, such as the BLAS kernels a product picks beyond the warm-up's, and graph
/// capture's executable graphs). On an H200 (driver 580) the runtime's share grew by 9.4 MiB over
/// the first pass of an 8B model with CPU layers and by 14.6 MiB with every layer, the head and a
/// captured decode step on the GPU; placements keep this much of the budget free (see
/// `HipDevice::placeable_bytes`). The estimate itself counts what the backends allocate (the
/// scheduler's grouped plan, its copy slot, the backend's scratch), so this covers the runtime
/// alone.
pub const RUNTIME_GROWTH: u64 = 16 << 20;

/// Hands a communicator id between the processes of its ranks (see `HipCollective::for_rank`):
/// called with rank 0's id on rank 0 and an empty slice elsewhere, it returns rank 0's id on
/// every rank, or why not.
pub type IdExchange<'a> = dyn FnMut(&[u8]) -> Result<Vec<u8>, String> + 'a;

#[cfg(test)]
mod tests {
    use super::StackKernel;

    #[test]
    fn stack_kernels_parse_by_name() {
        for (s, k) in [
            ("auto", StackKernel::Auto),
            ("native", StackKernel::Native),
            ("short", StackKernel::Short),
            ("split", StackKernel::Split),
            ("portable", StackKernel::Portable),
        ] {
            assert_eq!(s.parse::<StackKernel>(), Ok(k));
        }
        let e = "long".parse::<StackKernel>().expect_err("unknown name");
        assert!(e.contains("\"long\"") && e.contains("split"), "{e}");
    }
}
