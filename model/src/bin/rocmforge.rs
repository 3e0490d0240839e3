//! The `rocmforge` command-line front end.

fn main() {
    eprintln!("rocmforge: no subcommands yet");
    std::process::exit(2);
}
