//! The `rocmforge` command-line front end: the model commands of `model::cli` plus `serve` and
//! `bench-serve`.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "rocmforge",
    version,
    about = "Run GGUF language models (llama, mistral, qwen2/3, gemma2/3)",
    after_help = "Environment variables: `rocmforge env` lists them with their meaning and defaults."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    #[command(flatten)]
    Model(model::cli::Cmd),
    /// Serve the model over an OpenAI-compatible HTTP API.
    Serve(rocmforge_server::cli::ServeArgs),
    /// Load generator: streamed completions against an OpenAI-compatible server.
    BenchServe(rocmforge_server::cli::BenchServeArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse_from(model::cli::args());
    model::cli::init_logging();
    let result = match cli.cmd {
        Cmd::Model(c) => model::cli::run(c).map_err(|e| e.to_string()),
        Cmd::Serve(a) => rocmforge_server::cli::serve(a).map_err(|e| e.to_string()),
        Cmd::BenchServe(a) => rocmforge_server::cli::bench_serve(a).map_err(|e| e.to_string()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rocmforge: error: {e}");
            ExitCode::FAILURE
        }
    }
}
