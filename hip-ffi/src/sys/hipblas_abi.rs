//! hipBLAS's `*GemmEx` type constants per ABI generation, which no single header describes: the
//! generated table ([`super::hipblas`], from hipBLAS 2.x's headers) declares those parameters with
//! `hipblasDatatype_t`, and every generation passes them as a C `int`.
//!
//! hipBLAS changed the data-type ABI at major version 3 (ROCm 7): before it, data and compute
//! types are `hipblasDatatype_t` (150..); from it, `hipDataType` (CUDA's values) and
//! `hipblasComputeType_t`. The provider picks the constants by the loaded library's soname.

use super::hipblas::hipblasDatatype_t::{self, Type};

/// Data/compute type constants of one `*GemmEx` ABI generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GemmAbi {
    pub r_32f: Type,
    pub r_16f: Type,
    pub r_16bf: Type,
    pub compute_32f: Type,
}

/// hipBLAS 0.x-2.x (`hipblasDatatype_t`; the compute type is a data type too).
pub const GEMM_ABI_V1: GemmAbi = GemmAbi {
    r_32f: hipblasDatatype_t::HIPBLAS_R_32F,
    r_16f: hipblasDatatype_t::HIPBLAS_R_16F,
    r_16bf: hipblasDatatype_t::HIPBLAS_R_16B,
    compute_32f: hipblasDatatype_t::HIPBLAS_R_32F,
};

/// hipBLAS 3.x (`hipDataType`: `HIP_R_32F` 0, `HIP_R_16F` 2, `HIP_R_16BF` 14; and
/// `hipblasComputeType_t`: `HIPBLAS_COMPUTE_32F` 2).
pub const GEMM_ABI_V2: GemmAbi = GemmAbi {
    r_32f: 0,
    r_16f: 2,
    r_16bf: 14,
    compute_32f: 2,
};
