//! Server metrics in Prometheus' text exposition format: request and token counters, latency
//! histograms, and the engine's queue and KV-pool gauges read at scrape time.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

/// A cumulative histogram over fixed bucket bounds (seconds).
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    inner: Mutex<HistogramState>,
}

#[derive(Debug, Default)]
struct HistogramState {
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    /// An empty histogram over `bounds` (ascending, `+Inf` implied).
    pub fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            inner: Mutex::new(HistogramState {
                counts: vec![0; bounds.len()],
                ..HistogramState::default()
            }),
        }
    }

    /// Records one observation.
    pub fn observe(&self, d: Duration) {
        let v = d.as_secs_f64();
        let mut s = self.inner.lock();
        for (c, &b) in s.counts.iter_mut().zip(self.bounds) {
            if v <= b {
                *c += 1;
            }
        }
        s.sum += v;
        s.count += 1;
    }

    fn render(&self, name: &str, help: &str, out: &mut String) {
        let s = self.inner.lock();
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (c, b) in s.counts.iter().zip(self.bounds) {
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {c}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", s.count);
        let _ = writeln!(out, "{name}_sum {}", s.sum);
        let _ = writeln!(out, "{name}_count {}", s.count);
    }
}

const TTFT_BOUNDS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];
const ITL_BOUNDS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1.0,
];

/// Endpoints counted separately.
pub const ENDPOINTS: &[&str] = &[
    "chat",
    "completions",
    "embeddings",
    "tokenize",
    "detokenize",
    "models",
];

/// Counters the handlers update.
#[derive(Debug)]
pub struct Metrics {
    requests_ok: Vec<AtomicU64>,
    requests_err: Vec<AtomicU64>,
    rejected_busy: AtomicU64,
    prompt_tokens: AtomicU64,
    generated_tokens: AtomicU64,
    cancelled: AtomicU64,
    /// Time from a request's arrival to its first generated token.
    pub ttft: Histogram,
    /// Time between consecutive generated tokens of one request.
    pub itl: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            requests_ok: ENDPOINTS.iter().map(|_| AtomicU64::new(0)).collect(),
            requests_err: ENDPOINTS.iter().map(|_| AtomicU64::new(0)).collect(),
            rejected_busy: AtomicU64::new(0),
            prompt_tokens: AtomicU64::new(0),
            generated_tokens: AtomicU64::new(0),
            cancelled: AtomicU64::new(0),
            ttft: Histogram::new(TTFT_BOUNDS),
            itl: Histogram::new(ITL_BOUNDS),
        }
    }
}

/// What the engine reports at scrape time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineGauges {
    /// Sequences being decoded.
    pub running: usize,
    /// Requests waiting for a slot.
    pub waiting: usize,
    /// KV blocks in use.
    pub kv_blocks_used: usize,
    /// KV blocks free.
    pub kv_blocks_free: usize,
}

/// Memory one device holds for the model, as the engine's plan placed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceMemory {
    /// `cpu`, or the GPU's name.
    pub device: String,
    /// Weight bytes on the device.
    pub weights: u64,
    /// KV-cache bytes on the device (the whole block pool).
    pub kv: u64,
    /// Activation arena and backend workspace (GPU only; the CPU's are allocated per step).
    pub activations: u64,
    /// The memory budget the plan had to fit (`--gpu-mem-limit` or the free memory at start);
    /// `None` for the CPU.
    pub limit: Option<u64>,
}

impl DeviceMemory {
    /// Everything the plan puts on the device.
    pub fn used(&self) -> u64 {
        self.weights
            .saturating_add(self.kv)
            .saturating_add(self.activations)
    }
}

/// The process's resident set in bytes (Linux's `/proc/self/status`; `None` elsewhere).
pub fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line
        .trim_start_matches("VmRSS:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}

fn render_memory(out: &mut String, memory: &[DeviceMemory]) {
    let _ = writeln!(
        out,
        "# HELP rocmforge_memory_used_bytes Memory the model takes by device and use, as planned at load.
# TYPE rocmforge_memory_used_bytes gauge"
    );
    for m in memory {
        for (what, v) in [
            ("weights", m.weights),
            ("kv", m.kv),
            ("activations", m.activations),
        ] {
            let _ = writeln!(
                out,
                "rocmforge_memory_used_bytes{{device=\"{}\",use=\"{what}\"}} {v}",
                m.device
            );
        }
    }
    let _ = writeln!(
        out,
        "# HELP rocmforge_memory_limit_bytes The memory budget of a GPU the plan had to fit.
# TYPE rocmforge_memory_limit_bytes gauge"
    );
    for m in memory {
        if let Some(l) = m.limit {
            let _ = writeln!(
                out,
                "rocmforge_memory_limit_bytes{{device=\"{}\"}} {l}",
                m.device
            );
        }
    }
    let _ = writeln!(
        out,
        "# HELP rocmforge_memory_budget_use_ratio Planned bytes over the budget, per GPU.
# TYPE rocmforge_memory_budget_use_ratio gauge"
    );
    for m in memory {
        if let Some(l) = m.limit.filter(|&l| l > 0) {
            let _ = writeln!(
                out,
                "rocmforge_memory_budget_use_ratio{{device=\"{}\"}} {}",
                m.device,
                m.used() as f64 / l as f64
            );
        }
    }
    if let Some(rss) = resident_bytes() {
        let _ = writeln!(
            out,
            "# HELP rocmforge_resident_bytes The process's resident memory (mapped weights it touched, the CPU's KV cache, everything else).
# TYPE rocmforge_resident_bytes gauge
rocmforge_resident_bytes {rss}"
        );
    }
}

impl Metrics {
    /// Counts a finished request of `endpoint` (one of [`ENDPOINTS`]).
    pub fn request(&self, endpoint: &str, ok: bool) {
        if let Some(i) = ENDPOINTS.iter().position(|e| *e == endpoint) {
            let v = if ok {
                &self.requests_ok
            } else {
                &self.requests_err
            };
            v[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Counts a request refused because the queue was full.
    pub fn rejected_busy(&self) {
        self.rejected_busy.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a request the client abandoned.
    pub fn cancelled(&self) {
        self.cancelled.fetch_add(1, Ordering::Relaxed);
    }

    /// Adds a finished generation's token counts.
    pub fn tokens(&self, prompt: usize, generated: usize) {
        self.prompt_tokens
            .fetch_add(prompt as u64, Ordering::Relaxed);
        self.generated_tokens
            .fetch_add(generated as u64, Ordering::Relaxed);
    }

    /// The exposition text; `engine` and `memory` are `None` while the model loads.
    pub fn render(
        &self,
        engine: Option<EngineGauges>,
        memory: Option<&[DeviceMemory]>,
        in_flight: usize,
    ) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# HELP rocmforge_requests_total Finished requests by endpoint and outcome.\n# TYPE rocmforge_requests_total counter"
        );
        for (i, e) in ENDPOINTS.iter().enumerate() {
            for (status, v) in [("ok", &self.requests_ok), ("error", &self.requests_err)] {
                let _ = writeln!(
                    out,
                    "rocmforge_requests_total{{endpoint=\"{e}\",status=\"{status}\"}} {}",
                    v[i].load(Ordering::Relaxed)
                );
            }
        }
        let counters = [
            (
                "rocmforge_requests_rejected_total",
                "Requests refused with 503 because every slot and queue place was taken.",
                &self.rejected_busy,
            ),
            (
                "rocmforge_requests_cancelled_total",
                "Generations cancelled because the client went away.",
                &self.cancelled,
            ),
            (
                "rocmforge_prompt_tokens_total",
                "Prompt tokens of finished generations.",
                &self.prompt_tokens,
            ),
            (
                "rocmforge_generation_tokens_total",
                "Tokens generated.",
                &self.generated_tokens,
            ),
        ];
        for (name, help, v) in counters {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
                v.load(Ordering::Relaxed)
            );
        }
        self.ttft.render(
            "rocmforge_time_to_first_token_seconds",
            "Time from a request's arrival to its first generated token.",
            &mut out,
        );
        self.itl.render(
            "rocmforge_inter_token_latency_seconds",
            "Time between consecutive generated tokens of a request.",
            &mut out,
        );
        let mut gauge = |name: &str, help: &str, v: usize| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        };
        gauge(
            "rocmforge_requests_in_flight",
            "Generation requests admitted (running or queued).",
            in_flight,
        );
        gauge(
            "rocmforge_model_ready",
            "1 once the model is loaded.",
            usize::from(engine.is_some()),
        );
        if let Some(g) = engine {
            gauge(
                "rocmforge_requests_running",
                "Sequences being decoded.",
                g.running,
            );
            gauge(
                "rocmforge_queue_length",
                "Requests waiting for a decoding slot.",
                g.waiting,
            );
            gauge(
                "rocmforge_kv_blocks_used",
                "KV-cache blocks in use.",
                g.kv_blocks_used,
            );
            gauge(
                "rocmforge_kv_blocks_free",
                "KV-cache blocks free.",
                g.kv_blocks_free,
            );
        }
        if let Some(m) = memory {
            render_memory(&mut out, m);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let h = Histogram::new(&[0.1, 1.0]);
        h.observe(Duration::from_millis(50));
        h.observe(Duration::from_millis(500));
        h.observe(Duration::from_secs(5));
        let mut s = String::new();
        h.render("x", "help", &mut s);
        assert!(s.contains("x_bucket{le=\"0.1\"} 1\n"), "{s}");
        assert!(s.contains("x_bucket{le=\"1\"} 2\n"), "{s}");
        assert!(s.contains("x_bucket{le=\"+Inf\"} 3\n"), "{s}");
        assert!(s.contains("x_count 3\n"), "{s}");
    }
}
