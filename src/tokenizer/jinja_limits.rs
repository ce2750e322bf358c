//! Bounds on what a chat template may make minijinja do that its fuel does not count.
//!
//! A template comes with the model file, from anyone (`-hf`), and is rendered on the
//! server's threads. minijinja's fuel (see `TEMPLATE_FUEL`) bounds the instructions a
//! render runs and the data it makes, but minijinja 3.1.0 leaves four ways to abort the
//! whole process, each closed here:
//!
//! - **Deep expressions.** Chains of left-associative operators (`x + x + ...`,
//!   `x|f|f...`, `x.a.a...`, `- - - 1`) parse into a tree as deep as the chain, which
//!   the compiler and the tree's drop walk recursively: about 5 000 links overflow a
//!   2 MiB thread stack, and a stack overflow aborts. The parser's own recursion limit
//!   covers nested brackets and blocks, not chains. Here a tag may hold at most
//!   [`MAX_TAG_TOKENS`] tokens (real templates' largest tag has about 60).
//! - **List concatenation at run time.** `list + list` stays lazy until a chain of them
//!   is 33 deep; then minijinja copies it into one list without asking the fuel first,
//!   so a list doubled 33 times, or 33 appends to `[x] * 10**8`, allocates until the
//!   process aborts. Here every `+` of the compiled template is preceded by a call to
//!   [`guard_add`], which refuses a concatenation longer than [`MAX_CONCAT_ITEMS`] or
//!   than the fuel left could pay for, and otherwise hands both operands back to
//!   minijinja's own `+` (so results and errors stay minijinja's). The `sum` filter,
//!   which adds with the same code, is checked the same way.
//! - **Constant folding.** The compiler folds constant expressions, and a constant
//!   `[x] * N` is a lazy list of up to 100M items (`[[x] * 10**8] * 10**8` one of
//!   10^16), which later constant `+`s copy and `~` prints while compiling, where no
//!   fuel runs. Here a `*` beside a bracket (`] *`, `) *`, `* [`, `* (`) is refused: real
//!   templates repeat strings, not lists (none of llama.cpp's has one).
//! - **Deep, cyclic or huge values.** Printing, comparing, serializing and dropping a
//!   value recurse into it: a list nested about 20 000 deep (`{% set x = [x] %}` in a
//!   loop, through a lazy slice `[x][0:]`, or a macro calling itself) overflows the
//!   stack, and `{% set ns.x = ns %}` (or a chain of namespaces, or a `loop` whose
//!   `previtem` is the namespace) makes a value that printing recurses into without end.
//!   And a value's size is charged only when it is printed, so `[s] * 1000` of a 100 MB
//!   `s` is built in full (100 GB) before the fuel sees it. Here each instruction that
//!   makes a value (building a list, map or tuple; `+`, `*` and slicing; calling a
//!   filter, function, method or object) is followed by a call to [`guard_value`], which
//!   walks it without recursion, charging the fuel, and refuses one nested deeper than
//!   [`MAX_VALUE_DEPTH`] or larger than [`MAX_VALUE_BYTES`] written out; and a value
//!   assigned to a namespace must be plain data (no namespace, `loop` or macro; a lazy
//!   view is stored as the list it yields now), checked before the assignment, so
//!   namespaces cannot chain or cycle behind the walks' backs.
//!
//! The rewrite uses minijinja's `unstable_machinery`, so Cargo.toml pins minijinja's
//! version; a new version is taken after checking these holes again (the tests in
//! `tokenizer/tests.rs` send each one).

use std::sync::Arc;

use minijinja::machinery::{
    tokenize, CompiledTemplate, Instruction, Instructions, TemplateConfig, Token,
};
use minijinja::syntax::SyntaxConfig;
use minijinja::value::{Kwargs, ValueKind};
use minijinja::{AutoEscape, Error, ErrorKind, State, Value};

/// The most tokens one `{{ ... }}` or `{% ... %}` tag may hold: an expression's tree is
/// at most this deep, a fifth of what overflows a 2 MiB stack.
pub const MAX_TAG_TOKENS: usize = 1024;

/// The longest list a `+` may make: as many items as [`MAX_VALUE_BYTES`] holds (8M,
/// about 200 MB once minijinja copies it). Real templates concatenate lists of messages
/// or tools.
pub const MAX_CONCAT_ITEMS: usize = (MAX_VALUE_BYTES / SLOT_UNITS) as usize;

/// How deep a value may nest: JSON from a request nests at most 128 deep (serde_json's
/// limit), and printing a value 5 000 deep already overflows a 2 MiB stack.
pub const MAX_VALUE_DEPTH: usize = 512;

/// How large a value may be, its strings' bytes and 32 per item of its lists and maps
/// counted each time they are reached: four times the largest request body the server
/// takes by default (`--max-body-mib` 64), so a template can hold and print a whole
/// request, and printing a value cannot make gigabytes before the fuel counts them.
pub const MAX_VALUE_BYTES: u64 = 256 << 20;

/// The `type_name`s of minijinja 3.1.0's objects that a namespace may not hold: the
/// mutable ones, and macros (whose closures hold the namespaces they see). Tests in
/// `tokenizer/tests.rs` store each kind, so a renamed type fails them.
const NAMESPACE_TYPE: &str = "minijinja::value::namespace_object::Namespace";
const LOOP_TYPE: &str = "minijinja::vm::loop_object::Loop";
const MACRO_TYPE: &str = "minijinja::vm::macro_object::Macro";

/// The functions the rewritten instructions call. A template cannot shadow them with a
/// variable or macro of its own (the VM looks a call's name up among the template's
/// variables first): no identifier has a `:` in it.
pub(super) const GUARD_ADD: &str = "wgllm:guard_add";
pub(super) const GUARD_VALUE: &str = "wgllm:guard_value";
pub(super) const GUARD_STORED: &str = "wgllm:guard_stored";

/// Fuel units per fuel, and the units one list slot costs, as minijinja 3.1.0 counts.
const UNITS_PER_FUEL: u64 = 64;
const SLOT_UNITS: u64 = 32;

/// The fuel one item visited by a value's walk costs: a visit (a clone, a lookup in a
/// map, a step through minijinja's lazy concatenations) takes a few times an
/// instruction's time, so that a render's walks cannot take much longer than its
/// instructions could.
const VISIT_FUEL: u64 = 4;

/// Refuses a template whose shape could abort the process while compiling (deep
/// expressions, constant lists repeated); see the module's account.
pub(super) fn check_shape(source: &str, syntax: &SyntaxConfig) -> Result<(), Error> {
    let mut in_tag = false;
    let mut tokens = 0usize;
    let mut tag_line = 0;
    let (mut after_close, mut after_star) = (false, false);
    for token in tokenize(source, false, syntax.clone()) {
        // A template the lexer refuses is refused again, with its place, when compiled.
        let Ok((token, span)) = token else {
            return Ok(());
        };
        let star = matches!(token, Token::Mul);
        let open = matches!(token, Token::BracketOpen | Token::ParenOpen);
        if in_tag && ((star && after_close) || (open && after_star)) {
            return Err(shape_error(
                span.start_line,
                "a `*` beside a bracket (`[x] * n`); a constant list repeated is folded \
                 while compiling into one that is printed or joined without bound"
                    .to_string(),
            ));
        }
        after_close = matches!(token, Token::BracketClose | Token::ParenClose);
        after_star = star;
        match token {
            Token::VariableStart | Token::BlockStart => {
                in_tag = true;
                tokens = 0;
                tag_line = span.start_line;
            }
            Token::VariableEnd | Token::BlockEnd => in_tag = false,
            _ if in_tag => {
                tokens += 1;
                if tokens > MAX_TAG_TOKENS {
                    return Err(shape_error(
                        tag_line,
                        format!(
                            "a tag holds more than {MAX_TAG_TOKENS} tokens; an expression \
                             that long could overflow the stack while compiling"
                        ),
                    ));
                }
            }
            _ => {}
        }
    }
    Ok(())
}

fn shape_error(line: u16, what: String) -> Error {
    Error::new(
        ErrorKind::SyntaxError,
        format!(
            "line {line}: {what} (wgllm refuses such templates: fix the model's chat \
             template or pass --chat-template)"
        ),
    )
}

/// Compiles `source` as `name` with `syntax`, with the guards the module describes.
pub(super) fn compile<'s>(
    name: &'s str,
    source: &'s str,
    syntax: &SyntaxConfig,
) -> Result<CompiledTemplate<'s>, Error> {
    check_shape(source, syntax)?;
    let config = TemplateConfig {
        syntax_config: syntax.clone(),
        default_auto_escape: Arc::new(|_: &str| AutoEscape::None),
    };
    let mut compiled = CompiledTemplate::new(name, source, &config)?;
    compiled.instructions = with_guards(&compiled.instructions)?;
    for block in compiled.blocks.values_mut() {
        *block = with_guards(block)?;
    }
    Ok(compiled)
}

/// What instruction `pc` of `instrs` becomes:
/// - `Add`: a call of [`GUARD_ADD`] with both operands, which returns them as a list
///   (reversed, as unpacking reverses), the unpacking of that list, and the `Add`;
/// - an instruction that makes a value: itself, then [`GUARD_VALUE`] on the value;
/// - `SetAttr`: the value checked by [`GUARD_STORED`] first (swapped to the top and
///   back), so that nothing that could make a chain or a cycle goes in; then itself;
///   then the namespace looked up again (the `Lookup` and `GetAttr`s just before it,
///   which is all the compiler puts there), checked whole by [`GUARD_VALUE`] (its size
///   grows with each attribute) and dropped.
fn guarded<'s>(instrs: &Instructions<'s>, pc: u32) -> Result<Vec<Instruction<'s>>, Error> {
    let Some(instr) = instrs.get(pc) else {
        return Ok(Vec::new());
    };
    let guard_value = Instruction::CallFunction(GUARD_VALUE, Some(1));
    Ok(match instr {
        Instruction::Add => vec![
            Instruction::CallFunction(GUARD_ADD, Some(2)),
            Instruction::UnpackList(2),
            Instruction::Add,
            guard_value,
        ],
        // Constant lists (a constant map may be a call's keyword arguments, which must
        // reach the call as they are; constant folding keeps maps small).
        Instruction::LoadConst(v) if matches!(v.kind(), ValueKind::Seq | ValueKind::Iterable) => {
            vec![instr.clone(), guard_value]
        }
        Instruction::BuildList(_)
        | Instruction::BuildMap(_)
        | Instruction::BuildTuple(_)
        | Instruction::Mul
        | Instruction::Slice
        | Instruction::ApplyFilter(..)
        | Instruction::CallFunction(..)
        | Instruction::CallMethod(..)
        | Instruction::CallObject(_) => vec![instr.clone(), guard_value],
        Instruction::SetAttr(_) => {
            let mut out = vec![
                Instruction::Swap,
                Instruction::CallFunction(GUARD_STORED, Some(1)),
                Instruction::Swap,
                instr.clone(),
            ];
            let mut target = Vec::new();
            let mut at = pc;
            loop {
                at = at.checked_sub(1).ok_or_else(unexpected_set)?;
                match instrs.get(at) {
                    Some(get @ Instruction::GetAttr(_)) => target.push(get.clone()),
                    Some(lookup @ Instruction::Lookup(_)) => {
                        target.push(lookup.clone());
                        break;
                    }
                    _ => return Err(unexpected_set()),
                }
            }
            target.reverse();
            out.extend(target);
            out.extend([guard_value, Instruction::DiscardTop]);
            out
        }
        other => vec![other.clone()],
    })
}

fn unexpected_set() -> Error {
    Error::new(
        ErrorKind::SyntaxError,
        "an attribute assignment wgllm cannot check (minijinja compiled it unlike 3.1.0 does)",
    )
}

/// `instrs` with each instruction replaced by what [`guarded`] makes of it. Jump
/// targets and macro offsets move to their instructions' new places; each new
/// instruction keeps the source location of the one it came from.
fn with_guards<'s>(instrs: &Instructions<'s>) -> Result<Instructions<'s>, Error> {
    let mut expanded = Vec::new();
    while instrs.get(expanded.len() as u32).is_some() {
        expanded.push(guarded(instrs, expanded.len() as u32)?);
    }
    let mut new_pc = Vec::with_capacity(expanded.len() + 1);
    let mut next = 0u32;
    for e in &expanded {
        new_pc.push(next);
        next += e.len() as u32;
    }
    new_pc.push(next); // a jump past the last instruction
    let moved = |target: &u32| new_pc.get(*target as usize).copied().unwrap_or(next);
    let mut out = Instructions::new(instrs.name(), instrs.source());
    for (pc, group) in expanded.into_iter().enumerate() {
        let pc = pc as u32;
        for instr in group {
            let instr = match instr {
                Instruction::Jump(t) => Instruction::Jump(moved(&t)),
                Instruction::JumpIfFalse(t) => Instruction::JumpIfFalse(moved(&t)),
                Instruction::JumpIfFalseOrPop(t) => Instruction::JumpIfFalseOrPop(moved(&t)),
                Instruction::JumpIfTrueOrPop(t) => Instruction::JumpIfTrueOrPop(moved(&t)),
                Instruction::Iterate(t) => Instruction::Iterate(moved(&t)),
                Instruction::BuildMacro(name, offset, flags) => {
                    Instruction::BuildMacro(name, moved(&offset), flags)
                }
                other => other,
            };
            match (instrs.get_span(pc), instrs.get_line(pc)) {
                (Some(span), _) => out.add_with_span(instr, span),
                (None, Some(line)) => out.add_with_line(instr, line.try_into().unwrap_or(u16::MAX)),
                (None, None) => out.add(instr),
            };
        }
    }
    Ok(out)
}

/// Refuses `value` if it nests deeper than [`MAX_VALUE_DEPTH`] or is larger than
/// [`MAX_VALUE_BYTES`], or if a namespace in it holds what a namespace may not (see
/// [`guard_stored`]); returns it unchanged otherwise.
pub(super) fn guard_value(state: &State, value: Value) -> Result<Value, Error> {
    walk(state, &value, false)?;
    Ok(value)
}

/// [`guard_value`] for a value about to be assigned to a namespace attribute, which
/// must be plain data: no namespace or `loop` (mutable, so they could chain or come to
/// hold the namespace itself) and no callable (a macro's closure holds the namespaces
/// it sees). A lazy iterable is stored as a list of its items as they are now (a view
/// such as `ns.values()` follows its namespace as it changes, and `list + list` is
/// one), and one nested deeper is refused. Refused before the assignment, a cycle is
/// never made.
pub(super) fn guard_stored(state: &State, value: Value) -> Result<Value, Error> {
    if not_plain(&value) && value.kind() != ValueKind::Iterable {
        return Err(not_plain_error());
    }
    let value = if value.kind() == ValueKind::Iterable {
        let mut items = Vec::new();
        for item in value.try_iter()? {
            if items.len().is_multiple_of(1024) {
                state.consume_fuel(1024 * VISIT_FUEL)?;
            }
            if items.len() >= MAX_CONCAT_ITEMS {
                return Err(too_large());
            }
            items.push(item);
        }
        Value::from(items)
    } else {
        value
    };
    walk(state, &value, true)?;
    Ok(value)
}

/// Whether `v` is a list, map or iterable, which a walk goes into.
fn walks(v: &Value) -> bool {
    matches!(
        v.kind(),
        ValueKind::Seq | ValueKind::Map | ValueKind::Iterable
    )
}

/// What a namespace may not hold (see [`guard_stored`]); lazy iterables aside, which
/// a namespace holds only when made with one (`namespace(x=...)`): such a link is
/// walked whenever a namespace is made, so chains of them are counted.
fn not_plain(v: &Value) -> bool {
    let Some(object) = v.as_object() else {
        return false;
    };
    let name = object.type_name();
    name == NAMESPACE_TYPE || name == LOOP_TYPE || name == MACRO_TYPE
}

fn is_namespace(v: &Value) -> bool {
    v.as_object()
        .is_some_and(|o| o.type_name() == NAMESPACE_TYPE)
}

/// Walks `value` without recursion, charging each item visited to the fuel
/// ([`VISIT_FUEL`]), and checks it as [`guard_value`] says; `stored`: as
/// [`guard_stored`] says. Lists, maps and lazy iterables are walked (minijinja's
/// builtins make no iterable that walking could use up; an endless one runs out of
/// fuel).
fn walk(state: &State, value: &Value, stored: bool) -> Result<(), Error> {
    if stored && not_plain(value) {
        return Err(not_plain_error());
    }
    if !walks(value) {
        return match value.as_str() {
            Some(s) if s.len() as u64 > MAX_VALUE_BYTES => Err(too_large()),
            _ => Ok(()),
        };
    }
    let mut todo = vec![(value.clone(), 1usize, stored)];
    let (mut visited, mut bytes) = (0u64, 0u64);
    while let Some((v, depth, in_namespace)) = todo.pop() {
        if depth > MAX_VALUE_DEPTH {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!(
                    "a value nested more than {MAX_VALUE_DEPTH} deep, or containing itself; \
                     printing or dropping it could overflow the stack"
                ),
            ));
        }
        let is_map = v.kind() == ValueKind::Map;
        let inside_namespace = in_namespace || is_namespace(&v);
        for key in v.try_iter()? {
            visited += 1;
            if visited.is_multiple_of(1024) {
                state.consume_fuel(1024 * VISIT_FUEL)?;
            }
            let item = if is_map {
                v.get_item(&key)?
            } else {
                key.clone()
            };
            if inside_namespace
                && (not_plain(&item) || (stored && item.kind() == ValueKind::Iterable))
            {
                return Err(not_plain_error());
            }
            let strings = key.as_str().map_or(0, str::len) * usize::from(is_map)
                + item.as_str().map_or(0, str::len);
            bytes = bytes
                .saturating_add(strings as u64)
                .saturating_add(SLOT_UNITS);
            if bytes > MAX_VALUE_BYTES {
                return Err(too_large());
            }
            if walks(&item) {
                todo.push((item, depth + 1, inside_namespace));
            }
        }
    }
    state.consume_fuel(visited % 1024 * VISIT_FUEL)
}

fn not_plain_error() -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        "a namespace may hold only plain data, not a namespace, a loop, a macro or a lazy \
         view inside a list (such as [ns.items()]): wgllm refuses these, which could \
         chain or make the namespace hold itself",
    )
}

fn too_large() -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        format!(
            "a value larger than {} MiB written out (wgllm's bound on what one template \
             may build)",
            MAX_VALUE_BYTES >> 20
        ),
    )
}

/// The length of `v` if it is a list whose concatenation minijinja may copy.
fn list_len(v: &Value) -> Option<usize> {
    match v.kind() {
        ValueKind::Seq | ValueKind::Iterable => v.len(),
        _ => None,
    }
}

/// Whether `units` of fuel (minijinja's internal units) are still left in `state`.
fn ensure_fuel(state: &State, units: u64) -> Result<(), Error> {
    match state.fuel_levels() {
        Some((_, remaining)) if units.div_ceil(UNITS_PER_FUEL) >= remaining => Err(Error::new(
            ErrorKind::OutOfFuel,
            format!(
                "an addition would make {} MB of data, more than the fuel left pays for",
                units / 1_000_000
            ),
        )),
        _ => Ok(()),
    }
}

fn check_concat(items: usize) -> Result<(), Error> {
    if items > MAX_CONCAT_ITEMS {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!(
                "adding lists into one of {items} items, more than the {MAX_CONCAT_ITEMS} \
                 a template may make"
            ),
        ));
    }
    Ok(())
}

/// Checks what `a + b` would allocate before minijinja's `+` makes it: a list longer
/// than [`MAX_CONCAT_ITEMS`] is refused, and a string or list goes on only if the fuel
/// left could pay for it (the check minijinja makes for strings itself). Adding lists
/// is also charged for the result's length: minijinja copies a chain of 33 lazy
/// additions at about 400 ns an item, ten times what its fuel charges, so without this
/// a render could spend some 40 s copying; with it, at most about 3M items (about a
/// second), while appending a few hundred messages one by one costs well under 1 % of
/// `TEMPLATE_FUEL`. Returns the operands as `[b, a]`, for the rewritten instructions to
/// unpack.
pub(super) fn guard_add(state: &State, a: Value, b: Value) -> Result<Value, Error> {
    if let (Some(la), Some(lb)) = (list_len(&a), list_len(&b)) {
        let items = la.saturating_add(lb);
        check_concat(items)?;
        let units = (items as u64).saturating_mul(SLOT_UNITS);
        ensure_fuel(state, units)?;
        state.consume_fuel(units / UNITS_PER_FUEL)?;
    } else if let (Some(sa), Some(sb)) = (a.as_str(), b.as_str()) {
        ensure_fuel(state, (sa.len() as u64).saturating_add(sb.len() as u64))?;
    }
    Ok(Value::from(vec![b, a]))
}

/// The `sum` filter: minijinja's own, after a check when it adds lists: the whole
/// concatenation within [`MAX_CONCAT_ITEMS`], and the copies minijinja makes of it (one
/// per 33 terms) paid for in fuel first, since the filter runs outside the
/// instructions that would charge them.
pub(super) fn sum(
    state: &State,
    values: Value,
    attribute: Option<&str>,
    start: Option<Value>,
    kwargs: Kwargs,
) -> Result<Value, Error> {
    let start_kw: Option<Value> = match start {
        Some(_) => None,
        None => kwargs.peek("start")?,
    };
    if let Some(start_len) = start.as_ref().or(start_kw.as_ref()).and_then(list_len) {
        let path = match attribute {
            Some(a) => Some(a.to_string()),
            None => kwargs.peek::<Option<String>>("attribute")?,
        };
        let (mut items, mut terms) = (start_len, 0usize);
        for item in values.try_iter()? {
            state.consume_fuel(1)?;
            let item = match &path {
                Some(p) => attribute_path(&item, p),
                None => item,
            };
            items = items.saturating_add(list_len(&item).unwrap_or(0));
            terms += 1;
            check_concat(items)?;
        }
        let copies = (terms / 33 + 1) as u64;
        let units = copies
            .saturating_mul(items as u64)
            .saturating_mul(SLOT_UNITS);
        ensure_fuel(state, units)?;
        state.consume_fuel(units / UNITS_PER_FUEL)?;
    }
    minijinja::filters::sum(state, values, attribute, start, kwargs)
}

/// `item`'s value at a dotted `path` (`a.b.0`), undefined where a step is missing, as
/// `sum(attribute=...)` looks it up.
fn attribute_path(item: &Value, path: &str) -> Value {
    let mut v = item.clone();
    for part in path.split('.') {
        let next = match part.parse::<i64>() {
            Ok(i) => v.get_item(&Value::from(i)),
            Err(_) => v.get_attr(part),
        };
        v = match next {
            Ok(n) => n,
            Err(_) => return Value::UNDEFINED,
        };
    }
    v
}
