//! A reranker's input: the query and one document as one sequence, laid out as
//! llama-server's `format_prompt_rerank` does: the model's rerank template
//! (`tokenizer.chat_template.rerank`, `{query}` and `{document}` replaced, special tokens
//! in it parsed), else [BOS] query [EOS] [SEP] document [EOS], each special token where
//! the vocabulary adds it (WordPiece: [CLS] query [SEP] document).

use super::{Kind, Tokenizer};

impl Tokenizer {
    /// The tokens a reranker scores for `query` and `document`; the texts' own special
    /// tokens stay text, as llama-server tokenizes them.
    pub fn rerank_prompt(&self, query: &str, document: &str) -> Vec<u32> {
        if let Some(t) = &self.rerank_template {
            let text = t.replace("{query}", query).replace("{document}", document);
            return self.encode(&text, false, true);
        }
        let wordpiece = matches!(self.kind, Kind::Wpm(_));
        // llama.cpp's vocabularies add these: WordPiece always BOS ([CLS]) and SEP.
        let (add_bos, add_sep) = (self.add_bos || wordpiece, wordpiece);
        // The EOS added after each part, SEP where the vocabulary has no EOS.
        let eos = self.eos.or(self.sep);
        let mut out = Vec::new();
        if add_bos {
            out.extend(self.bos);
        }
        out.extend(self.encode(query, false, false));
        if self.add_eos {
            out.extend(eos);
        }
        if add_sep {
            out.extend(self.sep);
        }
        out.extend(self.encode(document, false, false));
        if self.add_eos {
            out.extend(eos);
        }
        out
    }
}
