//! How the NVIDIA provider translates: CUDA driver and cuBLAS status codes into HIP's and
//! hipBLAS's, HIP device attributes and hipBLAS enums into CUDA's numbering.

use crate::api::{DeviceAttribute, GemmType, Op};
use crate::sys::cublas::{
    cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cublasStatus_t, cudaDataType_t,
};
use crate::sys::cuda::{cudaError_enum as ce, CUdevice_attribute_enum as ca};
use crate::sys::hip::hipError_t as he;

/// Maps a `CUresult` to the `hipError_t` HIP's CUDA platform reports for it.
pub fn cu_to_hip(status: u32) -> i32 {
    let h = match status {
        ce::CUDA_SUCCESS => he::hipSuccess,
        ce::CUDA_ERROR_INVALID_VALUE => he::hipErrorInvalidValue,
        ce::CUDA_ERROR_OUT_OF_MEMORY => he::hipErrorOutOfMemory,
        ce::CUDA_ERROR_NOT_INITIALIZED => he::hipErrorNotInitialized,
        ce::CUDA_ERROR_DEINITIALIZED => he::hipErrorDeinitialized,
        ce::CUDA_ERROR_PROFILER_DISABLED => he::hipErrorProfilerDisabled,
        ce::CUDA_ERROR_PROFILER_NOT_INITIALIZED => he::hipErrorProfilerNotInitialized,
        ce::CUDA_ERROR_PROFILER_ALREADY_STARTED => he::hipErrorProfilerAlreadyStarted,
        ce::CUDA_ERROR_PROFILER_ALREADY_STOPPED => he::hipErrorProfilerAlreadyStopped,
        ce::CUDA_ERROR_STUB_LIBRARY | ce::CUDA_ERROR_SYSTEM_DRIVER_MISMATCH => {
            he::hipErrorInsufficientDriver
        }
        ce::CUDA_ERROR_NO_DEVICE | ce::CUDA_ERROR_DEVICE_UNAVAILABLE => he::hipErrorNoDevice,
        ce::CUDA_ERROR_INVALID_DEVICE => he::hipErrorInvalidDevice,
        ce::CUDA_ERROR_INVALID_IMAGE => he::hipErrorInvalidImage,
        ce::CUDA_ERROR_INVALID_CONTEXT => he::hipErrorInvalidContext,
        ce::CUDA_ERROR_CONTEXT_ALREADY_CURRENT => he::hipErrorContextAlreadyCurrent,
        ce::CUDA_ERROR_MAP_FAILED => he::hipErrorMapFailed,
        ce::CUDA_ERROR_UNMAP_FAILED => he::hipErrorUnmapFailed,
        ce::CUDA_ERROR_ARRAY_IS_MAPPED => he::hipErrorArrayIsMapped,
        ce::CUDA_ERROR_ALREADY_MAPPED => he::hipErrorAlreadyMapped,
        ce::CUDA_ERROR_NO_BINARY_FOR_GPU => he::hipErrorNoBinaryForGpu,
        ce::CUDA_ERROR_ALREADY_ACQUIRED => he::hipErrorAlreadyAcquired,
        ce::CUDA_ERROR_NOT_MAPPED => he::hipErrorNotMapped,
        ce::CUDA_ERROR_NOT_MAPPED_AS_ARRAY => he::hipErrorNotMappedAsArray,
        ce::CUDA_ERROR_NOT_MAPPED_AS_POINTER => he::hipErrorNotMappedAsPointer,
        ce::CUDA_ERROR_ECC_UNCORRECTABLE => he::hipErrorECCNotCorrectable,
        ce::CUDA_ERROR_UNSUPPORTED_LIMIT => he::hipErrorUnsupportedLimit,
        ce::CUDA_ERROR_CONTEXT_ALREADY_IN_USE => he::hipErrorContextAlreadyInUse,
        ce::CUDA_ERROR_PEER_ACCESS_UNSUPPORTED => he::hipErrorPeerAccessUnsupported,
        ce::CUDA_ERROR_INVALID_PTX
        | ce::CUDA_ERROR_UNSUPPORTED_PTX_VERSION
        | ce::CUDA_ERROR_JIT_COMPILER_NOT_FOUND => he::hipErrorInvalidKernelFile,
        ce::CUDA_ERROR_INVALID_GRAPHICS_CONTEXT => he::hipErrorInvalidGraphicsContext,
        ce::CUDA_ERROR_INVALID_SOURCE => he::hipErrorInvalidSource,
        ce::CUDA_ERROR_FILE_NOT_FOUND => he::hipErrorFileNotFound,
        ce::CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND => he::hipErrorSharedObjectSymbolNotFound,
        ce::CUDA_ERROR_SHARED_OBJECT_INIT_FAILED => he::hipErrorSharedObjectInitFailed,
        ce::CUDA_ERROR_OPERATING_SYSTEM => he::hipErrorOperatingSystem,
        ce::CUDA_ERROR_INVALID_HANDLE => he::hipErrorInvalidHandle,
        ce::CUDA_ERROR_ILLEGAL_STATE => he::hipErrorIllegalState,
        ce::CUDA_ERROR_NOT_FOUND => he::hipErrorNotFound,
        ce::CUDA_ERROR_NOT_READY => he::hipErrorNotReady,
        ce::CUDA_ERROR_ILLEGAL_ADDRESS => he::hipErrorIllegalAddress,
        ce::CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES => he::hipErrorLaunchOutOfResources,
        ce::CUDA_ERROR_LAUNCH_TIMEOUT => he::hipErrorLaunchTimeOut,
        ce::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => he::hipErrorPeerAccessAlreadyEnabled,
        ce::CUDA_ERROR_PEER_ACCESS_NOT_ENABLED => he::hipErrorPeerAccessNotEnabled,
        ce::CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE => he::hipErrorSetOnActiveProcess,
        ce::CUDA_ERROR_CONTEXT_IS_DESTROYED => he::hipErrorContextIsDestroyed,
        ce::CUDA_ERROR_ASSERT => he::hipErrorAssert,
        ce::CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED => he::hipErrorHostMemoryAlreadyRegistered,
        ce::CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED => he::hipErrorHostMemoryNotRegistered,
        ce::CUDA_ERROR_LAUNCH_FAILED
        | ce::CUDA_ERROR_HARDWARE_STACK_ERROR
        | ce::CUDA_ERROR_ILLEGAL_INSTRUCTION
        | ce::CUDA_ERROR_MISALIGNED_ADDRESS
        | ce::CUDA_ERROR_INVALID_ADDRESS_SPACE
        | ce::CUDA_ERROR_INVALID_PC => he::hipErrorLaunchFailure,
        ce::CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE => he::hipErrorCooperativeLaunchTooLarge,
        ce::CUDA_ERROR_NOT_SUPPORTED | ce::CUDA_ERROR_NOT_PERMITTED => he::hipErrorNotSupported,
        ce::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED => he::hipErrorStreamCaptureUnsupported,
        ce::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED => he::hipErrorStreamCaptureInvalidated,
        ce::CUDA_ERROR_STREAM_CAPTURE_MERGE => he::hipErrorStreamCaptureMerge,
        ce::CUDA_ERROR_STREAM_CAPTURE_UNMATCHED => he::hipErrorStreamCaptureUnmatched,
        ce::CUDA_ERROR_STREAM_CAPTURE_UNJOINED => he::hipErrorStreamCaptureUnjoined,
        ce::CUDA_ERROR_STREAM_CAPTURE_ISOLATION => he::hipErrorStreamCaptureIsolation,
        ce::CUDA_ERROR_STREAM_CAPTURE_IMPLICIT => he::hipErrorStreamCaptureImplicit,
        ce::CUDA_ERROR_CAPTURED_EVENT => he::hipErrorCapturedEvent,
        ce::CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD => he::hipErrorStreamCaptureWrongThread,
        ce::CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE => he::hipErrorGraphExecUpdateFailure,
        _ => he::hipErrorUnknown,
    };
    h as i32
}

/// Maps a `cublasStatus_t` to the `hipblasStatus_t` hipBLAS reports for it.
pub fn cublas_to_hipblas(status: u32) -> i32 {
    use crate::sys::hipblas::hipblasStatus_t as hb;
    let code = match status {
        cublasStatus_t::CUBLAS_STATUS_SUCCESS => hb::HIPBLAS_STATUS_SUCCESS,
        cublasStatus_t::CUBLAS_STATUS_NOT_INITIALIZED => hb::HIPBLAS_STATUS_NOT_INITIALIZED,
        cublasStatus_t::CUBLAS_STATUS_ALLOC_FAILED => hb::HIPBLAS_STATUS_ALLOC_FAILED,
        cublasStatus_t::CUBLAS_STATUS_INVALID_VALUE => hb::HIPBLAS_STATUS_INVALID_VALUE,
        cublasStatus_t::CUBLAS_STATUS_ARCH_MISMATCH => hb::HIPBLAS_STATUS_ARCH_MISMATCH,
        cublasStatus_t::CUBLAS_STATUS_MAPPING_ERROR => hb::HIPBLAS_STATUS_MAPPING_ERROR,
        cublasStatus_t::CUBLAS_STATUS_EXECUTION_FAILED => hb::HIPBLAS_STATUS_EXECUTION_FAILED,
        cublasStatus_t::CUBLAS_STATUS_INTERNAL_ERROR => hb::HIPBLAS_STATUS_INTERNAL_ERROR,
        cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED => hb::HIPBLAS_STATUS_NOT_SUPPORTED,
        _ => hb::HIPBLAS_STATUS_UNKNOWN,
    };
    // hipBLAS's codes are small enum values: they fit an i32.
    i32::try_from(code).unwrap_or(i32::MAX)
}

pub(super) fn cu_attr(a: DeviceAttribute) -> ca::Type {
    match a {
        DeviceAttribute::MultiprocessorCount => ca::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        DeviceAttribute::WarpSize => ca::CU_DEVICE_ATTRIBUTE_WARP_SIZE,
        DeviceAttribute::MaxThreadsPerBlock => ca::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
        DeviceAttribute::MaxSharedMemoryPerBlock => {
            ca::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK
        }
        DeviceAttribute::ComputeCapabilityMajor => ca::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
        DeviceAttribute::ComputeCapabilityMinor => ca::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
        DeviceAttribute::ClockRateKhz => ca::CU_DEVICE_ATTRIBUTE_CLOCK_RATE,
        DeviceAttribute::MemoryClockRateKhz => ca::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE,
        DeviceAttribute::MemoryBusWidthBits => ca::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH,
        DeviceAttribute::L2CacheBytes => ca::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE,
        DeviceAttribute::PciBusId => ca::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID,
        DeviceAttribute::PciDomainId => ca::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID,
        DeviceAttribute::PciDeviceId => ca::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID,
        DeviceAttribute::Integrated => ca::CU_DEVICE_ATTRIBUTE_INTEGRATED,
        DeviceAttribute::CooperativeLaunch => ca::CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH,
        DeviceAttribute::MaxSharedMemoryPerBlockOptin => {
            ca::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
        }
    }
}

pub(super) fn cu_op(op: Op) -> cublasOperation_t::Type {
    match op {
        Op::N => cublasOperation_t::CUBLAS_OP_N,
        Op::T => cublasOperation_t::CUBLAS_OP_T,
    }
}

/// cuBLAS numbers data types as CUDA's `cudaDataType_t`, not as hipBLAS does.
pub(super) fn cu_type(t: GemmType) -> cudaDataType_t::Type {
    match t {
        GemmType::F32 => cudaDataType_t::CUDA_R_32F,
        GemmType::F16 => cudaDataType_t::CUDA_R_16F,
        GemmType::BF16 => cudaDataType_t::CUDA_R_16BF,
    }
}

pub(super) const COMPUTE_32F: cublasComputeType_t::Type = cublasComputeType_t::CUBLAS_COMPUTE_32F;
pub(super) const GEMM_DEFAULT: cublasGemmAlgo_t::Type = cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::code;

    #[test]
    fn cuda_codes_map_to_hip_codes() {
        assert_eq!(cu_to_hip(ce::CUDA_SUCCESS), code::SUCCESS);
        assert_eq!(cu_to_hip(ce::CUDA_ERROR_OUT_OF_MEMORY), code::OUT_OF_MEMORY);
        assert_eq!(cu_to_hip(ce::CUDA_ERROR_NOT_READY), code::NOT_READY);
        assert_eq!(cu_to_hip(ce::CUDA_ERROR_NO_DEVICE), code::NO_DEVICE);
        assert_eq!(
            cu_to_hip(ce::CUDA_ERROR_INVALID_PTX),
            he::hipErrorInvalidKernelFile as i32
        );
        assert_eq!(
            cu_to_hip(ce::CUDA_ERROR_MISALIGNED_ADDRESS),
            he::hipErrorLaunchFailure as i32
        );
        assert_eq!(
            cu_to_hip(ce::CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE),
            code::COOPERATIVE_LAUNCH_TOO_LARGE
        );
        assert_eq!(cu_to_hip(123_456), code::UNKNOWN);
    }

    #[test]
    fn cublas_codes_map_to_hipblas_codes() {
        use crate::sys::hipblas::hipblasStatus_t as s;
        let hb = |c: s::Type| i32::try_from(c).expect("small code");
        assert_eq!(
            cublas_to_hipblas(cublasStatus_t::CUBLAS_STATUS_SUCCESS),
            hb(s::HIPBLAS_STATUS_SUCCESS)
        );
        assert_eq!(
            cublas_to_hipblas(cublasStatus_t::CUBLAS_STATUS_INVALID_VALUE),
            hb(s::HIPBLAS_STATUS_INVALID_VALUE)
        );
        assert_eq!(
            cublas_to_hipblas(cublasStatus_t::CUBLAS_STATUS_ALLOC_FAILED),
            hb(s::HIPBLAS_STATUS_ALLOC_FAILED)
        );
        assert_eq!(cublas_to_hipblas(9999), hb(s::HIPBLAS_STATUS_UNKNOWN));
    }

    #[test]
    fn new_device_attributes_map_to_the_driver_attributes() {
        assert_eq!(cu_attr(DeviceAttribute::CooperativeLaunch), 95);
        assert_eq!(cu_attr(DeviceAttribute::MaxSharedMemoryPerBlockOptin), 97);
        assert_eq!(cu_attr(DeviceAttribute::MultiprocessorCount), 16);
    }

    #[test]
    fn cublas_enums_differ_from_hipblas_and_are_mapped() {
        use crate::sys::hipblas::hipblasOperation_t::HIPBLAS_OP_N;
        use crate::sys::hipblas_abi::GEMM_ABI_V1;
        // The point of the mapping: the two libraries number the same things differently.
        assert_eq!(cu_op(Op::N), 0);
        assert_ne!(cu_op(Op::N), HIPBLAS_OP_N);
        assert_eq!(cu_type(GemmType::F16), 2);
        assert_eq!(cu_type(GemmType::BF16), 14);
        assert_eq!(cu_type(GemmType::F32), 0);
        assert_eq!(GEMM_ABI_V1.r_16f, 150);
        assert_eq!(COMPUTE_32F, 68);
    }
}
