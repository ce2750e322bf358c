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
//!
//! The conversion reads the schema into a tree of nodes (`schema.rs`), then writes that
//! tree as rules (`rules.rs`); integer ranges, `pattern`s and GBNF's text pieces have a
//! file each.

mod numbers;
mod pattern;
mod rules;
mod schema;
mod text;

use super::GrammarError;
use serde_json::Value;

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

/// A schema error at `path` (a JSON pointer into the schema).
fn fail(path: &str, what: &str) -> GrammarError {
    GrammarError::Schema(format!("at {path}: {what}"))
}

/// The GBNF grammar (start rule `root`) accepting the JSON texts `schema` describes.
pub fn to_grammar(schema: &Value) -> Result<String, GrammarError> {
    let (node, refs) = schema::read(schema)?;
    rules::write(&node, &refs)
}
