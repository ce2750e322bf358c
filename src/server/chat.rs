//! A chat request read as llama-server reads it: OpenAI's `messages` (text content or
//! text parts), an assistant message last continues that message (prefill, or
//! `continue_final_message`), `tools` offered to the model and earlier calls and results
//! in the history (`tools.rs`), and images (`image_url` parts, read by `media.rs`: the
//! server's marker in their place). Grammars and `response_format` are read with the
//! other generation settings (`params.rs`).

use super::error::{ApiError, ApiResult};
use super::media::{marker, url_bytes, ImageInput};
use super::params::{Fields, ReasoningDefaults};
use super::tools::{self, ToolFormat, Tools};
use crate::engine::service::Request;
use crate::engine::MediaPrompt;
use crate::sample::budget::ThinkingBudget;
use crate::tokenizer::reasoning::{Splitter, Thinking};
use crate::tokenizer::{knows_tools, ChatMessage, Tokenizer};
use serde_json::{json, Map, Value};
use std::sync::OnceLock;

pub struct ChatRequest {
    pub messages: Vec<ChatMessage>,
    /// Continue the last (assistant) message instead of opening a new turn.
    pub continue_last: bool,
    /// Open the assistant's turn (`add_generation_prompt`, true unless the request says).
    pub add_generation_prompt: bool,
    /// The tools offered, unless none are (or `tool_choice` is "none").
    pub tools: Option<Tools>,
    /// How tools reach the model and its calls come back, by the template.
    pub format: ToolFormat,
    /// The URLs of the messages' images, in order (each message's text holds the
    /// server's marker in their place).
    pub images: Vec<String>,
    /// How the template writes thinking.
    pub thinking: Thinking,
    /// Thinking goes to `reasoning_content` (else it stays in `content`:
    /// `reasoning_format: "none"`).
    pub extract: bool,
    /// The template's further variables: `enable_thinking` and the kwargs.
    pub context: Map<String, Value>,
    /// What the template adds to open the assistant's turn (set by `render`); the
    /// reply is read after it.
    gen_prompt: OnceLock<String>,
    /// Tokens of thinking before the closing tag is forced, and the message forced
    /// before it (the request's, else the server's).
    pub budget: Option<(u32, String)>,
}

impl ChatRequest {
    /// The request as `tok`'s chat template will render it, from the server's reasoning
    /// flags and the request's own fields.
    pub fn read(body: &Value, tok: &Tokenizer, r: &ReasoningDefaults) -> ApiResult<ChatRequest> {
        let f = Fields::of(body)?;
        let tools = Tools::read(&f)?;
        let mut images = Vec::new();
        let mut messages = messages(f.value("messages"), &mut images)?;
        let ends_with_calls = messages
            .last()
            .is_some_and(|m| m.extra.contains_key("tool_calls"));
        let template = tok.chat_template_or_chatml();
        let format = match (knows_tools(template), template.contains("<tool_call>")) {
            (false, _) => ToolFormat::Json,
            (true, true) => ToolFormat::Hermes,
            (true, false) => ToolFormat::Bare,
        };
        if format == ToolFormat::Json {
            messages = messages.into_iter().map(in_json_format).collect();
            if let Some(t) = &tools {
                // The tools go at the end of the system message (one is opened if none).
                let text = t.system_text();
                match messages.first_mut().filter(|m| m.role == "system") {
                    Some(sys) => sys.content = format!("{}\n\n{text}", sys.content),
                    None => messages.insert(0, ChatMessage::new("system", text)),
                }
            }
        }
        let trailing = messages
            .iter()
            .rev()
            .take_while(|m| m.role == "assistant")
            .count();
        if trailing >= 2 {
            return Err(ApiError::invalid(
                "Cannot have 2 or more assistant messages at the end of the list.",
            ));
        }
        let add_gen = f.bool("add_generation_prompt")?;
        let cont = f.bool("continue_final_message")?;
        if add_gen == Some(true) && cont == Some(true) {
            return Err(ApiError::invalid(
                "Cannot set both add_generation_prompt and continue_final_message to true.",
            ));
        }
        let continue_last = trailing == 1 && cont != Some(false) && add_gen != Some(true);
        if continue_last && ends_with_calls {
            return Err(ApiError::invalid(
                "Cannot continue an assistant message that contains tool calls.",
            ));
        }
        if continue_last {
            // The continued message's text parts are joined as llama.cpp joins them for
            // a continuation: with a blank line, not the newline of other messages.
            let raw = f.value("messages").and_then(Value::as_array);
            if let (Some(last), Some(m)) = (raw.and_then(|a| a.last()), messages.last_mut()) {
                let lf = Fields::of(last)?;
                // Its images were taken with the messages: the same markers come back.
                m.content = text_content(&lf, &m.role, "\n\n", &mut Vec::new(), || {
                    ApiError::invalid("the final message has no content")
                })?;
            }
        }
        let (thinking, toggles) = template_thinking(tok);
        let (context, extract) = reasoning_fields(&f, r, toggles)?;
        let budget = match f
            .i64("reasoning_budget_tokens")?
            .or(f.i64("thinking_budget_tokens")?)
        {
            None | Some(-1) => r.budget,
            Some(n) if n >= 0 => Some(n.min(u32::MAX as i64) as u32),
            Some(n) => {
                return Err(ApiError::invalid(format!(
                    "reasoning_budget_tokens {n}: give a token count, or -1 for the server's"
                )))
            }
        };
        let message = f.str("reasoning_budget_message")?;
        let budget = budget.map(|n| (n, message.unwrap_or(&r.budget_message).to_string()));
        Ok(ChatRequest {
            add_generation_prompt: add_gen != Some(false),
            continue_last,
            messages,
            tools,
            format,
            images,
            thinking,
            extract,
            context,
            gen_prompt: OnceLock::new(),
            budget,
        })
    }

    /// The prompt text: the template's rendering, cut after the last message's content
    /// when it is continued.
    pub fn render(&self, tok: &Tokenizer) -> ApiResult<String> {
        let wrap = |e: crate::tokenizer::TemplateError| ApiError::invalid(e.to_string());
        // Templates that render tools themselves get the list.
        let list = (self.tools.as_ref())
            .filter(|_| self.format != ToolFormat::Json)
            .map(|t| &t.list);
        let apply = |add_gen| {
            tok.apply_chat_template_with(&self.messages, add_gen, list, Some(&self.context))
        };
        if !self.continue_last {
            let full = apply(self.add_generation_prompt).map_err(wrap)?;
            if self.thinking.supported() && self.add_generation_prompt {
                // As llama-server finds it: what the turn's opening adds to the text.
                let bare = apply(false).map_err(wrap)?;
                let common = (full.bytes().zip(bare.bytes()))
                    .take_while(|(a, b)| a == b)
                    .count();
                let mut at = common;
                while !full.is_char_boundary(at) {
                    at -= 1;
                }
                let _ = self.gen_prompt.set(full[at..].to_string());
            }
            return Ok(full);
        }
        let last = self.messages.last().map_or("", |m| m.content.as_str());
        let full = apply(false).map_err(wrap)?;
        // The assistant's text as rendered ends the prompt; what the template puts after
        // it (its end-of-turn) is dropped so that the model continues the text.
        match full.rfind(last).filter(|_| !last.is_empty()) {
            Some(at) => Ok(full[..at + last.len()].to_string()),
            None => Err(ApiError::invalid(
                "the chat template does not render the final assistant message's text as given, so it cannot be continued",
            )),
        }
    }

    /// The tools' grammar as the request's (a request with tools may set none of its own).
    pub fn tools_grammar(&self, grammar: &mut Option<String>) -> ApiResult<()> {
        let Some(t) = &self.tools else {
            return Ok(());
        };
        if grammar.is_some() {
            return Err(ApiError::invalid(
                "Cannot use custom grammar constraints with tools.",
            ));
        }
        if let Some(g) = t.grammar_as(self.format)? {
            *grammar = Some(g);
        }
        Ok(())
    }

    /// The reply read back: its thinking split out, then with tools, its calls and
    /// text; without, the text as it is.
    pub fn reply(&self, text: &str) -> tools::Reply {
        let split = self
            .reading()
            .split(self.gen_prompt(), text, self.extract, false);
        let mut r = match &self.tools {
            Some(t) => t.parse_as(self.format, &split.content, || {
                super::wire::reply_id("call_")
            }),
            None => tools::Reply {
                content: split.content,
                ..Default::default()
            },
        };
        r.reasoning = split.reasoning;
        r
    }

    /// A streamed reply's reader: the thinking and text each piece adds.
    pub fn splitter(&self) -> Splitter {
        Splitter::new(self.reading(), self.gen_prompt().to_string(), self.extract)
    }

    /// How the reply is read: as the template writes thinking, where the reply opens
    /// a turn; a continued message, or a reply with no turn opened, is not split.
    fn reading(&self) -> Thinking {
        match self.gen_prompt.get() {
            Some(_) => self.thinking.clone(),
            None => Thinking::None,
        }
    }

    fn gen_prompt(&self) -> &str {
        self.gen_prompt.get().map_or("", String::as_str)
    }

    /// The prompt: its tokens, with its images read, prepared and in place.
    pub fn prompt(&self, tok: &Tokenizer, input: &ImageInput) -> ApiResult<MediaPrompt> {
        let files = (self.images.iter())
            .map(|u| url_bytes(u, input.media_path.as_deref()))
            .collect::<ApiResult<Vec<_>>>()?;
        input.prompt(tok, &self.render(tok)?, &files, true)
    }

    /// A chat body read, and the request it queues: `base` (the body's generation
    /// settings) with the rendered prompt, its images and the tools' grammar.
    pub fn request(
        body: &Value,
        base: &Request,
        tok: &Tokenizer,
        input: &ImageInput,
        r: &ReasoningDefaults,
    ) -> ApiResult<(Self, Request)> {
        let chat = ChatRequest::read(body, tok, r)?;
        let mut req = base.clone();
        chat.tools_grammar(&mut req.params.sampling.grammar)?;
        let prompt = chat.prompt(tok, input)?;
        req.prompt = prompt.tokens;
        req.images = prompt.images;
        req.params.sampling.thinking_budget = chat.thinking_budget(tok);
        Ok((chat, req))
    }

    /// The thinking budget as the sampler keeps it: the template's tags as tokens
    /// (llama-server's: the closing tag forced after the message), the turn's opening
    /// replayed. None without a budget, where the template has no closing tag, or for a
    /// continued message.
    pub fn thinking_budget(&self, tok: &Tokenizer) -> Option<ThinkingBudget> {
        let (tokens, message) = self.budget.as_ref()?;
        let (open, close) = self.thinking.tags()?;
        let gen_prompt = self.gen_prompt.get()?;
        let end = tok.encode(close, false, true);
        let mut forced = tok.encode(message, false, true);
        forced.extend(&end);
        Some(ThinkingBudget {
            tokens: *tokens,
            start: tok.encode(open, false, true),
            end,
            forced,
            prefill: tok.encode(gen_prompt, false, true),
        })
    }
}

/// How `tok`'s template writes thinking, and whether its `enable_thinking` changes the
/// turn's opening (llama-server's test for a template with thinking, which also finds
/// templates whose thinking wgllm cannot split out, such as Command R7B's). Found by
/// rendering, once per template.
fn template_thinking(tok: &Tokenizer) -> (Thinking, bool) {
    use std::hash::{Hash, Hasher};
    static KNOWN: std::sync::Mutex<Vec<(u64, Thinking, bool)>> = std::sync::Mutex::new(Vec::new());
    let template = tok.chat_template_or_chatml();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    template.hash(&mut h);
    let key = h.finish();
    let known = |k: &[(u64, Thinking, bool)]| {
        (k.iter().find(|e| e.0 == key)).map(|(_, t, b)| (t.clone(), *b))
    };
    if let Some(hit) = known(&KNOWN.lock().unwrap_or_else(|e| e.into_inner())) {
        return hit;
    }
    let thinking = Thinking::of_template(template, |m| {
        tok.apply_chat_template_with(m, false, None, None).ok()
    });
    let opening = |on: bool| {
        let mut context = Map::new();
        context.insert("enable_thinking".into(), json!(on));
        let hi = [ChatMessage::new("user", "Hi")];
        tok.apply_chat_template_with(&hi, true, None, Some(&context))
            .ok()
    };
    let toggles = thinking.supported() || opening(true) != opening(false);
    let mut k = KNOWN.lock().unwrap_or_else(|e| e.into_inner());
    if k.len() >= 64 {
        k.clear();
    }
    k.push((key, thinking.clone(), toggles));
    (thinking, toggles)
}

/// The template's variables and whether thinking is split out, as llama-server reads
/// them: the server's kwargs, the request's `chat_template_kwargs` over them
/// (`enable_thinking` must be a boolean), `reasoning_effort` ("none" turns thinking off)
/// and `reasoning_format`.
fn reasoning_fields(
    f: &Fields,
    r: &ReasoningDefaults,
    supported: bool,
) -> ApiResult<(Map<String, Value>, bool)> {
    // Today's date, which some templates print (Llama 3.x's `date_string`), then the
    // server's kwargs.
    let today = chrono::Local::now();
    let mut context = Map::new();
    context.insert(
        "datetime".into(),
        json!(today.format("%b %d %Y").to_string()),
    );
    context.insert(
        "date_string".into(),
        json!(today.format("%d %b %Y").to_string()),
    );
    context.extend(r.template_kwargs.clone());
    match f.value("chat_template_kwargs") {
        None | Some(Value::Null) => {}
        Some(Value::Object(m)) => context.extend(m.clone()),
        Some(_) => {
            return Err(ApiError::invalid(
                "\"chat_template_kwargs\" must be an object",
            ))
        }
    }
    let mut enable = r.enable.unwrap_or(true) && supported;
    match context.get("enable_thinking") {
        None => {}
        Some(Value::Bool(b)) => enable = *b,
        Some(Value::String(_)) => {
            return Err(ApiError::invalid(
                "invalid type for \"enable_thinking\" (expected boolean, got string)",
            ))
        }
        Some(_) => {}
    }
    match f.str("reasoning_effort")? {
        Some("none") => {
            enable = false;
            context.remove("reasoning_effort");
        }
        Some(e) if !e.is_empty() => {
            context.insert("reasoning_effort".into(), json!(e));
        }
        _ => {}
    }
    context.insert("enable_thinking".into(), json!(enable));
    let extract = match f.str("reasoning_format")? {
        None => !r.keep_in_content,
        Some("none") => false,
        Some("auto" | "deepseek" | "deepseek-legacy") => true,
        Some(other) => {
            return Err(ApiError::invalid(format!(
                "Unknown reasoning format: {other} (none, auto, deepseek or deepseek-legacy)"
            )))
        }
    };
    Ok((context, extract))
}

/// Chat messages from an OpenAI-style `messages` array (text parts of a content array
/// are joined with newlines); the URLs of their images go to `images`.
pub fn messages(v: Option<&Value>, images: &mut Vec<String>) -> ApiResult<Vec<ChatMessage>> {
    let items = match v {
        None => return Err(ApiError::invalid("'messages' is required")),
        Some(Value::Array(items)) => items,
        Some(_) => return Err(ApiError::invalid("Expected 'messages' to be an array")),
    };
    items.iter().map(|m| message(m, images)).collect()
}

/// One message, with the fields templates that know tools read: an assistant's
/// `tool_calls` (arguments as objects) and `reasoning_content`, a tool result's
/// `tool_call_id` and `name`.
fn message(m: &Value, images: &mut Vec<String>) -> ApiResult<ChatMessage> {
    let no_content = || ApiError::invalid("All non-assistant messages must contain 'content'");
    let f = Fields::of(m).map_err(|_| ApiError::invalid("Each message must be an object"))?;
    // As llama-server: the content check first, then the role's.
    if f.str("role")? != Some("assistant") && f.value("content").is_none() {
        return Err(no_content());
    }
    let role = f
        .str("role")?
        .ok_or_else(|| ApiError::invalid("Missing 'role' in message"))?;
    let mut msg = ChatMessage::new(role, text_content(&f, role, "\n", images, no_content)?);
    if role == "tool" {
        for k in ["tool_call_id", "name"] {
            if let Some(v) = f.str(k)? {
                msg.extra.insert(k.into(), json!(v));
            }
        }
    }
    if let Some(r) = f.str("reasoning_content")?.filter(|r| !r.is_empty()) {
        msg.extra.insert("reasoning_content".into(), json!(r));
    }
    match f.value("tool_calls") {
        Some(Value::Array(calls)) if role == "assistant" && !calls.is_empty() => {
            let calls: Vec<Value> = calls
                .iter()
                .map(tools::call_with_object_arguments)
                .collect();
            msg.extra.insert("tool_calls".into(), Value::Array(calls));
        }
        _ => {}
    }
    Ok(msg)
}

/// A message as templates that know nothing of tools take it: a tool's result as a user
/// message holding it, an assistant's calls as the JSON the model is asked to write
/// (see `tools.rs`).
fn in_json_format(mut m: ChatMessage) -> ChatMessage {
    if m.role == "tool" {
        let id = m.extra.remove("tool_call_id");
        m.extra.remove("name");
        let text = tools::response_text(id.as_ref().and_then(Value::as_str), &m.content);
        return ChatMessage {
            role: "user".into(),
            content: text,
            extra: m.extra,
        };
    }
    if let Some(Value::Array(calls)) = m.extra.remove("tool_calls") {
        let calls = tools::calls_text(&calls);
        m.content = if m.content.is_empty() {
            calls
        } else {
            format!("{}\n{calls}", m.content)
        };
    }
    m
}

/// A message's text: its string content, or its parts joined with `delimiter` (none
/// before or after an image's marker, as llama.cpp joins them); image URLs go to
/// `images`.
fn text_content(
    f: &Fields,
    role: &str,
    delimiter: &str,
    images: &mut Vec<String>,
    no_content: impl Fn() -> ApiError,
) -> ApiResult<String> {
    let content = match f.value("content") {
        None | Some(Value::Null) if role == "assistant" => String::new(),
        None => return Err(no_content()),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            let mut after_image = false;
            for p in parts {
                match part(p)? {
                    Part::Text(t) => {
                        if !after_image && !text.is_empty() {
                            text.push_str(delimiter);
                        }
                        text.push_str(&t);
                        after_image = false;
                    }
                    Part::Image(url) => {
                        images.push(url);
                        text.push_str(marker());
                        after_image = true;
                    }
                }
            }
            text
        }
        Some(_) => {
            return Err(ApiError::invalid(
                "Expected 'content' to be a string or an array",
            ))
        }
    };
    Ok(content)
}

/// A content part: text, or an image's URL.
enum Part {
    Text(String),
    Image(String),
}

fn part(p: &Value) -> ApiResult<Part> {
    match p.get("type").and_then(Value::as_str) {
        Some("text") => p
            .get("text")
            .and_then(Value::as_str)
            .map(|t| Part::Text(t.to_string()))
            .ok_or_else(|| ApiError::invalid("a text part needs \"text\"")),
        Some("image_url") => {
            let url = (p.get("image_url"))
                .and_then(|u| u.get("url").or(Some(u)))
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    ApiError::invalid("an image_url part needs \"image_url\": {\"url\": ...}")
                })?;
            Ok(Part::Image(url.to_string()))
        }
        // llama-server answers these as server errors (no encoder for them is loaded).
        Some("input_audio" | "input_video" | "video_url") => Err(ApiError::server(
            "audio and video input are not supported: wgllm reads text and images",
        )),
        Some(_) => Err(ApiError::invalid("unsupported content[].type")),
        None => Err(ApiError::invalid("each content part needs a \"type\"")),
    }
}
