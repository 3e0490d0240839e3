//! A server on a random local port over a model (a tiny synthetic one written by `model::synth`,
//! or the real Gemma from `ROCMFORGE_TEST_MODEL`), and what the tests compute without it.

#![allow(dead_code)] // each test binary uses its own part of these helpers

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use model::chat::ChatMessage;
use model::generate::{generate, GenerateOptions};
use model::placement::DeviceChoice;
use model::sampling::{Sampler, SamplerConfig};
use model::session::{Session, SessionOptions};
use model::text::TextModel;
use rocmforge_server::client::Client;
use rocmforge_server::{Backend, BackendOptions, Server, ServerOptions};

/// Context per request in the tests.
pub const N_CTX: usize = 160;

/// The tiny synthetic llama model (written once per test binary).
pub fn synth_model() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("server-tests");
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join(format!("llama-{}.gguf", std::process::id()));
        model::synth::write_model("llama", &path, 7).expect("write synthetic model");
        path
    })
    .clone()
}

/// The real model, when the environment names it.
pub fn real_model() -> Option<PathBuf> {
    match std::env::var_os("ROCMFORGE_TEST_MODEL") {
        Some(p) => Some(PathBuf::from(p)),
        None => {
            eprintln!("skipped: ROCMFORGE_TEST_MODEL is not set (the real Gemma 3 270M)");
            None
        }
    }
}

/// Session settings of the tests: CPU, 2 threads.
pub fn session_options(n_ctx: usize) -> SessionOptions {
    SessionOptions {
        n_ctx,
        n_threads: 2,
        device: DeviceChoice::Cpu,
        ..SessionOptions::default()
    }
}

/// A running server and the runtime that drives it.
pub struct TestServer {
    pub url: String,
    pub server: Server,
    pub rt: tokio::runtime::Runtime,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl TestServer {
    /// A client of this server.
    pub fn client(&self, key: Option<&str>) -> Client {
        Client::new(&self.url, key.map(str::to_owned)).expect("client")
    }

    /// Waits until no sequence runs and no KV block is used.
    pub fn wait_idle(&self) -> rocmforge_server::metrics::EngineGauges {
        let b = self.server.backend().expect("ready");
        let t0 = Instant::now();
        loop {
            let g = b.gauges();
            if g.running == 0 && g.waiting == 0 && g.kv_blocks_used == 0 {
                return g;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "the engine never went idle: {g:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(b) = self.server.backend() {
            b.shutdown();
        }
    }
}

/// Starts a server on `path` with `opts` (its model id is `test-model`).
pub fn start(path: &Path, parallel: usize, opts: ServerOptions) -> TestServer {
    start_with_ctx(path, parallel, opts, N_CTX)
}

/// [`start`] with `n_ctx` tokens of context per request.
pub fn start_with_ctx(
    path: &Path,
    parallel: usize,
    opts: ServerOptions,
    n_ctx: usize,
) -> TestServer {
    let tm = TextModel::load(path, |_, _| {}).expect("load model");
    let backend = Backend::start(
        tm,
        &BackendOptions {
            session: session_options(n_ctx),
            parallel,
            n_ctx_per_seq: n_ctx,
        },
    )
    .expect("start engine");
    let server = Server::new(ServerOptions {
        model_id: "test-model".into(),
        parallel,
        ..opts
    });
    server.set_ready(backend);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let s = server.clone();
    rt.spawn(async move {
        let _ = s
            .serve(listener, async {
                let _ = stopped.await;
            })
            .await;
    });
    TestServer {
        url,
        server,
        rt,
        stop: Some(stop),
    }
}

/// A copy of the model at `path` with the metadata `key` set to `value` (written next to it
/// as `*.{suffix}.gguf`).
pub fn with_metadata(
    path: &Path,
    suffix: &str,
    key: &str,
    value: impl Into<gguf::MetadataValue>,
) -> PathBuf {
    let f = gguf::GgufFile::open(path).expect("open");
    let out = path.with_extension(format!("{suffix}.gguf"));
    let mut w = gguf::GgufWriter::create(&out).expect("create");
    w.set_all(f.metadata()).expect("metadata");
    w.set(key, value).expect("set");
    for t in f.tensors() {
        w.add_tensor_info(&t.name, &t.dims, t.ggml_type)
            .expect("tensor");
    }
    w.write_header().expect("header");
    for t in f.tensors() {
        w.write_tensor_data(&t.name, f.tensor_data(t))
            .expect("data");
    }
    w.finish().expect("finish");
    out
}

/// What `rocmforge generate --temp 0` prints for `prompt` tokens (the library call behind it).
pub fn greedy_reference(
    path: &Path,
    prompt: &[u32],
    max_tokens: usize,
    stops: &[String],
) -> String {
    let tm = TextModel::load(path, |_, _| {}).expect("load model");
    let mut session = Session::new(tm.model(), &session_options(N_CTX)).expect("session");
    let mut sampler = Sampler::new(SamplerConfig::greedy());
    let mut out = String::new();
    generate(
        &mut session,
        &tm,
        &mut sampler,
        prompt,
        &GenerateOptions {
            max_tokens,
            stop_strings: stops.to_vec(),
            ignore_eog: false,
        },
        |t| out.push_str(t),
    )
    .expect("generate");
    out
}

/// The chat prompt tokens for one user message, as the server builds them.
pub fn chat_prompt(path: &Path, user: &str) -> (Vec<u32>, Vec<String>) {
    let tm = TextModel::load(path, |_, _| {}).expect("load model");
    let t = tm.chat_template();
    let text = t
        .render(&[ChatMessage::new("user", user)], true)
        .expect("render");
    (tm.encode_chat(&text).expect("encode"), t.stop_strings())
}
