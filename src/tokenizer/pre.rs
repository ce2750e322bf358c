//! Pre-tokenizers of byte-level BPE vocabularies: what each `tokenizer.ggml.pre` name
//! means in llama.cpp — the regexes that cut text into words, and the flags that come
//! with the name (merge skipping, BOS default, space clean-up, byte alphabet).
//!
//! The names and regexes follow llama.cpp (which adapts each model's `tokenizer.json`
//! split, e.g. spelling case-insensitive contractions out as character classes). A name
//! llama.cpp does not know is refused there, and here too: a wrong split gives plausible
//! but different token ids, which is worse than an error.

use super::TokenizerError;

/// `'s|'t|...| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)`: the GPT-2 split.
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
/// Contractions with either case of each letter, as llama.cpp spells out `(?i:...)`.
macro_rules! contractions {
    () => {
        r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
    };
}
/// Llama-3's split: digits in groups of up to three.
const LLAMA3: &str = concat!(
    contractions!(),
    r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);
/// Qwen2's split: like Llama-3's but every digit alone.
const QWEN2: &str = concat!(
    contractions!(),
    r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);
/// Qwen3.5's split: combining marks stay with the letters before them.
const QWEN35: &str = concat!(
    contractions!(),
    r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);
/// GPT-4o's split: words cut at lower→upper case changes, contractions attached.
const GPT4O: &str = concat!(
    r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+",
    contractions!(),
    r"?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*",
    contractions!(),
    r"?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);
/// GPT-4o's split with combining marks counted as letters.
const GRANITE_EMB_MULTI: &str = concat!(
    r"[^\r\n\p{L}\p{N}]?((?=[\p{L}\p{M}])([^a-z]))*((?=[\p{L}\p{M}])([^A-Z]))+",
    contractions!(),
    r"?|[^\r\n\p{L}\p{N}]?((?=[\p{L}\p{M}])([^a-z]))+((?=[\p{L}\p{M}])([^A-Z]))*",
    contractions!(),
    r"?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);
/// Mistral's Tekken split (GPT-4o's without contractions, digits alone).
const TEKKEN: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Upper/lower-case runs with marks and their contractions, as Tiny Aya and Youtu
/// split words.
macro_rules! cased_words {
    () => {
        concat!(
            r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+",
            contractions!(),
            r"?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*",
            contractions!(),
            "?"
        )
    };
}
const TINY_AYA: &str = concat!(
    cased_words!(),
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);
const YOUTU: &str = concat!(
    cased_words!(),
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);
/// DeepSeek-V3's word split (after digits and CJK runs are cut out).
const DEEPSEEK3_WORDS: &str = r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##;
/// Letters DeepSeek-LLM treats as cased words (its tokenizer.json lists them as ranges).
const DEEPSEEK_LLM_LETTERS: &str = "\\s?[A-Za-z\u{B5}\u{C0}-\u{D6}\u{D8}-\u{F6}\u{F8}-\u{1BA}\u{1BC}-\u{1BF}\u{1C4}-\u{293}\u{295}-\u{2AF}\u{370}-\u{373}\u{376}\u{377}\u{37B}-\u{37D}\u{37F}\u{386}\u{388}-\u{38A}\u{38C}\u{38E}-\u{3A1}\u{3A3}-\u{3F5}\u{3F7}-\u{481}\u{48A}-\u{52F}\u{531}-\u{556}\u{10A0}-\u{10C5}\u{13A0}-\u{13F5}\u{13F8}-\u{13FD}\u{1C90}-\u{1CBA}\u{1CBD}-\u{1CBF}\u{1D00}-\u{1D2B}\u{1D6B}-\u{1D77}\u{1D79}-\u{1D9A}\u{1E00}-\u{1F15}\u{1F18}-\u{1F1D}\u{1F20}-\u{1F45}\u{1F48}-\u{1F4D}\u{1F50}-\u{1F57}\u{1F59}\u{1F5B}\u{1F5D}\u{1F5F}-\u{1F7D}\u{1F80}-\u{1FB4}\u{1FB6}-\u{1FBC}\u{1FBE}\u{1FC2}-\u{1FC4}\u{1FC6}-\u{1FCC}\u{1FD0}-\u{1FD3}\u{1FD6}-\u{1FDB}\u{1FE0}-\u{1FEC}\u{1FF2}-\u{1FF4}\u{1FF6}-\u{1FFC}\u{2102}\u{2107}\u{210A}-\u{2113}\u{2115}\u{2119}-\u{211D}\u{2124}\u{2126}\u{2128}\u{212A}-\u{212D}\u{212F}-\u{2134}\u{2139}\u{213C}-\u{213F}\u{2145}-\u{2149}\u{214E}\u{2183}\u{2184}\u{2C00}-\u{2C7B}\u{2C7E}-\u{2CE4}\u{2CEB}-\u{2CEE}\u{2CF2}\u{2CF3}\u{A640}-\u{A66D}\u{A680}-\u{A69B}\u{A722}-\u{A76F}\u{A771}-\u{A787}\u{A78B}-\u{A78E}\u{AB70}-\u{ABBF}\u{FB00}-\u{FB06}\u{FB13}-\u{FB17}\u{FF21}-\u{FF3A}\u{FF41}-\u{FF5A}\u{10400}-\u{1044F}\u{104B0}-\u{104D3}\u{104D8}-\u{104FB}\u{10C80}-\u{10CB2}\u{10CC0}-\u{10CF2}\u{118A0}-\u{118DF}\u{1E900}-\u{1E943}]+";
/// CJK ideographs and Hangul as DeepSeek's splits list them.
const DEEPSEEK_CJK: &str = r"[一-龥ࠀ-一가-퟿]+";
/// Lines and runs of newlines (SentencePiece-style BPE merges across spaces).
const LINES: &str = r"[^\n]+|[\n]+";
/// Words up to punctuation, for BLOOM-family vocabularies.
const BLOOM: &str = r" ?[^(\s|.,!?…。，、।۔،)]+";

/// What a pre-tokenizer name selects.
#[derive(Debug, Clone, Copy)]
pub(super) struct PreTokenizer {
    /// Applied one after another, each splitting the pieces the previous one left.
    pub regexes: &'static [&'static str],
    /// A word that is already a whole token skips merging (Llama-3 family).
    pub ignore_merges: bool,
    /// Default for `add_bos` before the metadata flag overrides it.
    pub add_bos: bool,
    /// Undo the space-before-punctuation convention when detokenizing.
    pub clean_spaces: bool,
    /// Words are mapped into the GPT-2 byte alphabet before merging; without it they stay
    /// UTF-8 and unknown bytes become `<0xNN>` tokens.
    pub byte_encode: bool,
    /// Spaces are written as `▁` before splitting (SentencePiece-style BPE, Gemma-4).
    pub escape_spaces: bool,
    /// A word made only of newlines is looked up whole before merging (Gemma-4).
    pub whole_newlines: bool,
}

const fn bpe(regexes: &'static [&'static str]) -> PreTokenizer {
    PreTokenizer {
        regexes,
        ignore_merges: false,
        add_bos: false,
        clean_spaces: true,
        byte_encode: true,
        escape_spaces: false,
        whole_newlines: false,
    }
}

impl PreTokenizer {
    const fn keep_spaces(mut self) -> Self {
        self.clean_spaces = false;
        self
    }
    const fn whole_words(mut self) -> Self {
        self.ignore_merges = true;
        self
    }
    const fn with_bos(mut self) -> Self {
        self.add_bos = true;
        self
    }
    const fn spm_style(mut self) -> Self {
        self.byte_encode = false;
        self.escape_spaces = true;
        self.whole_newlines = true;
        self
    }
}

const DEFAULT: PreTokenizer = bpe(&[r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"]);

/// Every name llama.cpp accepts that wgllm implements, with what it selects.
const TABLE: &[(&[&str], PreTokenizer)] = &[
    (&["default"], DEFAULT),
    (
        &[
            "llama3",
            "llama-v3",
            "llama-bpe",
            "falcon3",
            "falcon-h1",
            "pixtral",
            "midm-2.0",
            "lfm2",
            "jina-v5-nano",
        ],
        bpe(&[LLAMA3]).whole_words().with_bos(),
    ),
    (&["jais-2", "dbrx", "smaug-bpe"], bpe(&[LLAMA3])),
    (&["chatglm-bpe"], bpe(&[LLAMA3])),
    (&["glm4", "glm5"], bpe(&[LLAMA3]).whole_words()),
    (&["minicpm5"], bpe(&[r"\p{N}{1,3}", concat!(
        contractions!(),
        r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    )]).whole_words()),
    (
        &["deepseek-llm"],
        bpe(&[
            r"[\r\n]",
            DEEPSEEK_LLM_LETTERS,
            r"\s?[!-/:-~！-／：-～‘-‟　-。]+",
            r"\s+$",
            DEEPSEEK_CJK,
            r"\p{N}+",
        ])
        .keep_spaces(),
    ),
    (
        &["deepseek-coder"],
        bpe(&[r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", DEEPSEEK_CJK, r"\p{N}"]).keep_spaces(),
    ),
    (
        &["deepseek-v3", "hunyuan-dense", "hy_v4", "joyai-llm"],
        bpe(&[r"\p{N}{1,3}", r"[一-龥぀-ゟ゠-ヿ]+", DEEPSEEK3_WORDS]).keep_spaces(),
    ),
    (
        &["spark2_5"],
        bpe(&[
            r"\p{N}{1,3}",
            r"[一-龥぀-ゟ゠-ヿ]+",
            r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+|[\r\n]|\s+(?!\S)|\s+"##,
            r"\p{N}",
        ])
        .keep_spaces(),
    ),
    (
        &["youtu"],
        bpe(&[
            r"[가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|[一-龥぀-ゟ゠-ヿ]+",
            YOUTU,
        ])
        .keep_spaces()
        .whole_words(),
    ),
    (
        &["falcon"],
        bpe(&[r"[\p{P}\$\+<=>\^~\|`]+", GPT2, r"[0-9][0-9][0-9]"]),
    ),
    (
        &["starcoder", "refact", "codeshell", "exaone", "minerva-7b", "mellum2"],
        bpe(&[r"\p{N}", GPT2]),
    ),
    (&["command-r", "smollm"], bpe(&[r"\p{N}", GPT2]).keep_spaces()),
    (
        &[
            "gpt-2",
            "phi-2",
            "jina-es",
            "jina-de",
            "gigachat",
            "jina-v2-es",
            "jina-v2-de",
            "a.x-4.0",
            "mellum",
            "modern-bert",
            "jina-v1-en",
            "jina-v2-code",
            "roberta-bpe",
            "exaone4",
            "mpt",
            "olmo",
            "jais",
        ],
        bpe(&[GPT2]),
    ),
    (&["trillion", "granite-docling"], bpe(&[GPT2]).keep_spaces()),
    (
        &["qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "hunyuan", "solar-open", "grok-2"],
        bpe(&[QWEN2]).keep_spaces(),
    ),
    (&["stablelm2", "megrez"], bpe(&[QWEN2])),
    (&["qwen35"], bpe(&[QWEN35]).keep_spaces()),
    (
        &["ufakzeka"],
        bpe(&[r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"])
            .keep_spaces(),
    ),
    (
        &["bailingmoe", "bailingmoe2", "llada-moe"],
        bpe(&[r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"])
            .keep_spaces(),
    ),
    (
        &["seed-coder"],
        bpe(&[concat!(
            contractions!(),
            r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+"
        )])
        .keep_spaces(),
    ),
    (&["laguna"], bpe(&[LINES, QWEN2]).keep_spaces()),
    (
        &["exaone-moe"],
        bpe(&[concat!(
            contractions!(),
            r"|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+"
        )]),
    ),
    (&["poro-chat"], bpe(&[BLOOM]).keep_spaces()),
    (&["bloom", "gpt3-finnish"], bpe(&[BLOOM])),
    (&["viking"], bpe(&[BLOOM, r"\p{N}"]).keep_spaces()),
    (&["tekken"], bpe(&[TEKKEN]).keep_spaces().whole_words().with_bos()),
    (
        &["chameleon"],
        bpe(&[
            r"<sentinel:[0-9]+>",
            r"(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
            r"([\t\n]|    |  )",
            r"\p{N}",
            r"[\p{P}!-/:-@\[-`{-~]",
            GPT2,
        ])
        .keep_spaces()
        .with_bos(),
    ),
    (
        &["gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"],
        bpe(&[GPT4O]).keep_spaces(),
    ),
    (
        &["granite-embed-multi-97m"],
        bpe(&[GRANITE_EMB_MULTI]).keep_spaces().whole_words(),
    ),
    (
        &["tiny_aya", "cohere2moe"],
        bpe(&[r"[0-9]{1,3}(?=(?:[0-9]{3})*\b)", TINY_AYA]).keep_spaces(),
    ),
    (
        &["gemma4", "granite-embed-multi-311m"],
        bpe(&[LINES]).spm_style(),
    ),
];

/// The pre-tokenizer a `tokenizer.ggml.pre` name selects. An empty name means llama.cpp's
/// default split (with a warning: such files predate the key); an unknown one is an error.
pub(super) fn lookup(pre: &str) -> Result<PreTokenizer, TokenizerError> {
    if pre.is_empty() {
        log::warn!(
            "the model has no pre-tokenizer type (tokenizer.ggml.pre); using llama.cpp's \
             default split: tokenization may be worse than the model was trained with"
        );
        return Ok(DEFAULT);
    }
    TABLE
        .iter()
        .find(|(names, _)| names.contains(&pre))
        .map(|&(_, p)| p)
        .ok_or_else(|| TokenizerError::UnknownPre {
            name: pre.to_string(),
            supported: supported().join(", "),
        })
}

/// Every pre-tokenizer name wgllm knows, sorted.
pub fn supported() -> Vec<&'static str> {
    let mut v: Vec<&str> = TABLE.iter().flat_map(|(n, _)| n.iter().copied()).collect();
    v.sort_unstable();
    v
}
