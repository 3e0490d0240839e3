//! `gpu-mem`: the safe GPU memory layer of rocmforge (devices, streams, events, RAII buffers,
//! views, pools, budgets and estimates), built on `hip-ffi`.
