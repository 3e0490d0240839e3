//! `model`: model execution plans, tokenizer, sampling and KV cache, plus the `rocmforge` CLI; the
//! top layer of rocmforge.
