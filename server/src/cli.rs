//! The `serve` and `bench-serve` subcommands of the `rocmforge` binary.

use std::net::SocketAddr;

use clap::Args;
use model::cli::ModelArgs;

use crate::bench::{self, BenchOptions};
use crate::client::Client;
use crate::engine::{Backend, BackendOptions};
use crate::error::ServerError;
use crate::{Server, ServerOptions};

/// `rocmforge serve`.
#[derive(Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    m: ModelArgs,
    /// Address to listen on (localhost only by default).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0: any free port).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Sequences decoded together.
    #[arg(long, short = 'n', alias = "np", default_value_t = 4)]
    parallel: usize,
    /// Requests that may wait beyond `--parallel` before the server answers 503.
    #[arg(long, default_value_t = 64)]
    queue: usize,
    /// Require `Authorization: Bearer KEY` (also env ROCMFORGE_API_KEY).
    #[arg(long)]
    api_key: Option<String>,
    /// The model id clients use (default: the file name without `.gguf`).
    #[arg(long)]
    alias: Option<String>,
    /// Largest request body in bytes.
    #[arg(long, default_value_t = 4 << 20)]
    body_limit: usize,
    /// Log each request's prompt text (at info level, `ROCMFORGE_LOG=info`); prompts are
    /// never logged without it.
    #[arg(long)]
    log_prompts: bool,
}

/// `rocmforge bench-serve`.
#[derive(Args, Debug)]
pub struct BenchServeArgs {
    /// The server's base URL.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    url: String,
    /// Bearer key (also env ROCMFORGE_API_KEY).
    #[arg(long)]
    api_key: Option<String>,
    /// Concurrency levels, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32,64")]
    concurrency: Vec<usize>,
    /// Requests per level (at least the level's concurrency).
    #[arg(long, default_value_t = 64)]
    requests: usize,
    /// Prompt tokens per request.
    #[arg(long, default_value_t = 128)]
    prompt_tokens: usize,
    /// Output tokens per request.
    #[arg(long, default_value_t = 128)]
    output_tokens: usize,
    /// Mixed lengths as vLLM's random dataset: prompt and output lengths uniform in
    /// `mean * (1 - R) ..= mean * (1 + R)` (0: fixed lengths).
    #[arg(long, default_value_t = 0.0)]
    range_ratio: f64,
    /// Mixed lengths with a range ratio of 0.5.
    #[arg(long, conflicts_with = "range_ratio")]
    mixed: bool,
    /// Seed of the mixed lengths.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Model id to send (default: the server's first).
    #[arg(long)]
    model: Option<String>,
}

fn runtime() -> Result<tokio::runtime::Runtime, ServerError> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|source| ServerError::Io {
            what: "starting the async runtime".into(),
            source,
        })
}

async fn ctrl_c() {
    // Without a signal handler the server runs until killed, which is still a clean stop.
    if tokio::signal::ctrl_c().await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Most sequences `--parallel` takes (as batched-bench's `-npl`): a typo cannot ask for
/// billions of KV cache slots.
const MAX_PARALLEL: usize = 4096;
/// Most waiting requests `--queue` takes; each holds its body (up to `--body-limit`).
const MAX_QUEUE: usize = 1 << 16;
/// The range of `--body-limit`: a chat request needs some room; more than 1 GiB per request is
/// a typo.
const BODY_LIMITS: std::ops::RangeInclusive<usize> = 1024..=1 << 30;

/// Refuses counts the server cannot use, before it binds or loads anything.
fn check_serve(a: &ServeArgs) -> Result<(), ServerError> {
    let bad = |m: String| Err(ServerError::InvalidArgument(m));
    if !(1..=MAX_PARALLEL).contains(&a.parallel) {
        return bad(format!(
            "--parallel {}: give 1 to {MAX_PARALLEL} sequences",
            a.parallel
        ));
    }
    if a.queue > MAX_QUEUE {
        return bad(format!(
            "--queue {}: at most {MAX_QUEUE} waiting requests",
            a.queue
        ));
    }
    if !BODY_LIMITS.contains(&a.body_limit) {
        return bad(format!(
            "--body-limit {}: give {} to {} bytes",
            a.body_limit,
            BODY_LIMITS.start(),
            BODY_LIMITS.end()
        ));
    }
    Ok(())
}

/// Runs `rocmforge serve`: listens at once, loads the model in the background (`/health` says
/// loading), then serves until Ctrl-C.
pub fn serve(a: ServeArgs) -> Result<(), ServerError> {
    check_serve(&a)?;
    let path = a.m.path();
    let model_id = a.alias.clone().unwrap_or_else(|| {
        path.file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".into())
    });
    let api_key = a
        .api_key
        .clone()
        .or_else(|| model::cli::env_value(model::cli::API_KEY_VAR))
        .filter(|k| !k.is_empty());
    let server = Server::new(ServerOptions {
        model_id: model_id.clone(),
        api_key,
        max_queue: a.queue,
        parallel: a.parallel,
        body_limit: a.body_limit,
        log_prompts: a.log_prompts,
    });
    let rt = runtime()?;
    let addr = format!("{}:{}", a.host, a.port);
    let listener = rt
        .block_on(tokio::net::TcpListener::bind(&addr))
        .map_err(|source| ServerError::Io {
            what: format!("binding {addr}"),
            source,
        })?;
    let local: SocketAddr = listener.local_addr().map_err(|source| ServerError::Io {
        what: "reading the bound address".into(),
        source,
    })?;
    eprintln!("rocmforge serve: listening on http://{local} (model id `{model_id}`)");
    let loader = server.clone();
    let m = a.m.clone();
    let parallel = a.parallel;
    let load = std::thread::Builder::new()
        .name("rocmforge-load".into())
        .spawn(move || {
            let r = (|| -> Result<Backend, model::ModelError> {
                let tm = m.load()?;
                let session = m.session_options(&tm)?;
                let opts = BackendOptions {
                    n_ctx_per_seq: session.n_ctx,
                    session,
                    parallel,
                };
                let b = Backend::start(tm, &opts)?;
                let g = b.gauges();
                eprintln!("{}", b.device_plan());
                eprintln!(
                    "memory plan: {} sequences x {} tokens of context; KV cache {} blocks ({} free)",
                    parallel,
                    b.n_ctx(),
                    g.kv_blocks_used + g.kv_blocks_free,
                    g.kv_blocks_free
                );
                for m in b.memory() {
                    eprintln!(
                        "  {}: weights {}, KV cache {}, activations {}{}",
                        m.device,
                        model::placement::mib(m.weights),
                        model::placement::mib(m.kv),
                        model::placement::mib(m.activations),
                        m.limit.map_or(String::new(), |l| format!(
                            " (budget {})",
                            model::placement::mib(l)
                        ))
                    );
                }
                Ok(b)
            })();
            match r {
                Ok(b) => {
                    loader.set_ready(b);
                    eprintln!("rocmforge serve: ready on http://{local}");
                }
                Err(e) => {
                    eprintln!("rocmforge serve: error: loading the model failed: {e}");
                    loader.set_failed(e.to_string());
                }
            }
        })
        .map_err(|source| ServerError::Io {
            what: "starting the loader thread".into(),
            source,
        })?;
    let r = rt.block_on(server.serve(listener, ctrl_c()));
    if let Some(b) = server.backend() {
        b.shutdown();
    }
    let _ = load.join();
    r
}

/// Runs `rocmforge bench-serve` and prints its table.
pub fn bench_serve(a: BenchServeArgs) -> Result<(), ServerError> {
    let key = a
        .api_key
        .clone()
        .or_else(|| model::cli::env_value(model::cli::API_KEY_VAR));
    let client = Client::new(&a.url, key)?;
    let opts = BenchOptions {
        concurrency: a.concurrency.clone(),
        requests: a.requests,
        prompt_tokens: a.prompt_tokens,
        output_tokens: a.output_tokens,
        range_ratio: if a.mixed { 0.5 } else { a.range_ratio },
        seed: a.seed,
        model: a.model.clone(),
    };
    let reports = runtime()?.block_on(bench::run(&client, &opts))?;
    let mixed = if opts.range_ratio > 0.0 {
        format!(" (means, range ratio {})", opts.range_ratio)
    } else {
        String::new()
    };
    println!(
        "{} prompt tokens, {} output tokens{mixed} per request, seed {}, against {}",
        a.prompt_tokens, a.output_tokens, a.seed, a.url
    );
    print!("{}", bench::table(&reports));
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::{check_serve, ServeArgs};
    use crate::error::ServerError;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        a: ServeArgs,
    }

    #[test]
    fn serve_counts_are_bounded() {
        let parse = |v: &[&str]| {
            let argv = ["serve"].iter().chain(v).copied();
            Cli::try_parse_from(argv).expect("parse").a
        };
        assert!(check_serve(&parse(&[])).is_ok());
        for (v, words) in [
            (&["--parallel", "0"][..], "--parallel 0: give 1 to 4096"),
            (&["--parallel", "1000000000"], "give 1 to 4096 sequences"),
            (
                &["--queue", "18446744073709551615"],
                "at most 65536 waiting",
            ),
            (&["--body-limit", "10"], "--body-limit 10: give 1024 to"),
        ] {
            let e = check_serve(&parse(v)).expect_err("refused");
            assert!(matches!(e, ServerError::InvalidArgument(_)), "{e:?}");
            assert!(e.to_string().contains(words), "{v:?}: {e}");
        }
    }
}
