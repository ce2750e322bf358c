//! Chat turns on top of a session: the conversation is rendered with the model's chat
//! template each turn, and only the text the template adds since the last turn is
//! tokenized and decoded, so the cache keeps the whole conversation.

use crate::tokenizer::{ChatMessage, TemplateError, Tokenizer};

/// The messages so far and the rendered text already in the cache.
#[derive(Clone, Debug, Default)]
pub struct Conversation {
    pub messages: Vec<ChatMessage>,
    /// The formatted conversation whose tokens are in the cache.
    shown: String,
}

impl Conversation {
    pub fn new(system: Option<&str>) -> Self {
        Conversation {
            messages: system
                .map(|s| vec![ChatMessage::new("system", s)])
                .unwrap_or_default(),
            shown: String::new(),
        }
    }

    /// True before the first turn has been rendered.
    pub fn is_empty(&self) -> bool {
        self.shown.is_empty()
    }

    /// Adds a user message; returns the text to decode: what the template renders beyond
    /// what is cached, ending with the assistant's generation prompt.
    pub fn user_turn(&mut self, tok: &Tokenizer, text: &str) -> Result<String, TemplateError> {
        self.messages.push(ChatMessage::new("user", text));
        let formatted = match tok.apply_chat_template(&self.messages, true) {
            Ok(f) => f,
            Err(e) => {
                self.messages.pop();
                return Err(e);
            }
        };
        let new_text = formatted
            .strip_prefix(self.shown.as_str())
            .unwrap_or(&formatted)
            .to_string();
        self.shown = formatted;
        Ok(new_text)
    }

    /// Records the assistant's reply (already in the cache as generated tokens). The
    /// template's end-of-turn text after the reply is not in the cache yet: it is part
    /// of the next turn's new text.
    pub fn assistant_reply(&mut self, tok: &Tokenizer, reply: &str) -> Result<(), TemplateError> {
        self.messages.push(ChatMessage::new("assistant", reply));
        let with_reply = tok.apply_chat_template(&self.messages, false)?;
        let after = with_reply.strip_prefix(self.shown.as_str()).unwrap_or("");
        let consumed = after.find(reply).map_or(0, |i| i + reply.len());
        self.shown.push_str(&after[..consumed]);
        Ok(())
    }
}
