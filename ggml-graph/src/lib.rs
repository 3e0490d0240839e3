//! `ggml-graph`: a ggml-style graph IR with optimizer passes, a memory planner and an executor over
//! CPU, HIP and dummy backends; the compute layer of rocmforge, above `gguf`.
