//! The `rocmforge` command-line front end.

fn main() -> std::process::ExitCode {
    model::cli::main()
}
