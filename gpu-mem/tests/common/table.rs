//! Test data shared by gpu-mem's GPU tests and transfer benchmark: a model's tensor table and
//! stand-in tensor contents. Reading the table takes `gguf`, a dev-dependency only: the memory
//! layer itself knows nothing about model files.

/// A model's tensor table, `(name, bytes)` per tensor, for upload tests and benchmarks: from the
/// GGUF at `ROCMFORGE_TEST_MODEL`, else from the TSV at `ROCMFORGE_TENSOR_TABLE` (written by
/// `cargo xtask device-bundle` where the model cannot travel). `Err` says why there is none.
pub fn tensor_table() -> std::result::Result<(String, Vec<(String, u64)>), String> {
    if let Ok(path) = std::env::var("ROCMFORGE_TEST_MODEL") {
        let file = gguf::GgufFile::open(&path).map_err(|e| format!("{path}: {e}"))?;
        let t = file
            .tensors()
            .iter()
            .map(|t| (t.name.clone(), t.size))
            .collect();
        return Ok((path, t));
    }
    let path = std::env::var("ROCMFORGE_TENSOR_TABLE")
        .map_err(|_| "neither ROCMFORGE_TEST_MODEL nor ROCMFORGE_TENSOR_TABLE is set".to_owned())?;
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
    let mut v = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let cols: Vec<&str> = line.split('\t').collect();
        let [name, _ty, bytes] = cols[..] else {
            return Err(format!("{path}:{}: expected name, type, bytes", i + 1));
        };
        let bytes = bytes
            .trim()
            .parse::<u64>()
            .map_err(|e| format!("{path}:{}: {e}", i + 1))?;
        v.push((name.to_owned(), bytes));
    }
    Ok((path, v))
}

/// Deterministic stand-in contents for tensor `index` (distinct per tensor and offset).
pub fn synthetic_tensor(index: usize, bytes: u64) -> Vec<u8> {
    let seed = (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (0..bytes)
        .map(|i| ((i.wrapping_mul(31) ^ seed ^ (i >> 8)) & 0xff) as u8)
        .collect()
}
