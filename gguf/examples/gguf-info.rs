//! Prints a GGUF file's metadata and tensor table, like gguf-py's `gguf-dump`.
//!
//! Usage: `cargo run -p gguf --example gguf-info FILE`

use std::process::ExitCode;

fn main() -> ExitCode {
    let Some(path) = std::env::args_os().nth(1) else {
        eprintln!("usage: gguf-info FILE");
        return ExitCode::from(2);
    };
    let file = match gguf::GgufFile::open(&path) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("gguf-info: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!(
        "version {} alignment {} data offset {}",
        file.version(),
        file.alignment(),
        file.data_offset()
    );
    for (k, v) in file.metadata().iter() {
        println!("{k} = {v}");
    }
    for t in file.tensors() {
        println!(
            "{} {} {} {} {}",
            t.name,
            t.ggml_type,
            t.shape_string(),
            t.size,
            t.offset
        );
    }
    ExitCode::SUCCESS
}
