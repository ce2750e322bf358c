//! A reranker's input: the query and one document as one sequence, laid out as
//! llama-server's `format_prompt_rerank` does: the model's rerank template
//! (`tokenizer.chat_template.rerank`, `{query}` and `{document}` replaced, special tokens
//! in it parsed), else [BOS] query [EOS] [SEP] document [EOS], each special token where
//! the vocabulary adds it (WordPiece: [CLS] query [SEP] document).

use super::{Kind, Tokenizer};

impl Tokenizer {
    /// The tokens a reranker scores for `query` and each of `documents`, none longer than
    /// `max_tokens` (the query's own tokens are counted first, once, so that a long query
    /// is refused before it is copied into every document's prompt); the texts' own
    /// special tokens stay text, as llama-server tokenizes them.
    pub fn rerank_prompts(
        &self,
        query: &str,
        documents: &[String],
        max_tokens: usize,
    ) -> Result<Vec<Vec<u32>>, String> {
        let too_long = |what: &str, n: usize| {
            format!(
                "{what} is {n} tokens, more than a slot's context of {max_tokens}: use a larger context (-c) or a shorter text"
            )
        };
        let n_query = self.encode(query, false, false).len();
        if n_query > max_tokens {
            return Err(too_long("the query", n_query));
        }
        (documents.iter().enumerate())
            .map(|(i, d)| {
                let p = self.rerank_prompt(query, d);
                match p.len() > max_tokens {
                    true => Err(too_long(&format!("document {i} with the query"), p.len())),
                    false => Ok(p),
                }
            })
            .collect()
    }

    /// The tokens a reranker scores for `query` and `document`; the texts' own special
    /// tokens stay text, as llama-server tokenizes them.
    pub fn rerank_prompt(&self, query: &str, document: &str) -> Vec<u32> {
        if let Some(t) = &self.rerank_template {
            return self.encode(&fill_rerank_template(t, query, document), false, true);
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

/// `template` with each `{query}` and `{document}` replaced in one pass over the
/// template alone. llama-server replaces every `{query}` first and then every
/// `{document}` in the result, so a `{document}` written in the query becomes the
/// document too: a request could multiply its own size (a query of many such
/// placeholders and one long document). Here the texts go in as written.
fn fill_rerank_template(template: &str, query: &str, document: &str) -> String {
    let mut out = String::with_capacity(template.len() + query.len() + document.len());
    let mut rest = template;
    loop {
        let next = ["{query}", "{document}"]
            .iter()
            .filter_map(|p| rest.find(p).map(|i| (i, *p)))
            .min();
        let Some((i, p)) = next else {
            out.push_str(rest);
            return out;
        };
        out.push_str(&rest[..i]);
        out.push_str(if p == "{query}" { query } else { document });
        rest = &rest[i + p.len()..];
    }
}

#[cfg(test)]
mod tests {
    use super::fill_rerank_template;

    #[test]
    fn the_template_is_filled_without_rescanning_what_went_in() {
        let t = "<q>{query}</q><d>{document}</d>{query}";
        assert_eq!(fill_rerank_template(t, "a", "b"), "<q>a</q><d>b</d>a");
        // A placeholder inside a text stays text.
        assert_eq!(
            fill_rerank_template(t, "{document}", "{query}"),
            "<q>{document}</q><d>{query}</d>{document}"
        );
        assert_eq!(fill_rerank_template("none", "a", "b"), "none");
    }
}
