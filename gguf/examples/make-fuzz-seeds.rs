//! Writes small, valid GGUF files (every metadata kind, several tensor types) as seeds for the
//! reader's fuzz corpus. Usage: `cargo run -p rocmforge-gguf --example make-fuzz-seeds DIR`.

use rocmforge_gguf::{ArrayValue, GgmlType, Metadata, MetadataValue, TensorToWrite};

/// A seed file: its name and its tensors' types and shapes.
type Seed<'a> = (&'a str, &'a [(GgmlType, &'a [u64])]);

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::args()
        .nth(1)
        .ok_or("usage: make-fuzz-seeds DIR")?;
    std::fs::create_dir_all(&dir)?;
    let mut md = Metadata::new();
    md.set("general.architecture", "llama");
    md.set("llama.block_count", 1u32);
    md.set("i8", -3i8);
    md.set("u16", 9u16);
    md.set("f64", 2.5f64);
    md.set("b", true);
    md.set("tokens", vec!["<s>".to_owned(), "a".to_owned()]);
    md.set("scores", vec![0.0f32, -1.0]);
    md.set(
        "nested",
        MetadataValue::Array(ArrayValue::Array(vec![
            ArrayValue::I64(vec![1]),
            ArrayValue::U8(vec![]),
        ])),
    );
    let seeds: [Seed<'_>; 3] = [
        (
            "plain.gguf",
            &[(GgmlType::F32, &[4]), (GgmlType::F16, &[2, 2])],
        ),
        (
            "legacy.gguf",
            &[
                (GgmlType::Q4_0, &[32]),
                (GgmlType::Q8_0, &[32, 2]),
                (GgmlType::IQ4_NL, &[32]),
            ],
        ),
        (
            "kquant.gguf",
            &[
                (GgmlType::Q4_K, &[256]),
                (GgmlType::IQ2_XXS, &[256]),
                (GgmlType::TQ2_0, &[256]),
            ],
        ),
    ];
    for (name, tensors) in seeds {
        let data: Vec<Vec<u8>> = tensors
            .iter()
            .map(|(ty, dims)| {
                let n: u64 = dims.iter().product();
                vec![0x11; n as usize / ty.block_size() * ty.type_size()]
            })
            .collect();
        let names: Vec<String> = (0..tensors.len()).map(|i| format!("t{i}")).collect();
        let tw: Vec<TensorToWrite<'_>> = tensors
            .iter()
            .zip(&data)
            .zip(&names)
            .map(|(((ty, dims), d), n)| TensorToWrite {
                name: n,
                dims,
                ty: *ty,
                data: d,
            })
            .collect();
        rocmforge_gguf::write_file(std::path::Path::new(&dir).join(name), &md, &tw)?;
    }
    Ok(())
}
