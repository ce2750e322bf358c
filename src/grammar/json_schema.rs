//! JSON schemas to GBNF, accepting the same JSON texts as llama.cpp's converter (so that
//! constrained generation picks the same tokens): the same keywords, the same
//! whitespace between tokens (none, one space, or up to two newlines and 20 indenting
//! characters), properties in the schema's order with optional ones skippable, numbers
//! of at most 16 digits per part.
//!
//! Supported: `type` (one or a list), `properties`, `required`, `additionalProperties`,
//! `items` / `prefixItems`, `minItems` / `maxItems`, `minLength` / `maxLength`, `format`
//! (date, time, date-time, uuid), integer `minimum` / `maximum` (and the exclusive ones),
//! `const`, `enum`, `anyOf` / `oneOf`, `allOf` (objects and enums), and `$ref` into the
//! same document (`#/$defs/...`, recursion included), and `pattern` for the regular
//! expressions llama.cpp converts (anchored with `^...$`; literals, `.`, groups,
//! alternatives, `[...]` classes, `* + ? {m,n}`, GBNF's escapes): others, such as `\d`,
//! are logged and accept any string, as llama.cpp does.

use super::GrammarError;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap, HashSet};

/// Bounds on the work one schema may cause (a request's schema is converted on a server
/// worker, whose stack is small and whose time other requests wait for). Schemas nest
/// through `$ref` chains as well as JSON, and `allOf`, type lists and optional
/// properties multiply what a short text describes; real schemas (tool parameters,
/// response formats) are far inside all of these.
///
/// How deep schemas may nest, counting each `$ref` followed.
pub const MAX_DEPTH: usize = 128;
/// Most schema nodes built and visited in all.
pub const MAX_NODES: usize = 100_000;
/// Longest grammar the conversion may write, in bytes.
pub const MAX_GRAMMAR_BYTES: usize = 8 << 20;
/// Longest property name and `pattern`, in bytes.
pub const MAX_NAME_BYTES: usize = 1024;
pub const MAX_PATTERN_BYTES: usize = 8192;

/// Counts nesting and nodes against [`MAX_DEPTH`] and [`MAX_NODES`].
#[derive(Default)]
struct Budget {
    depth: usize,
    nodes: usize,
}

impl Budget {
    fn enter(&mut self, path: &str) -> Result<(), GrammarError> {
        self.nodes += 1;
        if self.nodes > MAX_NODES {
            return Err(fail(
                path,
                &format!("the schema expands to more than {MAX_NODES} nodes (through allOf, $ref or type lists); simplify it"),
            ));
        }
        if self.depth >= MAX_DEPTH {
            return Err(fail(
                path,
                &format!("schemas nested (or $ref chains) more than {MAX_DEPTH} deep"),
            ));
        }
        self.depth += 1;
        Ok(())
    }
    fn leave(&mut self) {
        self.depth -= 1;
    }
}

/// The GBNF grammar (start rule `root`) accepting the JSON texts `schema` describes.
pub fn to_grammar(schema: &Value) -> Result<String, GrammarError> {
    let mut b = Builder {
        root: schema,
        refs: HashMap::new(),
        budget: Budget::default(),
    };
    let node = b.node(schema, "#")?;
    let mut c = Converter {
        rules: BTreeMap::new(),
        refs: &b.refs,
        resolving: HashSet::new(),
        budget: Budget::default(),
        bytes: 0,
        next_suffix: HashMap::new(),
        suffixed: HashMap::new(),
    };
    c.rules.insert("space".into(), SPACE.into());
    c.visit(&node, "")?;
    c.check_size()?;
    let mut out = String::new();
    for (name, rule) in &c.rules {
        out.push_str(name);
        out.push_str(" ::= ");
        out.push_str(rule);
        out.push('\n');
    }
    Ok(out)
}

/// Whitespace between JSON tokens.
const SPACE: &str = r#"| " " | "\n"{1,2} [ \t]{0,20}"#;

/// Built-in rules: name, body, the rules the body uses.
const PRIMITIVES: &[(&str, &str, &[&str])] = &[
    ("boolean", r#"("true" | "false")"#, &[]),
    ("decimal-part", "[0-9]{1,16}", &[]),
    ("integral-part", "[0] | [1-9] [0-9]{0,15}", &[]),
    (
        "number",
        r#"("-"? integral-part) ("." decimal-part)? ([eE] [-+]? integral-part)?"#,
        &["integral-part", "decimal-part"],
    ),
    ("integer", r#"("-"? integral-part)"#, &["integral-part"]),
    (
        "value",
        "object | array | string | number | boolean | null",
        &["object", "array", "string", "number", "boolean", "null"],
    ),
    (
        "object",
        r#""{" space ( string ":" space value ("," space string ":" space value)* )? space "}""#,
        &["string", "value"],
    ),
    (
        "array",
        r#""[" space ( value ("," space value)* )? space "]""#,
        &["value"],
    ),
    (
        "uuid",
        r#""\"" [0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{12} "\"""#,
        &[],
    ),
    (
        "char",
        r#"[^"\\\x7F\x00-\x1F] | [\\] (["\\bfnrt] | "u" [0-9a-fA-F]{4})"#,
        &[],
    ),
    ("string", r#""\"" char* "\"""#, &["char"]),
    ("null", r#""null""#, &[]),
    (
        "date",
        r#"[0-9]{4} "-" ( "0" [1-9] | "1" [0-2] ) "-" ( "0" [1-9] | [1-2] [0-9] | "3" [0-1] )"#,
        &[],
    ),
    (
        "time",
        r#"([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{3} )? ( "Z" | ( "+" | "-" ) ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] )"#,
        &[],
    ),
    ("date-time", r#"date "T" time"#, &["date", "time"]),
    ("date-string", r#""\"" date "\"""#, &["date"]),
    ("time-string", r#""\"" time "\"""#, &["time"]),
    ("date-time-string", r#""\"" date-time "\"""#, &["date-time"]),
];

fn primitive(name: &str) -> (&'static str, &'static str, &'static [&'static str]) {
    *PRIMITIVES
        .iter()
        .find(|p| p.0 == name)
        .expect("a built-in rule")
}

fn is_reserved(name: &str) -> bool {
    name == "root" || PRIMITIVES.iter().any(|p| p.0 == name)
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Format {
    None,
    Date,
    Time,
    DateTime,
    Uuid,
}

/// A schema, checked and with its keywords resolved to one kind.
#[derive(Debug)]
enum Node {
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

struct Builder<'a> {
    root: &'a Value,
    /// Each `$ref`'s target, built once (None while it is being built).
    refs: HashMap<String, Option<Node>>,
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

fn fail(path: &str, what: &str) -> GrammarError {
    GrammarError::Schema(format!("at {path}: {what}"))
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

/// `item` repeated `min` to `max` (None: unbounded) times, `sep` between repetitions.
fn repetition(item: &str, min: usize, max: Option<usize>, sep: &str) -> String {
    if max == Some(0) {
        return String::new();
    }
    if min == 0 && max == Some(1) {
        return format!("{item}?");
    }
    if sep.is_empty() {
        return match (min, max) {
            (1, None) => format!("{item}+"),
            (0, None) => format!("{item}*"),
            (lo, Some(hi)) => format!("{item}{{{lo},{hi}}}"),
            (lo, None) => format!("{item}{{{lo},}}"),
        };
    }
    let rest = repetition(
        &format!("({sep} {item})"),
        min.saturating_sub(1),
        max.map(|m| m - 1),
        "",
    );
    let r = format!("{item} {rest}");
    if min == 0 {
        format!("({r})?")
    } else {
        r
    }
}

/// A GBNF string literal.
fn literal(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '\r' => out.push_str("\\r"),
            '\n' => out.push_str("\\n"),
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// One character inside a GBNF `[...]` set.
fn set_char(c: char) -> String {
    match c {
        '\\' | ']' | '-' | '"' | '^' | '[' => format!("\\x{:02X}", c as u32),
        '\r' => "\\r".into(),
        '\n' => "\\n".into(),
        '\t' => "\\t".into(),
        c => c.to_string(),
    }
}

fn rule_name(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut in_bad = false;
    for c in s.chars() {
        if c.is_ascii_alphanumeric() || c == '-' {
            out.push(c);
            in_bad = false;
        } else if !in_bad {
            out.push('-');
            in_bad = true;
        }
    }
    out
}

struct Converter<'a> {
    rules: BTreeMap<String, String>,
    refs: &'a HashMap<String, Option<Node>>,
    resolving: HashSet<String>,
    budget: Budget,
    /// Bytes of rule names and bodies so far.
    bytes: usize,
    /// Per rule name taken: the lowest suffix not known to be taken (names are never
    /// freed, so the search for a free `{name}{i}` resumes here instead of at 0).
    next_suffix: HashMap<String, usize>,
    /// (name, body) -> the suffixed name it was added under, so the same rule added
    /// again is found without a scan.
    suffixed: HashMap<(String, String), String>,
}

impl Converter<'_> {
    /// Adds `rule` under `name`, or under `{name}{i}` with the lowest free `i` where
    /// another rule holds `name`; a rule equal to one already added keeps that one's name.
    fn add_rule(&mut self, name: &str, rule: String) -> String {
        let name = rule_name(name);
        match self.rules.get(&name) {
            None => {
                self.bytes += name.len() + rule.len();
                self.rules.insert(name.clone(), rule);
                return name;
            }
            Some(r) if *r == rule => return name,
            Some(_) => {}
        }
        let key = (name, rule);
        if let Some(n) = self.suffixed.get(&key) {
            return n.clone();
        }
        let (name, rule) = key;
        let mut i = self.next_suffix.get(&name).copied().unwrap_or(0);
        loop {
            let key = format!("{name}{i}");
            match self.rules.get(&key) {
                Some(r) if *r == rule => return key,
                Some(_) => i += 1,
                None => {
                    self.next_suffix.insert(name.clone(), i + 1);
                    self.bytes += key.len() + rule.len();
                    self.rules.insert(key.clone(), rule.clone());
                    self.suffixed.insert((name, rule), key.clone());
                    return key;
                }
            }
        }
    }

    /// Refuses a grammar grown past [`MAX_GRAMMAR_BYTES`].
    fn check_size(&self) -> Result<(), GrammarError> {
        if self.bytes > MAX_GRAMMAR_BYTES {
            return Err(GrammarError::Schema(format!(
                "the schema's grammar grows past {} MiB; simplify the schema",
                MAX_GRAMMAR_BYTES >> 20
            )));
        }
        Ok(())
    }

    fn add_primitive(&mut self, name: &str, prim: &str) -> String {
        let (_, body, deps) = primitive(prim);
        let n = self.add_rule(name, body.to_string());
        for dep in deps {
            if !self.rules.contains_key(*dep) {
                self.add_primitive(dep, dep);
            }
        }
        n
    }

    fn visit(&mut self, node: &Node, name: &str) -> Result<String, GrammarError> {
        self.check_size()?;
        self.budget
            .enter(if name.is_empty() { "root" } else { name })?;
        let r = self.visit_inner(node, name);
        self.budget.leave();
        r
    }

    fn visit_inner(&mut self, node: &Node, name: &str) -> Result<String, GrammarError> {
        let rule = if is_reserved(name) {
            format!("{name}-")
        } else if name.is_empty() {
            "root".to_string()
        } else {
            name.to_string()
        };
        let sub = if name.is_empty() {
            String::new()
        } else {
            format!("{name}-")
        };
        let prim = |c: &mut Self, p: &str| {
            let n = if rule == "root" { "root" } else { p };
            c.add_primitive(n, p)
        };
        Ok(match node {
            Node::Ref(r) => {
                let body = self.reference(r)?;
                self.add_rule(&rule, body)
            }
            Node::AnyOf(alts) => {
                let mut names = Vec::new();
                for (i, a) in alts.iter().enumerate() {
                    let n = if name.is_empty() {
                        format!("alternative-{i}")
                    } else {
                        format!("{name}-{i}")
                    };
                    names.push(self.visit(a, &n)?);
                }
                self.add_rule(&rule, names.join(" | "))
            }
            Node::AllOf(children) => self.all_of(children, name, &rule)?,
            Node::Const(v) => self.add_rule(&rule, literal(&v.to_string())),
            Node::Pattern(body) => self.add_rule(&rule, format!("\"\\\"\" ({body}) \"\\\"\"")),
            Node::Enum(values) => {
                let alts: Vec<String> = values.iter().map(|v| literal(&v.to_string())).collect();
                self.add_rule(&rule, format!("({})", alts.join(" | ")))
            }
            Node::Object { props, additional } => {
                if props.is_empty() && matches!(additional.as_deref(), Some(Node::Any)) {
                    let o = self.add_primitive("object", "object");
                    self.add_rule(&rule, o)
                } else {
                    let props: Vec<(&str, &Node, bool)> =
                        props.iter().map(|(n, s, r)| (n.as_str(), s, *r)).collect();
                    let body = self.object(&props, name, additional.as_deref())?;
                    self.add_rule(&rule, body)
                }
            }
            Node::Tuple(items) => {
                let mut body = String::from("\"[\" space ");
                for (i, it) in items.iter().enumerate() {
                    if i > 0 {
                        body.push_str(" \",\" space ");
                    }
                    body.push_str(&self.visit(it, &format!("{sub}tuple-{i}"))?);
                }
                body.push_str(" space \"]\"");
                self.add_rule(&rule, body)
            }
            Node::Array { items, min, max } => {
                if matches!(**items, Node::Any) && *min == 0 && max.is_none() {
                    prim(self, "array")
                } else {
                    let item = self.visit(items, &format!("{sub}item"))?;
                    let body = format!(
                        "\"[\" space {} space \"]\"",
                        repetition(&item, *min, *max, "\",\" space")
                    );
                    self.add_rule(&rule, body)
                }
            }
            Node::String {
                format,
                min_len,
                max_len,
            } => match format {
                Format::Uuid => prim(self, "uuid"),
                Format::Date | Format::Time | Format::DateTime => {
                    let p = match format {
                        Format::Date => "date-string",
                        Format::Time => "time-string",
                        _ => "date-time-string",
                    };
                    let n = self.add_primitive(p, p);
                    self.add_rule(&rule, n)
                }
                Format::None if *min_len > 0 || max_len.is_some() => {
                    let c = self.add_primitive("char", "char");
                    let body = format!(
                        "\"\\\"\" {} \"\\\"\"",
                        repetition(&c, *min_len, *max_len, "")
                    );
                    self.add_rule(&rule, body)
                }
                Format::None => prim(self, "string"),
            },
            Node::Integer {
                min: None,
                max: None,
            } => prim(self, "integer"),
            Node::Integer { min, max } => {
                let body = format!("({})", int_range(*min, *max)?);
                self.add_rule(&rule, body)
            }
            Node::Number => prim(self, "number"),
            Node::Boolean => prim(self, "boolean"),
            Node::Null => prim(self, "null"),
            Node::Any => {
                let v = self.add_primitive("value", "value");
                self.add_rule(&rule, v)
            }
        })
    }

    fn reference(&mut self, r: &str) -> Result<String, GrammarError> {
        let fragment = r.split_once('#').map_or(r, |(_, f)| f);
        let name = format!("ref{}", rule_name(fragment));
        if !self.rules.contains_key(&name) && !self.resolving.contains(r) {
            let Some(Some(target)) = self.refs.get(r) else {
                return Err(GrammarError::Schema(format!("unresolved $ref {r}")));
            };
            self.resolving.insert(r.to_string());
            let n = self.visit(target, &name)?;
            self.resolving.remove(r);
            return Ok(n);
        }
        Ok(name)
    }

    fn all_of(
        &mut self,
        children: &[Node],
        name: &str,
        rule: &str,
    ) -> Result<String, GrammarError> {
        let mut props: Vec<(&str, &Node, bool)> = Vec::new();
        let mut required: HashSet<&str> = HashSet::new();
        let mut enums: BTreeMap<String, usize> = BTreeMap::new();
        /// Adds what `c` contributes; a `$ref` is followed (by a loop: a chain of
        /// references to references may be long, or a cycle, which contributes nothing).
        fn add<'n>(
            mut c: &'n Node,
            req: bool,
            refs: &'n HashMap<String, Option<Node>>,
            props: &mut Vec<(&'n str, &'n Node, bool)>,
            required: &mut HashSet<&'n str>,
            enums: &mut BTreeMap<String, usize>,
        ) {
            let mut followed: HashSet<&str> = HashSet::new();
            while let Node::Ref(r) = c {
                match refs.get(r) {
                    Some(Some(t)) if followed.insert(r.as_str()) => c = t,
                    _ => return,
                }
            }
            match c {
                Node::Object { props: p, .. } => {
                    for (n, s, _) in p {
                        props.push((n, s, false));
                        if req {
                            required.insert(n);
                        }
                    }
                }
                Node::Enum(values) => {
                    for v in values {
                        *enums.entry(literal(&v.to_string())).or_default() += 1;
                    }
                }
                _ => {}
            }
        }
        let refs = self.refs;
        for c in children {
            if let Node::AnyOf(alts) = c {
                for a in alts {
                    add(a, false, refs, &mut props, &mut required, &mut enums);
                }
            } else {
                add(c, true, refs, &mut props, &mut required, &mut enums);
            }
        }
        let common: Vec<String> = (enums.iter())
            .filter(|(_, &n)| n == children.len())
            .map(|(v, _)| v.clone())
            .collect();
        if !common.is_empty() {
            return Ok(self.add_rule(rule, format!("({})", common.join(" | "))));
        }
        for p in &mut props {
            p.2 = required.contains(p.0);
        }
        let body = self.object(&props, name, None)?;
        Ok(self.add_rule(rule, body))
    }

    /// An object's rule: the required properties in order, then the optional ones in
    /// order (each may be left out), then any additional ones.
    fn object(
        &mut self,
        props: &[(&str, &Node, bool)],
        name: &str,
        additional: Option<&Node>,
    ) -> Result<String, GrammarError> {
        let prefix = if name.is_empty() {
            String::new()
        } else {
            format!("{name}-")
        };
        let mut kv: HashMap<String, String> = HashMap::new();
        let mut required = Vec::new();
        let mut optional = Vec::new();
        for (pname, schema, req) in props {
            let value = self.visit(schema, &format!("{prefix}{pname}"))?;
            let key = literal(&Value::String(pname.to_string()).to_string());
            let r = self.add_rule(
                &format!("{prefix}{pname}-kv"),
                format!("{key} space \":\" space {value}"),
            );
            kv.insert(pname.to_string(), r);
            if *req {
                required.push(pname.to_string());
            } else {
                optional.push(pname.to_string());
            }
        }
        if let Some(extra) = additional {
            let sub = format!("{prefix}additional");
            let value = if matches!(extra, Node::Any) {
                self.add_primitive("value", "value")
            } else {
                self.visit(extra, &format!("{sub}-value"))?
            };
            let key = if props.is_empty() {
                self.add_primitive("string", "string")
            } else {
                let names: Vec<&str> = props.iter().map(|p| p.0).collect();
                let body = self.not_strings(&names);
                self.add_rule(&format!("{sub}-k"), body)
            };
            let r = self.add_rule(&format!("{sub}-kv"), format!("{key} \":\" space {value}"));
            kv.insert("*".into(), r);
            optional.push("*".into());
        }
        if required.is_empty() && optional.is_empty() {
            return Ok("\"{\" space \"}\"".into());
        }
        let mut body = String::from("\"{\" space ");
        let req: Vec<&str> = required.iter().map(|k| kv[k].as_str()).collect();
        body.push_str(&req.join(" \",\" space "));
        if !optional.is_empty() {
            body.push_str(" (");
            if !required.is_empty() {
                body.push_str(" \",\" space ( ");
            }
            let alts = self.optional_chains(&optional, &kv, &prefix);
            body.push_str(&alts.join(" | "));
            if !required.is_empty() {
                body.push_str(" )");
            }
            body.push_str(" )?");
        }
        body.push_str(" space \"}\"");
        Ok(body)
    }

    /// One alternative per optional property `keys[i]`: it present, then each of the
    /// ones after it optional, in order ("*": additional ones, repeatable). The rest of
    /// the chain after `keys[j]` is one rule (`{k}-rest`) that every alternative
    /// starting at or before `j` shares; the rules are made from the end, once each, so
    /// n properties cost n rules (and no recursion n deep).
    fn optional_chains(
        &mut self,
        keys: &[String],
        kv: &HashMap<String, String>,
        prefix: &str,
    ) -> Vec<String> {
        let item = |k: &String, optional: bool| {
            let r = &kv[k];
            let comma = format!("( \",\" space {r} )");
            if optional {
                format!("{comma}{}", if k == "*" { "*" } else { "?" })
            } else if k == "*" {
                format!("{r} {comma}*")
            } else {
                r.clone()
            }
        };
        // rest[j]: the rule for keys[j + 1..], each optional.
        let mut rest: Vec<Option<String>> = vec![None; keys.len()];
        for j in (0..keys.len().saturating_sub(1)).rev() {
            let mut body = item(&keys[j + 1], true);
            if let Some(after) = &rest[j + 1] {
                body.push(' ');
                body.push_str(after);
            }
            rest[j] = Some(self.add_rule(&format!("{prefix}{}-rest", keys[j]), body));
        }
        (keys.iter().zip(&rest))
            .map(|(k, after)| {
                let mut out = item(k, false);
                if let Some(after) = after {
                    out.push(' ');
                    out.push_str(after);
                }
                out
            })
            .collect()
    }

    /// A JSON string that is none of `names`.
    fn not_strings(&mut self, names: &[&str]) -> String {
        #[derive(Default)]
        struct Trie {
            children: BTreeMap<char, Trie>,
            word: bool,
        }
        let mut root = Trie::default();
        for n in names {
            let mut t = &mut root;
            for c in n.chars() {
                t = t.children.entry(c).or_default();
            }
            t.word = true;
        }
        let ch = self.add_primitive("char", "char");
        fn walk(t: &Trie, ch: &str, out: &mut String) {
            let mut rejects = String::new();
            for (i, (c, child)) in t.children.iter().enumerate() {
                if i > 0 {
                    out.push_str(" | ");
                }
                let c = set_char(*c);
                rejects.push_str(&c);
                out.push_str(&format!("[{c}]"));
                if child.children.is_empty() {
                    out.push_str(&format!(" {ch}+"));
                } else {
                    out.push_str(" (");
                    walk(child, ch, out);
                    out.push(')');
                }
            }
            if !t.children.is_empty() {
                out.push_str(&format!(" | [^\"{rejects}] {ch}*"));
            }
        }
        let mut out = String::from("[\"] ( ");
        walk(&root, &ch, &mut out);
        out.push_str(" )");
        if !root.word {
            out.push('?');
        }
        out.push_str(" [\"]");
        out
    }
}

/// The canonical decimal integers from `min` to `max` (a missing bound: up to 16 digits
/// on that side), as a GBNF alternation.
fn int_range(min: Option<i64>, max: Option<i64>) -> Result<String, GrammarError> {
    const WIDEST: u64 = 9_999_999_999_999_999; // 16 digits
    let neg = |lo: u64, hi: u64| format!("\"-\" ({})", naturals(lo, hi));
    Ok(match (min, max) {
        (Some(lo), Some(hi)) if lo > hi => {
            return Err(GrammarError::Schema(format!(
                "minimum {lo} is greater than maximum {hi}: no integer fits"
            )))
        }
        (Some(lo), Some(hi)) if hi < 0 => neg(hi.unsigned_abs(), lo.unsigned_abs()),
        (Some(lo), Some(hi)) if lo < 0 => {
            format!("{} | {}", neg(1, lo.unsigned_abs()), naturals(0, hi as u64))
        }
        (Some(lo), Some(hi)) => naturals(lo as u64, hi as u64),
        (Some(lo), None) if lo < 0 => {
            format!("{} | {}", neg(1, lo.unsigned_abs()), naturals(0, WIDEST))
        }
        (Some(lo), None) => naturals((lo as u64).min(WIDEST), WIDEST),
        (None, Some(hi)) if hi < 0 => neg(hi.unsigned_abs().min(WIDEST), WIDEST),
        (None, Some(hi)) => format!("{} | {}", neg(1, WIDEST), naturals(0, hi as u64)),
        (None, None) => naturals(0, WIDEST),
    })
}

/// The numbers `lo..=hi` (`lo <= hi`) written without leading zeros.
fn naturals(lo: u64, hi: u64) -> String {
    let mut alts = Vec::new();
    let (lo_s, hi_s) = (lo.to_string(), hi.to_string());
    for len in lo_s.len()..=hi_s.len() {
        let first = if len == 1 {
            0
        } else {
            10u64.pow(len as u32 - 1)
        };
        let last = 10u64.saturating_pow(len as u32).saturating_sub(1);
        let a = lo.max(first);
        let b = hi.min(last);
        if a <= b {
            alts.push(same_length(&a.to_string(), &b.to_string()));
        }
    }
    alts.join(" | ")
}

/// The digit strings of one length from `a` to `b` (`a <= b`).
fn same_length(a: &str, b: &str) -> String {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let common = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    let mut out = String::new();
    if common > 0 {
        out.push_str(&format!(
            "\"{}\"",
            std::str::from_utf8(&a[..common]).unwrap_or("")
        ));
    }
    if common == a.len() {
        return out;
    }
    if !out.is_empty() {
        out.push(' ');
    }
    let (x, y) = (a[common], b[common]);
    let rest = a.len() - common - 1;
    if rest == 0 {
        out.push_str(&format!("[{}-{}]", x as char, y as char));
        return out;
    }
    let a_rest = std::str::from_utf8(&a[common + 1..]).unwrap_or("");
    let b_rest = std::str::from_utf8(&b[common + 1..]).unwrap_or("");
    let zeros = "0".repeat(rest);
    let nines = "9".repeat(rest);
    let any = |n: usize| {
        if n == 1 {
            "[0-9]".to_string()
        } else {
            format!("[0-9]{{{n}}}")
        }
    };
    let mut alts = Vec::new();
    // From a: the first digit as in a, the rest from a's rest up.
    let (low_digit, high_digit);
    if a_rest == zeros {
        low_digit = x;
    } else {
        alts.push(format!("[{}] ({})", x as char, same_length(a_rest, &nines)));
        low_digit = x + 1;
    }
    if b_rest == nines {
        high_digit = y;
    } else {
        high_digit = y - 1;
    }
    if low_digit <= high_digit {
        alts.push(format!(
            "[{}-{}] {}",
            low_digit as char,
            high_digit as char,
            any(rest)
        ));
    }
    if b_rest != nines {
        alts.push(format!("[{}] ({})", y as char, same_length(&zeros, b_rest)));
    }
    out.push_str(&format!("({})", alts.join(" | ")));
    out
}

enum PatternError {
    /// A valid expression with no grammar equivalent here.
    Unsupported(&'static str),
    Invalid(&'static str),
}

/// Characters a regular expression escapes that are plain in a GBNF literal.
const REGEX_ONLY_ESCAPES: &str = "^$.[]()|{}*+?";

/// The length of a GBNF escape (`\x41`, `\n`, ...) at the start of `s`, or 0.
fn gbnf_escape_len(s: &[u8]) -> usize {
    if s.len() < 2 || s[0] != b'\\' {
        return 0;
    }
    let hex = match s[1] {
        b'x' => 2,
        b'u' => 4,
        b'U' => 8,
        b't' | b'r' | b'n' | b'\\' | b'"' | b'[' | b']' | b'-' => return 2,
        _ => return 0,
    };
    match s.get(2..2 + hex) {
        Some(h) if h.iter().all(u8::is_ascii_hexdigit) => 2 + hex,
        _ => 0,
    }
}

/// The GBNF for the content of a JSON string matching `pattern` (which must be anchored
/// with `^` and `$`).
fn pattern_rule(pattern: &str) -> Result<String, PatternError> {
    let inner = pattern
        .strip_prefix('^')
        .and_then(|p| p.strip_suffix('$'))
        .ok_or(PatternError::Unsupported("not anchored with '^' and '$'"))?;
    let b = inner.as_bytes();
    let mut i = 0;
    let mut depth = 0usize;
    // Each open group's terms; a term is one GBNF item a quantifier may follow.
    let mut groups: Vec<Vec<String>> = vec![Vec::new()];
    // What the last term carries: 0 no quantifier, 1 a quantifier, 2 a quantifier made
    // lazy (`*?`). As in ECMAScript, a quantifier cannot follow another (`a{2}*`, `a**`),
    // and laziness does not change what matches.
    let mut quantified = 0u8;
    while i < b.len() {
        let terms = groups.last_mut().expect("the outer group");
        let was = std::mem::take(&mut quantified);
        if matches!(b[i], b'*' | b'+' | b'?' | b'{') && was != 0 {
            if b[i] == b'?' && was == 1 {
                quantified = 2;
                i += 1;
                continue;
            }
            return Err(PatternError::Invalid(
                "nothing to repeat: a quantifier follows a quantifier",
            ));
        }
        match b[i] {
            b'.' => {
                terms.push(r"[^\x0A\x0D]".into());
                i += 1;
            }
            b'(' => {
                i += 1;
                if b.get(i) == Some(&b'?') {
                    if b.get(i + 1) != Some(&b':') {
                        return Err(PatternError::Unsupported(
                            "lookaround, named group or flags",
                        ));
                    }
                    i += 2;
                }
                depth += 1;
                if depth > 100 {
                    return Err(PatternError::Unsupported("pattern nesting too deep"));
                }
                groups.push(Vec::new());
            }
            b')' => {
                if depth == 0 {
                    return Err(PatternError::Invalid("unbalanced parentheses"));
                }
                depth -= 1;
                i += 1;
                let body = groups.pop().expect("an open group").join(" ");
                groups
                    .last_mut()
                    .expect("the outer group")
                    .push(format!("({body})"));
            }
            b'^' | b'$' => return Err(PatternError::Unsupported("anchor inside the pattern")),
            b'[' => {
                let start = i;
                i += 1;
                while i < b.len() && b[i] != b']' {
                    if b[i] == b'\\' {
                        let n = gbnf_escape_len(&b[i..]);
                        if n == 0 {
                            return Err(PatternError::Unsupported(
                                "an escape in a character class that GBNF lacks",
                            ));
                        }
                        i += n;
                    } else {
                        i += 1;
                    }
                }
                if i >= b.len() {
                    return Err(PatternError::Invalid("unterminated character class"));
                }
                i += 1;
                match &inner[start..i] {
                    // ECMAScript's class of no character matches nothing; GBNF has none.
                    "[]" => {
                        return Err(PatternError::Invalid(
                            "an empty character class [] matches nothing",
                        ))
                    }
                    // Its negation matches any character.
                    "[^]" => terms.push(".".into()),
                    class => terms.push(class.to_string()),
                }
            }
            b'|' => {
                terms.push("|".into());
                i += 1;
            }
            q @ (b'*' | b'+' | b'?') => {
                let last = terms.last_mut().filter(|t| *t != "|");
                let Some(last) = last else {
                    return Err(PatternError::Invalid("nothing to repeat"));
                };
                last.push(q as char);
                i += 1;
                quantified = 1;
            }
            b'{' => {
                let end = (inner[i..].find('}'))
                    .ok_or(PatternError::Unsupported("unterminated curly brackets"))?;
                let spec = &inner[i + 1..i + end];
                i += end + 1;
                let num = |s: &str| s.trim().parse::<usize>();
                let (lo, hi) = match spec.split_once(',') {
                    None => {
                        let n = num(spec).map_err(|_| {
                            PatternError::Unsupported("invalid number in curly brackets")
                        })?;
                        (n, Some(n))
                    }
                    Some((a, c)) => {
                        let lo = if a.is_empty() { Ok(0) } else { num(a) };
                        let hi = if c.is_empty() { None } else { Some(num(c)) };
                        let lo = lo.map_err(|_| {
                            PatternError::Unsupported("invalid number in curly brackets")
                        })?;
                        let hi = hi.transpose().map_err(|_| {
                            PatternError::Unsupported("invalid number in curly brackets")
                        })?;
                        (lo, hi)
                    }
                };
                let Some(last) = terms.last_mut().filter(|t| *t != "|") else {
                    return Err(PatternError::Invalid("nothing to repeat"));
                };
                *last = repetition(&format!("({last})"), lo, hi, "");
                quantified = 1;
            }
            b'\\' => {
                let Some(&next) = b.get(i + 1) else {
                    return Err(PatternError::Invalid("trailing backslash"));
                };
                if REGEX_ONLY_ESCAPES.as_bytes().contains(&next) {
                    terms.push(literal(&(next as char).to_string()));
                    i += 2;
                } else {
                    let n = gbnf_escape_len(&b[i..]);
                    if n == 0 {
                        return Err(PatternError::Unsupported(
                            "an escape GBNF lacks (such as \\d or \\w)",
                        ));
                    }
                    terms.push(format!("\"{}\"", &inner[i..i + n]));
                    i += n;
                }
            }
            b']' | b'}' => return Err(PatternError::Unsupported("a stray ']' or '}'")),
            _ => {
                let c = inner[i..].chars().next().expect("a character");
                terms.push(literal(&c.to_string()));
                i += c.len_utf8();
            }
        }
    }
    if depth != 0 {
        return Err(PatternError::Invalid("unbalanced parentheses"));
    }
    Ok(groups.pop().expect("the outer group").join(" "))
}
