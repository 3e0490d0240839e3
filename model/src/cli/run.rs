//! `info`, `tokenize`, `generate`, `chat`, `demo` and `synth`: the commands that print a file or
//! produce text.

use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};

use clap::Args;

use super::{ChatArgs, GenArgs, ModelArgs};
use crate::chat::ChatMessage;
use crate::error::ModelError;
use crate::generate::{generate as run_generation, GenerateOptions, Generation};
use crate::sampling::{Sampler, SamplerConfig};
use crate::session::Session;

fn io_err(path: &Path, source: std::io::Error) -> ModelError {
    ModelError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn stdout_write(text: &str) {
    let mut out = std::io::stdout().lock();
    // A closed pipe (e.g. `| head`) is not an error worth reporting mid-stream.
    let _ = out.write_all(text.as_bytes());
    let _ = out.flush();
}

pub(super) fn info(path: &Path) -> Result<(), ModelError> {
    let file = gguf::GgufFile::open(path).map_err(|e| ModelError::from(e).in_file(path))?;
    let mut out = std::io::stdout().lock();
    gguf::dump::write_info(&file, &mut out).map_err(|e| io_err(path, e))
}

pub(super) fn tokenize(
    m: &ModelArgs,
    text: &str,
    add_special: bool,
    ids_only: bool,
) -> Result<(), ModelError> {
    let tm = m.load()?;
    let ids = tm.encode(text, add_special)?;
    if ids_only {
        let s: Vec<String> = ids.iter().map(u32::to_string).collect();
        println!("{}", s.join(" "));
        return Ok(());
    }
    for id in ids {
        let piece = String::from_utf8_lossy(&tm.tokenizer().token_to_piece(id)).into_owned();
        println!("{id:>8} -> {piece:?}");
    }
    Ok(())
}

fn print_stats(g: &Generation) {
    let pp = g.prompt_tokens as f64 / g.prompt_s.max(1e-9);
    let tg = g.tokens.len() as f64 / g.gen_s.max(1e-9);
    eprintln!(
        "\n[prompt: {} tokens, {:.1} t/s | generated: {} tokens, {:.1} t/s | stop: {:?}]",
        g.prompt_tokens,
        pp,
        g.tokens.len(),
        tg,
        g.stop
    );
}

pub(super) fn generate(a: &GenArgs) -> Result<(), ModelError> {
    let cfg = a.s.config()?;
    let tm = a.m.load()?;
    let mut session = a.m.session(&tm, &a.m.session_options(&tm)?)?;
    let prompt = tm.encode(&a.prompt, true)?;
    let mut sampler = Sampler::new(cfg);
    let opts = GenerateOptions {
        max_tokens: a.n_predict,
        stop_strings: a.s.stop.clone(),
        ignore_eog: a.ignore_eos,
    };
    stdout_write(&a.prompt);
    let g = run_generation(
        &mut session,
        &tm,
        &mut sampler,
        &prompt,
        &opts,
        stdout_write,
    )?;
    stdout_write("\n");
    if a.stats {
        print_stats(&g);
    }
    Ok(())
}

/// Renders the conversation, reuses the cached prefix and generates the assistant's reply.
fn chat_turn(
    tm: &crate::text::TextModel,
    session: &mut Session,
    sampler: &mut Sampler,
    messages: &[ChatMessage],
    opts: &GenerateOptions,
) -> Result<String, ModelError> {
    let template = tm.chat_template();
    let text = template.render(messages, true)?;
    let tokens = tm.encode_chat(&text)?;
    let cached = session.reuse_prefix(&tokens);
    if tokens.len() + opts.max_tokens > session.n_ctx() {
        return Err(ModelError::ContextFull {
            needed: tokens.len() + opts.max_tokens,
            n_ctx: session.n_ctx(),
        });
    }
    let mut reply = String::new();
    let mut opts = opts.clone();
    opts.stop_strings.extend(template.stop_strings());
    run_generation(session, tm, sampler, &tokens[cached..], &opts, |t| {
        reply.push_str(t);
        stdout_write(t);
    })?;
    stdout_write("\n");
    Ok(reply)
}

pub(super) fn chat(a: &ChatArgs) -> Result<(), ModelError> {
    let cfg = a.s.config()?;
    let tm = a.m.load()?;
    let mut session = a.m.session(&tm, &a.m.session_options(&tm)?)?;
    let mut sampler = Sampler::new(cfg);
    let opts = GenerateOptions {
        max_tokens: a.n_predict,
        stop_strings: a.s.stop.clone(),
        ignore_eog: false,
    };
    let mut messages = Vec::new();
    if let Some(sys) = &a.system {
        messages.push(ChatMessage::new("system", sys.clone()));
    }
    let interactive = std::io::stdin().is_terminal();
    if interactive {
        eprintln!("chat with the model; an empty line or Ctrl-D ends the session");
    }
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    loop {
        if interactive {
            eprint!("> ");
        }
        let Some(line) = lines.next() else { break };
        let line = line.map_err(|e| io_err(Path::new("<stdin>"), e))?;
        let line = line.trim();
        if line.is_empty() {
            if interactive {
                break;
            }
            continue;
        }
        messages.push(ChatMessage::new("user", line));
        let reply = chat_turn(&tm, &mut session, &mut sampler, &messages, &opts)?;
        messages.push(ChatMessage::new("assistant", reply.trim()));
    }
    Ok(())
}

/// The prompt `demo` continues.
pub const DEMO_PROMPT: &str = "Once upon a time, in a small village by the sea,";

pub(super) fn demo(m: &ModelArgs, n_predict: usize) -> Result<(), ModelError> {
    let tm = m.load()?;
    let mut session = m.session(&tm, &m.session_options(&tm)?)?;
    let mut sampler = Sampler::new(SamplerConfig {
        temperature: 0.7,
        repeat_penalty: 1.1,
        seed: 42,
        ..SamplerConfig::default()
    });
    let cfg = tm.model().config();
    eprintln!(
        "model: {} ({}, {} layers, {} threads on the CPU)\n",
        m.path().display(),
        cfg.arch.name(),
        cfg.n_layer,
        session.n_threads()
    );
    let opts = GenerateOptions {
        max_tokens: n_predict,
        stop_strings: Vec::new(),
        ignore_eog: false,
    };
    let tokens = tm.encode(DEMO_PROMPT, true)?;
    stdout_write(DEMO_PROMPT);
    let g = run_generation(
        &mut session,
        &tm,
        &mut sampler,
        &tokens,
        &opts,
        stdout_write,
    )?;
    stdout_write("\n");
    print_stats(&g);
    Ok(())
}

/// `synth` arguments.
#[derive(Args, Debug)]
pub struct SynthArgs {
    /// Architecture: llama, mistral, qwen2, qwen3 or gemma3.
    #[arg(long)]
    arch: String,
    /// Shape preset (tiny ... llama3-8b; see `model::synth::preset`).
    #[arg(long, default_value = "tiny")]
    preset: String,
    /// Weight types: q4_k_m, or one type such as q8_0 or f16.
    #[arg(long, default_value = "q4_k_m")]
    ftype: String,
    /// Random seed of the weights.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Copy the tokenizer from this GGUF (default: a minimal byte-level vocabulary).
    #[arg(long)]
    vocab: Option<PathBuf>,
    /// Output file.
    #[arg(short, long)]
    out: PathBuf,
}

pub(super) fn synth(a: &SynthArgs) -> Result<(), ModelError> {
    let opts = crate::synth::SynthOptions::parse(&a.arch, &a.preset, &a.ftype, a.seed)?;
    crate::synth::write(&opts, a.vocab.as_deref(), &a.out)?;
    eprintln!("wrote {}", a.out.display());
    Ok(())
}
