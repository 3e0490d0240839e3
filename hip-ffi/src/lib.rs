//! `hip-ffi`: raw HIP and hipBLAS bindings loaded at run time, with an AMD provider (the HIP
//! runtime) and an NVIDIA provider (HIP's CUDA platform over the driver API and cuBLAS); the
//! lowest GPU layer of rocmforge.
