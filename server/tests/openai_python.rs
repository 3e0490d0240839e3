//! The official `openai` Python package (PyPI) against the server: chat (whole and streamed),
//! logprobs, completions with echo, embeddings, structured output, a tool call, models, and its
//! error classes for 400, 404 and 401. Skipped
//! with a reason when python3 or the package is missing (`cargo xtask test` installs it).

mod common;

use std::path::PathBuf;
use std::process::Command;

use rocmforge_server::ServerOptions;

#[test]
fn openai_python_client() {
    let have = Command::new("python3")
        .args(["-c", "import openai"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !have {
        eprintln!(
            "skipped: python3 with the `openai` package is not available (pip install openai)"
        );
        return;
    }
    let path = std::env::var_os("ROCMFORGE_TEST_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(common::synth_model);
    // Room for the tool descriptions the prompt carries in the tool-call case.
    let ts = common::start_with_ctx(
        &path,
        2,
        ServerOptions {
            api_key: Some("test-key".into()),
            ..ServerOptions::default()
        },
        1024,
    );
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/openai_client.py");
    let out = Command::new("python3")
        .arg(&script)
        .args([ts.url.as_str(), "test-key", "test-model"])
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    ts.wait_idle();
}
