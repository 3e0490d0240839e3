//! Lists a GGUF file's architecture and tensors with the `rocmforge-gguf` crate alone; without an argument
//! it writes a small Q8_0 file in memory and reads it back.

use rocmforge_gguf::{
    dequantize_to_vec, quantize, write_to_vec, GgmlType, GgufFile, Metadata, TensorToWrite,
};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let file = match std::env::args_os().nth(1) {
        Some(path) => GgufFile::open(path)?,
        None => {
            let values: Vec<f32> = (0..64).map(|i| i as f32 / 16.0).collect();
            let data = quantize(GgmlType::Q8_0, &values)?;
            let mut meta = Metadata::new();
            meta.set("general.architecture", "llama");
            let t = TensorToWrite {
                name: "w",
                dims: &[32, 2],
                ty: GgmlType::Q8_0,
                data: &data,
            };
            GgufFile::from_bytes(write_to_vec(&meta, &[t])?)?
        }
    };
    println!("architecture: {}", file.architecture()?);
    for t in file.tensors() {
        let values = dequantize_to_vec(t.ggml_type, file.tensor_data(t))?;
        let max = values.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        println!(
            "{} {:?} {:?}: max |value| {max}",
            t.name, t.dims, t.ggml_type
        );
    }
    Ok(())
}
