//! The hipBLAS function table, written by hand: Debian 12 ships no hipBLAS headers, so bindgen has
//! nothing to read. It declares only the calls hip-ffi makes, with the C types of hipBLAS's public
//! header; the enum values are the documented ABI of each hipBLAS major version.
//!
//! hipBLAS changed the `*GemmEx` data-type ABI at major version 3 (ROCm 7): before it, data and
//! compute types are `hipblasDatatype_t` (150..); from it, `hipDataType` (CUDA's values) and
//! `hipblasComputeType_t`. The call shapes are identical (every enum is a C `int`), so one table
//! serves both and the caller picks the constants with [`GemmAbi`].

use std::os::raw::{c_int, c_void};

pub type hipblasHandle_t = *mut c_void;
pub type hipblasStatus_t = c_int;
pub type hipblasOperation_t = c_int;
pub type hipblasPointerMode_t = c_int;
/// `hipblasDatatype_t` (v1) or `hipDataType` (v2), see [`GemmAbi`].
pub type hipblasDatatype_t = c_int;
/// The compute-type argument: `hipblasDatatype_t` (v1) or `hipblasComputeType_t` (v2).
pub type hipblasComputeType_t = c_int;
pub type hipblasGemmAlgo_t = c_int;
pub type hipblasStride = i64;
/// `hipStream_t` as hipBLAS sees it.
pub type hipStream_t = *mut c_void;

pub const HIPBLAS_STATUS_SUCCESS: hipblasStatus_t = 0;
pub const HIPBLAS_STATUS_NOT_INITIALIZED: hipblasStatus_t = 1;
pub const HIPBLAS_STATUS_ALLOC_FAILED: hipblasStatus_t = 2;
pub const HIPBLAS_STATUS_INVALID_VALUE: hipblasStatus_t = 3;
pub const HIPBLAS_STATUS_MAPPING_ERROR: hipblasStatus_t = 4;
pub const HIPBLAS_STATUS_EXECUTION_FAILED: hipblasStatus_t = 5;
pub const HIPBLAS_STATUS_INTERNAL_ERROR: hipblasStatus_t = 6;
pub const HIPBLAS_STATUS_NOT_SUPPORTED: hipblasStatus_t = 7;
pub const HIPBLAS_STATUS_ARCH_MISMATCH: hipblasStatus_t = 8;
pub const HIPBLAS_STATUS_HANDLE_IS_NULLPTR: hipblasStatus_t = 9;
pub const HIPBLAS_STATUS_INVALID_ENUM: hipblasStatus_t = 10;
pub const HIPBLAS_STATUS_UNKNOWN: hipblasStatus_t = 11;

pub const HIPBLAS_OP_N: hipblasOperation_t = 111;
pub const HIPBLAS_OP_T: hipblasOperation_t = 112;
pub const HIPBLAS_OP_C: hipblasOperation_t = 113;

pub const HIPBLAS_POINTER_MODE_HOST: hipblasPointerMode_t = 0;
pub const HIPBLAS_POINTER_MODE_DEVICE: hipblasPointerMode_t = 1;

pub const HIPBLAS_GEMM_DEFAULT: hipblasGemmAlgo_t = 160;

/// Data/compute type constants of one `*GemmEx` ABI generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GemmAbi {
    pub r_32f: hipblasDatatype_t,
    pub r_16f: hipblasDatatype_t,
    pub r_16bf: hipblasDatatype_t,
    pub compute_32f: hipblasComputeType_t,
}

/// hipBLAS 0.x-2.x (`hipblasDatatype_t`; the compute type is a data type too).
pub const GEMM_ABI_V1: GemmAbi = GemmAbi {
    r_32f: 151,
    r_16f: 150,
    r_16bf: 168,
    compute_32f: 151,
};

/// hipBLAS 3.x (`hipDataType` + `hipblasComputeType_t`).
pub const GEMM_ABI_V2: GemmAbi = GemmAbi {
    r_32f: 0,
    r_16f: 2,
    r_16bf: 14,
    compute_32f: 2,
};

/// The hipBLAS entry points hip-ffi uses, resolved from a loaded library.
pub struct HipblasLib {
    _library: libloading::Library,
    pub hipblasCreate: unsafe extern "C" fn(handle: *mut hipblasHandle_t) -> hipblasStatus_t,
    pub hipblasDestroy: unsafe extern "C" fn(handle: hipblasHandle_t) -> hipblasStatus_t,
    pub hipblasSetStream:
        unsafe extern "C" fn(handle: hipblasHandle_t, stream: hipStream_t) -> hipblasStatus_t,
    pub hipblasSetPointerMode: unsafe extern "C" fn(
        handle: hipblasHandle_t,
        mode: hipblasPointerMode_t,
    ) -> hipblasStatus_t,
    pub hipblasSgemm: unsafe extern "C" fn(
        handle: hipblasHandle_t,
        trans_a: hipblasOperation_t,
        trans_b: hipblasOperation_t,
        m: c_int,
        n: c_int,
        k: c_int,
        alpha: *const f32,
        a: *const f32,
        lda: c_int,
        b: *const f32,
        ldb: c_int,
        beta: *const f32,
        c: *mut f32,
        ldc: c_int,
    ) -> hipblasStatus_t,
    pub hipblasGemmEx: unsafe extern "C" fn(
        handle: hipblasHandle_t,
        trans_a: hipblasOperation_t,
        trans_b: hipblasOperation_t,
        m: c_int,
        n: c_int,
        k: c_int,
        alpha: *const c_void,
        a: *const c_void,
        a_type: hipblasDatatype_t,
        lda: c_int,
        b: *const c_void,
        b_type: hipblasDatatype_t,
        ldb: c_int,
        beta: *const c_void,
        c: *mut c_void,
        c_type: hipblasDatatype_t,
        ldc: c_int,
        compute_type: hipblasComputeType_t,
        algo: hipblasGemmAlgo_t,
    ) -> hipblasStatus_t,
    pub hipblasGemmStridedBatchedEx: unsafe extern "C" fn(
        handle: hipblasHandle_t,
        trans_a: hipblasOperation_t,
        trans_b: hipblasOperation_t,
        m: c_int,
        n: c_int,
        k: c_int,
        alpha: *const c_void,
        a: *const c_void,
        a_type: hipblasDatatype_t,
        lda: c_int,
        stride_a: hipblasStride,
        b: *const c_void,
        b_type: hipblasDatatype_t,
        ldb: c_int,
        stride_b: hipblasStride,
        beta: *const c_void,
        c: *mut c_void,
        c_type: hipblasDatatype_t,
        ldc: c_int,
        stride_c: hipblasStride,
        batch_count: c_int,
        compute_type: hipblasComputeType_t,
        algo: hipblasGemmAlgo_t,
    ) -> hipblasStatus_t,
}

impl HipblasLib {
    /// Resolves every entry point from `library`.
    ///
    /// # Safety
    /// `library` must be a hipBLAS build whose exported symbols have the C signatures declared
    /// above (every hipBLAS release so far does).
    pub unsafe fn from_library(library: libloading::Library) -> Result<Self, libloading::Error> {
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the caller guarantees the symbol has the declared signature.
                *unsafe { library.get(concat!($name, "\0").as_bytes()) }?
            };
        }
        Ok(Self {
            hipblasCreate: sym!("hipblasCreate"),
            hipblasDestroy: sym!("hipblasDestroy"),
            hipblasSetStream: sym!("hipblasSetStream"),
            hipblasSetPointerMode: sym!("hipblasSetPointerMode"),
            hipblasSgemm: sym!("hipblasSgemm"),
            hipblasGemmEx: sym!("hipblasGemmEx"),
            hipblasGemmStridedBatchedEx: sym!("hipblasGemmStridedBatchedEx"),
            _library: library,
        })
    }
}
