//! Chat templates: the Jinja template stored in `tokenizer.chat_template`, rendered
//! with minijinja the way Hugging Face's `apply_chat_template` renders it
//! (`trim_blocks` and `lstrip_blocks` on, Python string methods, `raise_exception`).

use std::collections::BTreeMap;

use minijinja::syntax::SyntaxConfig;
use minijinja::{Environment, Error, ErrorKind, Value};

/// One turn of a conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatMessage {
    /// "system", "user" or "assistant" (whatever the template understands).
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// ChatML, the fallback for models without a template (llama.cpp uses it too).
pub const CHATML: &str = "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}\
                          {% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// Gemma's turn format, for Gemma GGUFs that carry no template (llama.cpp falls back to
/// ChatML there, which the model was never trained on). Gemma has no system role: a
/// system message is put before the next user turn's text, as Gemma's own template does.
pub const GEMMA: &str = "{%- set ns = namespace(system='') -%}\
{%- for m in messages -%}\
{%- if m['role'] == 'system' -%}{%- set ns.system = ns.system + m['content'] | trim + '\n\n' -%}\
{%- else -%}\
{{- '<start_of_turn>' + ('model' if m['role'] == 'assistant' else m['role']) + '\n' + ns.system + m['content'] | trim + '<end_of_turn>\n' -}}\
{%- set ns.system = '' -%}\
{%- endif -%}\
{%- endfor -%}\
{%- if add_generation_prompt -%}{{- '<start_of_turn>model\n' -}}{%- endif -%}";

/// Why a chat template could not be rendered.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("chat template: {0}")]
    Render(String),
}

impl From<Error> for TemplateError {
    fn from(e: Error) -> Self {
        let mut msg = e.to_string();
        let mut src = std::error::Error::source(&e);
        while let Some(s) = src {
            msg.push_str(&format!(": {s}"));
            src = s.source();
        }
        TemplateError::Render(msg)
    }
}

/// Renders `template` for `messages`; `add_generation_prompt` appends the opening of an
/// assistant turn. `bos_token`/`eos_token` are the texts templates may reference.
pub fn apply_chat_template(
    template: &str,
    messages: &[ChatMessage],
    add_generation_prompt: bool,
    bos_token: &str,
    eos_token: &str,
) -> Result<String, TemplateError> {
    let mut env = Environment::new();
    env.set_syntax(
        SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(TemplateError::from)?,
    );
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", |msg: String| -> Result<Value, Error> {
        Err(Error::new(ErrorKind::InvalidOperation, msg))
    });
    env.add_template("chat", template)?;

    let msgs: Vec<Value> = messages
        .iter()
        .map(|m| {
            let mut map = BTreeMap::new();
            map.insert("role".to_string(), Value::from(m.role.as_str()));
            map.insert("content".to_string(), Value::from(m.content.as_str()));
            Value::from(map)
        })
        .collect();
    let mut ctx = BTreeMap::new();
    ctx.insert("messages".to_string(), Value::from(msgs));
    ctx.insert(
        "add_generation_prompt".to_string(),
        Value::from(add_generation_prompt),
    );
    ctx.insert("bos_token".to_string(), Value::from(bos_token));
    ctx.insert("eos_token".to_string(), Value::from(eos_token));
    Ok(env.get_template("chat")?.render(Value::from(ctx))?)
}
