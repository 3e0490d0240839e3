//! Kernel ids: the `extern "C"` symbols of `kernels/hip/*.hip` and the module each lives in.

/// One HIP source file, compiled into one code object per target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Module {
    /// `matvec.hip`: Q8_1 activation quantization and decode mat-vec products.
    Matvec,
    /// `dequant.hip`: dequantization to f16, get_rows, f32/f16 conversion.
    Dequant,
    /// `ops.hip`: norms, rope, softmax, activations, binary ops, KV writes, argmax.
    Ops,
    /// `attention.hip`: flash-style attention and its split combine.
    Attention,
    /// `stack.hip`: the persistent decode stack (every layer of a decode step in one launch).
    Stack,
    /// `mmq.hip`: batched quantized matrix products on integer tiles, and their split combine.
    Mmq,
    /// `allreduce.hip`: the one-shot all-reduce of small messages over peer memory.
    AllReduce,
}

impl Module {
    /// Every module.
    pub const ALL: &'static [Module] = &[
        Module::Matvec,
        Module::Dequant,
        Module::Ops,
        Module::Attention,
        Module::Stack,
        Module::Mmq,
        Module::AllReduce,
    ];

    /// The source file stem (`kernels/hip/<stem>.hip`).
    pub fn stem(self) -> &'static str {
        match self {
            Module::Matvec => "matvec",
            Module::Dequant => "dequant",
            Module::Ops => "ops",
            Module::Attention => "attention",
            Module::Stack => "stack",
            Module::Mmq => "mmq",
            Module::AllReduce => "allreduce",
        }
    }
}

/// ggml weight types the quantized kernels read in place.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types, reason = "names match ggml's type names")]
pub enum WeightType {
    /// 32 values: f16 scale, 4-bit values offset by 8.
    Q4_0,
    /// 32 values: f16 scale and min, 4-bit values.
    Q4_1,
    /// 32 values: f16 scale, 5-bit values offset by 16.
    Q5_0,
    /// 32 values: f16 scale and min, 5-bit values.
    Q5_1,
    /// 32 values: f16 scale, 8-bit values.
    Q8_0,
    /// 256-value super-block, 2-bit values.
    Q2_K,
    /// 256-value super-block, 3-bit values.
    Q3_K,
    /// 256-value super-block, 4-bit values, 6-bit scales and mins.
    Q4_K,
    /// 256-value super-block, 5-bit values, 6-bit scales and mins.
    Q5_K,
    /// 256-value super-block, 6-bit values, 8-bit scales.
    Q6_K,
}

impl WeightType {
    /// Every quantized weight type with kernels.
    pub const ALL: &'static [WeightType] = &[
        WeightType::Q4_0,
        WeightType::Q4_1,
        WeightType::Q5_0,
        WeightType::Q5_1,
        WeightType::Q8_0,
        WeightType::Q2_K,
        WeightType::Q3_K,
        WeightType::Q4_K,
        WeightType::Q5_K,
        WeightType::Q6_K,
    ];

    /// ggml's name (`"q4_K"`), which is also the GGUF type name.
    pub fn ggml_name(self) -> &'static str {
        match self {
            WeightType::Q4_0 => "q4_0",
            WeightType::Q4_1 => "q4_1",
            WeightType::Q5_0 => "q5_0",
            WeightType::Q5_1 => "q5_1",
            WeightType::Q8_0 => "q8_0",
            WeightType::Q2_K => "q2_K",
            WeightType::Q3_K => "q3_K",
            WeightType::Q4_K => "q4_K",
            WeightType::Q5_K => "q5_K",
            WeightType::Q6_K => "q6_K",
        }
    }

    /// The type named `name` (ggml spelling, case-insensitive).
    pub fn from_ggml_name(name: &str) -> Option<Self> {
        Self::ALL
            .iter()
            .copied()
            .find(|t| t.ggml_name().eq_ignore_ascii_case(name))
    }

    /// Values per block.
    pub fn block_values(self) -> usize {
        match self {
            WeightType::Q4_0
            | WeightType::Q4_1
            | WeightType::Q5_0
            | WeightType::Q5_1
            | WeightType::Q8_0 => 32,
            _ => 256,
        }
    }

    /// Bytes per block (ggml's layout).
    pub fn block_bytes(self) -> usize {
        match self {
            WeightType::Q4_0 => 18,
            WeightType::Q4_1 => 20,
            WeightType::Q5_0 => 22,
            WeightType::Q5_1 => 24,
            WeightType::Q8_0 => 34,
            WeightType::Q2_K => 84,
            WeightType::Q3_K => 110,
            WeightType::Q4_K => 144,
            WeightType::Q5_K => 176,
            WeightType::Q6_K => 210,
        }
    }

    /// The decode mat-vec kernel (`w`, `y` as planar Q8_1 from `quantize_q8_1`, `out`, `ncols`,
    /// `row_bytes`, `out_stride`, `nrows`), launched with [`crate::MATVEC_WARPS`] warps per
    /// block, grid x = ceil(nrows / [`WeightType::matvec_rows_per_block`]) and grid y = the
    /// number of activation vectors.
    pub fn matvec(self) -> KernelId {
        match self {
            WeightType::Q4_0 => KernelId::MatvecQ4_0,
            WeightType::Q4_1 => KernelId::MatvecQ4_1,
            WeightType::Q5_0 => KernelId::MatvecQ5_0,
            WeightType::Q5_1 => KernelId::MatvecQ5_1,
            WeightType::Q8_0 => KernelId::MatvecQ8_0,
            WeightType::Q2_K => KernelId::MatvecQ2_K,
            WeightType::Q3_K => KernelId::MatvecQ3_K,
            WeightType::Q4_K => KernelId::MatvecQ4_K,
            WeightType::Q5_K => KernelId::MatvecQ5_K,
            WeightType::Q6_K => KernelId::MatvecQ6_K,
        }
    }

    /// The expert mat-vec (ggml's `mul_mat_id`; `w`, `ids`, `y`, `out`, `ncols`, `row_bytes`,
    /// `mat_bytes`, `nrows`, `n_used`, `n_x`, `n_mat`): grid y runs over the (token, slot) pairs
    /// `p` (`ids` I32 `[n_used, n_tok]`), each multiplying matrix `ids[p]` of the stack `w`
    /// (`mat_bytes` apart) with activation vector `t * n_x + i % n_x` of `y` (planar Q8_1) into
    /// output row `p` (`nrows` values); grid x and block as [`WeightType::matvec`].
    pub fn matvec_id(self) -> KernelId {
        match self {
            WeightType::Q4_0 => KernelId::MatvecIdQ4_0,
            WeightType::Q4_1 => KernelId::MatvecIdQ4_1,
            WeightType::Q5_0 => KernelId::MatvecIdQ5_0,
            WeightType::Q5_1 => KernelId::MatvecIdQ5_1,
            WeightType::Q8_0 => KernelId::MatvecIdQ8_0,
            WeightType::Q2_K => KernelId::MatvecIdQ2_K,
            WeightType::Q3_K => KernelId::MatvecIdQ3_K,
            WeightType::Q4_K => KernelId::MatvecIdQ4_K,
            WeightType::Q5_K => KernelId::MatvecIdQ5_K,
            WeightType::Q6_K => KernelId::MatvecIdQ6_K,
        }
    }

    /// The gated decode mat-vec (`w_gate`, `w_up`, `y`, `out`, `ncols`, `row_bytes`,
    /// `out_stride`, `nrows`, `act`: [`crate::act`]): `out = act(w_gate . y) * (w_up . y)` with
    /// [`WeightType::matvec`]'s block and [`crate::matvec_gated_grid`].
    pub fn matvec_gated(self) -> KernelId {
        match self {
            WeightType::Q4_0 => KernelId::MatvecGatedQ4_0,
            WeightType::Q5_0 => KernelId::MatvecGatedQ5_0,
            WeightType::Q8_0 => KernelId::MatvecGatedQ8_0,
            WeightType::Q4_K => KernelId::MatvecGatedQ4_K,
            WeightType::Q5_K => KernelId::MatvecGatedQ5_K,
            WeightType::Q6_K => KernelId::MatvecGatedQ6_K,
            WeightType::Q2_K => KernelId::MatvecGatedQ2_K,
            WeightType::Q3_K => KernelId::MatvecGatedQ3_K,
            WeightType::Q4_1 => KernelId::MatvecGatedQ4_1,
            WeightType::Q5_1 => KernelId::MatvecGatedQ5_1,
        }
    }

    /// The biased expert mat-vec ([`WeightType::matvec_id`] with `bias` after `w`: f32
    /// `[nrows, n_mat]`, one row per expert): pair `p`'s output row plus row `ids[p]` of `bias`.
    /// MXFP4's is [`KernelId::MatvecIdAddMxfp4`].
    pub fn matvec_id_add(self) -> KernelId {
        match self {
            WeightType::Q4_0 => KernelId::MatvecIdAddQ4_0,
            WeightType::Q4_1 => KernelId::MatvecIdAddQ4_1,
            WeightType::Q5_0 => KernelId::MatvecIdAddQ5_0,
            WeightType::Q5_1 => KernelId::MatvecIdAddQ5_1,
            WeightType::Q8_0 => KernelId::MatvecIdAddQ8_0,
            WeightType::Q2_K => KernelId::MatvecIdAddQ2_K,
            WeightType::Q3_K => KernelId::MatvecIdAddQ3_K,
            WeightType::Q4_K => KernelId::MatvecIdAddQ4_K,
            WeightType::Q5_K => KernelId::MatvecIdAddQ5_K,
            WeightType::Q6_K => KernelId::MatvecIdAddQ6_K,
        }
    }

    /// The gated expert mat-vec ([`WeightType::matvec_id`] with two stacks: `w_gate`, `w_up`,
    /// `ids`, `y`, `out`, `ncols`, `row_bytes`, `mat_bytes`, `nrows`, `n_used`, `n_x`, `n_mat`,
    /// `act`: [`crate::act`]): pair `p`'s output row is `act(gate_e . y) * (up_e . y)` for
    /// expert `e = ids[p]`; block as [`WeightType::matvec`], grid x [`crate::matvec_gated_grid`],
    /// grid y the pairs.
    pub fn matvec_id_gated(self) -> KernelId {
        match self {
            WeightType::Q4_0 => KernelId::MatvecIdGatedQ4_0,
            WeightType::Q4_1 => KernelId::MatvecIdGatedQ4_1,
            WeightType::Q5_0 => KernelId::MatvecIdGatedQ5_0,
            WeightType::Q5_1 => KernelId::MatvecIdGatedQ5_1,
            WeightType::Q8_0 => KernelId::MatvecIdGatedQ8_0,
            WeightType::Q2_K => KernelId::MatvecIdGatedQ2_K,
            WeightType::Q3_K => KernelId::MatvecIdGatedQ3_K,
            WeightType::Q4_K => KernelId::MatvecIdGatedQ4_K,
            WeightType::Q5_K => KernelId::MatvecIdGatedQ5_K,
            WeightType::Q6_K => KernelId::MatvecIdGatedQ6_K,
        }
    }

    /// The expert mat-vecs over short rows, `[plain, biased]`: [`WeightType::matvec_id`] and
    /// [`WeightType::matvec_id_add`] with the f32 activations in place of their Q8_1 (each block
    /// quantizes its pair's vector), for rows of at most [`crate::MATVEC_ID_SHORT_ROW_BYTES`] and
    /// [`crate::MATVEC_ID_SHORT_MAX_COLS`] values, each warp taking a span of consecutive rows
    /// with its lanes split across them; grid x [`crate::matvec_id_short_grid`], grid y the
    /// pairs. The K-quant types only (the others measured faster on their per-row kernels).
    pub fn matvec_id_short(self) -> Option<[KernelId; 2]> {
        use KernelId as K;
        Some(match self {
            WeightType::Q2_K => [K::MatvecIdShortQ2_K, K::MatvecIdAddShortQ2_K],
            WeightType::Q3_K => [K::MatvecIdShortQ3_K, K::MatvecIdAddShortQ3_K],
            WeightType::Q4_K => [K::MatvecIdShortQ4_K, K::MatvecIdAddShortQ4_K],
            WeightType::Q5_K => [K::MatvecIdShortQ5_K, K::MatvecIdAddShortQ5_K],
            WeightType::Q6_K => [K::MatvecIdShortQ6_K, K::MatvecIdAddShortQ6_K],
            _ => return None,
        })
    }

    /// The grouped decode mat-vec (`w0`, `w1`, `w2`, `y`, `out0`, `out1`, `out2`, `ncols`,
    /// `row_bytes`, `n0`, `n1`, `n2`): up to three matrices of this type and row length times the
    /// same activations in one launch, grid x = the sum of [`crate::matvec_grid`] over the three
    /// (`w2`/`out2` null and `n2` = 0 for two).
    pub fn matvec_multi(self) -> KernelId {
        match self {
            WeightType::Q4_0 => KernelId::MatvecMultiQ4_0,
            WeightType::Q5_0 => KernelId::MatvecMultiQ5_0,
            WeightType::Q8_0 => KernelId::MatvecMultiQ8_0,
            WeightType::Q4_K => KernelId::MatvecMultiQ4_K,
            WeightType::Q5_K => KernelId::MatvecMultiQ5_K,
            WeightType::Q6_K => KernelId::MatvecMultiQ6_K,
            WeightType::Q2_K => KernelId::MatvecMultiQ2_K,
            WeightType::Q3_K => KernelId::MatvecMultiQ3_K,
            WeightType::Q4_1 => KernelId::MatvecMultiQ4_1,
            WeightType::Q5_1 => KernelId::MatvecMultiQ5_1,
        }
    }

    /// A variant of [`WeightType::matvec`]: `bias` adds a row (`w`, `bias`, `y`, `out`, `ncols`, `row_bytes`, `out_stride`,
    /// `nrows`), `k_split` has every warp of a block share the same rows, each taking a part of
    /// them (grid x = ceil(nrows / [`WeightType::matvec_rows_per_warp`]): long rows, few of them).
    pub fn matvec_variant(self, bias: bool, k_split: bool) -> KernelId {
        use KernelId as K;
        let ids = match self {
            WeightType::Q4_0 => [K::MatvecAddQ4_0, K::MatvecKsQ4_0, K::MatvecKsAddQ4_0],
            WeightType::Q5_0 => [K::MatvecAddQ5_0, K::MatvecKsQ5_0, K::MatvecKsAddQ5_0],
            WeightType::Q8_0 => [K::MatvecAddQ8_0, K::MatvecKsQ8_0, K::MatvecKsAddQ8_0],
            WeightType::Q4_K => [K::MatvecAddQ4_K, K::MatvecKsQ4_K, K::MatvecKsAddQ4_K],
            WeightType::Q5_K => [K::MatvecAddQ5_K, K::MatvecKsQ5_K, K::MatvecKsAddQ5_K],
            WeightType::Q6_K => [K::MatvecAddQ6_K, K::MatvecKsQ6_K, K::MatvecKsAddQ6_K],
            WeightType::Q2_K => [K::MatvecAddQ2_K, K::MatvecKsQ2_K, K::MatvecKsAddQ2_K],
            WeightType::Q3_K => [K::MatvecAddQ3_K, K::MatvecKsQ3_K, K::MatvecKsAddQ3_K],
            WeightType::Q4_1 => [K::MatvecAddQ4_1, K::MatvecKsQ4_1, K::MatvecKsAddQ4_1],
            WeightType::Q5_1 => [K::MatvecAddQ5_1, K::MatvecKsQ5_1, K::MatvecKsAddQ5_1],
        };
        match (bias, k_split) {
            (false, false) => self.matvec(),
            (true, false) => ids[0],
            (false, true) => ids[1],
            (true, true) => ids[2],
        }
    }

    /// Rows each warp of the mat-vec kernels computes (`R` in `hip/matvec.hip`).
    pub fn matvec_rows_per_warp(self) -> usize {
        self.matvec_rows_per_block() / crate::MATVEC_WARPS as usize
    }

    /// Output rows one block of [`WeightType::matvec`] computes: [`crate::MATVEC_WARPS`] warps
    /// times the rows per warp (`R` in `hip/matvec.hip`).
    pub fn matvec_rows_per_block(self) -> usize {
        let per_warp = match self {
            WeightType::Q4_K | WeightType::Q5_K => 1,
            _ => 2,
        };
        crate::MATVEC_WARPS as usize * per_warp
    }

    /// The column mat-vec of `m` activation vectors (2 to [`crate::MATVEC_COLS_MAX`];
    /// [`crate::matvec_cols_per_block`] of them per grid row), plain or adding a `bias` row (`w`,
    /// `bias` when adding, `y`, `out`, `ncols`, `row_bytes`, `out_stride`, `nrows`, `m`), for the
    /// types that have one (Q4_K, Q6_K): each
    /// weight block is read once for all of a block's vectors. Grid [`crate::matvec_cols_grid`],
    /// [`crate::MATVEC_WARPS`] warps per block.
    pub fn matvec_cols(self, m: usize, bias: bool) -> Option<KernelId> {
        let ids = self.cols_ids(m)?;
        Some(if bias { ids[1] } else { ids[0] })
    }

    /// The gated column mat-vec (`w_gate`, `w_up`, `y`, `out`, `ncols`, `row_bytes`,
    /// `out_stride`, `nrows`, `act_kind`, `m`): `act(gate) * up` for `m` vectors, launched as
    /// [`WeightType::matvec_cols`].
    pub fn matvec_cols_gated(self, m: usize) -> Option<KernelId> {
        self.cols_ids(m).map(|ids| ids[2])
    }

    /// The plain, biased and gated column mat-vecs for `m` vectors.
    fn cols_ids(self, m: usize) -> Option<[KernelId; 3]> {
        use KernelId as K;
        if !(2..=crate::MATVEC_COLS_MAX).contains(&m) {
            return None;
        }
        let nc = crate::matvec_cols_per_block(m);
        Some(match (self, nc) {
            (WeightType::Q4_K, 2) => [K::MatvecQ4_KC2, K::MatvecAddQ4_KC2, K::MatvecGatedQ4_KC2],
            (WeightType::Q4_K, _) => [K::MatvecQ4_KC4, K::MatvecAddQ4_KC4, K::MatvecGatedQ4_KC4],
            (WeightType::Q6_K, 2) => [K::MatvecQ6_KC2, K::MatvecAddQ6_KC2, K::MatvecGatedQ6_KC2],
            (WeightType::Q6_K, _) => [K::MatvecQ6_KC4, K::MatvecAddQ6_KC4, K::MatvecGatedQ6_KC4],
            _ => return None,
        })
    }

    /// Output rows one block of the column mat-vecs computes ([`WeightType::matvec_cols`]):
    /// [`crate::MATVEC_WARPS`] warps of one row (Q4_K) or two (the staged Q6_K).
    pub fn matvec_cols_rows_per_block(self) -> usize {
        self.matvec_rows_per_block()
    }

    /// Output rows one block of [`WeightType::matvec_gated`] computes: Q4_K takes two rows per
    /// warp there (each activation load serves four weight rows), the others as
    /// [`WeightType::matvec_rows_per_block`].
    pub fn matvec_gated_rows_per_block(self) -> usize {
        match self {
            WeightType::Q4_K => 2 * crate::MATVEC_WARPS as usize,
            _ => self.matvec_rows_per_block(),
        }
    }

    /// The batched product on integer tiles of `nt` (16, 32, 64 or 128; others take 128) activation
    /// vectors (`w0`, `w1`, `bias`, `y`, `out`, `part`, `k`, `row_bytes`, `out_stride`,
    /// `nrows`, `m`, `splits`; `hip/mmq.hip`), launched as [`crate::MmqPlan`] says with
    /// [`crate::MMQ_THREADS`] threads per block.
    pub fn mmq(self, nt: usize) -> KernelId {
        use KernelId as K;
        let ids = match self {
            WeightType::Q4_0 => [K::MmqQ4_0x16, K::MmqQ4_0x32, K::MmqQ4_0x64, K::MmqQ4_0x128],
            WeightType::Q4_1 => [K::MmqQ4_1x16, K::MmqQ4_1x32, K::MmqQ4_1x64, K::MmqQ4_1x128],
            WeightType::Q5_0 => [K::MmqQ5_0x16, K::MmqQ5_0x32, K::MmqQ5_0x64, K::MmqQ5_0x128],
            WeightType::Q5_1 => [K::MmqQ5_1x16, K::MmqQ5_1x32, K::MmqQ5_1x64, K::MmqQ5_1x128],
            WeightType::Q8_0 => [K::MmqQ8_0x16, K::MmqQ8_0x32, K::MmqQ8_0x64, K::MmqQ8_0x128],
            WeightType::Q2_K => [K::MmqQ2_Kx16, K::MmqQ2_Kx32, K::MmqQ2_Kx64, K::MmqQ2_Kx128],
            WeightType::Q3_K => [K::MmqQ3_Kx16, K::MmqQ3_Kx32, K::MmqQ3_Kx64, K::MmqQ3_Kx128],
            WeightType::Q4_K => [K::MmqQ4_Kx16, K::MmqQ4_Kx32, K::MmqQ4_Kx64, K::MmqQ4_Kx128],
            WeightType::Q5_K => [K::MmqQ5_Kx16, K::MmqQ5_Kx32, K::MmqQ5_Kx64, K::MmqQ5_Kx128],
            WeightType::Q6_K => [K::MmqQ6_Kx16, K::MmqQ6_Kx32, K::MmqQ6_Kx64, K::MmqQ6_Kx128],
        };
        match nt {
            16 => ids[0],
            32 => ids[1],
            64 => ids[2],
            _ => ids[3],
        }
    }

    /// The expert-grouped product on integer tiles of `nt` (16, 32 or 64; others take 64) pairs
    /// per tile (`w0`, `w1`, `rows`, `off`, `tiles`, `y`, `out`, `k`, `row_bytes`,
    /// `mat_bytes`, `nrows`, `n_used`, `n_x`, `n_mat`, `act_kind`; `hip/mmq.hip`), over the
    /// pairs [`KernelId::MoeGroup`] sorted, launched as [`crate::MmqIdPlan`] says with
    /// [`crate::MMQ_THREADS`] threads per block.
    pub fn mmq_id(self, nt: usize) -> KernelId {
        use KernelId as K;
        let ids = match self {
            WeightType::Q4_0 => [K::MmqIdQ4_0x16, K::MmqIdQ4_0x32, K::MmqIdQ4_0x64],
            WeightType::Q4_1 => [K::MmqIdQ4_1x16, K::MmqIdQ4_1x32, K::MmqIdQ4_1x64],
            WeightType::Q5_0 => [K::MmqIdQ5_0x16, K::MmqIdQ5_0x32, K::MmqIdQ5_0x64],
            WeightType::Q5_1 => [K::MmqIdQ5_1x16, K::MmqIdQ5_1x32, K::MmqIdQ5_1x64],
            WeightType::Q8_0 => [K::MmqIdQ8_0x16, K::MmqIdQ8_0x32, K::MmqIdQ8_0x64],
            WeightType::Q2_K => [K::MmqIdQ2_Kx16, K::MmqIdQ2_Kx32, K::MmqIdQ2_Kx64],
            WeightType::Q3_K => [K::MmqIdQ3_Kx16, K::MmqIdQ3_Kx32, K::MmqIdQ3_Kx64],
            WeightType::Q4_K => [K::MmqIdQ4_Kx16, K::MmqIdQ4_Kx32, K::MmqIdQ4_Kx64],
            WeightType::Q5_K => [K::MmqIdQ5_Kx16, K::MmqIdQ5_Kx32, K::MmqIdQ5_Kx64],
            WeightType::Q6_K => [K::MmqIdQ6_Kx16, K::MmqIdQ6_Kx32, K::MmqIdQ6_Kx64],
        };
        match nt {
            16 => ids[0],
            32 => ids[1],
            _ => ids[2],
        }
    }

    /// The dequantize-to-f16 kernel (`src`, `dst`, `ncols`, `row_bytes`, `dst_stride`).
    pub fn dequant_f16(self) -> KernelId {
        match self {
            WeightType::Q4_0 => KernelId::DequantF16Q4_0,
            WeightType::Q4_1 => KernelId::DequantF16Q4_1,
            WeightType::Q5_0 => KernelId::DequantF16Q5_0,
            WeightType::Q5_1 => KernelId::DequantF16Q5_1,
            WeightType::Q8_0 => KernelId::DequantF16Q8_0,
            WeightType::Q2_K => KernelId::DequantF16Q2_K,
            WeightType::Q3_K => KernelId::DequantF16Q3_K,
            WeightType::Q4_K => KernelId::DequantF16Q4_K,
            WeightType::Q5_K => KernelId::DequantF16Q5_K,
            WeightType::Q6_K => KernelId::DequantF16Q6_K,
        }
    }

    /// The get_rows kernel (`src`, `ids`, `dst` f32, `ncols`, `row_bytes`, `dst_stride`).
    pub fn get_rows(self) -> KernelId {
        match self {
            WeightType::Q4_0 => KernelId::GetRowsQ4_0,
            WeightType::Q4_1 => KernelId::GetRowsQ4_1,
            WeightType::Q5_0 => KernelId::GetRowsQ5_0,
            WeightType::Q5_1 => KernelId::GetRowsQ5_1,
            WeightType::Q8_0 => KernelId::GetRowsQ8_0,
            WeightType::Q2_K => KernelId::GetRowsQ2_K,
            WeightType::Q3_K => KernelId::GetRowsQ3_K,
            WeightType::Q4_K => KernelId::GetRowsQ4_K,
            WeightType::Q5_K => KernelId::GetRowsQ5_K,
            WeightType::Q6_K => KernelId::GetRowsQ6_K,
        }
    }
}

/// One kernel parameter's C type, in the order of the kernel's signature.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Param {
    /// A device pointer.
    Ptr,
    /// `int`.
    I32,
    /// `long long`.
    I64,
    /// `float`.
    F32,
    /// `attn_params` by value ([`crate::AttnParams`]).
    Attn,
    /// `ds_params` by value ([`crate::StackParams`]).
    Stack,
    /// `ar_params` by value ([`crate::PeerReduceParams`]).
    Peer,
}

impl Param {
    /// Bytes of a by-value struct parameter, `None` for scalars and pointers.
    pub fn struct_bytes(self) -> Option<usize> {
        match self {
            Param::Attn => Some(std::mem::size_of::<crate::AttnParams>()),
            Param::Stack => Some(std::mem::size_of::<crate::StackParams>()),
            Param::Peer => Some(std::mem::size_of::<crate::PeerReduceParams>()),
            _ => None,
        }
    }
}

macro_rules! kernel_ids {
    ($($variant:ident => $module:ident, $name:literal;)*) => {
        /// A kernel: its `extern "C"` symbol and module.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[allow(non_camel_case_types, reason = "quant type suffixes keep ggml's spelling")]
        pub enum KernelId {
            $(
                #[doc = concat!("`", $name, "`")]
                $variant,
            )*
        }

        impl KernelId {
            /// Every kernel.
            pub const ALL: &'static [KernelId] = &[$(KernelId::$variant,)*];

            /// The kernel's symbol in its code object.
            pub fn name(self) -> &'static str {
                match self {
                    $(KernelId::$variant => $name,)*
                }
            }

            /// The kernel's parameters in signature order (`kernels/hip`; a test keeps the two in
            /// step), for launchers that check their arguments.
            pub fn params(self) -> &'static [Param] {
                params_of(self)
            }

            /// The module (source file) the kernel is compiled into.
            pub fn module(self) -> Module {
                match self {
                    $(KernelId::$variant => Module::$module,)*
                }
            }
        }
    };
}

kernel_ids! {
    QuantizeQ8_1 => Matvec, "quantize_q8_1";
    MatvecQ4_0 => Matvec, "matvec_q4_0";
    MatvecQ4_1 => Matvec, "matvec_q4_1";
    MatvecQ5_0 => Matvec, "matvec_q5_0";
    MatvecQ5_1 => Matvec, "matvec_q5_1";
    MatvecQ8_0 => Matvec, "matvec_q8_0";
    MatvecQ2_K => Matvec, "matvec_q2_k";
    MatvecQ3_K => Matvec, "matvec_q3_k";
    MatvecQ4_K => Matvec, "matvec_q4_k";
    MatvecQ5_K => Matvec, "matvec_q5_k";
    MatvecQ6_K => Matvec, "matvec_q6_k";
    MatvecGatedQ4_0 => Matvec, "matvec_q4_0_gated";
    MatvecGatedQ5_0 => Matvec, "matvec_q5_0_gated";
    MatvecGatedQ8_0 => Matvec, "matvec_q8_0_gated";
    MatvecGatedQ4_K => Matvec, "matvec_q4_k_gated";
    MatvecGatedQ5_K => Matvec, "matvec_q5_k_gated";
    MatvecGatedQ6_K => Matvec, "matvec_q6_k_gated";
    MatvecGatedQ2_K => Matvec, "matvec_q2_k_gated";
    MatvecGatedQ3_K => Matvec, "matvec_q3_k_gated";
    MatvecGatedQ4_1 => Matvec, "matvec_q4_1_gated";
    MatvecGatedQ5_1 => Matvec, "matvec_q5_1_gated";
    MatvecMultiQ4_KQ6_K => Matvec, "matvec_q4_k_q6_k_multi";
    MatvecQ4_KC2 => Matvec, "matvec_q4_k_c2";
    MatvecAddQ4_KC2 => Matvec, "matvec_q4_k_c2_add";
    MatvecGatedQ4_KC2 => Matvec, "matvec_q4_k_c2_gated";
    MatvecQ4_KC4 => Matvec, "matvec_q4_k_c4";
    MatvecAddQ4_KC4 => Matvec, "matvec_q4_k_c4_add";
    MatvecGatedQ4_KC4 => Matvec, "matvec_q4_k_c4_gated";
    MatvecQ6_KC2 => Matvec, "matvec_q6_k_c2";
    MatvecAddQ6_KC2 => Matvec, "matvec_q6_k_c2_add";
    MatvecGatedQ6_KC2 => Matvec, "matvec_q6_k_c2_gated";
    MatvecQ6_KC4 => Matvec, "matvec_q6_k_c4";
    MatvecAddQ6_KC4 => Matvec, "matvec_q6_k_c4_add";
    MatvecGatedQ6_KC4 => Matvec, "matvec_q6_k_c4_gated";
    MatvecRopeKvQ4_K => Matvec, "matvec_q4_k_rope_kv";
    MatvecRopeKvQ4_KQ6_K => Matvec, "matvec_q4_k_q6_k_rope_kv";
    MatvecMultiQ4_0 => Matvec, "matvec_q4_0_multi";
    MatvecMultiQ5_0 => Matvec, "matvec_q5_0_multi";
    MatvecMultiQ8_0 => Matvec, "matvec_q8_0_multi";
    MatvecMultiQ4_K => Matvec, "matvec_q4_k_multi";
    MatvecMultiQ5_K => Matvec, "matvec_q5_k_multi";
    MatvecMultiQ6_K => Matvec, "matvec_q6_k_multi";
    MatvecMultiQ2_K => Matvec, "matvec_q2_k_multi";
    MatvecMultiQ3_K => Matvec, "matvec_q3_k_multi";
    MatvecMultiQ4_1 => Matvec, "matvec_q4_1_multi";
    MatvecMultiQ5_1 => Matvec, "matvec_q5_1_multi";
    MatvecAddQ4_0 => Matvec, "matvec_q4_0_add";
    MatvecKsQ4_0 => Matvec, "matvec_q4_0_ks";
    MatvecKsAddQ4_0 => Matvec, "matvec_q4_0_ks_add";
    MatvecAddQ5_0 => Matvec, "matvec_q5_0_add";
    MatvecKsQ5_0 => Matvec, "matvec_q5_0_ks";
    MatvecKsAddQ5_0 => Matvec, "matvec_q5_0_ks_add";
    MatvecAddQ8_0 => Matvec, "matvec_q8_0_add";
    MatvecKsQ8_0 => Matvec, "matvec_q8_0_ks";
    MatvecKsAddQ8_0 => Matvec, "matvec_q8_0_ks_add";
    MatvecAddQ4_K => Matvec, "matvec_q4_k_add";
    MatvecKsQ4_K => Matvec, "matvec_q4_k_ks";
    MatvecKsAddQ4_K => Matvec, "matvec_q4_k_ks_add";
    MatvecAddQ5_K => Matvec, "matvec_q5_k_add";
    MatvecKsQ5_K => Matvec, "matvec_q5_k_ks";
    MatvecKsAddQ5_K => Matvec, "matvec_q5_k_ks_add";
    MatvecAddQ6_K => Matvec, "matvec_q6_k_add";
    MatvecKsQ6_K => Matvec, "matvec_q6_k_ks";
    MatvecKsAddQ6_K => Matvec, "matvec_q6_k_ks_add";
    MatvecAddQ2_K => Matvec, "matvec_q2_k_add";
    MatvecKsQ2_K => Matvec, "matvec_q2_k_ks";
    MatvecKsAddQ2_K => Matvec, "matvec_q2_k_ks_add";
    MatvecAddQ3_K => Matvec, "matvec_q3_k_add";
    MatvecKsQ3_K => Matvec, "matvec_q3_k_ks";
    MatvecKsAddQ3_K => Matvec, "matvec_q3_k_ks_add";
    MatvecAddQ4_1 => Matvec, "matvec_q4_1_add";
    MatvecKsQ4_1 => Matvec, "matvec_q4_1_ks";
    MatvecKsAddQ4_1 => Matvec, "matvec_q4_1_ks_add";
    MatvecAddQ5_1 => Matvec, "matvec_q5_1_add";
    MatvecKsQ5_1 => Matvec, "matvec_q5_1_ks";
    MatvecKsAddQ5_1 => Matvec, "matvec_q5_1_ks_add";
    DecodeStack => Stack, "decode_stack";
    DecodeStackPortable => Stack, "decode_stack_portable";
    DecodeStackSplit => Stack, "decode_stack_split";
    DecodeStackQkv => Stack, "decode_stack_qkv";
    DecodeStackPortableQkv => Stack, "decode_stack_portable_qkv";
    HeadQ6_K => Stack, "head_q6_k";
    MatvecIdQ4_0 => Matvec, "matvec_q4_0_id";
    MatvecIdQ4_1 => Matvec, "matvec_q4_1_id";
    MatvecIdQ5_0 => Matvec, "matvec_q5_0_id";
    MatvecIdQ5_1 => Matvec, "matvec_q5_1_id";
    MatvecIdQ8_0 => Matvec, "matvec_q8_0_id";
    MatvecIdQ2_K => Matvec, "matvec_q2_k_id";
    MatvecIdQ3_K => Matvec, "matvec_q3_k_id";
    MatvecIdQ4_K => Matvec, "matvec_q4_k_id";
    MatvecIdQ5_K => Matvec, "matvec_q5_k_id";
    MatvecIdQ6_K => Matvec, "matvec_q6_k_id";
    MatvecIdAddQ4_0 => Matvec, "matvec_q4_0_id_add";
    MatvecIdAddQ4_1 => Matvec, "matvec_q4_1_id_add";
    MatvecIdAddQ5_0 => Matvec, "matvec_q5_0_id_add";
    MatvecIdAddQ5_1 => Matvec, "matvec_q5_1_id_add";
    MatvecIdAddQ8_0 => Matvec, "matvec_q8_0_id_add";
    MatvecIdAddQ2_K => Matvec, "matvec_q2_k_id_add";
    MatvecIdAddQ3_K => Matvec, "matvec_q3_k_id_add";
    MatvecIdAddQ4_K => Matvec, "matvec_q4_k_id_add";
    MatvecIdAddQ5_K => Matvec, "matvec_q5_k_id_add";
    MatvecIdAddQ6_K => Matvec, "matvec_q6_k_id_add";
    MatvecIdAddMxfp4 => Matvec, "matvec_mxfp4_id_add";
    MatvecIdGatedQ4_0 => Matvec, "matvec_q4_0_id_gated";
    MatvecIdGatedQ4_1 => Matvec, "matvec_q4_1_id_gated";
    MatvecIdGatedQ5_0 => Matvec, "matvec_q5_0_id_gated";
    MatvecIdGatedQ5_1 => Matvec, "matvec_q5_1_id_gated";
    MatvecIdGatedQ8_0 => Matvec, "matvec_q8_0_id_gated";
    MatvecIdGatedQ2_K => Matvec, "matvec_q2_k_id_gated";
    MatvecIdGatedQ3_K => Matvec, "matvec_q3_k_id_gated";
    MatvecIdGatedQ4_K => Matvec, "matvec_q4_k_id_gated";
    MatvecIdGatedQ5_K => Matvec, "matvec_q5_k_id_gated";
    MatvecIdGatedQ6_K => Matvec, "matvec_q6_k_id_gated";
    MatvecMxfp4 => Matvec, "matvec_mxfp4";
    MatvecIdMxfp4 => Matvec, "matvec_mxfp4_id";
    MatvecIdShortQ2_K => Matvec, "matvec_q2_k_id_short";
    MatvecIdShortQ3_K => Matvec, "matvec_q3_k_id_short";
    MatvecIdShortQ4_K => Matvec, "matvec_q4_k_id_short";
    MatvecIdShortQ5_K => Matvec, "matvec_q5_k_id_short";
    MatvecIdShortQ6_K => Matvec, "matvec_q6_k_id_short";
    MatvecIdAddShortQ2_K => Matvec, "matvec_q2_k_id_add_short";
    MatvecIdAddShortQ3_K => Matvec, "matvec_q3_k_id_add_short";
    MatvecIdAddShortQ4_K => Matvec, "matvec_q4_k_id_add_short";
    MatvecIdAddShortQ5_K => Matvec, "matvec_q5_k_id_add_short";
    MatvecIdAddShortQ6_K => Matvec, "matvec_q6_k_id_add_short";
    MatvecIdF32 => Matvec, "matvec_f32_id";
    MatvecIdF16 => Matvec, "matvec_f16_id";
    MatvecF32 => Matvec, "matvec_f32";
    MatvecF16 => Matvec, "matvec_f16";
    DequantF16Q4_0 => Dequant, "dequant_f16_q4_0";
    DequantF16Q4_1 => Dequant, "dequant_f16_q4_1";
    DequantF16Q5_0 => Dequant, "dequant_f16_q5_0";
    DequantF16Q5_1 => Dequant, "dequant_f16_q5_1";
    DequantF16Q8_0 => Dequant, "dequant_f16_q8_0";
    DequantF16Q2_K => Dequant, "dequant_f16_q2_k";
    DequantF16Q3_K => Dequant, "dequant_f16_q3_k";
    DequantF16Q4_K => Dequant, "dequant_f16_q4_k";
    DequantF16Q5_K => Dequant, "dequant_f16_q5_k";
    DequantF16Q6_K => Dequant, "dequant_f16_q6_k";
    GetRowsQ4_0 => Dequant, "get_rows_q4_0";
    GetRowsQ4_1 => Dequant, "get_rows_q4_1";
    GetRowsQ5_0 => Dequant, "get_rows_q5_0";
    GetRowsQ5_1 => Dequant, "get_rows_q5_1";
    GetRowsQ8_0 => Dequant, "get_rows_q8_0";
    GetRowsQ2_K => Dequant, "get_rows_q2_k";
    GetRowsQ3_K => Dequant, "get_rows_q3_k";
    GetRowsQ4_K => Dequant, "get_rows_q4_k";
    GetRowsQ5_K => Dequant, "get_rows_q5_k";
    GetRowsQ6_K => Dequant, "get_rows_q6_k";
    DequantF16Mxfp4 => Dequant, "dequant_f16_mxfp4";
    GetRowsMxfp4 => Dequant, "get_rows_mxfp4";
    GetRowsF32 => Dequant, "get_rows_f32";
    GetRowsF16 => Dequant, "get_rows_f16";
    ConvertF32F16 => Dequant, "convert_f32_f16";
    ConvertF16F32 => Dequant, "convert_f16_f32";
    RmsNormF32 => Ops, "rms_norm_f32";
    RmsNormQ8F32 => Ops, "rms_norm_q8_f32";
    RmsNormQ8SplitF32 => Ops, "rms_norm_q8_split_f32";
    RmsNormAddF32 => Ops, "rms_norm_add_f32";
    RmsNorm2F32 => Ops, "rms_norm2_f32";
    RopeF32 => Ops, "rope_f32";
    Rope2F32 => Ops, "rope2_f32";
    SoftmaxF32 => Ops, "softmax_f32";
    ActF32 => Ops, "act_f32";
    BinaryF32 => Ops, "binary_f32";
    ScaleF32 => Ops, "scale_f32";
    KvWriteF16 => Ops, "kv_write_f16";
    KvWriteF32 => Ops, "kv_write_f32";
    SetRowsF16 => Ops, "set_rows_f16";
    SetRowsF32 => Ops, "set_rows_f32";
    SetRowsQ8_0 => Ops, "set_rows_q8_0";
    SetRows2F16 => Ops, "set_rows2_f16";
    SetRows2F32 => Ops, "set_rows2_f32";
    RopeKvF16 => Ops, "rope_kv_f16";
    RopeKvF32 => Ops, "rope_kv_f32";
    NormRopeKvF16 => Ops, "norm_rope_kv_f16";
    NormRopeKvF32 => Ops, "norm_rope_kv_f32";
    ArgTopKF32 => Ops, "arg_top_k_f32";
    ExpertWeightsF32 => Ops, "expert_weights_f32";
    SwigluOaiF32 => Ops, "swiglu_oai_f32";
    MoeSumF32 => Ops, "moe_sum_f32";
    MoeRouteF32 => Ops, "moe_route_f32";
    ArgmaxF32 => Ops, "argmax_f32";
    AttnF16 => Attention, "attn_f16";
    AttnF32 => Attention, "attn_f32";
    AttnQ8_0 => Attention, "attn_q8_0";
    AttnDecF16 => Attention, "attn_dec_f16";
    AttnDecF32 => Attention, "attn_dec_f32";
    AttnCombineF32 => Attention, "attn_combine_f32";
    AttnQF16 => Attention, "attn_q_f16";
    AttnSoftmaxF16 => Attention, "attn_softmax_f16";
    PagedAttnF16 => Attention, "paged_attn_f16";
    PagedAttnF32 => Attention, "paged_attn_f32";
    PagedAttnQ8_0 => Attention, "paged_attn_q8_0";
    MmqQ4_0x16 => Mmq, "mmq_q4_0_16";
    MmqQ4_0x32 => Mmq, "mmq_q4_0_32";
    MmqQ4_0x64 => Mmq, "mmq_q4_0_64";
    MmqQ4_0x128 => Mmq, "mmq_q4_0_128";
    MmqQ4_1x16 => Mmq, "mmq_q4_1_16";
    MmqQ4_1x32 => Mmq, "mmq_q4_1_32";
    MmqQ4_1x64 => Mmq, "mmq_q4_1_64";
    MmqQ4_1x128 => Mmq, "mmq_q4_1_128";
    MmqQ5_0x16 => Mmq, "mmq_q5_0_16";
    MmqQ5_0x32 => Mmq, "mmq_q5_0_32";
    MmqQ5_0x64 => Mmq, "mmq_q5_0_64";
    MmqQ5_0x128 => Mmq, "mmq_q5_0_128";
    MmqQ5_1x16 => Mmq, "mmq_q5_1_16";
    MmqQ5_1x32 => Mmq, "mmq_q5_1_32";
    MmqQ5_1x64 => Mmq, "mmq_q5_1_64";
    MmqQ5_1x128 => Mmq, "mmq_q5_1_128";
    MmqQ8_0x16 => Mmq, "mmq_q8_0_16";
    MmqQ8_0x32 => Mmq, "mmq_q8_0_32";
    MmqQ8_0x64 => Mmq, "mmq_q8_0_64";
    MmqQ8_0x128 => Mmq, "mmq_q8_0_128";
    MmqQ2_Kx16 => Mmq, "mmq_q2_k_16";
    MmqQ2_Kx32 => Mmq, "mmq_q2_k_32";
    MmqQ2_Kx64 => Mmq, "mmq_q2_k_64";
    MmqQ2_Kx128 => Mmq, "mmq_q2_k_128";
    MmqQ3_Kx16 => Mmq, "mmq_q3_k_16";
    MmqQ3_Kx32 => Mmq, "mmq_q3_k_32";
    MmqQ3_Kx64 => Mmq, "mmq_q3_k_64";
    MmqQ3_Kx128 => Mmq, "mmq_q3_k_128";
    MmqQ4_Kx16 => Mmq, "mmq_q4_k_16";
    MmqQ4_Kx32 => Mmq, "mmq_q4_k_32";
    MmqQ4_Kx64 => Mmq, "mmq_q4_k_64";
    MmqQ4_Kx128 => Mmq, "mmq_q4_k_128";
    MmqQ5_Kx16 => Mmq, "mmq_q5_k_16";
    MmqQ5_Kx32 => Mmq, "mmq_q5_k_32";
    MmqQ5_Kx64 => Mmq, "mmq_q5_k_64";
    MmqQ5_Kx128 => Mmq, "mmq_q5_k_128";
    MmqQ6_Kx16 => Mmq, "mmq_q6_k_16";
    MmqQ6_Kx32 => Mmq, "mmq_q6_k_32";
    MmqQ6_Kx64 => Mmq, "mmq_q6_k_64";
    MmqQ6_Kx128 => Mmq, "mmq_q6_k_128";
    MmqCombine => Mmq, "mmq_combine";
    MmqIdQ4_0x16 => Mmq, "mmq_id_q4_0_16";
    MmqIdQ4_0x32 => Mmq, "mmq_id_q4_0_32";
    MmqIdQ4_0x64 => Mmq, "mmq_id_q4_0_64";
    MmqIdQ4_1x16 => Mmq, "mmq_id_q4_1_16";
    MmqIdQ4_1x32 => Mmq, "mmq_id_q4_1_32";
    MmqIdQ4_1x64 => Mmq, "mmq_id_q4_1_64";
    MmqIdQ5_0x16 => Mmq, "mmq_id_q5_0_16";
    MmqIdQ5_0x32 => Mmq, "mmq_id_q5_0_32";
    MmqIdQ5_0x64 => Mmq, "mmq_id_q5_0_64";
    MmqIdQ5_1x16 => Mmq, "mmq_id_q5_1_16";
    MmqIdQ5_1x32 => Mmq, "mmq_id_q5_1_32";
    MmqIdQ5_1x64 => Mmq, "mmq_id_q5_1_64";
    MmqIdQ8_0x16 => Mmq, "mmq_id_q8_0_16";
    MmqIdQ8_0x32 => Mmq, "mmq_id_q8_0_32";
    MmqIdQ8_0x64 => Mmq, "mmq_id_q8_0_64";
    MmqIdQ2_Kx16 => Mmq, "mmq_id_q2_k_16";
    MmqIdQ2_Kx32 => Mmq, "mmq_id_q2_k_32";
    MmqIdQ2_Kx64 => Mmq, "mmq_id_q2_k_64";
    MmqIdQ3_Kx16 => Mmq, "mmq_id_q3_k_16";
    MmqIdQ3_Kx32 => Mmq, "mmq_id_q3_k_32";
    MmqIdQ3_Kx64 => Mmq, "mmq_id_q3_k_64";
    MmqIdQ4_Kx16 => Mmq, "mmq_id_q4_k_16";
    MmqIdQ4_Kx32 => Mmq, "mmq_id_q4_k_32";
    MmqIdQ4_Kx64 => Mmq, "mmq_id_q4_k_64";
    MmqIdQ5_Kx16 => Mmq, "mmq_id_q5_k_16";
    MmqIdQ5_Kx32 => Mmq, "mmq_id_q5_k_32";
    MmqIdQ5_Kx64 => Mmq, "mmq_id_q5_k_64";
    MmqIdQ6_Kx16 => Mmq, "mmq_id_q6_k_16";
    MmqIdQ6_Kx32 => Mmq, "mmq_id_q6_k_32";
    MmqIdQ6_Kx64 => Mmq, "mmq_id_q6_k_64";
    MmqIdMxfp4x16 => Mmq, "mmq_id_mxfp4_16";
    MmqIdMxfp4x32 => Mmq, "mmq_id_mxfp4_32";
    MmqIdMxfp4x64 => Mmq, "mmq_id_mxfp4_64";
    MoeGroup => Mmq, "moe_group";
    GemmF32Part => Mmq, "gemm_f32_part";
    PagedDecF16H4 => Attention, "paged_dec_f16_h4";
    PagedDecF16H8 => Attention, "paged_dec_f16_h8";
    PagedDecF32H4 => Attention, "paged_dec_f32_h4";
    PagedDecF32H8 => Attention, "paged_dec_f32_h8";
    PagedCombineF32 => Attention, "paged_combine_f32";
    AllReducePeerF32 => AllReduce, "all_reduce_peer_f32";
}

fn params_of(k: KernelId) -> &'static [Param] {
    use KernelId as K;
    use Param::{Attn, Peer, Ptr, Stack, F32, I32, I64};
    match k {
        K::AllReducePeerF32 => &[Ptr, I32, Peer],
        K::DecodeStack
        | K::DecodeStackPortable
        | K::DecodeStackSplit
        | K::DecodeStackQkv
        | K::DecodeStackPortableQkv => &[Stack],
        K::QuantizeQ8_1 => &[Ptr, Ptr, I32, I64],
        K::HeadQ6_K
        | K::MatvecQ4_0
        | K::MatvecQ4_1
        | K::MatvecQ5_0
        | K::MatvecQ5_1
        | K::MatvecQ8_0
        | K::MatvecQ2_K
        | K::MatvecQ3_K
        | K::MatvecQ4_K
        | K::MatvecQ5_K
        | K::MatvecQ6_K
        | K::MatvecMxfp4 => &[Ptr, Ptr, Ptr, I32, I64, I32, I32],
        K::MatvecIdQ4_0
        | K::MatvecIdQ4_1
        | K::MatvecIdQ5_0
        | K::MatvecIdQ5_1
        | K::MatvecIdQ8_0
        | K::MatvecIdQ2_K
        | K::MatvecIdQ3_K
        | K::MatvecIdQ4_K
        | K::MatvecIdQ5_K
        | K::MatvecIdQ6_K
        | K::MatvecIdMxfp4
        | K::MatvecIdShortQ2_K
        | K::MatvecIdShortQ3_K
        | K::MatvecIdShortQ4_K
        | K::MatvecIdShortQ5_K
        | K::MatvecIdShortQ6_K
        | K::MatvecIdF32
        | K::MatvecIdF16 => &[Ptr, Ptr, Ptr, Ptr, I32, I64, I64, I32, I32, I32, I32],
        K::MatvecIdAddQ4_0
        | K::MatvecIdAddQ4_1
        | K::MatvecIdAddQ5_0
        | K::MatvecIdAddQ5_1
        | K::MatvecIdAddQ8_0
        | K::MatvecIdAddQ2_K
        | K::MatvecIdAddQ3_K
        | K::MatvecIdAddQ4_K
        | K::MatvecIdAddQ5_K
        | K::MatvecIdAddQ6_K
        | K::MatvecIdAddMxfp4
        | K::MatvecIdAddShortQ2_K
        | K::MatvecIdAddShortQ3_K
        | K::MatvecIdAddShortQ4_K
        | K::MatvecIdAddShortQ5_K
        | K::MatvecIdAddShortQ6_K => &[Ptr, Ptr, Ptr, Ptr, Ptr, I32, I64, I64, I32, I32, I32, I32],
        K::MatvecIdGatedQ4_0
        | K::MatvecIdGatedQ4_1
        | K::MatvecIdGatedQ5_0
        | K::MatvecIdGatedQ5_1
        | K::MatvecIdGatedQ8_0
        | K::MatvecIdGatedQ2_K
        | K::MatvecIdGatedQ3_K
        | K::MatvecIdGatedQ4_K
        | K::MatvecIdGatedQ5_K
        | K::MatvecIdGatedQ6_K => &[
            Ptr, Ptr, Ptr, Ptr, Ptr, I32, I64, I64, I32, I32, I32, I32, I32,
        ],
        K::MatvecGatedQ4_0
        | K::MatvecGatedQ5_0
        | K::MatvecGatedQ8_0
        | K::MatvecGatedQ4_K
        | K::MatvecGatedQ5_K
        | K::MatvecGatedQ6_K
        | K::MatvecGatedQ2_K
        | K::MatvecGatedQ3_K
        | K::MatvecGatedQ4_1
        | K::MatvecGatedQ5_1 => &[Ptr, Ptr, Ptr, Ptr, I32, I64, I32, I32, I32],
        K::MatvecMultiQ4_0
        | K::MatvecMultiQ5_0
        | K::MatvecMultiQ8_0
        | K::MatvecMultiQ4_K
        | K::MatvecMultiQ5_K
        | K::MatvecMultiQ6_K
        | K::MatvecMultiQ2_K
        | K::MatvecMultiQ3_K
        | K::MatvecMultiQ4_1
        | K::MatvecMultiQ5_1 => &[Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, I32, I64, I32, I32, I32],
        K::MatvecQ4_KC2 | K::MatvecQ4_KC4 | K::MatvecQ6_KC2 | K::MatvecQ6_KC4 => {
            &[Ptr, Ptr, Ptr, I32, I64, I32, I32, I32]
        }
        K::MatvecAddQ4_KC2 | K::MatvecAddQ4_KC4 | K::MatvecAddQ6_KC2 | K::MatvecAddQ6_KC4 => {
            &[Ptr, Ptr, Ptr, Ptr, I32, I64, I32, I32, I32]
        }
        K::MatvecGatedQ4_KC2
        | K::MatvecGatedQ4_KC4
        | K::MatvecGatedQ6_KC2
        | K::MatvecGatedQ6_KC4 => &[Ptr, Ptr, Ptr, Ptr, I32, I64, I32, I32, I32, I32],
        K::MatvecMultiQ4_KQ6_K => &[
            Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, I32, I64, I64, I32, I32, I32,
        ],
        // The multi kernels' arguments, then yq, yk, pos, head_dim, n_dims, base, freq_scale,
        // freq_factors, ext_factor, mscale, corr_lo, corr_hi, kc, kc_stride, vc, vc_stride, idx.
        K::MatvecRopeKvQ4_K => &[
            Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, I32, I64, I32, I32, I32, Ptr, Ptr, Ptr, I32, I32,
            F32, F32, Ptr, F32, F32, F32, F32, Ptr, I64, Ptr, I64, Ptr,
        ],
        K::MatvecRopeKvQ4_KQ6_K => &[
            Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, I32, I64, I64, I32, I32, I32, Ptr, Ptr, Ptr, I32,
            I32, F32, F32, Ptr, F32, F32, F32, F32, Ptr, I64, Ptr, I64, Ptr,
        ],
        K::MatvecKsQ4_0
        | K::MatvecKsQ5_0
        | K::MatvecKsQ8_0
        | K::MatvecKsQ4_K
        | K::MatvecKsQ5_K
        | K::MatvecKsQ6_K
        | K::MatvecKsQ2_K
        | K::MatvecKsQ3_K
        | K::MatvecKsQ4_1
        | K::MatvecKsQ5_1 => &[Ptr, Ptr, Ptr, I32, I64, I32, I32],
        K::MatvecAddQ4_0
        | K::MatvecKsAddQ4_0
        | K::MatvecAddQ5_0
        | K::MatvecKsAddQ5_0
        | K::MatvecAddQ8_0
        | K::MatvecKsAddQ8_0
        | K::MatvecAddQ4_K
        | K::MatvecKsAddQ4_K
        | K::MatvecAddQ5_K
        | K::MatvecKsAddQ5_K
        | K::MatvecAddQ6_K
        | K::MatvecKsAddQ6_K
        | K::MatvecAddQ2_K
        | K::MatvecKsAddQ2_K
        | K::MatvecAddQ3_K
        | K::MatvecKsAddQ3_K
        | K::MatvecAddQ4_1
        | K::MatvecKsAddQ4_1
        | K::MatvecAddQ5_1
        | K::MatvecKsAddQ5_1 => &[Ptr, Ptr, Ptr, Ptr, I32, I64, I32, I32],
        K::MatvecF32 | K::MatvecF16 => &[Ptr, Ptr, Ptr, I32, I64, I32],
        K::DequantF16Q4_0
        | K::DequantF16Q4_1
        | K::DequantF16Q5_0
        | K::DequantF16Q5_1
        | K::DequantF16Q8_0
        | K::DequantF16Q2_K
        | K::DequantF16Q3_K
        | K::DequantF16Q4_K
        | K::DequantF16Q5_K
        | K::DequantF16Q6_K
        | K::DequantF16Mxfp4 => &[Ptr, Ptr, I32, I64, I64],
        K::GetRowsQ4_0
        | K::GetRowsQ4_1
        | K::GetRowsQ5_0
        | K::GetRowsQ5_1
        | K::GetRowsQ8_0
        | K::GetRowsQ2_K
        | K::GetRowsQ3_K
        | K::GetRowsQ4_K
        | K::GetRowsQ5_K
        | K::GetRowsQ6_K
        | K::GetRowsMxfp4
        | K::GetRowsF32
        | K::GetRowsF16 => &[Ptr, Ptr, Ptr, I32, I64, I64],
        K::ConvertF32F16 | K::ConvertF16F32 => &[Ptr, Ptr, I64],
        K::RmsNormF32 => &[Ptr, Ptr, Ptr, I32, I64, I64, F32],
        K::RmsNormQ8F32 | K::RmsNormQ8SplitF32 => &[Ptr, Ptr, Ptr, Ptr, I32, I64, I64, F32],
        K::RmsNormAddF32 => &[
            Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, I32, I64, I64, F32, F32,
        ],
        K::RmsNorm2F32 => &[Ptr, Ptr, Ptr, I64, I32, Ptr, Ptr, Ptr, I64, I32, F32],
        K::RopeF32 => &[
            Ptr, Ptr, Ptr, I32, I32, I32, I64, I64, F32, F32, Ptr, I32, I32, F32, F32, F32, F32,
        ],
        K::Rope2F32 => &[
            Ptr, Ptr, I32, I64, I32, Ptr, Ptr, I32, I64, I32, Ptr, I32, I32, F32, F32, Ptr, I32,
            F32, F32, F32, F32,
        ],
        K::RopeKvF16 | K::RopeKvF32 => &[
            Ptr, Ptr, I32, I64, I32, Ptr, Ptr, I32, I64, I32, Ptr, I32, I32, F32, F32, Ptr, I32,
            F32, F32, F32, F32, Ptr, I64, Ptr, I32, I64, Ptr, I64, Ptr,
        ],
        K::NormRopeKvF16 | K::NormRopeKvF32 => &[
            Ptr, Ptr, Ptr, Ptr, I64, I32, I32, Ptr, Ptr, Ptr, Ptr, I64, I32, I32, F32, Ptr, I32,
            I32, F32, F32, Ptr, I32, F32, F32, F32, F32, Ptr, I64, Ptr, I32, I64, Ptr, I64, Ptr,
        ],
        K::SetRows2F16 | K::SetRows2F32 => {
            &[Ptr, Ptr, I32, I64, I64, Ptr, Ptr, I32, I64, I64, Ptr, I32]
        }
        K::SoftmaxF32 => &[Ptr, Ptr, Ptr, I32, I64, I64, I64, I32, F32],
        K::ActF32 => &[Ptr, Ptr, Ptr, I32, I32, I64, I64, I64, I32],
        K::BinaryF32 => &[Ptr, Ptr, Ptr, I32, I32, I64, I64, I64, I32, I32, I32],
        K::ScaleF32 => &[Ptr, Ptr, I64, F32, F32],
        K::KvWriteF16 | K::KvWriteF32 => &[Ptr, Ptr, I32, I32, I32, I64, I32, I64, I64],
        K::SetRowsF16 | K::SetRowsF32 | K::SetRowsQ8_0 => &[Ptr, Ptr, Ptr, I32, I32, I64, I64],
        K::ArgmaxF32 => &[Ptr, Ptr, I32, I64],
        K::ArgTopKF32 => &[Ptr, Ptr, I32, I32, I64],
        K::ExpertWeightsF32 => &[Ptr, Ptr, Ptr, I32, I32, I64, I32],
        K::SwigluOaiF32 => &[Ptr, Ptr, Ptr, I32, I32, I64, I64, I64, F32, F32],
        K::MoeSumF32 => &[Ptr, Ptr, Ptr, Ptr, I32, I32, I32, I64, I64, I64, I64, I64],
        K::MoeRouteF32 => &[Ptr, Ptr, Ptr, Ptr, I32, I32, I64, F32, I32, I32],
        K::AttnF16 | K::AttnF32 | K::AttnQ8_0 => &[Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Attn],
        K::AttnDecF16 | K::AttnDecF32 => &[Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Attn],
        K::AttnCombineF32 => &[Ptr, Ptr, I32, I32, I32, I32, I64, I64],
        K::AttnQF16 => &[Ptr, Ptr, I32, I32, I32, I32, I64, I64],
        K::AttnSoftmaxF16 => &[Ptr, Ptr, Ptr, I32, I32, I32, I32, I32, Ptr, I32, I32],
        K::MmqQ4_0x16
        | K::MmqQ4_0x32
        | K::MmqQ4_0x64
        | K::MmqQ4_0x128
        | K::MmqQ4_1x16
        | K::MmqQ4_1x32
        | K::MmqQ4_1x64
        | K::MmqQ4_1x128
        | K::MmqQ5_0x16
        | K::MmqQ5_0x32
        | K::MmqQ5_0x64
        | K::MmqQ5_0x128
        | K::MmqQ5_1x16
        | K::MmqQ5_1x32
        | K::MmqQ5_1x64
        | K::MmqQ5_1x128
        | K::MmqQ8_0x16
        | K::MmqQ8_0x32
        | K::MmqQ8_0x64
        | K::MmqQ8_0x128
        | K::MmqQ2_Kx16
        | K::MmqQ2_Kx32
        | K::MmqQ2_Kx64
        | K::MmqQ2_Kx128
        | K::MmqQ3_Kx16
        | K::MmqQ3_Kx32
        | K::MmqQ3_Kx64
        | K::MmqQ3_Kx128
        | K::MmqQ4_Kx16
        | K::MmqQ4_Kx32
        | K::MmqQ4_Kx64
        | K::MmqQ4_Kx128
        | K::MmqQ5_Kx16
        | K::MmqQ5_Kx32
        | K::MmqQ5_Kx64
        | K::MmqQ5_Kx128
        | K::MmqQ6_Kx16
        | K::MmqQ6_Kx32
        | K::MmqQ6_Kx64
        | K::MmqQ6_Kx128 => &[Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, I32, I64, I32, I32, I32, I32],
        K::MmqCombine => &[Ptr, Ptr, Ptr, I32, I32, I32, I32, I32, I32],
        K::MmqIdQ4_0x16
        | K::MmqIdQ4_0x32
        | K::MmqIdQ4_0x64
        | K::MmqIdQ4_1x16
        | K::MmqIdQ4_1x32
        | K::MmqIdQ4_1x64
        | K::MmqIdQ5_0x16
        | K::MmqIdQ5_0x32
        | K::MmqIdQ5_0x64
        | K::MmqIdQ5_1x16
        | K::MmqIdQ5_1x32
        | K::MmqIdQ5_1x64
        | K::MmqIdQ8_0x16
        | K::MmqIdQ8_0x32
        | K::MmqIdQ8_0x64
        | K::MmqIdQ2_Kx16
        | K::MmqIdQ2_Kx32
        | K::MmqIdQ2_Kx64
        | K::MmqIdQ3_Kx16
        | K::MmqIdQ3_Kx32
        | K::MmqIdQ3_Kx64
        | K::MmqIdQ4_Kx16
        | K::MmqIdQ4_Kx32
        | K::MmqIdQ4_Kx64
        | K::MmqIdQ5_Kx16
        | K::MmqIdQ5_Kx32
        | K::MmqIdQ5_Kx64
        | K::MmqIdQ6_Kx16
        | K::MmqIdQ6_Kx32
        | K::MmqIdQ6_Kx64
        | K::MmqIdMxfp4x16
        | K::MmqIdMxfp4x32
        | K::MmqIdMxfp4x64 => &[
            Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, I32, I64, I64, I32, I32, I32, I32, I32,
        ],
        K::MoeGroup => &[Ptr, Ptr, Ptr, Ptr, Ptr, I32, I32, I32, I32],
        K::GemmF32Part => &[Ptr, Ptr, Ptr, I32, I64, I64, I32, I32, I32],
        K::PagedAttnF16 | K::PagedAttnF32 | K::PagedAttnQ8_0 => {
            &[Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, I32, I32, Attn]
        }
        K::PagedDecF16H4 | K::PagedDecF16H8 | K::PagedDecF32H4 | K::PagedDecF32H8 => &[
            Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, I32, I32, I32, Attn,
        ],
        K::PagedCombineF32 => &[Ptr, Ptr, I32, I32, I32, I32, I64, I64, Ptr],
    }
}
