#![doc = include_str!("../README.md")]
#![warn(missing_docs)]
//!
//! ## Design choices
//! - Sources live in `kernels/hip/*.hip`; each file is one module (one code object per target).
//!   Every kernel is `extern "C"`, so its symbol is the name [`KernelId::name`] returns.
//! - AMD code objects are offload bundles holding one image per `gfx` target (the HIP runtime picks
//!   the device's); NVIDIA has SASS per `sm_XX` plus PTX for newer architectures to JIT.
//! - `build.rs` embeds what `kernels/out/` (or `$ROCMFORGE_KERNELS_DIR`) holds with
//!   `include_bytes!`, only when its source stamp matches the current sources; without them
//!   [`image`] fails with "kernels not built: run `cargo xtask kernels`".
//! - This crate is data and launch contracts only (ids, parameter structs, constants); loading and
//!   launching belong to the GPU backend, which caches modules per device.

mod ids;

pub use ids::{KernelId, Module, Param, WeightType};

include!(concat!(env!("OUT_DIR"), "/embedded.rs"));

/// One embedded code object, as listed in the manifest `cargo xtask kernels` writes.
#[derive(Debug)]
pub(crate) struct EmbeddedImage {
    module: &'static str,
    /// `amd`, `sm_80`, `sm_90`... or `ptx`.
    target: &'static str,
    /// For `amd`: the comma-separated `gfx` targets in the bundle; for `ptx`: the lowest
    /// compute capability it was generated for (`sm_80`); otherwise the SASS architecture.
    archs: &'static str,
    bytes: &'static [u8],
}

/// Errors from looking up a code object.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No code objects were embedded at build time.
    #[error("kernels not built: run `cargo xtask kernels`{}", note(.0))]
    NotBuilt(&'static str),
    /// Code objects exist, but none for this device.
    #[error("no `{module}` kernels for {device}; built targets: {available}")]
    NoImageForDevice {
        /// The module asked for.
        module: &'static str,
        /// The device's target (`gfx1100`, `sm_75`...).
        device: String,
        /// What this build holds.
        available: String,
    },
}

fn note(s: &str) -> String {
    if s.is_empty() {
        String::new()
    } else {
        format!(" ({s})")
    }
}

/// The GPU a code object must run on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Device {
    /// An AMD GPU, by its `gcnArchName` (`gfx90a:sramecc+:xnack-` or plain `gfx1030`).
    Amd(String),
    /// An NVIDIA GPU, by compute capability.
    Nvidia {
        /// Major compute capability (9 for Hopper).
        major: u32,
        /// Minor compute capability.
        minor: u32,
    },
}

/// How a code object is to be loaded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImageKind {
    /// A clang offload bundle or ELF code object for the HIP runtime on AMD.
    AmdCodeObject,
    /// NVIDIA SASS for one architecture.
    Cubin,
    /// NVIDIA PTX text (NUL-terminated), compiled by the driver for the device.
    Ptx,
}

/// A code object chosen for a device.
#[derive(Clone, Copy, Debug)]
pub struct Image {
    /// The module it holds.
    pub module: Module,
    /// How to load it.
    pub kind: ImageKind,
    /// Its bytes, ready for `hipModuleLoadData`.
    pub bytes: &'static [u8],
    /// NVIDIA: the compute capability it was compiled for, times ten (SASS or PTX); AMD: 0.
    pub compute: u32,
}

impl Image {
    /// Whether its kernels wait for the grids before them as they start (`rf_entry`: compiled
    /// for compute capability 9.0 or later), so that a stream may launch them before their
    /// predecessor ends (`gpu_mem::Stream::set_early_launch`).
    pub fn waits_for_predecessors(&self) -> bool {
        self.kind != ImageKind::AmdCodeObject && self.compute >= 90
    }
}

/// True when this build embeds code objects.
pub fn built() -> bool {
    cfg!(rocmforge_kernels) && !IMAGES.is_empty()
}

/// A one-line list of the embedded targets, for messages and logs.
pub fn built_targets() -> String {
    let mut seen: Vec<String> = Vec::new();
    for img in IMAGES {
        let t = if img.target == "amd" {
            format!("amd({})", img.archs)
        } else if img.target == "ptx" {
            format!("ptx(>={})", img.archs)
        } else {
            img.target.to_owned()
        };
        if !seen.contains(&t) {
            seen.push(t);
        }
    }
    if seen.is_empty() {
        "none".to_owned()
    } else {
        seen.join(", ")
    }
}

/// The code object of `module` for `device`: for NVIDIA the SASS of the same major architecture
/// with the highest minor not above the device's, else PTX built for an architecture not above
/// it; for AMD the bundle when it holds the device's `gfx` target.
pub fn image(module: Module, device: &Device) -> Result<Image, Error> {
    if !built() {
        return Err(Error::NotBuilt(STALE_NOTE));
    }
    let name = module.stem();
    let of_module = || IMAGES.iter().filter(move |i| i.module == name);
    let unavailable = |dev: String| Error::NoImageForDevice {
        module: name,
        device: dev,
        available: built_targets(),
    };
    match device {
        Device::Amd(arch) => {
            let base = arch.split(':').next().unwrap_or(arch);
            of_module()
                .find(|i| i.target == "amd" && i.archs.split(',').any(|a| a == base))
                .map(|i| Image {
                    module,
                    kind: ImageKind::AmdCodeObject,
                    bytes: i.bytes,
                    compute: 0,
                })
                .ok_or_else(|| unavailable(base.to_owned()))
        }
        Device::Nvidia { major, minor } => {
            let dev = major * 10 + minor;
            let sm = |s: &str| s.strip_prefix("sm_").and_then(|n| n.parse::<u32>().ok());
            let cubin = of_module()
                .filter(|i| i.target.starts_with("sm_"))
                .filter_map(|i| sm(i.target).map(|v| (v, i)))
                .filter(|(v, _)| v / 10 == *major && *v <= dev)
                .max_by_key(|(v, _)| *v);
            if let Some((v, i)) = cubin {
                return Ok(Image {
                    module,
                    kind: ImageKind::Cubin,
                    bytes: i.bytes,
                    compute: v,
                });
            }
            of_module()
                .filter_map(|i| sm(i.archs).filter(|_| i.target == "ptx").map(|v| (v, i)))
                .find(|(v, _)| *v <= dev)
                .map(|(v, i)| Image {
                    module,
                    kind: ImageKind::Ptx,
                    bytes: i.bytes,
                    compute: v,
                })
                .ok_or_else(|| unavailable(format!("sm_{dev}")))
        }
    }
}

/// `act_f32`'s `kind` argument.
pub mod act {
    /// GELU, tanh approximation.
    pub const GELU: i32 = 0;
    /// SiLU (x * sigmoid(x)).
    pub const SILU: i32 = 1;
}

/// `binary_f32`'s `op` argument.
pub mod binary {
    /// a + b.
    pub const ADD: i32 = 0;
    /// a * b.
    pub const MUL: i32 = 1;
}

/// Bytes per 32 device-quantized activation values (ggml's `block_q8_1`: f16 d, f16 d*sum,
/// 32 x i8), stored planar by `quantize_q8_1`: see [`q8_1_vector_bytes`].
pub const Q8_1_BYTES: usize = 36;
/// Values per Q8_1 activation block.
pub const QK8_1: usize = 32;
/// Warps per block of every mat-vec kernel (`MV_WARPS` in `hip/matvec.hip`).
pub const MATVEC_WARPS: u32 = 4;
/// Grid x of a mat-vec launch over `nrows` rows: one block per
/// [`WeightType::matvec_rows_per_block`] rows.
pub fn matvec_grid(t: WeightType, nrows: usize) -> u32 {
    u32::try_from(nrows.div_ceil(t.matvec_rows_per_block()).max(1)).unwrap_or(u32::MAX)
}

/// The most activation vectors the column mat-vecs ([`WeightType::matvec_cols`]) take.
pub const MATVEC_COLS_MAX: usize = 4;

/// Activation vectors per grid row of the column mat-vecs for `m` vectors: 2 or 4 (`NC` in
/// `hip/matvec.hip`), so that `m` up to [`MATVEC_COLS_MAX`] takes one grid row and reads each
/// weight once.
pub fn matvec_cols_per_block(m: usize) -> usize {
    if m <= 2 {
        2
    } else {
        4
    }
}

/// Grid of a column mat-vec ([`WeightType::matvec_cols`]) of type `t` over `nrows` rows and `m`
/// activation vectors.
pub fn matvec_cols_grid(t: WeightType, nrows: usize, m: usize) -> [u32; 3] {
    let x =
        u32::try_from(nrows.div_ceil(t.matvec_cols_rows_per_block()).max(1)).unwrap_or(u32::MAX);
    let y = u32::try_from(m.div_ceil(matvec_cols_per_block(m)).max(1)).unwrap_or(u32::MAX);
    [x, y, 1]
}

/// Output rows one block of the MXFP4 mat-vecs computes ([`MATVEC_WARPS`] warps of two rows).
/// MXFP4 is read by its own kernels ([`KernelId::MatvecMxfp4`], [`KernelId::MatvecIdMxfp4`],
/// [`KernelId::DequantF16Mxfp4`], [`KernelId::GetRowsMxfp4`]), not through [`WeightType`].
pub const MXFP4_MATVEC_ROWS_PER_BLOCK: usize = 2 * MATVEC_WARPS as usize;

/// Grid x of the MXFP4 mat-vecs for `nrows` output rows.
pub fn matvec_grid_mxfp4(nrows: usize) -> u32 {
    u32::try_from(nrows.div_ceil(MXFP4_MATVEC_ROWS_PER_BLOCK).max(1)).unwrap_or(u32::MAX)
}

/// Rows a warp of the short-row expert mat-vecs ([`WeightType::matvec_id_short`]) takes at once
/// (`MV_SHORT_ROWS` in `hip/matvec.hip`).
const MATVEC_ID_SHORT_ROWS: usize = 8;
/// Stage bytes per warp of the short-row expert mat-vecs (`MV_SHORT_BYTES`).
const MATVEC_ID_SHORT_STAGE: usize = 5120;
/// Output rows one block of the short-row expert mat-vecs computes.
pub const MATVEC_ID_SHORT_ROWS_PER_BLOCK: usize = MATVEC_ID_SHORT_ROWS * MATVEC_WARPS as usize;
/// Longest row (bytes) the short-row expert mat-vecs take: a warp's rows and their start's offset
/// in its 16-byte chunk fit its stage.
pub const MATVEC_ID_SHORT_ROW_BYTES: usize = (MATVEC_ID_SHORT_STAGE - 16) / MATVEC_ID_SHORT_ROWS;

/// Longest row (values) the short-row expert mat-vecs take: they quantize their activation
/// vector into shared memory (`MV_SHORT_MAX_COLS`).
pub const MATVEC_ID_SHORT_MAX_COLS: usize = 1792;

/// Whether the short-row expert mat-vecs take rows of `k` values in `row_bytes` bytes.
pub fn matvec_id_short_fits(k: usize, row_bytes: usize) -> bool {
    k <= MATVEC_ID_SHORT_MAX_COLS && row_bytes <= MATVEC_ID_SHORT_ROW_BYTES
}

/// Grid x of the short-row expert mat-vecs for `nrows` output rows.
pub fn matvec_id_short_grid(nrows: usize) -> u32 {
    u32::try_from(nrows.div_ceil(MATVEC_ID_SHORT_ROWS_PER_BLOCK).max(1)).unwrap_or(u32::MAX)
}

/// Grid x of [`WeightType::matvec_gated`] for `nrows` output rows.
pub fn matvec_gated_grid(t: WeightType, nrows: usize) -> u32 {
    u32::try_from(nrows.div_ceil(t.matvec_gated_rows_per_block()).max(1)).unwrap_or(u32::MAX)
}

/// Threads per block of the `mmq_*` kernels (`MMQ_THREADS` in `hip/mmq.hip`) and of
/// `mmq_combine`.
pub const MMQ_THREADS: u32 = 256;
/// Weight rows per block of the `mmq_*` kernels (`MMQ_ROWS`).
pub const MMQ_ROWS: usize = 64;
/// Values of each row per step of the `mmq_*` kernels (`MMQ_KT`); splits divide the steps.
pub const MMQ_STEP: usize = 256;
/// Most shares of a row's steps one `mmq_*` launch is split into.
pub const MMQ_MAX_SPLITS: usize = 8;
/// Blocks per multiprocessor the `mmq_*` kernels of 16, 32, 64 and 128 vectors per tile keep
/// their registers for (`MMQ_MIN_BLOCKS_16/32/64/128`).
pub const MMQ_BLOCKS_PER_SM: [(usize, usize); 4] = [(16, 4), (32, 4), (64, 2), (128, 2)];

/// Bytes of dynamic shared memory the `mmq_*` kernels of 16, 32, 64 and 128 vectors per tile are
/// launched with where their products run on tensor cores (NVIDIA, compute capability 8.0 and
/// later: `MMQ_SMEM_<NT>` in `hip/mmq.hip`, the staging plus a ring of weight copies, more
/// than the 48 KiB a kernel gets without opting in); elsewhere they use static shared memory.
pub const MMQ_SMEM_BYTES: [(usize, u32); 4] = [(16, 57344), (32, 57344), (64, 98304), (128, 98304)];

/// How a batched product on integer tiles ([`WeightType::mmq`]) is launched: `mats` matrices
/// (1, or 2 for a gated product: gate and up) of `nrows` rows of `k` values times `m` vectors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MmqPlan {
    /// Vectors per tile (16, 32, 64 or 128: the kernel [`WeightType::mmq`] picks).
    pub nt: usize,
    /// Shares each row's steps are split into (`splits`).
    pub splits: usize,
    /// Grid: vector tiles, row tiles, matrices times splits.
    pub grid: [u32; 3],
    /// Whether the blocks write partial results (`part`) that `mmq_combine` adds up: for two
    /// matrices or more than one split; otherwise they write `out` (plus the bias) themselves.
    pub partial: bool,
}

impl MmqPlan {
    /// The plan for a device with `sms` multiprocessors (0 when unknown: no split). A launch
    /// with fewer blocks than the multiprocessors keep resident ([`MMQ_BLOCKS_PER_SM`]) splits
    /// the steps into as many shares as keep the blocks within that number (one wave: a
    /// second, partial one would leave most multiprocessors idle while it runs), up to
    /// [`MMQ_MAX_SPLITS`] shares of at least two steps each.
    pub fn new(nrows: usize, m: usize, k: usize, mats: usize, sms: usize) -> Self {
        let nt = match m {
            0..=16 => 16,
            17..=32 => 32,
            33..=64 => 64,
            _ => 128,
        };
        let (col_tiles, row_tiles) = (m.div_ceil(nt).max(1), nrows.div_ceil(MMQ_ROWS).max(1));
        let tiles = col_tiles * row_tiles * mats;
        let steps = k.div_ceil(MMQ_STEP);
        let per_sm = MMQ_BLOCKS_PER_SM
            .iter()
            .find(|&&(w, _)| w == nt)
            .map_or(1, |&(_, b)| b);
        let target = per_sm * sms;
        let splits = (target / tiles)
            .min((steps / 2).max(1))
            .clamp(1, MMQ_MAX_SPLITS);
        let u = |v: usize| u32::try_from(v).unwrap_or(u32::MAX);
        Self {
            nt,
            splits,
            grid: [u(col_tiles), u(row_tiles), u(mats * splits)],
            partial: mats > 1 || splits > 1,
        }
    }

    /// Bytes of dynamic shared memory the launch takes on `target` ([`MMQ_SMEM_BYTES`] on
    /// NVIDIA, 0 on AMD); beyond 48 KiB the kernel must have been opted in to them.
    pub fn smem_bytes(&self, target: &Device) -> u32 {
        match target {
            Device::Nvidia { major, .. } if *major >= 8 => MMQ_SMEM_BYTES
                .iter()
                .find(|&&(w, _)| w == self.nt)
                .map_or(0, |&(_, b)| b),
            _ => 0,
        }
    }

    /// f32 values of partial results the launch writes to `part` (0 when it writes `out`).
    pub fn partial_values(&self, nrows: usize, m: usize) -> usize {
        if self.partial {
            self.grid[2] as usize * m * nrows
        } else {
            0
        }
    }
}

/// Grid of `mmq_combine` (blocks of [`MMQ_THREADS`]) for `nrows` rows of `m` vectors.
pub fn mmq_combine_grid(nrows: usize, m: usize) -> [u32; 3] {
    let u = |v: usize| u32::try_from(v).unwrap_or(u32::MAX);
    [
        u(nrows.div_ceil(MMQ_THREADS as usize).max(1)),
        u(m.max(1)),
        1,
    ]
}

/// Threads per block of [`KernelId::MoeGroup`] (`MOE_GROUP_THREADS` in `hip/mmq.hip`).
pub const MOE_GROUP_THREADS: u32 = 256;
/// Most experts [`KernelId::MoeGroup`] sorts pairs for (its shared histogram,
/// `MOE_GROUP_MAX_EXPERTS`).
pub const MOE_GROUP_MAX_EXPERTS: usize = 1024;

/// How an expert-grouped product on integer tiles ([`WeightType::mmq_id`]) is launched over
/// `pairs` (token, slot) pairs choosing among `n_mat` matrices of `nrows` rows, after
/// [`KernelId::MoeGroup`] (grid `[n_mat + 1, 1, 1]`, [`MOE_GROUP_THREADS`] threads) sorted them
/// for tiles of `nt`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MmqIdPlan {
    /// Pairs per tile (16, 32 or 64).
    pub nt: usize,
    /// Grid: every expert's column tiles at most (`pairs / nt` rounded up plus one partial tile
    /// per expert; the blocks past the sorted total leave at once), row tiles.
    pub grid: [u32; 3],
}

impl MmqIdPlan {
    /// The tile width fits the average expert's pairs with room for the uneven ones (a tile
    /// half a width wider than the average), as the dense plan's widths go.
    pub fn new(pairs: usize, n_mat: usize, nrows: usize) -> Self {
        let avg = pairs.div_ceil(n_mat.max(1));
        let nt = match avg + avg / 2 {
            0..=16 => 16,
            17..=32 => 32,
            _ => 64,
        };
        let u = |v: usize| u32::try_from(v).unwrap_or(u32::MAX);
        Self {
            nt,
            grid: [
                u(pairs.div_ceil(nt) + n_mat),
                u(nrows.div_ceil(MMQ_ROWS).max(1)),
                1,
            ],
        }
    }
}

/// The expert-grouped tile product of MXFP4 weights for tiles of `nt` pairs (as
/// [`WeightType::mmq_id`]; MXFP4 has no [`WeightType`]).
pub fn mmq_id_mxfp4(nt: usize) -> KernelId {
    match nt {
        16 => KernelId::MmqIdMxfp4x16,
        32 => KernelId::MmqIdMxfp4x32,
        _ => KernelId::MmqIdMxfp4x64,
    }
}

/// Rows and vectors per tile of [`KernelId::GemmF32Part`] (`GEMM_F32_TILE`).
pub const GEMM_F32_TILE: usize = 64;
/// Threads per block of [`KernelId::GemmF32Part`] (`GEMM_F32_THREADS`).
pub const GEMM_F32_THREADS: u32 = 256;

/// How [`KernelId::GemmF32Part`] is launched for `nrows` f32 rows of `k` values times `m`
/// vectors on a device with `sms` multiprocessors: the rows are split into `splits` shares of
/// `kper` values (a multiple of 16), enough blocks for two per multiprocessor, each share at
/// least 256 values; `mmq_combine` adds the shares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemmF32Plan {
    /// Shares of each row.
    pub splits: usize,
    /// Values per share.
    pub kper: usize,
    /// Grid: vector tiles, row tiles, shares.
    pub grid: [u32; 3],
}

impl GemmF32Plan {
    /// The plan for `nrows` x `k` times `m` vectors on `sms` multiprocessors (0: no split).
    pub fn new(nrows: usize, m: usize, k: usize, sms: usize) -> Self {
        let tiles = nrows.div_ceil(GEMM_F32_TILE).max(1) * m.div_ceil(GEMM_F32_TILE).max(1);
        let want = (2 * sms).div_ceil(tiles).max(1);
        let splits = want.min((k / 256).max(1)).min(MMQ_MAX_SPLITS);
        let kper = k.div_ceil(splits).div_ceil(16) * 16;
        let splits = k.div_ceil(kper.max(1)).max(1);
        let u = |v: usize| u32::try_from(v).unwrap_or(u32::MAX);
        Self {
            splits,
            kper,
            grid: [
                u(m.div_ceil(GEMM_F32_TILE).max(1)),
                u(nrows.div_ceil(GEMM_F32_TILE).max(1)),
                u(splits),
            ],
        }
    }
}

/// Bytes between consecutive activation vectors of `ncols` values (a multiple of 32) quantized
/// by `quantize_q8_1`: `ncols` int8 values, then `ncols / 32` half2 (d, d * sum) scales, rounded
/// up to 16 bytes so that every vector starts 16-byte aligned (`q8_vec_bytes` in `common.h`).
pub fn q8_1_vector_bytes(ncols: usize) -> usize {
    (ncols / QK8_1 * Q8_1_BYTES).div_ceil(16) * 16
}
/// Bytes of a decode-stack Q8 vector with one half2 (d, d * sum) per 16 values (its FFN
/// activation: `q8_16_vec_bytes` in `hip/stack/activations.h`): `ncols` int8 values, then
/// `ncols / 16` scales, rounded up to 16 bytes.
pub fn q8_16_vector_bytes(ncols: usize) -> usize {
    (ncols + ncols / 16 * 4).div_ceil(16) * 16
}
/// Most experts (router logits per token) `moe_route_f32` takes (`RF_ROUTE_MAX`).
pub const ROUTE_MAX_EXPERTS: usize = 1024;
/// Largest head dimension the attention kernels take.
pub const ATTN_MAX_HEAD_DIM: usize = 256;
/// Most cache positions `attn_dec_f16`/`attn_dec_f32` take (their scores live in shared memory).
pub const ATTN_DEC_MAX_KV: usize = 4096;
/// Threads per block of `attn_dec_f16`/`attn_dec_f32`.
pub const ATTN_DEC_THREADS: u32 = 512;
/// Threads per block of the flash-decoding paged attention (`paged_dec_*`).
pub const PAGED_DEC_THREADS: u32 = 128;

/// `attn_f16`/`attn_f32`'s parameter block, passed by value (layout mirrors `attn_params` in
/// `hip/attention.hip`: eight 32-bit ints, eight 64-bit strides in elements, a float, an int).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct AttnParams {
    /// Query tokens.
    pub n_tokens: i32,
    /// Query heads.
    pub n_heads: i32,
    /// KV heads (`n_heads` is a multiple).
    pub n_kv_heads: i32,
    /// Head dimension, at most [`ATTN_MAX_HEAD_DIM`].
    pub head_dim: i32,
    /// Valid cache positions.
    pub n_kv: i32,
    /// 1: key `p` is visible to query token `t` only when `p <= pos[t]` (positions are the
    /// kernel's `pos` argument, one per query token).
    pub causal: i32,
    /// Sliding window (0: none); key `p` is visible to query token `t` iff `pos[t] - p < window`.
    pub window: i32,
    /// KV positions per split (grid z).
    pub split_len: i32,
    /// Query strides (elements) between tokens and heads.
    pub q_tok_stride: i64,
    /// See `q_tok_stride`.
    pub q_head_stride: i64,
    /// K cache strides (elements) between positions and heads.
    pub k_pos_stride: i64,
    /// See `k_pos_stride`.
    pub k_head_stride: i64,
    /// V cache strides (elements) between positions and heads.
    pub v_pos_stride: i64,
    /// See `v_pos_stride`.
    pub v_head_stride: i64,
    /// Output strides (elements) between tokens and heads.
    pub o_tok_stride: i64,
    /// See `o_tok_stride`.
    pub o_head_stride: i64,
    /// Score scale (usually 1/sqrt(head_dim)).
    pub scale: f32,
    /// 0: one launch over the whole KV range (`split_len >= n_kv`). Split-K (several splits):
    /// launch 1 writes each split's score max and sum to `part`, launch 2 merges them and
    /// writes each split's share of the output, then `attn_combine_f32` adds the shares.
    pub phase: i32,
}

/// Threads per block of `decode_stack` (`DS_THREADS` in `hip/stack/params.h`); one block per
/// multiprocessor.
pub const STACK_THREADS: u32 = 512;
/// Most layers one `decode_stack` launch runs (`DS_MAX_LAYERS`): its parameter block carries
/// every layer's pointers and must stay under the 4 KB kernel parameter limit.
pub const STACK_MAX_LAYERS: usize = 32;
/// The only head size `decode_stack` takes (`DS_HEAD`).
pub const STACK_HEAD_DIM: usize = 128;
/// Ring slots per warp (`DS_STAGES`) and bytes per slot (`DS_SLOT`) of `decode_stack`.
const STACK_STAGES: usize = 5;
const STACK_SLOT: usize = 2304;

/// Most work items (32-row groups) one `decode_stack` block takes in a launch
/// (`DS_MAX_ITEMS`); their list sits in its shared memory, `STACK_ITEM_BYTES` each.
pub const STACK_MAX_ITEMS: usize = 512;
const STACK_ITEM_BYTES: usize = 32;

/// Dynamic shared memory of a `decode_stack` launch: the weight ring, the block's work list,
/// then the larger of the Q8 input of the widest product (`max_cols` values, with 16-value
/// scales at most) and the attention's per-warp shares.
pub fn stack_shared_bytes(max_cols: usize) -> usize {
    let warps = STACK_THREADS as usize / 32;
    let ring = STACK_STAGES * warps * STACK_SLOT;
    ring + STACK_MAX_ITEMS * STACK_ITEM_BYTES
        + q8_16_vector_bytes(max_cols).max(warps * STACK_HEAD_DIM * 4)
}

/// Dynamic shared memory of a `decode_stack_split` launch: as [`stack_shared_bytes`], the last
/// area at least the split attention's ([`STACK_ATTN_BYTES`]).
pub fn stack_split_shared_bytes(max_cols: usize) -> usize {
    let warps = STACK_THREADS as usize / 32;
    let ring = STACK_STAGES * warps * STACK_SLOT;
    ring + STACK_MAX_ITEMS * STACK_ITEM_BYTES + q8_16_vector_bytes(max_cols).max(STACK_ATTN_BYTES)
}

/// KV length (positions of the step's cache views: the keys rounded up to the decode step's
/// bucket) from which the host runs `decode_stack_split` instead of `decode_stack`. Below it the
/// per-query-head attention is faster (its phase leaves the product phases their registers);
/// above it most blocks would sit idle in attention while a few read every key once per query
/// head. Measured on the H200 (kernels/PERF.md, "attention at depth"): `decode_stack` 501 t/s
/// against 418 at 1024 keys, 278 against 371 at 4096.
pub const STACK_SPLIT_MIN_KV: usize = 2048;
/// Shared memory `decode_stack_split`'s attention uses in the dynamic area (the queries of a KV
/// head, one tile of their scores, the value pass's sums; `DS_ATTN_FLOATS` within it).
pub const STACK_ATTN_BYTES: usize = 16384;
/// Most query heads per KV head `decode_stack_split` takes (`DS_ATTN_MAX_GRP`).
pub const STACK_MAX_GQA: usize = 8;
/// Most KV heads `decode_stack_split` takes (`DS_ATTN_MAX_KV`): their attention counters follow
/// the grid barrier's word in [`STACK_BARRIER_WORDS`].
pub const STACK_MAX_KV_HEADS: usize = 64;
/// Keys per tile of `decode_stack_split`'s attention (`DS_ATTN_TILE`), also the keys per share
/// below which it takes fewer shares (longer contexts take up to [`stack_attn_splits`]).
pub const STACK_ATTN_TILE: usize = 256;
/// Most bytes of the shares' partial outputs ([`StackParams::attn_part`]).
const STACK_ATTN_PART_MAX: usize = 1 << 20;

/// Most shares times query heads per KV head of `decode_stack_split`'s attention
/// (`DS_ATTN_MAX_COMBINE`: the combination's weights sit in its shared memory).
pub const STACK_ATTN_MAX_COMBINE: usize = 1024;

/// Most shares of each KV head's keys in `decode_stack_split`'s attention over `blocks` blocks:
/// enough that every block has a share on long contexts, within `STACK_ATTN_PART_MAX` (1 MiB)
/// of partial outputs for `n_head` query heads and within [`STACK_ATTN_MAX_COMBINE`].
pub fn stack_attn_splits(blocks: usize, n_head: usize, n_head_kv: usize) -> usize {
    let per_share = n_head * (STACK_HEAD_DIM + 2) * 4;
    let fit = STACK_ATTN_PART_MAX / per_share.max(1);
    let grp = (n_head / n_head_kv.max(1)).max(1);
    (blocks / n_head_kv.max(1))
        .min(fit)
        .min(STACK_ATTN_MAX_COMBINE / grp)
        .max(1)
}

/// Rows at the start of each share of `decode_stack_split`'s attention (`splits` shares of each of
/// `n_head_kv` KV heads) that its blocks ask into L2 while phase 0 runs: as many as keep all the
/// shares' keys and values (512 bytes a row) within `STACK_PREFETCH_L2_SHARE` (60%) of an
/// `l2_bytes` L2; none where the L2 size is unknown (0). On the 8B (8 KV heads, 16 shares) and a
/// 50 MiB L2: 480, so contexts up to about 7,700 keys prefetch every row, as `decode_stack` does,
/// and 32,768 prefetches 31 MB of the layer's 134 MB.
pub fn stack_attn_prefetch_rows(l2_bytes: usize, splits: usize, n_head_kv: usize) -> i32 {
    let row = 2 * STACK_HEAD_DIM * 2;
    let items = (splits * n_head_kv).max(1);
    let rows = (l2_bytes as f64 * STACK_PREFETCH_L2_SHARE) as usize / (items * row);
    i32::try_from(rows).unwrap_or(i32::MAX)
}

/// Bytes of [`StackParams::attn_part`] for `splits` shares of `n_head` query heads.
pub fn stack_attn_part_bytes(splits: usize, n_head: usize) -> usize {
    splits * n_head * (STACK_HEAD_DIM + 2) * 4
}

/// Dynamic shared memory of a `decode_stack_portable` launch: as [`stack_shared_bytes`] without
/// the weight ring (its weights stream through registers).
pub fn stack_portable_shared_bytes(max_cols: usize) -> usize {
    let warps = STACK_THREADS as usize / 32;
    STACK_MAX_ITEMS * STACK_ITEM_BYTES
        + q8_16_vector_bytes(max_cols).max(warps * STACK_HEAD_DIM * 4)
}

/// Dynamic shared memory of a `head_q6_k` launch over `ncols`-wide rows: the weight ring, the
/// block's list of groups and the Q8_1 input.
pub fn head_shared_bytes(ncols: usize) -> usize {
    let warps = STACK_THREADS as usize / 32;
    STACK_STAGES * warps * STACK_SLOT
        + STACK_MAX_ITEMS * STACK_ITEM_BYTES
        + q8_1_vector_bytes(ncols)
}

/// Whether `head_q6_k` takes a Q6_K matrix of `nrows` rows of `ncols` values over `blocks`
/// blocks: 32-row groups, whole 2048-value chunk pairs (16-byte aligned rows), each block's
/// groups within [`STACK_MAX_ITEMS`] and the groups' first rows / 16 within an i16. Only tall
/// matrices (output heads, [`HEAD_RING_MIN_ROWS`] rows and more) take it.
pub fn head_takes(nrows: usize, ncols: usize, blocks: usize) -> bool {
    nrows >= HEAD_RING_MIN_ROWS
        && nrows % 32 == 0
        && ncols > 0
        && ncols % 2048 == 0
        && ncols / 256 / 4 <= u8::MAX as usize
        && blocks > 0
        && (nrows / 32).div_ceil(blocks) <= STACK_MAX_ITEMS
        && nrows / 16 <= i16::MAX as usize
}

/// Fewest rows of a Q6_K mat-vec that `head_q6_k` takes instead of the per-op kernel.
pub const HEAD_RING_MIN_ROWS: usize = 65536;

/// Work items of the busiest block (block 0) of a `decode_stack` launch over `blocks` blocks:
/// per layer, its share of the 32-row groups of the q/k/v, output, gate/up and down products
/// (`ds_build` in `hip/stack/items.h`; where the q/k/v or gate/up last round goes out as half
/// groups, block 0 takes the whole rounds and one half, the same count). The launch needs it
/// within [`STACK_MAX_ITEMS`].
pub fn stack_items(
    blocks: usize,
    n_layer: usize,
    n_embd: usize,
    n_ff: usize,
    n_head: usize,
    n_head_kv: usize,
) -> usize {
    let share = |rows: usize| (rows / 32).div_ceil(blocks.max(1));
    let per_layer =
        share((n_head + 2 * n_head_kv) * STACK_HEAD_DIM) + 2 * share(n_embd) + share(n_ff);
    n_layer * per_layer
}

/// Share of the L2 that `decode_stack`'s prefetch during the attention phase may fill (and
/// `decode_stack_split`'s of keys and values during phase 0, [`stack_attn_prefetch_rows`]).
const STACK_PREFETCH_L2_SHARE: f64 = 0.6;

/// Gate/up work items (32 gate and 32 up rows of `n_embd` Q4_K values each) whose rows each
/// block without an attention head asks into L2 while the weight streams stand still in the
/// attention phase: at most 2, and no more than keep all those blocks' requests within 60% of
/// an `l2_bytes` L2, so that they are still there when the gate/up phase reads them. On the 8B
/// over 132 blocks and a 50 MiB L2: 2 (29 MB; 3, 44 MB, measured slower on an H200).
pub fn stack_prefetch_items(l2_bytes: usize, blocks: usize, n_head: usize, n_embd: usize) -> i32 {
    let idle = blocks.saturating_sub(n_head);
    let item = 2 * 32 * (n_embd / 256) * 144;
    if idle == 0 || item == 0 {
        return 0;
    }
    let fit = (l2_bytes as f64 * STACK_PREFETCH_L2_SHARE) as usize / (idle * item);
    fit.min(2) as i32
}

/// One layer of [`StackParams`] (`ds_layer` in `hip/stack/params.h`): weight rows as in the GGUF
/// file, the f32 norm weights, the f16 caches. Addresses are device pointers.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct StackLayer {
    /// `attn_q` (Q4_K).
    pub wq: u64,
    /// `attn_k` (Q4_K).
    pub wk: u64,
    /// `attn_v` (Q4_K or Q6_K, see [`StackParams::v_q6`]).
    pub wv: u64,
    /// `attn_output` (Q4_K).
    pub wo: u64,
    /// `ffn_gate` (Q4_K).
    pub wg: u64,
    /// `ffn_up` (Q4_K).
    pub wu: u64,
    /// `ffn_down` (Q4_K or Q6_K, see [`StackParams::d_q6`]).
    pub wd: u64,
    /// `attn_norm` weight.
    pub attn_norm: u64,
    /// `ffn_norm` weight.
    pub ffn_norm: u64,
    /// K cache (f16 rows of `kv_stride` elements per position).
    pub kc: u64,
    /// V cache.
    pub vc: u64,
}

/// [`StackParams::qkv`] flag: every layer adds its [`StackParams::qkv_vec`] rows to the q, k and
/// v projections (Qwen2).
pub const STACK_QKV_BIAS: u32 = 1;
/// [`StackParams::qkv`] flag: the rope rotates dims `i` and `i + 64` of a head (NeoX, all of its
/// [`STACK_HEAD_DIM`] dims rotated), else `2i` and `2i + 1`.
pub const STACK_QKV_NEOX: u32 = 2;
/// [`StackParams::qkv`] flag: every layer RMS-norms each q and k head (epsilon
/// [`StackParams::eps`]) times its [`StackParams::qkv_vec`] weight before the rope (Qwen3).
pub const STACK_QKV_NORM: u32 = 4;
/// Most q plus k heads of a launch with [`STACK_QKV_NORM`]: each has a counter and a sum of
/// squares in the barrier buffer.
pub const STACK_NORM_HEADS: usize = 192;
/// Where the q/k norms' (counter, sum) pairs start in the barrier buffer, in u32 words: after
/// `decode_stack_split`'s per-KV-head counters (words [`STACK_MAX_KV_HEADS`] to 127).
const STACK_NORM_AT: usize = 2 * STACK_MAX_KV_HEADS;
/// u32 words of the decode stack's barrier buffer, zeroed once and left so by every launch: the
/// grid barrier's counter at 0, `decode_stack_split`'s per-KV-head counters from
/// [`STACK_MAX_KV_HEADS`] on, the q/k norms' per-head counters and sums of squares from
/// `STACK_NORM_AT` (`DS_NORM_AT`) on.
pub const STACK_BARRIER_WORDS: usize = STACK_NORM_AT + 2 * STACK_NORM_HEADS;

/// `decode_stack`'s parameter block, passed by value (layout mirrors `ds_params` in
/// `hip/stack/params.h`; no implicit padding).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct StackParams {
    /// The layers, `n_layer` of them used.
    pub layer: [StackLayer; STACK_MAX_LAYERS],
    /// Rope frequency factors (f32, `n_dims / 2`), or 0.
    pub freq_factors: u64,
    /// The step's position (one i32).
    pub pos: u64,
    /// The residual before the first layer (f32, `n_embd`).
    pub x_in: u64,
    /// The residual after the last layer, also the running residual (f32, `n_embd`).
    pub x_out: u64,
    /// Scratch: roped queries (f32, `n_head * 128`; then `n_head_kv * 128` keys with
    /// [`STACK_QKV_NORM`]).
    pub q: u64,
    /// Scratch: Q8_1 of the normed residual (`n_embd` values).
    pub xq: u64,
    /// Scratch: Q8_1 of the attention output (`n_head * 128` values).
    pub aq: u64,
    /// Scratch: Q8 of the FFN activation (`n_ff` values, 16-value scales: see
    /// [`q8_16_vector_bytes`]).
    pub hq: u64,
    /// Scratch: `2 * n_layer` f32 sums of squares.
    pub ss: u64,
    /// The barrier buffer ([`STACK_BARRIER_WORDS`] u32 words, 0 before the first launch; each
    /// launch leaves them so): the grid barrier's counter, then `decode_stack_split`'s per-KV-head
    /// counters.
    pub bar: u64,
    /// Cache elements between positions.
    pub kv_stride: i64,
    /// Bit `l`: layer `l`'s `attn_v` is Q6_K (else Q4_K).
    pub v_q6: u32,
    /// Bit `l`: layer `l`'s `ffn_down` is Q6_K (else Q4_K).
    pub d_q6: u32,
    /// Layers in this launch (1 ..= [`STACK_MAX_LAYERS`]).
    pub n_layer: i32,
    /// Residual width.
    pub n_embd: i32,
    /// FFN width.
    pub n_ff: i32,
    /// Query heads.
    pub n_head: i32,
    /// KV heads (`n_head` is a multiple).
    pub n_head_kv: i32,
    /// Rows of the cache views; keys past the position are masked anyway.
    pub n_kv: i32,
    /// Rotated dims per head.
    pub n_dims: i32,
    /// RMS norm epsilon.
    pub eps: f32,
    /// Attention score scale.
    pub attn_scale: f32,
    /// Rope base.
    pub base: f32,
    /// Rope frequency scale.
    pub freq_scale: f32,
    /// YaRN extrapolation mix.
    pub ext_factor: f32,
    /// YaRN magnitude scale.
    pub mscale: f32,
    /// YaRN correction range, low end.
    pub corr_lo: f32,
    /// YaRN correction range, high end.
    pub corr_hi: f32,
    /// Gate/up work items whose rows each block without an attention head asks into L2 during
    /// the attention phase ([`stack_prefetch_items`]).
    pub prefetch_items: i32,
    /// `decode_stack_split`: most shares a KV head's keys are split into in the attention phase,
    /// one block each ([`stack_attn_splits`]).
    pub attn_splits: i32,
    /// `decode_stack_split`: rows at the start of each share asked into L2 during phase 0
    /// ([`stack_attn_prefetch_rows`]).
    pub attn_prefetch_rows: i32,
    /// `decode_stack_split`'s scratch: the shares' partial attention outputs (f32,
    /// [`stack_attn_part_bytes`]).
    pub attn_part: u64,
    /// Per layer, f32 vectors: the q, k and v biases where [`StackParams::qkv`] has
    /// [`STACK_QKV_BIAS`], the q and k heads' norm weights (and 0) where it has
    /// [`STACK_QKV_NORM`]; else 0. Read by `decode_stack_qkv` and `decode_stack_portable_qkv`
    /// only, after the other fields so that theirs keep the offsets the llama kernels had.
    pub qkv_vec: [[u64; 3]; STACK_MAX_LAYERS],
    /// [`STACK_QKV_BIAS`], [`STACK_QKV_NEOX`] and [`STACK_QKV_NORM`] flags (0: the llama
    /// kernels).
    pub qkv: u32,
    /// 0 (no implicit padding).
    pub pad: u32,
}

impl Default for StackParams {
    fn default() -> Self {
        bytemuck::Zeroable::zeroed()
    }
}

/// Most ranks of a peer all-reduce (`AR_MAX_RANKS` in `hip/allreduce.hip`).
pub const PEER_MAX_RANKS: usize = 8;
/// Blocks of every `all_reduce_peer_f32` launch (`AR_BLOCKS`): the same grid on every rank and
/// every call, since block `b` of one rank waits for block `b` of the others.
pub const PEER_BLOCKS: u32 = 32;
/// Floats per block below which `all_reduce_peer_f32` runs a message on fewer blocks
/// (`AR_MIN_FLOATS`): a message of `n` floats takes `ceil(n / PEER_MIN_FLOATS)` of them.
pub const PEER_MIN_FLOATS: usize = 512;
/// Threads per block of `all_reduce_peer_f32` (`AR_THREADS`).
pub const PEER_THREADS: u32 = 512;
/// 32-bit words of a rank's sync area (`AR_SYNC_WORDS`): the peers' flags per block, then the
/// per-block epochs; zeroed once before the first launch.
pub const PEER_SYNC_WORDS: usize = PEER_BLOCKS as usize * PEER_MAX_RANKS + PEER_BLOCKS as usize;

/// `all_reduce_peer_f32`'s peer table, passed by value (layout mirrors `ar_params` in
/// `hip/allreduce.hip`; no implicit padding).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct PeerReduceParams {
    /// Device address of each rank's exchange buffer: two phases of `phase_floats` floats.
    pub bufs: [u64; PEER_MAX_RANKS],
    /// Device address of each rank's sync area ([`PEER_SYNC_WORDS`] zeroed words).
    pub sync: [u64; PEER_MAX_RANKS],
    /// Device address of a 32-bit word in mapped host memory, made nonzero when a wait for the
    /// peers timed out.
    pub error: u64,
    /// How long a block waits for its peers, in nanoseconds.
    pub timeout_ns: i64,
    /// This rank.
    pub rank: i32,
    /// Ranks taking part (at most [`PEER_MAX_RANKS`]).
    pub world: i32,
    /// Floats per phase: a multiple of 4, at least every message's length.
    pub phase_floats: i32,
    /// Tail padding (0).
    pub pad: i32,
}

#[cfg(test)]
mod tests;
