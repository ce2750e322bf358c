//! Writing the rules: a [`Node`] tree becomes GBNF rules, named after the schema's
//! properties and definitions as llama.cpp names them, so the grammar texts match.

use super::numbers::int_range;
use super::schema::{Format, Node, Refs};
use super::text::{literal, repetition, rule_name, set_char};
use super::{Budget, MAX_GRAMMAR_BYTES};
use crate::grammar::GrammarError;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap, HashSet};

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

/// The grammar text for `node`, one `name ::= body` line per rule, in name order.
pub(super) fn write(node: &Node, refs: &Refs) -> Result<String, GrammarError> {
    let mut c = Converter {
        rules: BTreeMap::new(),
        refs,
        resolving: HashSet::new(),
        budget: Budget::default(),
        bytes: 0,
        next_suffix: HashMap::new(),
        suffixed: HashMap::new(),
    };
    c.rules.insert("space".into(), SPACE.into());
    c.visit(node, "")?;
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

struct Converter<'a> {
    rules: BTreeMap<String, String>,
    refs: &'a Refs,
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
