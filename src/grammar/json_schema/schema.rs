//! Reading a schema: the JSON value becomes a tree of [`Node`]s, with `$ref`s resolved
//! into the same document and every bound of [`super::Budget`] checked on the way.

use super::pattern::{pattern_rule, PatternError};
use super::{fail, Budget, MAX_NAME_BYTES, MAX_PATTERN_BYTES};
use crate::grammar::GrammarError;
use serde_json::Value;
use std::collections::{HashMap, HashSet};

#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Format {
    None,
    Date,
    Time,
    DateTime,
    Uuid,
}

/// A schema, checked and with its keywords resolved to one kind.
#[derive(Debug)]
pub(super) enum Node {
    Any,
    Null,
    Boolean,
    Number,
    Integer {
        min: Option<i64>,
        max: Option<i64>,
    },
    String {
        format: Format,
        min_len: usize,
        max_len: Option<usize>,
    },
    Array {
        items: Box<Node>,
        min: usize,
        max: Option<usize>,
    },
    Tuple(Vec<Node>),
    Object {
        props: Vec<(String, Node, bool)>,
        additional: Option<Box<Node>>,
    },
    /// A string matching a regular expression: the GBNF of its content.
    Pattern(String),
    Const(Value),
    Enum(Vec<Value>),
    AnyOf(Vec<Node>),
    AllOf(Vec<Node>),
    Ref(String),
}

/// The tree `schema` describes, with each `$ref`'s target (by its `#/...` path).
pub(super) fn read(schema: &Value) -> Result<(Node, Refs), GrammarError> {
    let mut b = Builder {
        root: schema,
        refs: HashMap::new(),
        budget: Budget::default(),
    };
    let node = b.node(schema, "#")?;
    Ok((node, b.refs))
}

/// Each `$ref`'s target, by its path (None only while that target is being built).
pub(super) type Refs = HashMap<String, Option<Node>>;

struct Builder<'a> {
    root: &'a Value,
    /// Each `$ref`'s target, built once (None while it is being built).
    refs: Refs,
    budget: Budget,
}

/// Refuses `what` of `len` bytes where at most `max` are taken.
fn at_most(path: &str, what: &str, len: usize, max: usize) -> Result<(), GrammarError> {
    if len > max {
        return Err(fail(
            path,
            &format!("{what} is {len} bytes long; at most {max} are taken"),
        ));
    }
    Ok(())
}

fn count(s: &Value, key: &str, path: &str) -> Result<Option<usize>, GrammarError> {
    match s.get(key) {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .filter(|&n| n <= i32::MAX as u64)
            .map(|n| Some(n as usize))
            .ok_or_else(|| fail(path, &format!("{key} must be a non-negative integer"))),
    }
}

/// An integer bound; a fractional one is rounded towards the integers it admits.
fn bound(v: &Value, key: &str, path: &str, round_up: bool) -> Result<i64, GrammarError> {
    if let Some(i) = v.as_i64() {
        return Ok(i);
    }
    let d = v
        .as_f64()
        .ok_or_else(|| fail(path, &format!("{key} must be a number")))?;
    Ok(if round_up { d.ceil() } else { d.floor() } as i64)
}

fn format_of(s: &Value, path: &str) -> Result<Format, GrammarError> {
    let Some(v) = s.get("format") else {
        return Ok(Format::None);
    };
    let f = v
        .as_str()
        .ok_or_else(|| fail(path, "format must be a string"))?;
    Ok(match f {
        "date" => Format::Date,
        "time" => Format::Time,
        "date-time" => Format::DateTime,
        "uuid" | "uuid1" | "uuid2" | "uuid3" | "uuid4" | "uuid5" => Format::Uuid,
        _ => Format::None,
    })
}

impl Builder<'_> {
    fn node(&mut self, s: &Value, path: &str) -> Result<Node, GrammarError> {
        self.node_as(s, s.get("type"), path)
    }

    /// The node of schema `s` taken as of type `ty` (its own, or one of a type list's).
    fn node_as(&mut self, s: &Value, ty: Option<&Value>, path: &str) -> Result<Node, GrammarError> {
        self.budget.enter(path)?;
        let n = self.node_inner(s, ty, path);
        self.budget.leave();
        n
    }

    fn node_inner(
        &mut self,
        s: &Value,
        ty: Option<&Value>,
        path: &str,
    ) -> Result<Node, GrammarError> {
        let Some(obj) = s.as_object() else {
            return Err(fail(path, "a schema must be an object"));
        };
        if let Some(r) = obj.get("$ref") {
            return self.reference(r, path);
        }
        for key in ["oneOf", "anyOf"] {
            if let Some(alts) = obj.get(key) {
                return Ok(Node::AnyOf(
                    self.alternatives(alts, &format!("{path}/{key}"))?,
                ));
            }
        }
        if let Some(Value::Array(types)) = ty {
            if types.is_empty() {
                return Err(fail(path, "type must not be empty"));
            }
            let mut alts = Vec::new();
            for (i, t) in types.iter().enumerate() {
                alts.push(self.node_as(s, Some(t), &format!("{path}/type/{i}"))?);
            }
            return Ok(Node::AnyOf(alts));
        }
        if let Some(c) = obj.get("const") {
            return Ok(Node::Const(c.clone()));
        }
        if let Some(e) = obj.get("enum") {
            return match e.as_array() {
                Some(values) if !values.is_empty() => Ok(Node::Enum(values.clone())),
                _ => Err(fail(path, "enum must be a non-empty array")),
            };
        }
        let type_name = match ty {
            None | Some(Value::Null) => "",
            Some(Value::String(t)) => t.as_str(),
            Some(_) => return Err(fail(path, "type must be a string or an array of strings")),
        };
        let has_properties = obj.contains_key("properties")
            || obj
                .get("additionalProperties")
                .is_some_and(|a| a != &Value::Bool(true));
        let all_of = |b: &mut Self| -> Result<Node, GrammarError> {
            Ok(Node::AllOf(
                b.alternatives(&obj["allOf"], &format!("{path}/allOf"))?,
            ))
        };
        match type_name {
            "" => {
                if has_properties {
                    self.object(s, path)
                } else if obj.contains_key("allOf") {
                    all_of(self)
                } else if obj.contains_key("items") || obj.contains_key("prefixItems") {
                    self.array(s, path)
                } else if ["pattern", "minLength", "maxLength"]
                    .iter()
                    .any(|k| obj.contains_key(*k))
                    || format_of(s, path)? != Format::None
                {
                    self.string(s, path)
                } else {
                    Ok(Node::Any)
                }
            }
            "object" if !has_properties && obj.contains_key("allOf") => all_of(self),
            "object" => self.object(s, path),
            "string" if obj.contains_key("allOf") => all_of(self),
            "string" => self.string(s, path),
            "array" => self.array(s, path),
            "integer" => {
                let mut min = None;
                let mut max = None;
                if let Some(v) = obj.get("minimum") {
                    min = Some(bound(v, "minimum", path, true)?);
                } else if let Some(v) = obj.get("exclusiveMinimum") {
                    min = Some(bound(v, "exclusiveMinimum", path, false)?.saturating_add(1));
                }
                if let Some(v) = obj.get("maximum") {
                    max = Some(bound(v, "maximum", path, false)?);
                } else if let Some(v) = obj.get("exclusiveMaximum") {
                    max = Some(bound(v, "exclusiveMaximum", path, true)?.saturating_sub(1));
                }
                Ok(Node::Integer { min, max })
            }
            "number" => Ok(Node::Number),
            "boolean" => Ok(Node::Boolean),
            "null" => Ok(Node::Null),
            other => Err(fail(path, &format!("unrecognized type {other}"))),
        }
    }

    fn alternatives(&mut self, alts: &Value, path: &str) -> Result<Vec<Node>, GrammarError> {
        let Some(items) = alts.as_array() else {
            return Err(fail(path, "must be an array of schemas"));
        };
        if items.is_empty() {
            return Err(fail(path, "must not be empty"));
        }
        (items.iter().enumerate())
            .map(|(i, a)| self.node(a, &format!("{path}/{i}")))
            .collect()
    }

    fn reference(&mut self, r: &Value, path: &str) -> Result<Node, GrammarError> {
        let Some(r) = r.as_str() else {
            return Err(fail(path, "$ref must be a string"));
        };
        if !r.starts_with("#/") {
            return Err(fail(
                path,
                &format!(
                    "unsupported $ref {r}: only references into the same document are supported"
                ),
            ));
        }
        if !self.refs.contains_key(r) {
            self.refs.insert(r.to_string(), None);
            let mut target = self.root;
            for sel in r[2..].split('/') {
                target = match target {
                    Value::Object(o) if o.contains_key(sel) => &o[sel],
                    Value::Array(a) => sel
                        .parse::<usize>()
                        .ok()
                        .and_then(|i| a.get(i))
                        .ok_or_else(|| {
                            fail(
                                path,
                                &format!("cannot resolve $ref {r}: {sel} is out of range"),
                            )
                        })?,
                    _ => {
                        return Err(fail(
                            path,
                            &format!("cannot resolve $ref {r}: {sel} not found"),
                        ))
                    }
                };
            }
            let node = self.node(target, r)?;
            self.refs.insert(r.to_string(), Some(node));
        }
        Ok(Node::Ref(r.to_string()))
    }

    fn object(&mut self, s: &Value, path: &str) -> Result<Node, GrammarError> {
        let required: HashSet<&str> = (s.get("required").and_then(Value::as_array))
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let mut props = Vec::new();
        if let Some(p) = s.get("properties") {
            let Some(p) = p.as_object() else {
                return Err(fail(path, "properties must be an object"));
            };
            for (name, schema) in p {
                at_most(path, "a property name", name.len(), MAX_NAME_BYTES)?;
                let node = self.node(schema, &format!("{path}/properties/{name}"))?;
                props.push((name.clone(), node, required.contains(name.as_str())));
            }
        }
        let additional = match s.get("additionalProperties") {
            Some(Value::Bool(true)) => Some(Box::new(Node::Any)),
            Some(Value::Bool(false)) => None,
            Some(a @ Value::Object(_)) => Some(Box::new(
                self.node(a, &format!("{path}/additionalProperties"))?,
            )),
            Some(_) => {
                return Err(fail(
                    path,
                    "additionalProperties must be a boolean or a schema",
                ))
            }
            // {"type": "object"} alone accepts any object.
            None if s.get("properties").is_none() => Some(Box::new(Node::Any)),
            None => None,
        };
        Ok(Node::Object { props, additional })
    }

    fn array(&mut self, s: &Value, path: &str) -> Result<Node, GrammarError> {
        let key = if s.get("items").is_some() {
            "items"
        } else {
            "prefixItems"
        };
        let items = match s.get(key) {
            Some(Value::Array(list)) => {
                let tuple = (list.iter().enumerate())
                    .map(|(i, it)| self.node(it, &format!("{path}/{key}/{i}")))
                    .collect::<Result<_, _>>()?;
                return Ok(Node::Tuple(tuple));
            }
            Some(it) => self.node(it, &format!("{path}/{key}"))?,
            None => Node::Any,
        };
        Ok(Node::Array {
            items: Box::new(items),
            min: count(s, "minItems", path)?.unwrap_or(0),
            max: count(s, "maxItems", path)?,
        })
    }

    fn string(&mut self, s: &Value, path: &str) -> Result<Node, GrammarError> {
        if let Some(p) = s.get("pattern") {
            let p = p
                .as_str()
                .ok_or_else(|| fail(path, "pattern must be a string"))?;
            at_most(path, "the pattern", p.len(), MAX_PATTERN_BYTES)?;
            return match pattern_rule(p) {
                Ok(body) => Ok(Node::Pattern(body)),
                Err(PatternError::Unsupported(why)) => {
                    let shown: String = p.chars().take(200).collect();
                    let more = if shown.len() < p.len() { "..." } else { "" };
                    log::warn!("JSON schema at {path}: pattern {shown:?}{more} is not supported ({why}); accepting any string there, as llama.cpp does");
                    Ok(Node::String {
                        format: Format::None,
                        min_len: 0,
                        max_len: None,
                    })
                }
                Err(PatternError::Invalid(why)) => {
                    Err(fail(path, &format!("invalid pattern {p:?}: {why}")))
                }
            };
        }
        Ok(Node::String {
            format: format_of(s, path)?,
            min_len: count(s, "minLength", path)?.unwrap_or(0),
            max_len: count(s, "maxLength", path)?,
        })
    }
}
