//! Where the default model lives, shared by the CLI and `cargo xtask fetch-model` (which includes
//! this file as a module), so both always agree.

use std::path::PathBuf;

/// File name of the default model (what `cargo xtask fetch-model` downloads).
pub const DEFAULT_MODEL_FILE: &str = "gemma-3-270m-q4_k_m.gguf";

/// The model cache folder: `$ROCMFORGE_CACHE`, else `$XDG_CACHE_HOME/rocmforge/models`, else
/// `~/.cache/rocmforge/models`.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("ROCMFORGE_CACHE") {
        return PathBuf::from(dir);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from(".cache"));
    base.join("rocmforge").join("models")
}
