//! Tool calls for any chat template. The request's tools are described to the model at
//! the end of its system message, and a grammar holds the reply to one JSON object:
//! `{"tool_calls": [{"name": ..., "arguments": {...}}]}` (one call unless
//! `parallel_tool_calls`), or `{"response": "..."}` where a call is not required. The
//! reply is read back into OpenAI's `tool_calls` or Anthropic's `tool_use` blocks.
//! History is written in the same JSON (see `chat.rs`): an assistant's calls as its
//! content, a tool's result as a user message holding `{"tool_response": ...}`, so that
//! templates which know nothing of tools (SmolLM2's, Gemma's) render every turn.
//!
//! Templates that render tools themselves (they read `tool_calls`) get the list and the
//! history's calls and results as fields instead, and the model's own syntax is read
//! back: Hermes' `<tool_call>{...}</tool_call>` blocks (Qwen 2.5 and 3, Hermes), else a
//! bare JSON call (Llama 3.x); a grammar holds the reply only where a call is required.

use super::error::{ApiError, ApiResult};
use super::params::Fields;
use serde_json::{json, Value};

/// One callable function, as OpenAI's `tools` list gives it.
#[derive(Clone, Debug, PartialEq)]
pub struct Tool {
    pub name: String,
    pub description: String,
    /// JSON schema of the arguments object.
    pub parameters: Value,
}

/// `tool_choice`: any tool or a plain answer, some tool, or one named tool.
#[derive(Clone, Debug, PartialEq)]
pub enum Choice {
    Auto,
    Required,
    Named(String),
}

/// How tools reach the model and its calls come back, by what the template knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolFormat {
    /// The template knows nothing of tools: wgllm's JSON, written into the messages.
    Json,
    /// The template renders tools; the model writes `<tool_call>` blocks of JSON.
    Hermes,
    /// The template renders tools; the model writes a call as a bare JSON object.
    Bare,
}

/// The tools a chat request offers the model.
#[derive(Clone, Debug, PartialEq)]
pub struct Tools {
    pub tools: Vec<Tool>,
    /// The request's `tools` as given (OpenAI's form), for templates that render them.
    pub list: Value,
    pub choice: Choice,
    /// Several calls in one reply (`parallel_tool_calls`).
    pub parallel: bool,
}

/// A call the model made.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: Value,
}

/// The model's reply read back: its thinking, its text, and its calls.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Reply {
    /// The thinking split from the text (see `tokenizer::reasoning`); empty here.
    pub reasoning: String,
    pub content: String,
    pub calls: Vec<ToolCall>,
}

impl Tools {
    /// The request's `tools`, `tool_choice` and `parallel_tool_calls` (OpenAI's fields);
    /// None without tools or with `tool_choice: "none"`.
    pub fn read(f: &Fields) -> ApiResult<Option<Tools>> {
        let list = match f.value("tools") {
            None | Some(Value::Null) => return Ok(None),
            Some(Value::Array(a)) => a,
            Some(_) => return Err(ApiError::invalid("\"tools\" must be an array")),
        };
        if list.is_empty() {
            return Ok(None);
        }
        let tools = list.iter().map(tool).collect::<ApiResult<Vec<_>>>()?;
        let choice = match f.value("tool_choice") {
            None | Some(Value::Null) => Choice::Auto,
            Some(Value::String(s)) => match s.as_str() {
                "auto" => Choice::Auto,
                "none" => return Ok(None),
                "required" => Choice::Required,
                other => {
                    return Err(ApiError::invalid(format!(
                        "Invalid tool_choice: {other} (expected \"auto\", \"none\", \"required\" or a function)"
                    )))
                }
            },
            Some(v) => {
                let name = v
                    .get("function")
                    .and_then(|f| f.get("name"))
                    .and_then(Value::as_str)
                    .ok_or_else(|| {
                        ApiError::invalid(
                            "\"tool_choice\" must be a string or {\"type\": \"function\", \"function\": {\"name\": ...}}",
                        )
                    })?;
                if !tools.iter().any(|t| t.name == name) {
                    return Err(ApiError::invalid(format!(
                        "\"tool_choice\" names {name:?}, which is not among the tools"
                    )));
                }
                Choice::Named(name.to_string())
            }
        };
        let parallel = f.bool("parallel_tool_calls")?.unwrap_or(false);
        Ok(Some(Tools {
            tools,
            list: Value::Array(list.clone()),
            choice,
            parallel,
        }))
    }

    /// The tools the model may call: all, or the one `tool_choice` names.
    fn offered(&self) -> impl Iterator<Item = &Tool> {
        self.tools.iter().filter(move |t| match &self.choice {
            Choice::Named(n) => &t.name == n,
            _ => true,
        })
    }

    /// What the system message gains: the tools, and the reply's format.
    pub fn system_text(&self) -> String {
        let specs: Vec<Value> = self
            .offered()
            .map(|t| json!({"name": t.name, "description": t.description, "parameters": t.parameters}))
            .collect();
        let list = serde_json::to_string_pretty(&specs).unwrap_or_default();
        let calls = if self.parallel {
            "To call tools, list one or more calls"
        } else {
            "To call a tool, give one call"
        };
        let answer = if self.choice == Choice::Auto {
            " To answer without a tool, write {\"response\": \"<your answer>\"}."
        } else {
            ""
        };
        format!(
            "These tools are available:\n{list}\n\nReply with one JSON object. {calls}: \
             {{\"tool_calls\": [{{\"name\": \"<tool>\", \"arguments\": {{...}}}}]}}.{answer}"
        )
    }

    /// The JSON schema the reply must match.
    pub fn schema(&self) -> Value {
        let mut calls = json!({
            "type": "array",
            "items": self.call_schema(),
            "minItems": 1,
        });
        if !self.parallel {
            calls["maxItems"] = json!(1);
        }
        let with_calls = json!({
            "type": "object",
            "properties": {"tool_calls": calls},
            "required": ["tool_calls"],
        });
        if self.choice != Choice::Auto {
            return with_calls;
        }
        json!({"anyOf": [
            with_calls,
            {"type": "object", "properties": {"response": {"type": "string"}}, "required": ["response"]},
        ]})
    }

    /// The grammar (GBNF) of [`Self::schema`].
    pub fn grammar(&self) -> ApiResult<String> {
        to_grammar(&self.schema())
    }

    /// One call's JSON schema: a `name` of the offered tools and its `arguments`.
    fn call_schema(&self) -> Value {
        let call = |t: &Tool| {
            let params = match &t.parameters {
                Value::Object(o) if !o.is_empty() => t.parameters.clone(),
                _ => json!({"type": "object"}),
            };
            json!({
                "type": "object",
                "properties": {"name": {"const": t.name}, "arguments": params},
                "required": ["name", "arguments"],
            })
        };
        json!({"anyOf": self.offered().map(call).collect::<Vec<_>>()})
    }

    /// The grammar the reply is held to in `format`: always in wgllm's JSON; in a
    /// template's own syntax only where a call is required (one `<tool_call>` block, or
    /// one bare call), the model otherwise free to answer in text.
    pub fn grammar_as(&self, format: ToolFormat) -> ApiResult<Option<String>> {
        if format == ToolFormat::Json {
            return self.grammar().map(Some);
        }
        if self.choice == Choice::Auto {
            return Ok(None);
        }
        let call = to_grammar(&self.call_schema())?;
        if format == ToolFormat::Bare {
            return Ok(Some(call));
        }
        // The call's rules under another root, inside the block.
        let renamed: Vec<String> = call
            .lines()
            .map(|l| match l.strip_prefix("root ::=") {
                Some(rest) => format!("wgllm-call ::={rest}"),
                None => l.to_string(),
            })
            .collect();
        Ok(Some(format!(
            "root ::= \"<tool_call>\\n\" wgllm-call \"\\n</tool_call>\"\n{}",
            renamed.join("\n")
        )))
    }

    /// [`Self::parse`] for the reply of `format`.
    pub fn parse_as(&self, format: ToolFormat, text: &str, new_id: impl Fn() -> String) -> Reply {
        match format {
            ToolFormat::Json => self.parse(text, new_id),
            ToolFormat::Hermes => parse_hermes(text, new_id),
            ToolFormat::Bare => match serde_json::from_str::<Value>(text.trim())
                .ok()
                .and_then(|v| read_call(&v, &new_id))
            {
                Some(call) => Reply {
                    content: String::new(),
                    calls: vec![call],
                    ..Default::default()
                },
                None => Reply {
                    content: text.to_string(),
                    calls: Vec::new(),
                    ..Default::default()
                },
            },
        }
    }

    /// The model's reply read back. Text that is not the JSON asked for (a reply cut by
    /// the token limit) is returned as it is, as content.
    pub fn parse(&self, text: &str, new_id: impl Fn() -> String) -> Reply {
        let Ok(Value::Object(o)) = serde_json::from_str::<Value>(text.trim()) else {
            return Reply {
                content: text.to_string(),
                calls: Vec::new(),
                ..Default::default()
            };
        };
        let calls: Vec<ToolCall> = o
            .get("tool_calls")
            .and_then(Value::as_array)
            .map(|calls| {
                calls
                    .iter()
                    .filter_map(|c| {
                        Some(ToolCall {
                            id: new_id(),
                            name: c.get("name")?.as_str()?.to_string(),
                            arguments: c.get("arguments").cloned().unwrap_or(json!({})),
                        })
                    })
                    .collect()
            })
            .unwrap_or_default();
        let content = match o.get("response") {
            Some(Value::String(r)) => r.clone(),
            _ if calls.is_empty() => text.to_string(),
            _ => String::new(),
        };
        Reply {
            content,
            calls,
            ..Default::default()
        }
    }
}

fn to_grammar(schema: &Value) -> ApiResult<String> {
    crate::grammar::json_schema::to_grammar(schema)
        .map_err(|e| ApiError::invalid(format!("\"tools\": {e}")))
}

/// A call object as models write it: `name`, and `arguments` (or Llama's `parameters`).
fn read_call(v: &Value, new_id: &impl Fn() -> String) -> Option<ToolCall> {
    let name = v.get("name")?.as_str()?.to_string();
    let arguments = v.get("arguments").or_else(|| v.get("parameters"))?.clone();
    // Some models write the arguments as a JSON string.
    let arguments = match arguments {
        Value::String(s) => serde_json::from_str(&s).unwrap_or(Value::String(s)),
        a => a,
    };
    Some(ToolCall {
        id: new_id(),
        name,
        arguments,
    })
}

/// Hermes' syntax read back: each `<tool_call>` block's JSON call (a block the token
/// limit cut short is kept as text), the text around them as content.
fn parse_hermes(text: &str, new_id: impl Fn() -> String) -> Reply {
    const OPEN: &str = "<tool_call>";
    const CLOSE: &str = "</tool_call>";
    let mut content = String::new();
    let mut calls = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find(OPEN) {
        let body = &rest[at + OPEN.len()..];
        let Some(end) = body.find(CLOSE) else {
            break;
        };
        match serde_json::from_str::<Value>(body[..end].trim())
            .ok()
            .and_then(|v| read_call(&v, &new_id))
        {
            Some(call) => {
                content.push_str(&rest[..at]);
                calls.push(call);
            }
            None => content.push_str(&rest[..at + OPEN.len() + end + CLOSE.len()]),
        }
        rest = &body[end + CLOSE.len()..];
    }
    content.push_str(rest);
    Reply {
        content: content.trim().to_string(),
        calls,
        ..Default::default()
    }
}

/// An OpenAI call with its `arguments` as an object where the string parses (templates
/// write them with `tojson`).
pub fn call_with_object_arguments(c: &Value) -> Value {
    let mut c = c.clone();
    if let Some(Value::String(s)) = c.get("function").and_then(|f| f.get("arguments")) {
        if let Ok(v @ Value::Object(_)) = serde_json::from_str::<Value>(s) {
            c["function"]["arguments"] = v;
        }
    }
    c
}

/// One entry of OpenAI's `tools`: `{"type": "function", "function": {"name", "description",
/// "parameters"}}`.
fn tool(v: &Value) -> ApiResult<Tool> {
    let bad = || {
        ApiError::invalid(
            "each tool must be {\"type\": \"function\", \"function\": {\"name\": ..., \"parameters\": ...}}",
        )
    };
    if v.get("type").and_then(Value::as_str) != Some("function") {
        return Err(bad());
    }
    let f = v.get("function").ok_or_else(bad)?;
    let name = f.get("name").and_then(Value::as_str).ok_or_else(bad)?;
    if name.is_empty() {
        return Err(bad());
    }
    Ok(Tool {
        name: name.to_string(),
        description: f
            .get("description")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        parameters: f.get("parameters").cloned().unwrap_or(json!({})),
    })
}

/// An assistant turn's calls as the model is asked to write them (history).
pub fn calls_text(calls: &[Value]) -> String {
    let calls: Vec<Value> = calls
        .iter()
        .map(|c| {
            let f = c.get("function").unwrap_or(c);
            let args = match f.get("arguments") {
                // OpenAI sends the arguments as a JSON string.
                Some(Value::String(s)) => serde_json::from_str(s).unwrap_or(json!(s)),
                Some(v) => v.clone(),
                None => json!({}),
            };
            json!({"name": f.get("name").cloned().unwrap_or(Value::Null), "arguments": args})
        })
        .collect();
    json!({ "tool_calls": calls }).to_string()
}

/// A tool's result as the user message that carries it (history).
pub fn response_text(tool_call_id: Option<&str>, content: &str) -> String {
    json!({"tool_response": {"tool_call_id": tool_call_id, "content": content}}).to_string()
}

/// OpenAI's `tool_calls` array of a reply.
pub fn openai_calls(calls: &[ToolCall]) -> Value {
    Value::Array(
        calls
            .iter()
            .map(|c| {
                json!({
                    "type": "function",
                    "id": c.id,
                    "function": {"name": c.name, "arguments": c.arguments.to_string()},
                })
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grammar::{accepts_text, Grammar};
    use std::sync::Arc;

    fn tools(extra: Value) -> Tools {
        let mut body = json!({"tools": [
            {"type": "function", "function": {"name": "get_weather", "description": "Weather",
             "parameters": {"type": "object", "properties": {"location": {"type": "string"}},
                            "required": ["location"]}}},
            {"type": "function", "function": {"name": "now"}},
        ]});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        Tools::read(&Fields::of(&body).unwrap()).unwrap().unwrap()
    }

    fn accepts(t: &Tools, text: &str) -> bool {
        let g = Grammar::parse(&t.grammar().unwrap(), None).unwrap();
        accepts_text(Arc::new(g), text)
    }

    #[test]
    fn the_grammar_holds_replies_to_the_offered_calls() {
        let auto = tools(json!({}));
        let call =
            r#"{"tool_calls": [{"name": "get_weather", "arguments": {"location": "Paris"}}]}"#;
        assert!(accepts(&auto, call));
        assert!(accepts(&auto, r#"{"response": "Hello"}"#));
        assert!(accepts(
            &auto,
            r#"{"tool_calls": [{"name": "now", "arguments": {}}]}"#
        ));
        // Unknown tools, missing arguments, two calls without parallel_tool_calls.
        assert!(!accepts(
            &auto,
            r#"{"tool_calls": [{"name": "other", "arguments": {}}]}"#
        ));
        assert!(!accepts(
            &auto,
            r#"{"tool_calls": [{"name": "get_weather", "arguments": {}}]}"#
        ));
        let two = r#"{"tool_calls": [{"name": "now", "arguments": {}}, {"name": "now", "arguments": {}}]}"#;
        assert!(!accepts(&auto, two));
        assert!(accepts(&tools(json!({"parallel_tool_calls": true})), two));
        let required = tools(json!({"tool_choice": "required"}));
        assert!(!accepts(&required, r#"{"response": "Hello"}"#));
        assert!(accepts(&required, call));
        let named =
            tools(json!({"tool_choice": {"type": "function", "function": {"name": "now"}}}));
        assert!(!accepts(&named, call));
        assert!(accepts(
            &named,
            r#"{"tool_calls": [{"name": "now", "arguments": {}}]}"#
        ));
    }

    #[test]
    fn replies_are_read_back() {
        let t = tools(json!({}));
        let id = || "call_1".to_string();
        let r = t.parse(
            r#" {"tool_calls": [{"name": "get_weather", "arguments": {"location": "Paris"}}]}"#,
            id,
        );
        assert_eq!(r.content, "");
        assert_eq!(
            r.calls,
            vec![ToolCall {
                id: "call_1".into(),
                name: "get_weather".into(),
                arguments: json!({"location": "Paris"}),
            }]
        );
        let r = t.parse(r#"{"response": "It is sunny."}"#, id);
        assert_eq!((r.content.as_str(), r.calls.len()), ("It is sunny.", 0));
        // Cut short by the token limit: the text as it came.
        let r = t.parse(r#"{"tool_calls": [{"name": "get_we"#, id);
        assert_eq!(r.content, r#"{"tool_calls": [{"name": "get_we"#);
        assert!(r.calls.is_empty());
    }

    #[test]
    fn a_templates_own_syntax_is_read_back() {
        let t = tools(json!({}));
        let id = || "c".to_string();
        let r = t.parse_as(
            ToolFormat::Hermes,
            "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris\"}}\n</tool_call>",
            id,
        );
        assert_eq!(r.content, "Let me look.");
        assert_eq!(r.calls.len(), 1);
        assert_eq!(r.calls[0].arguments, json!({"location": "Paris"}));
        // A block cut short stays text.
        let r = t.parse_as(ToolFormat::Hermes, "<tool_call>\n{\"name\": \"get", id);
        assert!(r.calls.is_empty() && r.content.starts_with("<tool_call>"));
        let r = t.parse_as(
            ToolFormat::Bare,
            r#"{"name": "get_weather", "parameters": {"location": "Paris"}}"#,
            id,
        );
        assert_eq!(r.calls[0].name, "get_weather");
        assert_eq!(t.parse_as(ToolFormat::Bare, "Hello", id).content, "Hello");
        // Held by a grammar only where a call is required.
        assert!(t.grammar_as(ToolFormat::Hermes).unwrap().is_none());
        let required = tools(json!({"tool_choice": "required"}));
        let g = required.grammar_as(ToolFormat::Hermes).unwrap().unwrap();
        let g = Arc::new(Grammar::parse(&g, None).unwrap());
        let block = "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";
        assert!(accepts_text(g.clone(), block));
        assert!(!accepts_text(g, "Hello"));
    }

    #[test]
    fn bad_tools_are_refused() {
        for body in [
            json!({"tools": {}}),
            json!({"tools": [{"type": "code"}]}),
            json!({"tools": [{"type": "function", "function": {}}]}),
            json!({"tools": [{"type": "function", "function": {"name": "a"}}], "tool_choice": "sometimes"}),
            json!({"tools": [{"type": "function", "function": {"name": "a"}}],
                   "tool_choice": {"type": "function", "function": {"name": "b"}}}),
        ] {
            let e = Tools::read(&Fields::of(&body).unwrap()).unwrap_err();
            assert_eq!(e.status.as_u16(), 400, "{body}");
        }
        let none = json!({"tools": [{"type": "function", "function": {"name": "a"}}], "tool_choice": "none"});
        assert!(Tools::read(&Fields::of(&none).unwrap()).unwrap().is_none());
    }

    #[test]
    fn history_is_written_as_the_model_is_asked_to_write() {
        let calls = [json!({"id": "c1", "type": "function",
                            "function": {"name": "get_weather", "arguments": "{\"location\":\"Paris\"}"}})];
        let text = calls_text(&calls);
        assert!(tools(json!({})).parse(&text, || "x".into()).calls.len() == 1);
        assert_eq!(
            serde_json::from_str::<Value>(&response_text(Some("c1"), "Sunny")).unwrap(),
            json!({"tool_response": {"tool_call_id": "c1", "content": "Sunny"}})
        );
    }
}
