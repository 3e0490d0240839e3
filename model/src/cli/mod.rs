//! The `rocmforge` command-line front end: argument parsing and one module per group of
//! subcommands. The binary itself lives in the `server` crate, which adds `serve` to these.

mod batched_bench;
mod bench;
mod cache;
mod embed;
mod env;
mod run;

use std::path::PathBuf;

use clap::{Args, Subcommand};
use ggml_graph::StackKernel;
use indicatif::{ProgressBar, ProgressStyle};

pub use cache::{cache_dir, DEFAULT_MODEL_FILE};

use crate::arch::KvType;
use crate::error::ModelError;
use crate::gpus::{GpuSelection, SplitMode};
use crate::placement::{parse_bytes, DeviceChoice};
use crate::sampling::SamplerConfig;
use crate::session::{Session, SessionOptions};
use crate::text::TextModel;

/// The default model path.
pub fn default_model() -> PathBuf {
    cache_dir().join(DEFAULT_MODEL_FILE)
}

pub use env::{get as env_value, API_KEY as API_KEY_VAR};

/// The model commands; the binary flattens them into its own command list.
#[derive(Subcommand, Debug)]
pub enum Cmd {
    /// List the GPUs the HIP providers find (AMD, or NVIDIA through HIP's CUDA platform).
    Devices,
    /// Print a GGUF file's header, metadata and tensor table.
    Info {
        /// The GGUF file.
        #[arg(short, long)]
        model: Option<PathBuf>,
    },
    /// Print the token ids (and pieces) of a text.
    Tokenize {
        /// The model whose tokenizer to use.
        #[command(flatten)]
        m: ModelArgs,
        /// The text.
        #[command(flatten)]
        prompt: PromptArgs,
        /// Do not add BOS/EOS even if the model asks for them.
        #[arg(long)]
        no_special: bool,
        /// Print only the ids, space-separated.
        #[arg(long)]
        ids_only: bool,
    },
    /// Continue a prompt, streaming the text.
    Generate(GenArgs),
    /// Interactive chat using the model's chat template (reads stdin line by line; a line of
    /// more than 1 MiB is skipped with a message and the chat goes on).
    Chat(ChatArgs),
    /// Prompt-processing and generation speed, like llama-bench.
    Bench(bench::BenchArgs),
    /// Many sequences at once through the batching engine, like llama-batched-bench.
    BatchedBench(batched_bench::BatchedBenchArgs),
    /// Perplexity over a text file, like llama-perplexity.
    Perplexity(bench::PplArgs),
    /// Generate a short text from a fixed prompt with the default model.
    Demo {
        /// The model (the default one when none is given).
        #[command(flatten)]
        m: ModelArgs,
        /// Tokens to generate.
        #[arg(short = 'n', long, default_value_t = 96)]
        n_predict: usize,
    },
    /// The GPU/CPU split and the GPU bytes a run would use, without running the model (on
    /// GPU 0, or without a GPU for `--gpu-mem` bytes).
    Fit(FitArgs),
    /// The embedding of a text (an embedding model's, or a decoder's pooled hidden states),
    /// as a JSON array, like llama-embedding.
    Embed(embed::EmbedArgs),
    /// Write a synthetic GGUF model (seeded random weights at a real architecture's shapes).
    Synth(run::SynthArgs),
    /// List the environment variables rocmforge reads, their meaning, defaults and values now.
    Env,
}

/// Model and session settings shared by the commands that run a model (`serve` too).
#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// The GGUF model (default: the model `cargo xtask fetch-model` downloads).
    #[arg(short, long)]
    model: Option<PathBuf>,
    /// Context length (0: the model's maximum; default 4096 or the model's maximum if smaller).
    #[arg(short = 'c', long = "ctx-size")]
    ctx: Option<usize>,
    /// CPU threads (0: all cores; more than the cores warns, more than 512 is refused).
    #[arg(short = 't', long, default_value_t = 0)]
    threads: usize,
    /// Prompt tokens per forward pass.
    #[arg(short = 'b', long = "batch-size", default_value_t = 512)]
    batch: usize,
    /// KV cache element type: f16, f32 or q8_0 (half of f16's memory; the model's head size
    /// must be a multiple of 32).
    #[arg(long = "kv-type", default_value = "f16")]
    kv_type: KvType,
    /// Same as `--kv-type f32`.
    #[arg(long, conflicts_with = "kv_type")]
    kv_f32: bool,
    /// Where to run: auto (the GPU when present, as many layers as fit), gpu or cpu.
    #[arg(long, default_value = "auto")]
    device: DeviceChoice,
    /// Repeating layers on the GPU, counted from the last (more than the model has: the output
    /// head too); default: as many as fit.
    /// (`-ngl N` is accepted as in llama.cpp.)
    #[arg(long = "n-gpu-layers", visible_alias = "ngl")]
    n_gpu_layers: Option<usize>,
    /// Caps the GPU memory used (bytes, or with a K/M/G suffix); also env
    /// ROCMFORGE_GPU_MEM_LIMIT (see `rocmforge env`).
    #[arg(long)]
    gpu_mem_limit: Option<String>,
    /// How a model spreads over several GPUs: layer (consecutive layers per GPU), tensor (alias
    /// row: every layer on every GPU, attention heads and feed-forward columns divided among
    /// them) or none (one GPU, `--main-gpu`). Default: one GPU when the model fits it, else
    /// layer over all. (`-sm` is accepted as in llama.cpp.)
    #[arg(long)]
    split_mode: Option<String>,
    /// GPUs to use, in split order (`0,2`); default: all.
    #[arg(long)]
    devices: Option<String>,
    /// Share of the layers (split mode layer) or of the heads and feed-forward columns (split
    /// mode tensor) per GPU (`3,1`); default: in proportion to free memory.
    /// (`-ts` is accepted as in llama.cpp.)
    #[arg(long)]
    tensor_split: Option<String>,
    /// The GPU (index into the GPUs used) holding the output head with `--split-mode layer`
    /// (default: the last) or the embeddings, norms, sums and head with `--split-mode tensor`
    /// (default: the first), or the one GPU used with `--split-mode none` (default: the first).
    /// (`-mg` is accepted as in llama.cpp.)
    #[arg(long)]
    main_gpu: Option<usize>,
    /// One process per GPU: this process is rank `--rank` of `--world-size` of a tensor split,
    /// meeting the others at `HOST:PORT` (rank 0 listens there). Every rank runs the same
    /// command on its own GPU (`--devices N` or `CUDA_VISIBLE_DEVICES`).
    #[arg(long, value_name = "HOST:PORT", requires_all = ["rank", "world_size"])]
    dist_init: Option<String>,
    /// This process's rank with `--dist-init` (0 listens).
    #[arg(long, requires = "dist_init")]
    rank: Option<usize>,
    /// Number of ranks with `--dist-init`.
    #[arg(long, requires = "dist_init")]
    world_size: Option<usize>,
    /// Seconds the ranks wait for each other (the rendezvous, and any one collective before
    /// the watchdog aborts it).
    #[arg(long, default_value_t = 120)]
    dist_timeout: u64,
    /// Runs llama-family decode layers with the per-op GPU kernels instead of the persistent
    /// decode stack (one cooperative kernel per step), which they use by default where the
    /// layers fit it.
    #[arg(long)]
    no_gpu_stack: bool,
    /// The persistent decode stack's kernel: auto (the NVIDIA-specific one where the GPU runs
    /// it, its split-attention form on long contexts; else the portable one, as on AMD), native,
    /// short (never the split form), split (always it), portable (also on NVIDIA), or off (as
    /// `--no-gpu-stack`).
    #[arg(long, value_name = "KERNEL", conflicts_with = "no_gpu_stack")]
    gpu_stack: Option<String>,
    /// Read the model into memory instead of mapping it: uses RAM for the whole file, but the
    /// run no longer depends on the file staying unchanged (a mapped file that is truncated or
    /// rewritten meanwhile kills the process with SIGBUS or changes its output).
    #[arg(long)]
    no_mmap: bool,
}

impl ModelArgs {
    /// The model file: `-m`, else the default model.
    pub fn path(&self) -> PathBuf {
        self.model.clone().unwrap_or_else(default_model)
    }

    /// The session settings the flags ask for (`--ctx-size` defaults to 4096 or the model's
    /// maximum if smaller).
    pub fn session_options(&self, tm: &TextModel) -> Result<SessionOptions, ModelError> {
        let max = tm.model().config().n_ctx_train;
        let limit = match &self.gpu_mem_limit {
            Some(s) => Some(s.clone()),
            None => env::gpu_mem_limit(),
        };
        run::check_threads(self.threads)?;
        // Before any session opens a GPU (`serve` comes here too).
        env::choose_platform()?;
        // `--gpu-stack`: None where it is off.
        let stack = match self.gpu_stack.as_deref() {
            None => Some(StackKernel::Auto),
            Some("off") => None,
            Some(k) => Some(k.parse().map_err(ModelError::InvalidArgument)?),
        };
        let mut opts = SessionOptions {
            n_ctx: self.ctx.unwrap_or(4096.min(max)),
            kv_type: if self.kv_f32 {
                KvType::F32
            } else {
                self.kv_type
            },
            n_batch: self.batch,
            n_threads: self.threads,
            device: self.device,
            n_gpu_layers: self.n_gpu_layers,
            gpu_mem_limit: limit.as_deref().map(parse_bytes).transpose()?,
            gpus: self.gpu_selection()?,
            gpu_stack: !self.no_gpu_stack && stack.is_some(),
            ..SessionOptions::default()
        };
        opts.hip.stack_kernel = stack.unwrap_or(StackKernel::Auto);
        env::apply(&mut opts);
        Ok(opts)
    }

    /// The GPUs and split the flags ask for.
    fn gpu_selection(&self) -> Result<GpuSelection, ModelError> {
        Ok(GpuSelection {
            devices: self
                .devices
                .as_deref()
                .map(GpuSelection::parse_devices)
                .transpose()?,
            split_mode: self
                .split_mode
                .as_deref()
                .map(str::parse::<SplitMode>)
                .transpose()?,
            tensor_split: self
                .tensor_split
                .as_deref()
                .map(GpuSelection::parse_tensor_split)
                .transpose()?,
            main_gpu: self.main_gpu,
            collectives: env::collective_options(),
            dist: match (&self.dist_init, self.rank, self.world_size) {
                (Some(addr), Some(rank), Some(world)) => Some(crate::dist::DistSpec::new(
                    addr,
                    rank,
                    world,
                    std::time::Duration::from_secs(self.dist_timeout.max(1)),
                )?),
                _ => None,
            },
        })
    }

    /// A session with a progress bar for the weight upload; prints the device plan to stderr and,
    /// on a GPU, the memory in use after the first forward pass.
    fn session(&self, tm: &TextModel, opts: &SessionOptions) -> Result<Session, ModelError> {
        let bar = ProgressBar::new(0);
        bar.set_style(
            ProgressStyle::with_template("uploading weights [{bar:30}] {bytes}/{total_bytes}")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        let s = Session::with_progress(tm.model(), opts, &mut |done, total| {
            bar.set_length(total);
            bar.set_position(done);
        });
        bar.finish_and_clear();
        let mut s = s?;
        eprintln!("{}", s.device_plan());
        if s.device_plan().uses_gpu() {
            s.on_first_pass(Box::new(|m| eprintln!("after the first forward pass: {m}")));
        }
        Ok(s)
    }

    /// Loads the model with a progress bar on stderr.
    pub fn load(&self) -> Result<TextModel, ModelError> {
        let path = self.path();
        if !path.exists() {
            return Err(ModelError::Io {
                path: path.clone(),
                source: std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "model not found (run `cargo xtask fetch-model` for the default model, or pass -m)",
                ),
            });
        }
        let bar = ProgressBar::new(0);
        bar.set_style(
            ProgressStyle::with_template(
                "loading {msg} [{bar:30}] {bytes}/{total_bytes} ({elapsed})",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        bar.set_message(
            path.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
        );
        let opts = crate::session::LoadOptions {
            mmap: !self.no_mmap,
        };
        let tm = TextModel::load_with(&path, &opts, |done, total| {
            bar.set_length(total);
            bar.set_position(done);
        });
        bar.finish_and_clear();
        tm
    }
}

/// Sampling flags.
#[derive(Args, Debug, Clone)]
struct SampleArgs {
    /// Temperature (0 or below: greedy).
    #[arg(long, default_value_t = 0.8, allow_negative_numbers = true)]
    temp: f32,
    /// Top-k (0: off).
    #[arg(long, default_value_t = 40)]
    top_k: usize,
    /// Top-p (1.0: off).
    #[arg(long, default_value_t = 0.95, allow_negative_numbers = true)]
    top_p: f32,
    /// Min-p (0: off).
    #[arg(long, default_value_t = 0.05, allow_negative_numbers = true)]
    min_p: f32,
    /// Repetition penalty (1.0: off).
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    repeat_penalty: f32,
    /// Tokens the penalties look back over.
    #[arg(long, default_value_t = 64)]
    repeat_last_n: usize,
    /// Frequency penalty.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    frequency_penalty: f32,
    /// Presence penalty.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    presence_penalty: f32,
    /// Random seed (same seed, same text).
    #[arg(long, default_value_t = 0x5eed)]
    seed: u64,
    /// Stop when this text appears (repeatable).
    #[arg(long = "stop")]
    stop: Vec<String>,
}

impl SampleArgs {
    fn config(&self) -> Result<SamplerConfig, ModelError> {
        let finite = [
            ("--temp", self.temp),
            ("--top-p", self.top_p),
            ("--min-p", self.min_p),
            ("--repeat-penalty", self.repeat_penalty),
            ("--frequency-penalty", self.frequency_penalty),
            ("--presence-penalty", self.presence_penalty),
        ];
        if let Some((flag, v)) = finite.iter().find(|(_, v)| !v.is_finite()) {
            return Err(ModelError::InvalidArgument(format!(
                "{flag} {v} is not a number: give a finite value"
            )));
        }
        if !(0.0..=1.0).contains(&self.top_p) || !(0.0..=1.0).contains(&self.min_p) {
            return Err(ModelError::InvalidArgument(
                "--top-p and --min-p must be between 0 and 1".into(),
            ));
        }
        if self.repeat_penalty <= 0.0 {
            return Err(ModelError::InvalidArgument(
                "--repeat-penalty must be positive".into(),
            ));
        }
        Ok(SamplerConfig {
            temperature: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n,
            frequency_penalty: self.frequency_penalty,
            presence_penalty: self.presence_penalty,
            seed: self.seed,
        })
    }
}

/// Where the prompt comes from: `-p TEXT`, `-f FILE`, or `-f -` for standard input.
#[derive(Args, Debug, Clone)]
#[group(required = true, multiple = false)]
pub struct PromptArgs {
    /// The prompt text.
    #[arg(short, long)]
    prompt: Option<String>,
    /// Read the prompt from this file (`-` reads standard input); at most 64 MiB.
    #[arg(short = 'f', long = "file")]
    file: Option<PathBuf>,
}

/// The options of `rocmforge generate`.
#[derive(Args, Debug)]
pub struct GenArgs {
    #[command(flatten)]
    m: ModelArgs,
    #[command(flatten)]
    s: SampleArgs,
    #[command(flatten)]
    prompt: PromptArgs,
    /// Tokens to generate.
    #[arg(short = 'n', long = "n-predict", default_value_t = 128)]
    n_predict: usize,
    /// Keep generating past end-of-generation tokens.
    #[arg(long)]
    ignore_eos: bool,
    /// Print timings to stderr at the end.
    #[arg(long)]
    stats: bool,
}

/// The options of `rocmforge chat`.
#[derive(Args, Debug)]
pub struct ChatArgs {
    #[command(flatten)]
    m: ModelArgs,
    #[command(flatten)]
    s: SampleArgs,
    /// System prompt.
    #[arg(long)]
    system: Option<String>,
    /// Tokens per reply at most.
    #[arg(short = 'n', long = "n-predict", default_value_t = 512)]
    n_predict: usize,
}

/// The process arguments, with llama.cpp's spellings made clap's.
pub fn args() -> impl Iterator<Item = std::ffi::OsString> {
    // llama.cpp spells the layer count `-ngl`, the split flags `-sm`, `-ts`, `-mg` (and batched-bench's lists `-npp`, `-ntg`,
    // `-npl`), which are not one-letter flags for clap.
    std::env::args_os().map(|a| {
        if a == "-ngl" {
            "--n-gpu-layers".into()
        } else if a == "-sm" {
            "--split-mode".into()
        } else if a == "-ts" {
            "--tensor-split".into()
        } else if a == "-mg" {
            "--main-gpu".into()
        } else if a == "-npp" || a == "-ntg" || a == "-npl" {
            format!("-{}", a.to_string_lossy()).into()
        } else {
            a
        }
    })
}

/// Logs to stderr, filtered by `ROCMFORGE_LOG` (default: warnings).
pub fn init_logging() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env(env::LOG)
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .try_init();
}

/// Arguments of `rocmforge fit`.
#[derive(Args, Debug)]
pub struct FitArgs {
    /// Model, context, batch, KV type, `-ngl`, `--gpu-mem-limit`.
    #[command(flatten)]
    m: ModelArgs,
    /// Plan for a GPU of this many bytes (K/M/G suffix) instead of GPU 0: works without a
    /// GPU; the runtime context's share is then unknown and not counted.
    #[arg(long)]
    gpu_mem: Option<String>,
}

/// `rocmforge fit`: the plan and its byte breakdown.
fn fit(a: &FitArgs) -> Result<(), ModelError> {
    let tm = a.m.load()?;
    let opts = a.m.session_options(&tm)?;
    let target = match &a.gpu_mem {
        Some(s) => {
            let total = parse_bytes(s)?;
            // The run's budget from a card's free memory, under the limit when given.
            let budget = gpu_mem::BudgetConfig::inference().limit_for(total);
            let available = opts.gpu_mem_limit.map_or(budget, |l| budget.min(l));
            let cfg = gpu_mem::BudgetConfig::inference();
            crate::fit::FitTarget::Budget {
                available,
                note: format!(
                    "a {} card: {:.0}% of it less {} kept back{}",
                    crate::placement::mib(total),
                    cfg.fraction * 100.0,
                    crate::placement::mib(cfg.reserve_bytes),
                    if opts.gpu_mem_limit.is_some() {
                        ", under --gpu-mem-limit"
                    } else {
                        ""
                    }
                ),
            }
        }
        None => crate::fit::FitTarget::Device,
    };
    let r = crate::fit::fit(tm.model(), &opts, &target).map_err(|e| match (&target, e) {
        (crate::fit::FitTarget::Device, ModelError::Graph(g)) => ModelError::Device(format!(
            "{g}; give --gpu-mem BYTES to plan for a GPU without one"
        )),
        (_, e) => e,
    })?;
    println!("{r}");
    Ok(())
}

/// Runs one model command.
pub fn run(cmd: Cmd) -> Result<(), ModelError> {
    env::choose_platform()?;
    match cmd {
        Cmd::Devices => {
            gpu_mem::print_summary();
            print!("{}", run::several_gpus_summary(&env::nccl_options()));
            Ok(())
        }
        Cmd::Info { model } => run::info(&model.unwrap_or_else(default_model)),
        Cmd::Tokenize {
            m,
            prompt,
            no_special,
            ids_only,
        } => run::tokenize(&m, &prompt, !no_special, ids_only),
        Cmd::Generate(a) => run::generate(&a),
        Cmd::Chat(a) => run::chat(&a),
        Cmd::Bench(a) => bench::bench(&a),
        Cmd::BatchedBench(a) => batched_bench::batched_bench(&a),
        Cmd::Perplexity(a) => bench::perplexity(&a),
        Cmd::Demo { m, n_predict } => run::demo(&m, n_predict),
        Cmd::Synth(a) => run::synth(&a),
        Cmd::Embed(a) => embed::embed(&a),
        Cmd::Fit(a) => fit(&a),
        Cmd::Env => {
            print!("{}", env::table());
            Ok(())
        }
    }
}
