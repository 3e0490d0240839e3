//! The load generator behind `rocmforge bench-serve`: streamed completions at fixed
//! concurrencies against any OpenAI-compatible server (ours or llama.cpp's `llama-server`),
//! reporting requests/s, output tokens/s, time to first token and inter-token latency
//! percentiles, as vLLM's `bench serve` does.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use model::sampling::Rng;
use serde_json::{json, Value};

use crate::client::Client;
use crate::error::ServerError;

/// What to run.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Concurrency levels, each one run after the other.
    pub concurrency: Vec<usize>,
    /// Requests per level (at least the level's concurrency).
    pub requests: usize,
    /// Prompt tokens per request (the mean with a range ratio).
    pub prompt_tokens: usize,
    /// Output tokens per request (the mean with a range ratio); end-of-generation is ignored.
    pub output_tokens: usize,
    /// Mixed lengths as vLLM's `bench serve` random dataset: each request's prompt and output
    /// lengths drawn uniformly from `mean * (1 - r) ..= mean * (1 + r)` (at least 1); 0: fixed
    /// lengths. In `0.0..1.0`.
    pub range_ratio: f64,
    /// Seed of the lengths and prompt choice.
    pub seed: u64,
    /// The model id sent with each request (`None`: the server's first model).
    pub model: Option<String>,
}

/// One level's figures.
#[derive(Debug, Clone, PartialEq)]
pub struct LevelReport {
    /// Concurrent clients.
    pub concurrency: usize,
    /// Requests that finished.
    pub completed: usize,
    /// Requests that failed.
    pub failed: usize,
    /// Wall time of the level.
    pub duration: Duration,
    /// Tokens generated in all.
    pub output_tokens: usize,
    /// Requests per second.
    pub request_rate: f64,
    /// Output tokens per second.
    pub output_rate: f64,
    /// Time to first token, p50 and p99 (ms).
    pub ttft_ms: (f64, f64),
    /// Inter-token latency, p50 and p99 (ms).
    pub itl_ms: (f64, f64),
}

/// A length drawn uniformly from `mean * (1 - ratio) ..= mean * (1 + ratio)`, at least 1.
fn draw_len(rng: &mut Rng, mean: usize, ratio: f64) -> usize {
    let lo = ((mean as f64 * (1.0 - ratio)).floor() as usize).max(1);
    let hi = ((mean as f64 * (1.0 + ratio)).ceil() as usize).max(lo);
    lo + (rng.next_u64() % (hi - lo + 1) as u64) as usize
}

/// The `q`-quantile (0..=1) of sorted values, nearest rank.
fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// One request's measurements.
#[derive(Debug, Default)]
struct Sample {
    ok: bool,
    ttft: Option<Duration>,
    itl: Vec<Duration>,
    tokens: usize,
}

/// Asks the server for its model id and a pool of prompt token ids (a fixed text, tokenized by
/// the server itself so any model's vocabulary works).
async fn prepare(client: &Client, opts: &BenchOptions) -> Result<(String, Vec<u32>), ServerError> {
    let model = match &opts.model {
        Some(m) => m.clone(),
        None => {
            let r = client.get("/v1/models").await?.json()?;
            r["data"][0]["id"]
                .as_str()
                .ok_or_else(|| ServerError::Http(format!("/v1/models lists no model: {r}")))?
                .to_owned()
        }
    };
    const TEXT: &str = "The history of computing is a story of people, ideas and machines. \
        Early mechanical calculators gave way to electronic computers, which filled rooms and \
        consumed enormous power, yet could only perform simple arithmetic. Over decades, \
        transistors, integrated circuits and microprocessors shrank those machines to fit in a \
        pocket, while software grew from hand-written machine code to vast systems. ";
    let want = (opts.prompt_tokens as f64 * (1.0 + opts.range_ratio)).ceil() as usize + 1;
    let mut text = String::new();
    let mut ids = Vec::new();
    while ids.len() < want {
        text.push_str(TEXT);
        let r = client
            .post("/tokenize", &json!({"content": text, "add_special": false}))
            .await?
            .json()?;
        ids = r["tokens"]
            .as_array()
            .ok_or_else(|| ServerError::Http(format!("/tokenize gave no tokens: {r}")))?
            .iter()
            .filter_map(Value::as_u64)
            .map(|t| t as u32)
            .collect();
        if ids.is_empty() {
            return Err(ServerError::Http("/tokenize gave no tokens".into()));
        }
    }
    Ok((model, ids))
}

async fn one_request(client: &Client, body: Value) -> Sample {
    let start = Instant::now();
    let mut s = Sample::default();
    let mut last: Option<Instant> = None;
    let r = client
        .stream("/v1/completions", &body, |data| {
            if data == "[DONE]" {
                return false;
            }
            let Ok(v) = serde_json::from_str::<Value>(data) else {
                return true;
            };
            let text = v["choices"][0]["text"].as_str().unwrap_or("");
            if !text.is_empty() {
                let now = Instant::now();
                match last {
                    None => s.ttft = Some(now - start),
                    Some(l) => s.itl.push(now - l),
                }
                last = Some(now);
                s.tokens += 1;
            }
            if let Some(n) = v["usage"]["completion_tokens"].as_u64() {
                s.tokens = n as usize;
            }
            true
        })
        .await;
    s.ok = r.is_ok() && s.ttft.is_some();
    s
}

/// Most concurrent clients per level: far beyond any server's batch, and each is a task.
pub const MAX_CONCURRENCY: usize = 4096;
/// Most requests per level (each request body is made before the level starts).
pub const MAX_REQUESTS: usize = 1 << 20;
/// Longest prompt or output per request, in tokens (the mean with a range ratio).
pub const MAX_TOKENS: usize = 1 << 20;

/// Refuses options no run can use, before any request: the counts size what is made up front.
fn check(opts: &BenchOptions) -> Result<(), ServerError> {
    let bad = |m: String| Err(ServerError::InvalidArgument(m));
    if opts.prompt_tokens == 0 || opts.output_tokens == 0 {
        return bad("prompt and output lengths must be at least 1".into());
    }
    for (flag, v) in [
        ("--prompt-tokens", opts.prompt_tokens),
        ("--output-tokens", opts.output_tokens),
    ] {
        if v > MAX_TOKENS {
            return bad(format!(
                "{flag} {v}: at most {MAX_TOKENS} tokens per request"
            ));
        }
    }
    if opts.requests > MAX_REQUESTS {
        return bad(format!(
            "--requests {}: at most {MAX_REQUESTS} per level",
            opts.requests
        ));
    }
    if !(0.0..1.0).contains(&opts.range_ratio) {
        return bad(format!(
            "range ratio {} must be in [0, 1)",
            opts.range_ratio
        ));
    }
    if opts.concurrency.is_empty() {
        return bad("--concurrency needs at least one level".into());
    }
    if let Some(&c) = opts
        .concurrency
        .iter()
        .find(|&&c| c == 0 || c > MAX_CONCURRENCY)
    {
        return bad(format!(
            "--concurrency {c}: give 1 to {MAX_CONCURRENCY} clients per level"
        ));
    }
    Ok(())
}

/// Runs every level and returns the reports.
pub async fn run(client: &Client, opts: &BenchOptions) -> Result<Vec<LevelReport>, ServerError> {
    check(opts)?;
    let (model, pool) = prepare(client, opts).await?;
    let pool = Arc::new(pool);
    let mut reports = Vec::new();
    for &conc in &opts.concurrency {
        let n = opts.requests.max(conc);
        let mut rng = Rng::new(opts.seed ^ conc as u64);
        let mut bodies = Vec::with_capacity(n);
        for _ in 0..n {
            let p = draw_len(&mut rng, opts.prompt_tokens, opts.range_ratio).min(pool.len());
            let o = draw_len(&mut rng, opts.output_tokens, opts.range_ratio);
            let off = (rng.next_u64() % (pool.len() - p + 1) as u64) as usize;
            bodies.push(json!({
                "model": model,
                "prompt": pool[off..off + p].to_vec(),
                "max_tokens": o,
                "temperature": 0.0,
                "ignore_eos": true,
                "stream": true,
                "stream_options": {"include_usage": true},
            }));
        }
        let queue = Arc::new(parking_lot::Mutex::new(bodies));
        let start = Instant::now();
        let mut tasks = Vec::new();
        for _ in 0..conc {
            let queue = Arc::clone(&queue);
            let client = client.clone();
            tasks.push(tokio::spawn(async move {
                let mut out = Vec::new();
                loop {
                    let Some(body) = queue.lock().pop() else {
                        break;
                    };
                    out.push(one_request(&client, body).await);
                }
                out
            }));
        }
        let mut samples = Vec::new();
        for t in tasks {
            samples.extend(
                t.await
                    .map_err(|e| ServerError::Http(format!("client task: {e}")))?,
            );
        }
        let duration = start.elapsed();
        let ok: Vec<&Sample> = samples.iter().filter(|s| s.ok).collect();
        let mut ttft: Vec<f64> = ok
            .iter()
            .filter_map(|s| s.ttft)
            .map(|d| d.as_secs_f64() * 1e3)
            .collect();
        let mut itl: Vec<f64> = ok
            .iter()
            .flat_map(|s| s.itl.iter().map(|d| d.as_secs_f64() * 1e3))
            .collect();
        ttft.sort_by(f64::total_cmp);
        itl.sort_by(f64::total_cmp);
        let output_tokens: usize = ok.iter().map(|s| s.tokens).sum();
        let secs = duration.as_secs_f64().max(1e-9);
        reports.push(LevelReport {
            concurrency: conc,
            completed: ok.len(),
            failed: samples.len() - ok.len(),
            duration,
            output_tokens,
            request_rate: ok.len() as f64 / secs,
            output_rate: output_tokens as f64 / secs,
            ttft_ms: (quantile(&ttft, 0.5), quantile(&ttft, 0.99)),
            itl_ms: (quantile(&itl, 0.5), quantile(&itl, 0.99)),
        });
    }
    Ok(reports)
}

/// The reports as a table.
pub fn table(reports: &[LevelReport]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "| conc | done | fail | time s | req/s | out tok/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms |"
    );
    let _ = writeln!(s, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in reports {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {:.2} | {:.2} | {:.1} | {:.1} | {:.1} | {:.2} | {:.2} |",
            r.concurrency,
            r.completed,
            r.failed,
            r.duration.as_secs_f64(),
            r.request_rate,
            r.output_rate,
            r.ttft_ms.0,
            r.ttft_ms.1,
            r.itl_ms.0,
            r.itl_ms.1
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_no_run_can_use_are_refused() {
        let ok = BenchOptions {
            concurrency: vec![1, 8],
            requests: 64,
            prompt_tokens: 128,
            output_tokens: 128,
            range_ratio: 0.0,
            seed: 1,
            model: None,
        };
        assert!(check(&ok).is_ok());
        type Edit = fn(&mut BenchOptions);
        let cases: [(Edit, &str); 7] = [
            (|o| o.requests = usize::MAX, "at most 1048576 per level"),
            (
                |o| o.range_ratio = f64::NAN,
                "range ratio NaN must be in [0, 1)",
            ),
            (|o| o.prompt_tokens = usize::MAX, "--prompt-tokens"),
            (|o| o.output_tokens = 0, "at least 1"),
            (
                |o| o.concurrency = vec![1, 0],
                "--concurrency 0: give 1 to 4096",
            ),
            (|o| o.concurrency = vec![1 << 40], "give 1 to 4096"),
            (|o| o.concurrency.clear(), "at least one level"),
        ];
        for (edit, words) in cases {
            let mut o = ok.clone();
            edit(&mut o);
            let e = check(&o).expect_err("refused");
            assert!(matches!(e, ServerError::InvalidArgument(_)), "{e:?}");
            assert!(e.to_string().contains(words), "{words}: {e}");
        }
    }

    #[test]
    fn nearest_rank_quantiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&v, 0.5), 50.0);
        assert_eq!(quantile(&v, 0.99), 99.0);
        assert_eq!(quantile(&v[..1], 0.99), 1.0);
        assert!(quantile(&[], 0.5).is_nan());
    }

    #[test]
    fn lengths_span_the_range_ratio() {
        let mut rng = Rng::new(7);
        let v: Vec<usize> = (0..2000).map(|_| draw_len(&mut rng, 100, 0.5)).collect();
        assert_eq!(v.iter().min(), Some(&50));
        assert_eq!(v.iter().max(), Some(&150));
        let mean = v.iter().sum::<usize>() as f64 / v.len() as f64;
        assert!((mean - 100.0).abs() < 3.0, "{mean}");
        assert!((0..50).all(|_| draw_len(&mut rng, 100, 0.0) == 100));
        assert!((0..50).all(|_| draw_len(&mut rng, 1, 0.9) >= 1));
    }
}
