//! BPE pre-tokenizers: split text into words the way llama.cpp's hand-written splitters do for
//! the GPT-2, llama3 and qwen2 regexes, and its `std::regex` passes for the default set.
//!
//! Every splitter works on code points and refines a list of chunk lengths (in code points), so
//! several passes can run one after the other as llama.cpp chains its regexes.

use std::sync::OnceLock;

use super::regex::Regex;
use super::unicode::{flags, Flags};

/// llama.cpp's pre-tokenizer types (`LLAMA_VOCAB_PRE_TYPE_*`), each a chain of splitting
/// passes over the text.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PreTokenizer {
    /// No `tokenizer.ggml.pre`, `default` or an unknown name: punctuation runs, GPT-2 words,
    /// digit runs, 3-digit groups.
    Default,
    /// `gpt-2`, `mpt`, `olmo`, `jais`, `trillion`, `granite-docling`...: the GPT-2 regex.
    Gpt2,
    /// `llama3`/`llama-bpe`, `dbrx`, `smaug-bpe`, `chatglm-bpe`/`glm4`...: the llama 3 regex
    /// (digits in groups of up to three).
    Llama3,
    /// `qwen2`, `stablelm2`, `hunyuan`, `solar-open`, `grok-2`, `megrez`...: the llama 3
    /// regex with single digits.
    Qwen2,
    /// `qwen35`: as `Qwen2` with combining marks inside words.
    Qwen35,
    /// `deepseek-llm`
    DeepseekLlm,
    /// `deepseek-coder`
    DeepseekCoder,
    /// `deepseek-v3`, `hunyuan-dense`, `joyai-llm`, `hy_v4`
    Deepseek3,
    /// `spark2_5`
    Spark25,
    /// `youtu`
    Youtu,
    /// `falcon`
    Falcon,
    /// `starcoder`, `refact`, `command-r`, `smollm`, `codeshell`, `exaone`, `minerva-7b`,
    /// `mellum2`: single digits, then the GPT-2 regex.
    Starcoder,
    /// `poro-chat`, `bloom`, `gpt3-finnish`
    Bloom,
    /// `viking`
    Viking,
    /// `tekken`
    Tekken,
    /// `chameleon`
    Chameleon,
    /// `gpt-4o`, `llama4`, `minimax-m2`, `kanana2`, `talkie`
    Gpt4o,
    /// `granite-embed-multi-97m`
    GraniteEmbMulti,
    /// `tiny_aya`, `cohere2moe`
    TinyAya,
    /// `kimi-k2`
    KimiK2,
    /// `superbpe`
    SuperBpe,
    /// `bailingmoe`, `bailingmoe2`, `llada-moe`
    BailingMoe,
    /// `seed-coder`
    SeedCoder,
    /// `ufakzeka`
    Ufakzeka,
    /// `afmoe`
    Afmoe,
    /// `laguna`
    Laguna,
    /// `exaone-moe`
    ExaoneMoe,
    /// `jais-2`
    Jais2,
    /// `gemma4`, `granite-embed-multi-311m`: SentencePiece-style BPE, split at newlines only.
    Gemma4,
    /// `sarvam-moe`: as `Gemma4`.
    SarvamMoe,
    /// `minicpm5`
    MiniCpm5,
    /// `whitespace`: runs of non-space.
    Whitespace,
}

/// How a `tokenizer.ggml.pre` name changes the vocabulary's defaults (llama.cpp's loader).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct PreFlags {
    /// `clean_spaces = false` for this name.
    pub no_clean_spaces: bool,
    /// Whole words found in the vocabulary skip the merges.
    pub ignore_merges: bool,
    /// BOS is added by default.
    pub add_bos: bool,
    /// The BOS id is cleared.
    pub no_bos: bool,
    /// Spaces become `▁` before splitting.
    pub escape_whitespaces: bool,
}

/// One splitting pass.
#[derive(Clone, Copy, Debug)]
enum Step {
    /// llama.cpp's hand-written GPT-2 splitter.
    Gpt2,
    /// llama.cpp's hand-written llama 3 splitter with this many digits per group.
    Llama3(usize),
    /// The hand-written Kimi-K2 splitter.
    Kimi,
    /// The hand-written AFMoE digit grouping.
    AfmoeDigits,
    /// `[^\n]+|[\n]+`
    Newlines,
    /// A regular expression run as `std::regex` would.
    Re(&'static str),
}

const DEEPSEEK_LLM_LETTERS: &str = "\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+";
const CJK_DEEPSEEK: &str = "[一-龥ࠀ-一가-퟿]+";
const CJK_KANA: &str = "[一-龥぀-ゟ゠-ヿ]+";
const DEEPSEEK3_MAIN: &str = "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+";
const BLOOM_RE: &str = " ?[^(\\s|.,!?…。，、।۔،)]+";

impl PreTokenizer {
    /// The variant llama.cpp uses for a `tokenizer.ggml.pre` name, or `None` for a name it
    /// does not know.
    pub fn from_name(name: Option<&str>) -> Option<Self> {
        Self::lookup(name).map(|(p, _)| p)
    }

    pub(crate) fn lookup(name: Option<&str>) -> Option<(Self, PreFlags)> {
        let f = PreFlags::default();
        let nc = PreFlags {
            no_clean_spaces: true,
            ..f
        };
        let Some(name) = name else {
            return Some((Self::Default, f));
        };
        Some(match name {
            "default" => (Self::Default, f),
            "minicpm5" => (
                Self::MiniCpm5,
                PreFlags {
                    ignore_merges: true,
                    ..f
                },
            ),
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral"
            | "midm-2.0" | "lfm2" | "jina-v5-nano" => (
                Self::Llama3,
                PreFlags {
                    ignore_merges: true,
                    add_bos: true,
                    ..f
                },
            ),
            "deepseek-llm" => (Self::DeepseekLlm, nc),
            "deepseek-coder" => (Self::DeepseekCoder, nc),
            "deepseek-v3" | "hunyuan-dense" | "joyai-llm" | "hy_v4" => (Self::Deepseek3, nc),
            "spark2_5" => (Self::Spark25, nc),
            "youtu" => (
                Self::Youtu,
                PreFlags {
                    ignore_merges: true,
                    ..nc
                },
            ),
            "falcon" => (Self::Falcon, f),
            "mpt" | "olmo" | "jais" | "exaone4" | "gpt-2" | "phi-2" | "jina-es" | "jina-de"
            | "gigachat" | "jina-v2-es" | "jina-v2-de" | "a.x-4.0" | "mellum" | "modern-bert"
            | "jina-v1-en" | "jina-v2-code" | "roberta-bpe" => (Self::Gpt2, f),
            "trillion" | "granite-docling" => (Self::Gpt2, nc),
            "starcoder" | "refact" | "codeshell" | "exaone" | "minerva-7b" | "mellum2" => {
                (Self::Starcoder, f)
            }
            "command-r" | "smollm" => (Self::Starcoder, nc),
            "jais-2" => (Self::Jais2, f),
            "gemma4" | "granite-embed-multi-311m" => (
                Self::Gemma4,
                PreFlags {
                    escape_whitespaces: true,
                    ..f
                },
            ),
            "sarvam-moe" => (
                Self::SarvamMoe,
                PreFlags {
                    escape_whitespaces: true,
                    ..nc
                },
            ),
            "whitespace" => (Self::Whitespace, f),
            "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "hunyuan" | "grok-2"
            | "solar-open" => (Self::Qwen2, nc),
            "stablelm2" | "megrez" => (Self::Qwen2, f),
            "qwen35" => (Self::Qwen35, nc),
            "dbrx" | "smaug-bpe" => (Self::Llama3, f),
            "poro-chat" => (Self::Bloom, nc),
            "bloom" | "gpt3-finnish" => (Self::Bloom, f),
            "chatglm-bpe" => (Self::Llama3, PreFlags { no_bos: true, ..f }),
            "glm4" | "glm5" => (
                Self::Llama3,
                PreFlags {
                    no_bos: true,
                    ignore_merges: true,
                    ..f
                },
            ),
            "viking" => (Self::Viking, nc),
            "tekken" => (
                Self::Tekken,
                PreFlags {
                    ignore_merges: true,
                    add_bos: true,
                    ..nc
                },
            ),
            "chameleon" => (
                Self::Chameleon,
                PreFlags {
                    add_bos: true,
                    ..nc
                },
            ),
            "gpt-4o" | "llama4" | "kanana2" | "talkie" | "minimax-m2" => (Self::Gpt4o, nc),
            "granite-embed-multi-97m" => (
                Self::GraniteEmbMulti,
                PreFlags {
                    ignore_merges: true,
                    ..nc
                },
            ),
            "tiny_aya" | "cohere2moe" => (Self::TinyAya, nc),
            "superbpe" => (Self::SuperBpe, nc),
            "bailingmoe" | "bailingmoe2" | "llada-moe" => (Self::BailingMoe, nc),
            "seed-coder" => (Self::SeedCoder, nc),
            "kimi-k2" => (Self::KimiK2, nc),
            "ufakzeka" => (Self::Ufakzeka, nc),
            "afmoe" => (Self::Afmoe, nc),
            "laguna" => (Self::Laguna, nc),
            "exaone-moe" => (Self::ExaoneMoe, f),
            _ => return None,
        })
    }

    /// Whether words are mapped through GPT-2's byte table before merging (false for the
    /// SentencePiece-style BPE vocabularies, which hold raw UTF-8).
    pub(crate) fn byte_encode(self) -> bool {
        !matches!(self, Self::Gemma4 | Self::SarvamMoe | Self::Whitespace)
    }

    fn steps(self) -> &'static [Step] {
        use Step::*;
        match self {
            Self::Default => &[],
            Self::Gpt2 => &[Gpt2],
            Self::Llama3 => &[Llama3(3)],
            Self::Qwen2 => &[Llama3(1)],
            Self::Qwen35 => &[Re(
                "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
            )],
            Self::Jais2 => &[Re(
                "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s{512}(?!\\S)|\\s{256}(?!\\S)|\\s{128}(?!\\S)|\\s{64}(?!\\S)|\\s{32}(?!\\S)|\\s{16}(?!\\S)|\\s{8}(?!\\S)|\\s{4}(?!\\S)|\\s{1,2}(?!\\S)|\\s{1}",
            )],
            Self::DeepseekLlm => &[
                Re("[\r\n]"),
                Re(DEEPSEEK_LLM_LETTERS),
                Re("\\s?[!-/:-~！-／：-～‘-‟　-。]+"),
                Re("\\s+$"),
                Re(CJK_DEEPSEEK),
                Re("\\p{N}+"),
            ],
            Self::Deepseek3 => &[Re("\\p{N}{1,3}"), Re(CJK_KANA), Re(DEEPSEEK3_MAIN)],
            Self::Spark25 => &[
                Re("\\p{N}{1,3}"),
                Re(CJK_KANA),
                Re("[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+|[\r\n]|\\s+(?!\\S)|\\s+"),
                Re("\\p{N}"),
            ],
            Self::Youtu => &[
                Re("[가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|[一-龥぀-ゟ゠-ヿ]+"),
                Re("[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"),
            ],
            Self::DeepseekCoder => &[
                Re("[\r\n]"),
                Re("\\s?\\p{L}+"),
                Re("\\s?\\p{P}+"),
                Re(CJK_DEEPSEEK),
                Re("\\p{N}"),
            ],
            Self::Falcon => &[Re("[\\p{P}\\$\\+<=>\\^~\\|`]+"), Gpt2, Re("[0-9][0-9][0-9]")],
            Self::Starcoder => &[Re("\\p{N}"), Gpt2],
            Self::Bloom => &[Re(BLOOM_RE)],
            Self::Viking => &[Re(BLOOM_RE), Re("\\p{N}")],
            Self::Tekken => &[Re(
                "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
            )],
            Self::Chameleon => &[
                Re("<sentinel:[0-9]+>"),
                Re("(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z"),
                Re("([\\t\\n]|    |  )"),
                Re("\\p{N}"),
                Re("[\\p{P}!-/:-@\\[-`{-~]"),
                Gpt2,
            ],
            Self::Gpt4o => &[Re(
                "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
            )],
            Self::GraniteEmbMulti => &[Re(
                "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}\\p{M}])([^a-z]))*((?=[\\p{L}\\p{M}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}\\p{M}])([^a-z]))+((?=[\\p{L}\\p{M}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
            )],
            Self::TinyAya => &[
                AfmoeDigits,
                Re("[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"),
            ],
            Self::KimiK2 => &[Kimi],
            Self::SuperBpe => &[Re("\\p{N}+"), Re("(?=(\\d{3})+(?!\\d))")],
            Self::BailingMoe => &[Re(
                "'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+",
            )],
            Self::SeedCoder => &[Re(
                "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
            )],
            Self::Ufakzeka => &[Re(
                "[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
            )],
            Self::Afmoe => &[
                AfmoeDigits,
                Re("[一-鿿㐀-䶿豈-﫿぀-ゟ゠-ヿ･-ﾟ⼀-⿟เ-๿຀-໿ក-៿က-႟ꩠ-ꩿꧠ-꧿가-힯ᄀ-ᇿ]+"),
                Re("[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"),
            ],
            Self::Laguna => &[Newlines, Llama3(1)],
            Self::ExaoneMoe => &[Re(
                "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?(?:\\p{L}\\p{M}*(?: \\p{L}\\p{M}*)*)+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]?|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+",
            )],
            Self::Gemma4 | Self::SarvamMoe => &[Newlines],
            Self::MiniCpm5 => &[
                Re("\\p{N}{1,3}"),
                Re("(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}+| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"),
            ],
            Self::Whitespace => &[Re("\\S+")],
        }
    }

    /// Splits `text` into words.
    pub fn split(self, text: &str) -> Vec<String> {
        let cpts: Vec<char> = text.chars().collect();
        let lens = self.split_lens(&cpts);
        let mut words = Vec::with_capacity(lens.len());
        let mut start = 0;
        for len in lens {
            words.push(cpts[start..start + len].iter().collect());
            start += len;
        }
        words
    }

    fn split_lens(self, cpts: &[char]) -> Vec<usize> {
        let whole = vec![cpts.len()];
        if self == Self::Default {
            let a = split_runs(cpts, &whole, is_default_punct);
            let b = split_gpt2(cpts, &a);
            let c = split_runs(cpts, &b, is_number_collapsed);
            return split_ascii_triples(cpts, &c);
        }
        let steps = self.steps();
        let mut texts: Option<(Vec<u32>, Vec<u32>)> = None;
        let mut lens = whole;
        for (k, step) in steps.iter().enumerate() {
            lens = match *step {
                Step::Gpt2 => split_gpt2(cpts, &lens),
                Step::Llama3(d) => split_llama3(cpts, &lens, d),
                Step::Kimi => split_kimi(cpts, &lens),
                Step::AfmoeDigits => split_afmoe_digits(cpts, &lens),
                Step::Newlines => split_newlines(cpts, &lens),
                Step::Re(pat) => {
                    let Some(re) = compiled(self, k) else {
                        continue;
                    };
                    let (wide, collapsed) =
                        texts.get_or_insert_with(|| (wide_text(cpts), collapsed_text(cpts)));
                    let text = if uses_categories(pat) {
                        &*collapsed
                    } else {
                        &*wide
                    };
                    let mut out = Vec::with_capacity(lens.len());
                    let mut start = 0;
                    for &len in &lens {
                        re.split(text, start, start + len, &mut out);
                        start += len;
                    }
                    out
                }
            };
        }
        lens
    }
}

const N_PRE: usize = PreTokenizer::Whitespace as usize + 1;

/// Each pre-tokenizer's compiled patterns, built on first use.
fn compiled(pre: PreTokenizer, step: usize) -> Option<&'static Regex> {
    static CACHE: [OnceLock<Vec<Option<Regex>>>; N_PRE] = [const { OnceLock::new() }; N_PRE];
    let all = CACHE[pre as usize].get_or_init(|| {
        pre.steps()
            .iter()
            .map(|s| match s {
                Step::Re(p) => match Regex::new(&collapse_pattern(p)) {
                    Ok(r) => Some(r),
                    Err(e) => {
                        tracing::error!("pre-tokenizer {pre:?}: pattern not compiled: {}", e.0);
                        None
                    }
                },
                _ => None,
            })
            .collect()
    });
    all.get(step).and_then(Option::as_ref)
}

/// The Unicode categories llama.cpp rewrites into its collapsed form.
const CATEGORY_CLASSES: &[(&str, u32, &str)] = &[
    ("\\p{N}", 0xD1, "0-9"),
    ("\\p{L}", 0xD2, "A-Za-z"),
    ("\\p{P}", 0xD3, "!-#%-*,-/:-;?-@\\[-\\]_\\{\\}"),
    ("\\p{M}", 0xD4, ""),
    ("\\p{S}", 0xD5, "\\$\\+<->^`\\|\\~"),
    ("\\p{Lu}", 0xD2, "A-Za-z"),
    ("\\p{Ll}", 0xD2, "A-Za-z"),
    ("\\p{Lt}", 0xD2, "A-Za-z"),
    ("\\p{Lm}", 0xD2, "A-Za-z"),
    ("\\p{Lo}", 0xD2, "A-Za-z"),
];

fn uses_categories(pat: &str) -> bool {
    CATEGORY_CLASSES.iter().any(|(p, _, _)| pat.contains(p))
}

/// llama.cpp's rewrite of `\p{..}` into classes over the collapsed text: the category's
/// stand-in byte plus its ASCII members.
fn collapse_pattern(pat: &str) -> String {
    if !uses_categories(pat) {
        return pat.to_owned();
    }
    let mut out = String::with_capacity(pat.len() * 2);
    let b = pat.as_bytes();
    let mut inside = false;
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'[' && (i == 0 || b[i - 1] != b'\\') {
            out.push('[');
            inside = true;
            i += 1;
            continue;
        }
        if inside && c == b']' && b[i - 1] != b'\\' {
            out.push(']');
            inside = false;
            i += 1;
            continue;
        }
        if let Some(&(p, code, ascii)) = CATEGORY_CLASSES
            .iter()
            .find(|(p, _, _)| pat[i..].starts_with(p))
        {
            if !inside {
                out.push('[');
            }
            out.push(char::from_u32(code).unwrap_or('\u{D0}'));
            out.push_str(ascii);
            if !inside {
                out.push(']');
            }
            i += p.len();
            continue;
        }
        // Patterns with categories are ASCII (as llama.cpp requires).
        out.push(char::from(c));
        i += 1;
    }
    out
}

/// Code points with non-ASCII whitespace as `\v` (what llama.cpp gives `std::wregex`).
fn wide_text(cpts: &[char]) -> Vec<u32> {
    cpts.iter()
        .map(|&c| {
            let u = u32::from(c);
            if u > 0x7F && flags(c).space {
                0x0B
            } else {
                u
            }
        })
        .collect()
}

/// One code unit per code point: ASCII as is, others as their category's stand-in byte.
fn collapsed_text(cpts: &[char]) -> Vec<u32> {
    cpts.iter()
        .map(|&c| {
            let u = u32::from(c);
            if u < 128 {
                return u;
            }
            let f = flags(c);
            if f.space {
                0x0B
            } else if f.number {
                0xD1
            } else if f.letter {
                0xD2
            } else if f.punct {
                0xD3
            } else if f.mark {
                0xD4
            } else if f.symbol {
                0xD5
            } else {
                0xD0
            }
        })
        .collect()
}

/// One chunk of the text with out-of-range reads answered as "nothing here".
struct Chunk<'a> {
    cpts: &'a [char],
    ini: usize,
    end: usize,
}

impl Chunk<'_> {
    fn cpt(&self, pos: usize) -> Option<char> {
        (self.ini <= pos && pos < self.end).then(|| self.cpts[pos])
    }
    fn flags(&self, pos: usize) -> Flags {
        self.cpt(pos).map(flags).unwrap_or_default()
    }
}

/// Collects word lengths, skipping empty ones.
struct Out {
    lens: Vec<usize>,
    prev_end: usize,
}

impl Out {
    fn add(&mut self, end: usize) -> usize {
        let len = end - self.prev_end;
        if len > 0 {
            self.lens.push(len);
        }
        self.prev_end = end;
        len
    }
}

fn contraction_len(c: &Chunk<'_>, pos: usize, case_insensitive: bool) -> Option<usize> {
    if c.cpt(pos) != Some('\'') || pos + 1 >= c.end {
        return None;
    }
    let low = |p: usize| {
        c.cpt(p).map(|ch| {
            if case_insensitive {
                ch.to_ascii_lowercase()
            } else {
                ch
            }
        })
    };
    let n1 = low(pos + 1);
    if matches!(n1, Some('s' | 't' | 'm' | 'd')) {
        return Some(2);
    }
    if pos + 2 < c.end {
        let n2 = low(pos + 2);
        if matches!(
            (n1, n2),
            (Some('r'), Some('e')) | (Some('v'), Some('e')) | (Some('l'), Some('l'))
        ) {
            return Some(3);
        }
    }
    None
}

fn not_word(f: Flags) -> bool {
    !(f.space || f.letter || f.number) && f.defined
}

/// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
fn split_gpt2(cpts: &[char], offsets: &[usize]) -> Vec<usize> {
    let mut out = Out {
        lens: Vec::with_capacity(offsets.len()),
        prev_end: 0,
    };
    let mut start = 0;
    for &off in offsets {
        let c = Chunk {
            cpts,
            ini: start,
            end: start + off,
        };
        start += off;
        out.prev_end = c.ini;
        let mut pos = c.ini;
        while pos < c.end {
            let cpt = c.cpt(pos);
            if let Some(n) = contraction_len(&c, pos, false) {
                pos += out.add(pos + n);
                continue;
            }
            let is_sp = cpt == Some(' ');
            let mut f2 = if is_sp {
                c.flags(pos + 1)
            } else {
                c.flags(pos)
            };
            if f2.letter {
                pos += usize::from(is_sp);
                while f2.letter {
                    pos += 1;
                    f2 = c.flags(pos);
                }
                out.add(pos);
                continue;
            }
            if f2.number {
                pos += usize::from(is_sp);
                while f2.number {
                    pos += 1;
                    f2 = c.flags(pos);
                }
                out.add(pos);
                continue;
            }
            if not_word(f2) {
                pos += usize::from(is_sp);
                while not_word(f2) {
                    pos += 1;
                    f2 = c.flags(pos);
                }
                out.add(pos);
                continue;
            }
            let mut n_ws = 0;
            while c.flags(pos + n_ws).space {
                n_ws += 1;
            }
            if n_ws > 1 && c.cpt(pos + n_ws).is_some() {
                pos += n_ws - 1;
                out.add(pos);
                continue;
            }
            if n_ws > 0 {
                pos += n_ws;
                out.add(pos);
                continue;
            }
            pos += 1;
            out.add(pos);
        }
    }
    out.lens
}

/// `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max_digits}|
/// ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
fn split_llama3(cpts: &[char], offsets: &[usize], max_digits: usize) -> Vec<usize> {
    let mut out = Out {
        lens: Vec::with_capacity(offsets.len()),
        prev_end: 0,
    };
    let mut start = 0;
    for &off in offsets {
        let c = Chunk {
            cpts,
            ini: start,
            end: start + off,
        };
        start += off;
        out.prev_end = c.ini;
        let mut pos = c.ini;
        while pos < c.end {
            let cpt = c.cpt(pos);
            let f = c.flags(pos);
            if let Some(n) = contraction_len(&c, pos, true) {
                pos += out.add(pos + n);
                continue;
            }
            let is_crlf = |ch: Option<char>| matches!(ch, Some('\r' | '\n'));
            if !(is_crlf(cpt) || f.number) && (f.letter || c.flags(pos + 1).letter) {
                pos += 1;
                while c.flags(pos).letter {
                    pos += 1;
                }
                out.add(pos);
                continue;
            }
            if f.number {
                let mut ini = pos;
                while c.flags(pos).number {
                    pos += 1;
                    if pos - ini >= max_digits {
                        out.add(pos);
                        ini = pos;
                    }
                }
                out.add(pos);
                continue;
            }
            let is_sp = cpt == Some(' ');
            let mut f2 = if is_sp { c.flags(pos + 1) } else { f };
            if !(f2.space || f2.letter || f2.number) && f.defined {
                pos += usize::from(is_sp);
                while not_word(f2) {
                    pos += 1;
                    f2 = c.flags(pos);
                }
                while is_crlf(c.cpt(pos)) {
                    pos += 1;
                }
                out.add(pos);
                continue;
            }
            let mut n_ws = 0;
            let mut last_crlf_end = 0;
            while c.flags(pos + n_ws).space {
                if is_crlf(c.cpt(pos + n_ws)) {
                    last_crlf_end = pos + n_ws + 1;
                }
                n_ws += 1;
            }
            if last_crlf_end > 0 {
                pos = last_crlf_end;
                out.add(pos);
                continue;
            }
            if n_ws > 1 && c.cpt(pos + n_ws).is_some() {
                pos += n_ws - 1;
                out.add(pos);
                continue;
            }
            if n_ws > 0 {
                pos += n_ws;
                out.add(pos);
                continue;
            }
            pos += 1;
            out.add(pos);
        }
    }
    out.lens
}

/// `[\p{P}\$\+<=>\^~\|]`
fn is_default_punct(ch: char) -> bool {
    if ch.is_ascii() {
        return ch.is_ascii_punctuation() && ch != '`'
            || matches!(ch, '$' | '+' | '<' | '=' | '>' | '^' | '~' | '|');
    }
    let f = flags(ch);
    // llama.cpp collapses non-ASCII whitespace before matching, so it never counts as punctuation.
    !f.space && f.punct
}

/// `\p{N}` on llama.cpp's collapsed text.
fn is_number_collapsed(ch: char) -> bool {
    if ch.is_ascii() {
        return ch.is_ascii_digit();
    }
    let f = flags(ch);
    !f.space && f.number
}

/// `class+` as a `std::regex` split: each maximal run is a word, and so is each gap.
fn split_runs(cpts: &[char], offsets: &[usize], class: fn(char) -> bool) -> Vec<usize> {
    let mut lens = Vec::with_capacity(offsets.len());
    let mut start = 0;
    for &off in offsets {
        let chunk = &cpts[start..start + off];
        start += off;
        let mut i = 0;
        let mut gap_start = 0;
        while i < chunk.len() {
            if class(chunk[i]) {
                let run_start = i;
                while i < chunk.len() && class(chunk[i]) {
                    i += 1;
                }
                if run_start > gap_start {
                    lens.push(run_start - gap_start);
                }
                lens.push(i - run_start);
                gap_start = i;
            } else {
                i += 1;
            }
        }
        if gap_start < chunk.len() {
            lens.push(chunk.len() - gap_start);
        }
    }
    lens
}

/// `[0-9][0-9][0-9]` as a `std::regex` split.
fn split_ascii_triples(cpts: &[char], offsets: &[usize]) -> Vec<usize> {
    let mut lens = Vec::with_capacity(offsets.len());
    let mut start = 0;
    for &off in offsets {
        let chunk = &cpts[start..start + off];
        start += off;
        let mut i = 0;
        let mut gap_start = 0;
        while i + 3 <= chunk.len() {
            if chunk[i..i + 3].iter().all(char::is_ascii_digit) {
                if i > gap_start {
                    lens.push(i - gap_start);
                }
                lens.push(3);
                i += 3;
                gap_start = i;
            } else {
                i += 1;
            }
        }
        if gap_start < chunk.len() {
            lens.push(chunk.len() - gap_start);
        }
    }
    lens
}

/// Han ideographs as llama.cpp's `unicode_cpt_is_han` lists them.
fn is_han(c: char) -> bool {
    matches!(u32::from(c),
        0x4E00..=0x9FFF
        | 0x3400..=0x4DBF
        | 0x20000..=0x2A6DF
        | 0x2A700..=0x2B73F
        | 0x2B740..=0x2B81F
        | 0x2B820..=0x2CEAF
        | 0x2CEB0..=0x2EBEF
        | 0xF900..=0xFAFF
        | 0x2F800..=0x2FA1F)
}

/// Kimi-K2's pattern (Han runs, then a GPT-4o-like word pattern excluding Han), as llama.cpp's
/// hand-written splitter walks it.
fn split_kimi(cpts: &[char], offsets: &[usize]) -> Vec<usize> {
    let mut out = Out {
        lens: Vec::with_capacity(offsets.len()),
        prev_end: 0,
    };
    let mut start = 0;
    for &off in offsets {
        let c = Chunk {
            cpts,
            ini: start,
            end: start + off,
        };
        start += off;
        out.prev_end = c.ini;
        let han = |p: usize| c.cpt(p).is_some_and(is_han);
        let non_han_letter = |p: usize| c.flags(p).letter && !han(p);
        let mut pos = c.ini;
        while pos < c.end {
            let cpt = c.cpt(pos);
            let f = c.flags(pos);
            if han(pos) {
                while han(pos) {
                    pos += 1;
                }
                out.add(pos);
                continue;
            }
            let lead_ok = !(matches!(cpt, Some('\r' | '\n')) || f.letter || f.number);
            if non_han_letter(pos) || (lead_ok && non_han_letter(pos + 1)) {
                let mut has_lead = false;
                if lead_ok {
                    has_lead = true;
                    pos += 1;
                }
                let mut has_letters = false;
                while non_han_letter(pos) {
                    has_letters = true;
                    pos += 1;
                }
                if has_letters || (!has_lead && non_han_letter(pos)) {
                    if !has_letters {
                        pos += 1;
                    }
                    while non_han_letter(pos) {
                        pos += 1;
                    }
                    if let Some(n) = contraction_len(&c, pos, true) {
                        pos += n;
                    }
                    out.add(pos);
                    continue;
                } else if has_lead {
                    pos -= 1;
                }
            }
            if f.number {
                let mut ini = pos;
                while c.flags(pos).number {
                    pos += 1;
                    if pos - ini >= 3 {
                        out.add(pos);
                        ini = pos;
                    }
                }
                out.add(pos);
                continue;
            }
            let is_sp = cpt == Some(' ');
            let mut f2 = if is_sp { c.flags(pos + 1) } else { f };
            if not_word(f2) {
                pos += usize::from(is_sp);
                while not_word(f2) {
                    pos += 1;
                    f2 = c.flags(pos);
                }
                while matches!(c.cpt(pos), Some('\r' | '\n')) {
                    pos += 1;
                }
                out.add(pos);
                continue;
            }
            let mut n_ws = 0;
            let mut last_crlf_end = 0;
            while c.flags(pos + n_ws).space {
                if matches!(c.cpt(pos + n_ws), Some('\r' | '\n')) {
                    last_crlf_end = pos + n_ws + 1;
                }
                n_ws += 1;
            }
            if last_crlf_end > 0 {
                pos = last_crlf_end;
                out.add(pos);
                continue;
            }
            if n_ws > 1 && c.cpt(pos + n_ws).is_some() {
                pos += n_ws - 1;
                out.add(pos);
                continue;
            }
            if n_ws > 0 {
                pos += n_ws;
                out.add(pos);
                continue;
            }
            pos += 1;
            out.add(pos);
        }
    }
    out.lens
}

/// AFMoE's digit grouping (1-2 leading digits, then threes), llama.cpp's splitter: text before
/// a digit run joins the run's first group.
fn split_afmoe_digits(cpts: &[char], offsets: &[usize]) -> Vec<usize> {
    let mut out = Out {
        lens: Vec::with_capacity(offsets.len()),
        prev_end: 0,
    };
    let mut start = 0;
    for &off in offsets {
        let c = Chunk {
            cpts,
            ini: start,
            end: start + off,
        };
        start += off;
        out.prev_end = c.ini;
        let mut pos = c.ini;
        while pos < c.end {
            if c.flags(pos).number {
                let first = pos;
                while c.flags(pos).number {
                    pos += 1;
                }
                let count = pos - first;
                let mut cur = first;
                let rem = count % 3;
                if rem > 0 {
                    cur += rem;
                    out.add(cur);
                }
                while cur < first + count {
                    cur += 3;
                    out.add(cur);
                }
                continue;
            }
            pos += 1;
        }
        if out.prev_end < c.end {
            out.add(c.end);
        }
    }
    out.lens
}

/// `[^\n]+|[\n]+`
fn split_newlines(cpts: &[char], offsets: &[usize]) -> Vec<usize> {
    let mut lens = Vec::with_capacity(offsets.len());
    let mut start = 0;
    for &off in offsets {
        let (ini, end) = (start, start + off);
        start = end;
        let mut pos = ini;
        while pos < end {
            let nl = cpts[pos] == '\n';
            let run = pos;
            while pos < end && (cpts[pos] == '\n') == nl {
                pos += 1;
            }
            lens.push(pos - run);
        }
    }
    lens
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: &[PreTokenizer] = &[
        PreTokenizer::Default,
        PreTokenizer::Gpt2,
        PreTokenizer::Llama3,
        PreTokenizer::Qwen2,
        PreTokenizer::Qwen35,
        PreTokenizer::DeepseekLlm,
        PreTokenizer::DeepseekCoder,
        PreTokenizer::Deepseek3,
        PreTokenizer::Spark25,
        PreTokenizer::Youtu,
        PreTokenizer::Falcon,
        PreTokenizer::Starcoder,
        PreTokenizer::Bloom,
        PreTokenizer::Viking,
        PreTokenizer::Tekken,
        PreTokenizer::Chameleon,
        PreTokenizer::Gpt4o,
        PreTokenizer::GraniteEmbMulti,
        PreTokenizer::TinyAya,
        PreTokenizer::KimiK2,
        PreTokenizer::SuperBpe,
        PreTokenizer::BailingMoe,
        PreTokenizer::SeedCoder,
        PreTokenizer::Ufakzeka,
        PreTokenizer::Afmoe,
        PreTokenizer::Laguna,
        PreTokenizer::ExaoneMoe,
        PreTokenizer::Jais2,
        PreTokenizer::Gemma4,
        PreTokenizer::SarvamMoe,
        PreTokenizer::MiniCpm5,
        PreTokenizer::Whitespace,
    ];

    #[test]
    fn every_pattern_compiles_and_splits_losslessly() {
        assert_eq!(ALL.len(), N_PRE);
        let text =
            "Hello World's 1234567 ÆØÅ été 中文字 ﾟ  \n\r\n tab\tend!!  <sentinel:12> IMGIMGABZ";
        for &p in ALL {
            for (k, step) in p.steps().iter().enumerate() {
                if let Step::Re(pat) = step {
                    assert!(compiled(p, k).is_some(), "{p:?}: `{pat}` does not compile");
                }
            }
            let words = p.split(text);
            assert_eq!(words.concat(), text, "{p:?} lost text");
        }
    }

    #[test]
    fn names_map_as_llama_cpp() {
        for (name, want) in [
            ("smollm", PreTokenizer::Starcoder),
            ("deepseek-v3", PreTokenizer::Deepseek3),
            ("llama4", PreTokenizer::Gpt4o),
            ("pixtral", PreTokenizer::Llama3),
            ("kimi-k2", PreTokenizer::KimiK2),
            ("chatglm-bpe", PreTokenizer::Llama3),
            ("poro-chat", PreTokenizer::Bloom),
        ] {
            assert_eq!(PreTokenizer::from_name(Some(name)), Some(want), "{name}");
        }
        assert_eq!(PreTokenizer::from_name(Some("nope")), None);
    }

    #[test]
    fn regex_passes_match_the_hand_written_ones() {
        // The falcon chain ends in a regex pass; superbpe's lookahead splits digit groups.
        assert_eq!(
            split(PreTokenizer::SuperBpe, "x 1234567"),
            ["x ", "1", "", "234", "", "567"]
        );
        assert_eq!(
            split(PreTokenizer::Tekken, "HelloWorld foo"),
            ["Hello", "World", " foo"]
        );
        assert_eq!(split(PreTokenizer::Afmoe, "ab1234"), ["ab", "1", "234"]);
    }

    fn split(p: PreTokenizer, s: &str) -> Vec<String> {
        p.split(s)
    }

    #[test]
    fn gpt2_words() {
        assert_eq!(
            split(PreTokenizer::Gpt2, "Hello world's  end\n"),
            ["Hello", " world", "'s", " ", " end", "\n"]
        );
    }

    #[test]
    fn llama3_digits_and_newlines() {
        assert_eq!(
            split(PreTokenizer::Llama3, "x 12345\n\n  y"),
            ["x", " ", "123", "45", "\n\n", " ", " y"]
        );
        assert_eq!(split(PreTokenizer::Qwen2, "123"), ["1", "2", "3"]);
        assert_eq!(split(PreTokenizer::Llama3, "I'M ok"), ["I", "'M", " ok"]);
    }

    #[test]
    fn default_chain() {
        assert_eq!(
            split(PreTokenizer::Default, "a+b 1234!!"),
            ["a", "+", "b", " ", "123", "4", "!!"]
        );
    }
}
