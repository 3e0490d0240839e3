//! Fuzz target: any byte string given to the GGUF reader yields a file or a typed error, and
//! whatever parses can be listed and dequantized without panicking.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(file) = gguf::GgufFile::from_bytes(data.to_vec()) else {
        return;
    };
    let _ = gguf::dump::canonical_listing(&file);
    let mut sink = Vec::new();
    let _ = gguf::dump::write_info(&file, &mut sink);
    let _ = file.architecture();
    let _ = file.arch_u32("block_count");
    for t in file.tensors() {
        let n = t.n_elements();
        if n <= 1 << 16 {
            let mut out = vec![0f32; n as usize];
            // Ranges and shapes were validated at parse time, so this must succeed.
            if let Err(e) = gguf::dequantize(t.ggml_type, file.tensor_data(t), &mut out) {
                panic!("validated tensor `{}` failed to dequantize: {e}", t.name);
            }
        }
    }
});
