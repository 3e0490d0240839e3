//! Prints a GGUF file's metadata and tensor table, like gguf-py's `gguf-dump`.
//!
//! Usage: `cargo run -p rocmforge-gguf --example gguf-info FILE`

use std::io::Write;
use std::process::ExitCode;

fn main() -> ExitCode {
    let Some(path) = std::env::args_os().nth(1) else {
        eprintln!("usage: gguf-info FILE");
        return ExitCode::from(2);
    };
    let file = match rocmforge_gguf::GgufFile::open(&path) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("gguf-info: {e}");
            return ExitCode::FAILURE;
        }
    };
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    match rocmforge_gguf::dump::write_info(&file, &mut out).and_then(|()| out.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        // A closed pipe (`| head`) is not an error worth reporting.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gguf-info: {e}");
            ExitCode::FAILURE
        }
    }
}
