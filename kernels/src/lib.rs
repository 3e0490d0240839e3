//! `kernels`: rocmforge's HIP C++ kernels, one source for AMD and NVIDIA, embedded as code objects
//! when `cargo xtask kernels` has built them.
