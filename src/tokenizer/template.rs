//! Chat templates: the Jinja template stored in `tokenizer.chat_template`, rendered
//! with minijinja the way Hugging Face's `apply_chat_template` renders it
//! (`trim_blocks` and `lstrip_blocks` on, Python string methods, `raise_exception`).

use minijinja::syntax::SyntaxConfig;
use minijinja::value::ValueKind;
use minijinja::{Environment, Error, ErrorKind, UndefinedBehavior, Value};

use super::{jinja_limits, pyjinja};

/// One turn of a conversation.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ChatMessage {
    /// "system", "user" or "assistant" (whatever the template understands).
    pub role: String,
    pub content: String,
    /// Further fields templates may read, after `role` and `content`: an assistant's
    /// `tool_calls` and `reasoning_content`, a tool result's `tool_call_id`.
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
            extra: Default::default(),
        }
    }
}

/// Whether a template renders tool calls and tools itself (it reads `tool_calls`), so
/// that they are given to it as fields rather than written into the messages' text.
pub fn knows_tools(template: &str) -> bool {
    template.contains("tool_calls")
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

/// Llama 3's turn format (llama.cpp's built-in `llama3`).
const LLAMA3: &str = "{%- for m in messages -%}\
{{- '<|start_header_id|>' + m['role'] + '<|end_header_id|>\n\n' + m['content'] | trim + '<|eot_id|>' -}}\
{%- endfor -%}\
{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}{%- endif -%}";

/// Cohere Command-R's turn format (llama.cpp's built-in `command-r`).
const COMMAND_R: &str = "{%- for m in messages -%}\
{%- set tok = {'system': '<|SYSTEM_TOKEN|>', 'user': '<|USER_TOKEN|>', 'assistant': '<|CHATBOT_TOKEN|>'}[m['role']] -%}\
{{- '<|START_OF_TURN_TOKEN|>' + tok + m['content'] | trim + '<|END_OF_TURN_TOKEN|>' -}}\
{%- endfor -%}\
{%- if add_generation_prompt -%}{{- '<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>' -}}{%- endif -%}";

/// Phi-3's turn format (llama.cpp's built-in `phi3`).
const PHI3: &str = "{%- for m in messages -%}\
{{- '<|' + m['role'] + '|>\n' + m['content'] + '<|end|>\n' -}}\
{%- endfor -%}\
{%- if add_generation_prompt -%}{{- '<|assistant|>\n' -}}{%- endif -%}";

/// The names of the built-in templates (`--chat-template NAME`).
pub const BUILTIN_TEMPLATES: [&str; 5] = ["chatml", "gemma", "llama3", "command-r", "phi3"];

/// A built-in template by llama.cpp's name for it.
pub fn builtin_template(name: &str) -> Option<&'static str> {
    Some(match name {
        "chatml" => CHATML,
        "gemma" => GEMMA,
        "llama3" => LLAMA3,
        "command-r" => COMMAND_R,
        "phi3" => PHI3,
        _ => return None,
    })
}

/// Why a chat template could not be rendered.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("chat template: {0}")]
    Render(String),
}

impl From<Error> for TemplateError {
    fn from(e: Error) -> Self {
        let mut msg = jinja2_undefined_wording(&e.to_string());
        let mut src = std::error::Error::source(&e);
        while let Some(s) = src {
            msg.push_str(&format!(": {s}"));
            src = s.source();
        }
        TemplateError::Render(msg)
    }
}

/// minijinja (in debug mode) says which variable was undefined as `` `name` is
/// undefined ``; Jinja2's UndefinedError says `'name' is undefined`. The message keeps
/// minijinja's account and words that part as Jinja2 does, so an error reads the same
/// as under Hugging Face's renderer.
fn jinja2_undefined_wording(msg: &str) -> String {
    let mut out = String::with_capacity(msg.len());
    let mut rest = msg;
    while let Some(at) = rest.find('`') {
        out.push_str(&rest[..at]);
        let tail = &rest[at + 1..];
        let name_len = tail
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        if name_len > 0 && tail[name_len..].starts_with("` is undefined") {
            out.push('\'');
            out.push_str(&tail[..name_len]);
            out.push('\'');
            rest = &tail[name_len + 1..];
        } else {
            out.push('`');
            rest = tail;
        }
    }
    out.push_str(rest);
    out
}

/// What a chat template is rendered with besides the messages.
#[derive(Debug, Clone, Default)]
pub struct TemplateOptions<'a> {
    /// Append the opening of an assistant turn.
    pub add_generation_prompt: bool,
    /// The model's BOS text, as templates reference it (`bos_token`).
    pub bos_token: &'a str,
    /// The model's EOS text (`eos_token`).
    pub eos_token: &'a str,
    /// The time `strftime_now` formats. `None` is the local time at the call, as Hugging
    /// Face's renderer gives; tests fix it so that renders are reproducible.
    pub now: Option<chrono::NaiveDateTime>,
    /// The `tools` list (OpenAI's form) for templates that render it; `None` otherwise.
    pub tools: Option<&'a serde_json::Value>,
    /// Further top-level variables, set after the others as llama-server sets them:
    /// `enable_thinking` and the request's `chat_template_kwargs`.
    pub context: Option<&'a serde_json::Map<String, serde_json::Value>>,
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
    render_chat_template(
        template,
        messages,
        &TemplateOptions {
            add_generation_prompt,
            bos_token,
            eos_token,
            now: None,
            tools: None,
            context: None,
        },
    )
}

/// Renders `template` for `messages` as Hugging Face's `apply_chat_template` renders it
/// with Python's Jinja2: the same whitespace rules, globals, filters, Python string and
/// dict methods, and Python's way of printing values. The context is the one
/// transformers passes: `messages`, `tools` and `documents` (both `None`, since wgllm
/// gives neither), `add_generation_prompt`, `bos_token` and `eos_token`.
pub fn render_chat_template(
    template: &str,
    messages: &[ChatMessage],
    opts: &TemplateOptions,
) -> Result<String, TemplateError> {
    let now = opts
        .now
        .unwrap_or_else(|| chrono::Local::now().naive_local());
    let env = environment(now)?;
    let source = generation_blocks(template);
    let compiled = jinja_limits::compile("chat", &source, &syntax()?)?;

    // Maps keep their insertion order (minijinja's preserve_order), as Python dicts do.
    let msgs: Vec<Value> = messages
        .iter()
        .map(|m| {
            let mut pairs = vec![
                ("role".to_string(), Value::from(m.role.as_str())),
                ("content".to_string(), Value::from(m.content.as_str())),
            ];
            for (k, v) in &m.extra {
                pairs.push((k.clone(), json_value(v)));
            }
            Value::from_pairs(pairs)
        })
        .collect();
    let tools = opts.tools.map_or(Value::from(()), json_value);
    let mut pairs: Vec<(String, Value)> = vec![
        ("messages".into(), Value::from(msgs)),
        ("tools".into(), tools),
        ("documents".into(), Value::from(())),
        ("bos_token".into(), Value::from(opts.bos_token)),
        ("eos_token".into(), Value::from(opts.eos_token)),
    ];
    // The request's variables may not replace the messages, tools or the generation
    // prompt's switch, which are set from the request's own fields.
    for (k, v) in opts.context.into_iter().flatten() {
        match pairs.iter_mut().find(|(name, _)| name == k) {
            Some(_) if matches!(k.as_str(), "messages" | "tools") => {}
            Some(p) => p.1 = json_value(v),
            None => pairs.push((k.clone(), json_value(v))),
        }
    }
    pairs.push((
        "add_generation_prompt".into(),
        Value::from(opts.add_generation_prompt),
    ));
    let ctx = Value::from_pairs(pairs);
    let mut out = String::new();
    minijinja::machinery::eval(
        &env,
        &compiled.instructions,
        ctx,
        &compiled.blocks,
        &mut minijinja::machinery::make_string_output(&mut out),
        compiled.initial_auto_escape.clone(),
    )?;
    log::debug!("chat template rendered {} bytes", out.len());
    Ok(out)
}

/// A JSON value as the template sees it (objects keep their key order, as Python dicts do).
fn json_value(v: &serde_json::Value) -> Value {
    use serde_json::Value as J;
    match v {
        J::Null => Value::from(()),
        J::Bool(b) => Value::from(*b),
        J::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => Value::from(i),
            (None, Some(u)) => Value::from(u),
            _ => Value::from(n.as_f64().unwrap_or(f64::NAN)),
        },
        J::String(s) => Value::from(s.as_str()),
        J::Array(a) => Value::from(a.iter().map(json_value).collect::<Vec<_>>()),
        J::Object(o) => Value::from_pairs(o.iter().map(|(k, v)| (k.as_str(), json_value(v)))),
    }
}

/// The fuel one render may burn. minijinja 3 charges one per instruction and one per 64
/// bytes of data an operation makes (strings and lists from `~`, `+`, `*`, literals,
/// filters), refusing an allocation it can size before making it: so a render runs at
/// most 50M instructions and makes at most about 3.2 GB of data, however its loops and
/// string doublings go. Real templates take a few hundred instructions per message, but
/// some build the prompt by appending each message to one string (Reka-Edge), which is
/// quadratic: 200 messages of 2.5 KB ran out at 2M.
pub const TEMPLATE_FUEL: u64 = 50_000_000;

/// Jinja2's syntax as transformers configures it: `trim_blocks` and `lstrip_blocks`.
fn syntax() -> Result<SyntaxConfig, TemplateError> {
    SyntaxConfig::builder()
        .trim_blocks(true)
        .lstrip_blocks(true)
        .build()
        .map_err(TemplateError::from)
}

/// The minijinja environment set up as transformers sets up Jinja2 for chat templates.
fn environment(now: chrono::NaiveDateTime) -> Result<Environment<'static>, TemplateError> {
    let mut env = Environment::new();
    // A template comes with the model file (`-hf` fetches them from anyone): its
    // instructions are counted, so a loop without end is an error, not a hung worker.
    env.set_fuel(Some(TEMPLATE_FUEL));
    // Jinja2's default Undefined: prints empty, iterates empty, is false, fails on
    // attribute access. minijinja's lenient behaviour is the same.
    env.set_undefined_behavior(UndefinedBehavior::Lenient);
    // `{{ x }}` prints Python's str(x): True/None, Python reprs of lists and dicts.
    env.set_formatter(|out, _state, value| {
        out.write_str(&pyjinja::py_str(value))
            .map_err(|e| Error::new(ErrorKind::WriteFailure, e.to_string()))
    });
    env.set_unknown_method_callback(pyjinja::unknown_method);
    env.add_function("raise_exception", |msg: String| -> Result<Value, Error> {
        Err(Error::new(ErrorKind::InvalidOperation, msg))
    });
    // Parsing a format costs about an instruction's time per byte, which the fuel
    // would otherwise not see (a fuzzed template looped over it for seconds).
    env.add_function(
        "strftime_now",
        move |state: &minijinja::State, fmt: String| {
            let text = pyjinja::strftime(&now, &fmt)?; // refuses a format over 1 KiB first
            state.consume_fuel(fmt.len() as u64)?;
            Ok::<_, Error>(text)
        },
    );
    env.add_filter("tojson", pyjinja::tojson);
    // What minijinja's fuel does not bound (see `jinja_limits`): the compiled template
    // calls these before each `+` and after each new value; `sum` checks lists it adds.
    env.add_function(jinja_limits::GUARD_ADD, jinja_limits::guard_add);
    env.add_function(jinja_limits::GUARD_VALUE, jinja_limits::guard_value);
    env.add_function(jinja_limits::GUARD_STORED, jinja_limits::guard_stored);
    env.add_filter("sum", jinja_limits::sum);
    // Jinja2's tests ask Python: `none` is not iterable (templates check `tools is
    // iterable` before taking its length) and strings and dicts are sequences.
    env.add_test("iterable", |v: &Value| {
        v.is_undefined() || (!v.is_none() && v.try_iter().is_ok())
    });
    env.add_test("sequence", |v: &Value| {
        v.is_undefined()
            || matches!(
                v.kind(),
                ValueKind::Seq | ValueKind::String | ValueKind::Map
            )
    });
    // Debug mode names the undefined expression behind an error, as Jinja2's
    // UndefinedError does ("'x' is undefined"). It tags each undefined value with the
    // instruction that made it, a small cost for a prompt's render.
    env.set_debug(true);
    Ok(env)
}

/// transformers adds a `{% generation %}...{% endgeneration %}` block tag, which marks
/// the assistant's text when an assistant-token mask is asked for and otherwise renders
/// its body unchanged. minijinja takes no custom tags, so each tag becomes `if true` /
/// `endif`, keeping its whitespace-control marks (`-`, `+`) and so its trimming.
fn generation_blocks(template: &str) -> String {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(at) = rest.find("{%") {
        out.push_str(&rest[..at]);
        rest = &rest[at..];
        match generation_tag(rest) {
            Some((len, open, end, close)) => {
                let body = if end { "endif" } else { "if true" };
                out.push_str(&format!("{{%{open} {body} {close}%}}"));
                rest = &rest[len..];
            }
            None => {
                out.push_str("{%");
                rest = &rest[2..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// If `s` starts with a `generation` or `endgeneration` tag: its length, its opening
/// and closing whitespace marks, and whether it is the end tag.
fn generation_tag(s: &str) -> Option<(usize, &str, bool, &str)> {
    let inner = s.strip_prefix("{%")?;
    let open_len = usize::from(inner.starts_with(['-', '+']));
    let (open, inner) = inner.split_at(open_len);
    let trimmed = inner.trim_start();
    let (end, after) = if let Some(a) = trimmed.strip_prefix("endgeneration") {
        (true, a)
    } else {
        (false, trimmed.strip_prefix("generation")?)
    };
    let after_ws = after.trim_start();
    if after_ws.len() == after.len() && !after.starts_with(['-', '+', '%']) {
        return None; // a longer name, such as `generation_prompt`
    }
    let close_len = usize::from(after_ws.starts_with(['-', '+']));
    let (close, tail) = after_ws.split_at(close_len);
    tail.strip_prefix("%}")?;
    let len = s.len() - tail.len() + 2;
    Some((len, open, end, close))
}
