//! The crate's error type: every failure names the key, tensor, file or limit involved.

use std::path::PathBuf;

/// Everything that can go wrong loading or running a model.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    /// Reading the GGUF file failed.
    #[error(transparent)]
    Gguf(#[from] gguf::GgufError),
    /// Loading the model file failed; `source` says where in it and why.
    #[error("{}: {source}", path.display())]
    InFile {
        /// The model file.
        path: PathBuf,
        /// What went wrong.
        #[source]
        source: Box<ModelError>,
    },
    /// Building or running a compute graph failed.
    #[error("graph: {0}")]
    Graph(#[from] ggml_graph::GraphError),
    /// The vocabulary could not be built from the file's metadata.
    #[error("tokenizer: {0}")]
    Tokenizer(#[from] crate::tokenizer::TokenizerError),
    /// The rendezvous of rank processes at `addr` (`--dist-init`) failed.
    #[error("rendezvous at {addr}: {reason}")]
    Rendezvous {
        /// The address rank 0 listens on.
        addr: String,
        /// What went wrong.
        reason: String,
    },
    /// A required metadata key is absent.
    #[error("metadata key `{0}` is missing")]
    MissingKey(String),
    /// A metadata key holds an unusable value.
    #[error("metadata key `{key}`: {reason}")]
    BadKey {
        /// The key.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
    /// `general.architecture` names an architecture without an execution plan.
    #[error("architecture `{0}` is not supported (supported: llama (also mistral), qwen2, qwen3, gemma2, gemma3)")]
    UnsupportedArchitecture(String),
    /// A tensor the architecture needs is absent.
    #[error("tensor `{0}` is missing")]
    MissingTensor(String),
    /// A tensor has an unexpected shape or type.
    #[error("tensor `{name}`: {reason}")]
    BadTensor {
        /// The tensor.
        name: String,
        /// What was expected and found.
        reason: String,
    },
    /// The chat template failed to parse or render.
    #[error("chat template: {0}")]
    ChatTemplate(String),
    /// The prompt plus generation would not fit the KV cache.
    #[error("context full: {needed} positions needed, the context holds {n_ctx}")]
    ContextFull {
        /// Positions needed.
        needed: usize,
        /// Context length.
        n_ctx: usize,
    },
    /// No usable GPU, or the layers asked for do not fit it.
    #[error("device: {0}")]
    Device(String),
    /// A caller-provided setting is out of range.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The batching engine's KV pool does not fit the host memory allowed for it.
    #[error("the KV pool's host part needs {bytes} bytes ({positions} positions per layer), more than the {limit} bytes allowed: lower the parallel sequences or the context, or use --kv-type q8_0")]
    KvPool {
        /// Bytes of the KV rows of the layers on the CPU.
        bytes: u64,
        /// The host limit.
        limit: u64,
        /// Positions the pool holds per layer.
        positions: usize,
    },
    /// The KV cache type cannot store this model's heads.
    #[error("KV cache type {kv_type} stores blocks of {block} values, but the model's head size is {head_dim}: use --kv-type f16")]
    KvType {
        /// The requested type.
        kv_type: String,
        /// The key or value head size that is no multiple of the block.
        head_dim: usize,
        /// Values per block of the type.
        block: usize,
    },
    /// A token id outside the vocabulary.
    #[error("token id {id} is outside the vocabulary of {n_vocab}")]
    BadToken {
        /// The id.
        id: u32,
        /// Vocabulary size.
        n_vocab: usize,
    },
    /// An input file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

impl ModelError {
    /// True when a device ran out of memory (see [`ggml_graph::GraphError::is_out_of_memory`]):
    /// fewer GPU layers, a smaller batch or a shorter context may help.
    pub fn is_out_of_memory(&self) -> bool {
        match self {
            Self::Graph(e) => e.is_out_of_memory(),
            Self::InFile { source, .. } => source.is_out_of_memory(),
            _ => false,
        }
    }

    /// Names `path` in the error, unless it already does (I/O errors carry their path).
    pub fn in_file(self, path: &std::path::Path) -> Self {
        match self {
            Self::Gguf(gguf::GgufError::Io { .. }) | Self::Io { .. } | Self::InFile { .. } => self,
            e => Self::InFile {
                path: path.to_owned(),
                source: Box::new(e),
            },
        }
    }
}

#[cfg(all(test, feature = "hip"))]
mod tests {
    use gpu_mem::GpuError;

    use super::ModelError;

    fn budget() -> GpuError {
        GpuError::BudgetExceeded {
            tag: "weights".into(),
            requested: 10,
            used: 5,
            limit: 12,
        }
    }

    #[test]
    fn out_of_memory_is_seen_through_the_layers() {
        let graph = ggml_graph::GraphError::Device {
            backend: "hip",
            op: "alloc",
            source: Box::new(budget()),
        };
        let e = ModelError::from(graph);
        assert!(e.is_out_of_memory());
        let e = e.in_file(std::path::Path::new("model.gguf"));
        assert!(e.is_out_of_memory(), "{e}");
        let source = std::error::Error::source(&e).expect("the graph error");
        assert!(
            source.to_string().contains("exceeds the budget"),
            "{source}"
        );
        let gpu = |source: GpuError| {
            ModelError::from(ggml_graph::GraphError::Device {
                backend: "hip",
                op: "copy bandwidth",
                source: Box::new(source),
            })
        };
        assert!(gpu(budget()).is_out_of_memory());
        assert!(!gpu(GpuError::InvalidArgument("n = 0".into())).is_out_of_memory());
        assert!(!ModelError::Device("no GPU".into()).is_out_of_memory());
    }
}
