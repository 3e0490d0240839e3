//! `info`, `tokenize`, `generate`, `chat`, `demo` and `synth`: the commands that print a file or
//! produce text.

use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};

use clap::Args;

use super::{ChatArgs, GenArgs, ModelArgs, PromptArgs};
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

/// Largest prompt read from a file or standard input.
pub(super) const MAX_PROMPT_BYTES: u64 = 64 << 20;

/// The prompt text of `-p`, `-f FILE` or `-f -` (standard input), at most
/// [`MAX_PROMPT_BYTES`] of UTF-8.
pub(super) fn prompt_text(p: &PromptArgs) -> Result<String, ModelError> {
    use std::io::Read as _;
    if let Some(text) = &p.prompt {
        return Ok(text.clone());
    }
    let path = p.file.clone().unwrap_or_else(|| PathBuf::from("-"));
    let mut bytes = Vec::new();
    let read = if path.as_os_str() == "-" {
        std::io::stdin()
            .lock()
            .take(MAX_PROMPT_BYTES + 1)
            .read_to_end(&mut bytes)
    } else {
        std::fs::File::open(&path)
            .and_then(|f| f.take(MAX_PROMPT_BYTES + 1).read_to_end(&mut bytes))
    };
    read.map_err(|e| io_err(&path, e))?;
    if bytes.len() as u64 > MAX_PROMPT_BYTES {
        return Err(ModelError::InvalidArgument(format!(
            "{}: the prompt is longer than {} MiB",
            path.display(),
            MAX_PROMPT_BYTES >> 20
        )));
    }
    String::from_utf8(bytes).map_err(|e| {
        io_err(
            &path,
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "the prompt is not UTF-8 text (byte {})",
                    e.utf8_error().valid_up_to()
                ),
            ),
        )
    })
}

/// Longest line `chat` takes as one turn (bytes, without the newline): far above any context a
/// turn fits in, small enough that a runaway pipe cannot fill the memory.
pub(super) const MAX_CHAT_LINE_BYTES: usize = 1 << 20;

/// One line of `chat`'s input.
#[derive(Debug, PartialEq, Eq)]
enum ChatLine {
    /// A line of text, without its line ending.
    Text(String),
    /// A line longer than the cap: its length in bytes (it was read to its end, not kept).
    TooLong(u64),
    /// A line that is not UTF-8: the offset of its first bad byte.
    NotUtf8(usize),
    /// End of input.
    End,
}

/// Reads one line of at most `max` bytes; the bytes of a longer line are consumed but not kept.
fn read_chat_line(r: &mut impl BufRead, max: usize) -> std::io::Result<ChatLine> {
    let mut kept = Vec::new();
    let mut len = 0u64;
    let mut last = None;
    let mut seen_any = false;
    loop {
        let chunk = match r.fill_buf() {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if chunk.is_empty() {
            break;
        }
        seen_any = true;
        let (take, ends) = match chunk.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (chunk.len(), false),
        };
        let content = &chunk[..take - usize::from(ends)];
        len += content.len() as u64;
        last = content.last().copied().or(last);
        // One byte past the cap tells a long line; `\r` of a CRLF ending may be that byte.
        let room = (max + 1).saturating_sub(kept.len());
        kept.extend_from_slice(&content[..content.len().min(room)]);
        r.consume(take);
        if ends {
            break;
        }
    }
    if !seen_any {
        return Ok(ChatLine::End);
    }
    if last == Some(b'\r') {
        len -= 1;
        kept.truncate(len.min(kept.len() as u64) as usize);
    }
    if len > max as u64 {
        return Ok(ChatLine::TooLong(len));
    }
    match String::from_utf8(kept) {
        Ok(s) => Ok(ChatLine::Text(s)),
        Err(e) => Ok(ChatLine::NotUtf8(e.utf8_error().valid_up_to())),
    }
}

/// Refuses `-t` above [`crate::session::MAX_THREADS`] and warns above the core count.
pub(super) fn check_threads(threads: usize) -> Result<(), ModelError> {
    let max = crate::session::MAX_THREADS;
    if threads > max {
        return Err(ModelError::InvalidArgument(format!(
            "-t {threads}: at most {max} threads are supported (0 uses one per core)"
        )));
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if threads > cores {
        tracing::warn!(
            "-t {threads} is more than the {cores} cores here: the extra threads only compete"
        );
    }
    Ok(())
}

pub(super) fn info(path: &Path) -> Result<(), ModelError> {
    let file = gguf::GgufFile::open(path).map_err(|e| ModelError::from(e).in_file(path))?;
    let mut out = std::io::stdout().lock();
    gguf::dump::write_info(&file, &mut out).map_err(|e| io_err(path, e))
}

pub(super) fn tokenize(
    m: &ModelArgs,
    prompt: &PromptArgs,
    add_special: bool,
    ids_only: bool,
) -> Result<(), ModelError> {
    let text = prompt_text(prompt)?;
    let tm = m.load()?;
    let ids = tm.encode(&text, add_special)?;
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
    let text = prompt_text(&a.prompt)?;
    let tm = a.m.load()?;
    let mut session = a.m.session(&tm, &a.m.session_options(&tm)?)?;
    let prompt = tm.encode(&text, true)?;
    let mut sampler = Sampler::new(cfg);
    let opts = GenerateOptions {
        max_tokens: a.n_predict,
        stop_strings: a.s.stop.clone(),
        ignore_eog: a.ignore_eos,
    };
    stdout_write(&text);
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
        if let Some(m) = session.device_memory() {
            eprintln!("[at the end: {m}]");
        }
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
    let mut input = std::io::stdin().lock();
    loop {
        if interactive {
            eprint!("> ");
        }
        let line = match read_chat_line(&mut input, MAX_CHAT_LINE_BYTES)
            .map_err(|e| io_err(Path::new("<stdin>"), e))?
        {
            ChatLine::Text(t) => t,
            ChatLine::End => break,
            ChatLine::TooLong(n) => {
                eprintln!(
                    "chat: a line of {n} bytes was skipped: one turn is at most {} MiB \
                     (for a longer text use `generate -f FILE`)",
                    MAX_CHAT_LINE_BYTES >> 20
                );
                continue;
            }
            ChatLine::NotUtf8(at) => {
                eprintln!("chat: a line that is not UTF-8 text (byte {at}) was skipped");
                continue;
            }
        };
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
    /// Architecture: llama, mistral, qwen2, qwen3, gemma2, gemma3, phi3, olmo2, granite, the
    /// embedding encoders bert and nomic-bert, or with experts mixtral, qwen3moe or gpt-oss.
    #[arg(long)]
    arch: String,
    /// Shape preset (tiny ... llama3-8b, bert-base, nomic-embed-text-v1.5; with experts
    /// tiny-moe, mixtral-8x7b, qwen3-30b-a3b;
    /// see `model::synth::preset`).
    #[arg(long, default_value = "tiny")]
    preset: String,
    /// Weight types: a llama.cpp file type, mixed as llama-quantize mixes it (q4_0, q4_1,
    /// q5_0, q5_1, q8_0, q2_k, q3_k_s/m/l, q4_k_s/m, q5_k_s/m, q6_k, iq4_nl, iq4_xs), or one type
    /// for every matrix (q4_k, q5_k, f16, bf16, f32...).
    #[arg(long, default_value = "q4_k_m")]
    ftype: String,
    /// Random seed of the weights.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Trained context length written to the file (`<arch>.context_length`; default the
    /// preset's): room for benchmarks at depth (`bench -d 32768` on the 8B shape, whose preset
    /// says 8192). Weights stay the same.
    #[arg(long, value_name = "N")]
    ctx: Option<u32>,
    /// Copy the tokenizer from this GGUF (default: a minimal byte-level vocabulary).
    #[arg(long)]
    vocab: Option<PathBuf>,
    /// Output file.
    #[arg(short, long)]
    out: PathBuf,
}

pub(super) fn synth(a: &SynthArgs) -> Result<(), ModelError> {
    let mut opts = crate::synth::SynthOptions::parse(&a.arch, &a.preset, &a.ftype, a.seed)?;
    match a.ctx {
        Some(0) => {
            return Err(ModelError::InvalidArgument(
                "--ctx 0: a model needs a context of at least one position".into(),
            ))
        }
        Some(n) => opts.shape.n_ctx = n,
        None => {}
    }
    crate::synth::write(&opts, a.vocab.as_deref(), &a.out)?;
    eprintln!("wrote {}", a.out.display());
    Ok(())
}

/// What `rocmforge devices` adds for several GPUs: which pairs reach each other directly
/// (peer access), and the collective library (NCCL/RCCL) found with `opts`, or why none.
pub(super) fn several_gpus_summary(opts: &gpu_mem::NcclOptions) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let Ok(list) = gpu_mem::devices() else {
        return s;
    };
    let opened: Vec<gpu_mem::Device> = list
        .iter()
        .filter_map(|d| gpu_mem::Device::open(d.ordinal).ok())
        .collect();
    for a in &opened {
        for b in opened.iter().filter(|b| b.ordinal() > a.ordinal()) {
            let yes = |x: &gpu_mem::Device, y: &gpu_mem::Device| match x.can_access_peer(y) {
                Ok(true) => "yes".to_owned(),
                Ok(false) => "no".to_owned(),
                Err(e) => format!("unknown ({e})"),
            };
            let _ = writeln!(
                s,
                "peer access [{}] -> [{}]: {}, [{}] -> [{}]: {}",
                a.ordinal(),
                b.ordinal(),
                yes(a, b),
                b.ordinal(),
                a.ordinal(),
                yes(b, a)
            );
        }
    }
    if let Some(first) = opened.first() {
        match gpu_mem::comm::load_library(first, opts) {
            Ok(n) => {
                let v = n
                    .version_string()
                    .unwrap_or_else(|e| format!("version unknown: {e}"));
                let _ = writeln!(s, "collectives: {} {v}", n.library_name());
            }
            Err(e) => {
                let _ = writeln!(s, "collectives: none ({e})");
            }
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::super::Cmd;
    use super::*;

    /// The model commands as the binary parses them (it flattens [`Cmd`] into its own list).
    #[derive(Parser)]
    struct Cli {
        #[command(subcommand)]
        cmd: Cmd,
    }

    fn gen_args(args: &[&str]) -> GenArgs {
        let argv = ["rocmforge", "generate"].iter().chain(args).copied();
        match Cli::try_parse_from(argv).map(|c| c.cmd) {
            Ok(Cmd::Generate(g)) => g,
            Ok(other) => panic!("parsed as {other:?}"),
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn synth_writes_the_context_length_asked_for() {
        let out =
            std::env::temp_dir().join(format!("rocmforge-synth-ctx-{}.gguf", std::process::id()));
        let args = |ctx: &str| {
            let o = out.to_str().expect("path");
            let argv = [
                "rocmforge",
                "synth",
                "--arch",
                "llama",
                "--ctx",
                ctx,
                "-o",
                o,
            ];
            match Cli::try_parse_from(argv).map(|c| c.cmd) {
                Ok(Cmd::Synth(a)) => a,
                Ok(other) => panic!("parsed as {other:?}"),
                Err(e) => panic!("{e}"),
            }
        };
        let e = synth(&args("0")).expect_err("a context of 0");
        assert!(e.to_string().contains("--ctx 0"), "{e}");
        synth(&args("40000")).expect("synth");
        let m = crate::session::Model::load(&out, |_, _| {}).expect("load");
        assert_eq!(m.config().n_ctx_train, 40000);
        drop(m);
        let _ = std::fs::remove_file(&out);
    }

    #[test]
    fn negative_sampling_values_are_numbers_not_flags() {
        let g = gen_args(&["-p", "x", "--temp", "-1", "--presence-penalty", "-0.5"]);
        assert_eq!(g.s.temp, -1.0);
        assert_eq!(g.s.presence_penalty, -0.5);
        assert_eq!(g.s.config().expect("greedy").temperature, -1.0);
    }

    #[test]
    fn non_finite_sampling_values_are_refused() {
        for (flag, v) in [
            ("--temp", "NaN"),
            ("--repeat-penalty", "nan"),
            ("--frequency-penalty", "inf"),
            ("--presence-penalty", "NaN"),
            ("--top-p", "NaN"),
        ] {
            let g = gen_args(&["-p", "x", flag, v]);
            let e = g.s.config().expect_err("non-finite value");
            assert!(matches!(e, ModelError::InvalidArgument(_)), "{e:?}");
            assert!(e.to_string().contains(flag), "{flag} {v}: {e}");
        }
    }

    #[test]
    fn prompts_come_from_text_or_a_file() {
        let path =
            std::env::temp_dir().join(format!("rocmforge-prompt-{}.txt", std::process::id()));
        std::fs::write(&path, "Once upon a time\n").expect("write prompt");
        let g = gen_args(&["-f", path.to_str().expect("utf-8 path")]);
        assert_eq!(prompt_text(&g.prompt).expect("file"), "Once upon a time\n");
        let g = gen_args(&["-p", "inline"]);
        assert_eq!(prompt_text(&g.prompt).expect("text"), "inline");
        std::fs::write(&path, [0xff, 0xfe]).expect("write bytes");
        let g = gen_args(&["-f", path.to_str().expect("utf-8 path")]);
        let e = prompt_text(&g.prompt).expect_err("not UTF-8");
        assert!(e.to_string().contains("not UTF-8"), "{e}");
        let _ = std::fs::remove_file(&path);
        // Exactly one of -p and -f.
        assert!(Cli::try_parse_from(["rocmforge", "generate"]).is_err());
        assert!(Cli::try_parse_from(["rocmforge", "generate", "-p", "a", "-f", "b"]).is_err());
    }

    #[test]
    fn chat_lines_are_capped_and_the_session_goes_on() {
        let long = "x".repeat(100);
        let input = format!("hello\r\n{long}\nabc\n\u{e9}t\u{e9}\nlast");
        let mut bytes = input.into_bytes();
        bytes.extend_from_slice(b"\n\xff\xfe\nend");
        // A small buffer so lines span many reads.
        let mut r = std::io::BufReader::with_capacity(7, &bytes[..]);
        let mut got = Vec::new();
        loop {
            let line = read_chat_line(&mut r, 10).expect("read");
            if line == ChatLine::End {
                break;
            }
            got.push(line);
        }
        assert_eq!(
            got,
            [
                ChatLine::Text("hello".into()),
                ChatLine::TooLong(100),
                ChatLine::Text("abc".into()),
                ChatLine::Text("\u{e9}t\u{e9}".into()),
                ChatLine::Text("last".into()),
                ChatLine::NotUtf8(0),
                ChatLine::Text("end".into()),
            ]
        );
        // At the cap exactly, with and without a CRLF ending; one past it is too long.
        for (text, want) in [
            ("0123456789\r\n", ChatLine::Text("0123456789".into())),
            ("0123456789\n", ChatLine::Text("0123456789".into())),
            ("0123456789a\r\n", ChatLine::TooLong(11)),
            ("", ChatLine::End),
        ] {
            let mut r = text.as_bytes();
            assert_eq!(read_chat_line(&mut r, 10).expect("read"), want, "{text:?}");
        }
    }

    #[test]
    fn thread_counts_are_capped() {
        assert!(check_threads(0).is_ok());
        let e = check_threads(100_000).expect_err("too many");
        assert!(e.to_string().contains("at most 512"), "{e}");
    }

    #[test]
    fn perplexity_arguments_fail_before_loading() {
        for (args, words) in [
            (&["-c", "3"][..], "at least 4 tokens"),
            (&["--chunks", "0"][..], "--chunks 0"),
        ] {
            let argv = [
                "rocmforge",
                "perplexity",
                "-f",
                "/nonexistent",
                "-m",
                "/nonexistent",
            ];
            let cli = Cli::try_parse_from(argv.iter().chain(args)).expect("parse");
            let Cmd::Perplexity(a) = cli.cmd else {
                panic!("not perplexity")
            };
            let e = super::super::bench::perplexity(&a).expect_err("bad arguments");
            assert!(e.to_string().contains(words), "{args:?}: {e}");
        }
    }
}
