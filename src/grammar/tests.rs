use super::*;
use serde_json::json;

/// Token 0..=255: that byte; 256: end of generation.
fn byte_vocab() -> Arc<TokenPieces> {
    Arc::new(TokenPieces::bytes())
}
const EOG: u32 = 256;

fn state(g: &str, v: &Arc<TokenPieces>) -> GrammarState {
    let g = Grammar::parse(g, None).unwrap_or_else(|e| panic!("{e}\n{g}"));
    GrammarState::new(Arc::new(g), v.clone())
}

/// Whether the grammar accepts all of `text`, byte by byte, and may end after it.
fn accepts(g: &str, text: &str) -> bool {
    let g = Grammar::parse(g, None).unwrap_or_else(|e| panic!("{e}\n{g}"));
    accepts_text(Arc::new(g), text)
}

#[test]
fn repetitions_match_their_counts() {
    let g = r#"root ::= "a"{5,5}"#;
    assert!(accepts(g, "aaaaa"));
    assert!(!accepts(g, "aaaa"));
    assert!(!accepts(g, "aaaaaa"));
    let g = r#"root ::= "x" "ab"{2,} "y"? "z"{0,3} [0-9]+ "-"*"#;
    assert!(accepts(g, "xabab1"));
    assert!(accepts(g, "xabababyzzz42--"));
    assert!(!accepts(g, "xab1"), "{{2,}} needs two");
    assert!(!accepts(g, "xababzzzz1"), "{{0,3}} allows three");
    assert!(!accepts(g, "xabab"), "+ needs one");
    assert!(!accepts(g, "xababyy1"), "? allows one");
}

#[test]
fn sets_escapes_groups_and_comments() {
    let g = "# a comment\nroot ::= item (\",\" item)* # trailing\nitem ::= [a-c]+ | [^a-z\\n,] | \"\\x41\\u00e9\\t\" | (\n  \"q\" | \"r\" ) \".\" .\n";
    assert!(accepts(g, "abc,ccc"));
    assert!(accepts(g, "Z,1"));
    assert!(accepts(g, "Aé\t"));
    assert!(accepts(g, "q.x,r.é"));
    assert!(!accepts(g, "d"));
    assert!(!accepts(g, "ab,"));
    assert!(!accepts(g, "q."), ". needs a character");
    assert!(!accepts(g, "ZZ"), "a negated set is one character");
}

#[test]
fn utf8_split_across_tokens() {
    let v = byte_vocab();
    let s0 = state(r#"root ::= "é" [a-z]"#, &v);
    let mut s = s0.clone();
    assert!(s.allows(0xC3));
    assert!(!s.allows(b'e' as u32));
    // A lead byte whose characters cannot reach é (U+00E9) is refused.
    assert!(!s.allows(0xE2));
    s.accept(0xC3).unwrap();
    assert!(s.allows(0xA9));
    assert!(!s.allows(0xA8), "é is C3 A9");
    s.accept(0xA9).unwrap();
    assert!(s.allows(b'q' as u32) && !s.allows(EOG));
    // A multi-byte piece continuing a partial character.
    let v2 = Arc::new(TokenPieces::from_pieces(
        vec![
            vec![0xC3],
            vec![0xA9, b'x'],
            vec![0xA9, b'1'],
            b"</s>".to_vec(),
        ],
        vec![false, false, false, true],
    ));
    let mut s = state(r#"root ::= "é" [a-z]"#, &v2);
    s.accept(0).unwrap();
    assert!(s.allows(1) && !s.allows(2));
    s.accept(1).unwrap();
    assert!(s.allows(3) && s.must_end());
}

#[test]
fn tokens_by_id() {
    let v = byte_vocab();
    let mut s = state(r#"root ::= <[65]> "b" !<[66]>"#, &v);
    assert!(s.allows(65) && !s.allows(66));
    s.accept(65).unwrap();
    s.accept(b'b' as u32).unwrap();
    assert!(!s.allows(66) && s.allows(67));
    assert!(s.accept(66).is_err());
    s.accept(67).unwrap();
    assert!(s.must_end());
}

#[test]
fn end_of_generation_only_where_the_grammar_may_end() {
    let v = byte_vocab();
    let mut s = state(r#"root ::= "ab" | "abc""#, &v);
    assert!(!s.allows(EOG));
    assert!(s.accept(EOG).is_err());
    s.accept(b'a' as u32).unwrap();
    s.accept(b'b' as u32).unwrap();
    assert!(s.allows(EOG) && s.allows(b'c' as u32) && !s.must_end());
    s.accept(b'c' as u32).unwrap();
    assert!(s.must_end() && !s.allows(b'c' as u32));
    s.reset();
    assert!(s.allows(b'a' as u32) && !s.allows(EOG));
}

#[test]
fn bad_grammars_are_refused_with_the_reason() {
    let cases = [
        ("root ::= this is (not valid GBNF", "expecting ')'"),
        ("root ::= foo", "undefined rule identifier 'foo'"),
        ("item ::= \"a\"", "no 'root' rule"),
        ("root ::= root \"a\" | \"a\"", "left recursion"),
        // Through rules that may be empty only by way of others (found by fuzzing: it
        // was taken, and the start's expansion ran into its bound after about 1 s).
        (
            "root ::= x root \"e\"\nx ::= y\ny ::= \"a\" | ",
            "left recursion",
        ),
        ("root ::= (((\"a\")*?) root\"e\"+)", "left recursion"),
        ("root ::= \"\\q\"", "unknown escape"),
        ("root ::= \"a\"{3000}", "more than 2000"),
        ("root ::= \"abc", "unexpected end of input"),
        ("root ::= * \"a\"", "expecting an item"),
        ("root = \"a\"", "expecting ::="),
        ("root ::= <hi>", "no vocabulary"),
    ];
    for (g, want) in cases {
        let e = Grammar::parse(g, None).expect_err(g).to_string();
        assert!(e.contains(want), "{g:?}: {e:?} lacks {want:?}");
    }
    let e = Grammar::parse("root ::= \"a\"\n  \"b\" ]", None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("line 2"), "{e}");
}

/// Tiny deterministic generator for the randomized tests.
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) as u32
    }
}

/// The mask over a whole vocabulary equals trying each token on its own: on a
/// vocabulary of random multi-character pieces, along random valid walks through a JSON
/// grammar.
#[test]
fn mask_equals_accepting_each_token() {
    let alphabet: Vec<char> = "{}[]\",: 0123456789abtruefalsn\n-.".chars().collect();
    let mut rng = Lcg(7);
    let mut pieces: Vec<Vec<u8>> = alphabet
        .iter()
        .map(|c| c.to_string().into_bytes())
        .collect();
    for _ in 0..600 {
        let n = 2 + rng.next() as usize % 4;
        let s: String = (0..n)
            .map(|_| alphabet[rng.next() as usize % alphabet.len()])
            .collect();
        pieces.push(s.into_bytes());
    }
    pieces.push(b"</s>".to_vec());
    let n = pieces.len();
    let mut eog = vec![false; n];
    eog[n - 1] = true;
    let v = Arc::new(TokenPieces::from_pieces(pieces, eog));
    let schema = json!({"type": "object", "properties": {
        "a": {"type": "array", "items": {"type": "integer"}, "maxItems": 3},
        "b": {"type": "boolean"}, "n": {"type": "number"}}, "required": ["a"]});
    let g = json_schema::to_grammar(&schema).unwrap();
    let ids: Vec<u32> = (0..n as u32).collect();
    let mut steps = 0;
    for walk in 0..12 {
        let mut s = state(&g, &v);
        let mut rng = Lcg(walk);
        let mut text = Vec::new();
        for _ in 0..40 {
            let mut allowed = vec![true; n];
            s.check(&ids, &mut allowed);
            for (t, &ok) in allowed.iter().enumerate() {
                let alone = s.clone().accept(t as u32).is_ok();
                assert_eq!(
                    ok,
                    alone,
                    "token {t} {:?} after {:?}",
                    String::from_utf8_lossy(&v.bytes[t]),
                    String::from_utf8_lossy(&text)
                );
            }
            steps += 1;
            let choices: Vec<u32> = (0..n as u32).filter(|&t| allowed[t as usize]).collect();
            let t = choices[rng.next() as usize % choices.len()];
            if t as usize == n - 1 {
                break;
            }
            s.accept(t).unwrap();
            text.extend_from_slice(&v.bytes[t as usize]);
        }
    }
    assert!(steps > 100, "{steps} steps walked");
}

/// A JSON text accepted by the grammar of `schema`?
fn schema_accepts(schema: &serde_json::Value, text: &str) -> bool {
    let g = json_schema::to_grammar(schema).unwrap_or_else(|e| panic!("{e}"));
    accepts(&g, text)
}

#[test]
fn integer_bounds_are_exact() {
    let ranges: [(Option<i64>, Option<i64>); 12] = [
        (Some(0), Some(30)),
        (Some(7), Some(7)),
        (Some(5), Some(1234)),
        (Some(-15), Some(9)),
        (Some(-300), Some(-20)),
        (Some(100), Some(199)),
        (Some(99), Some(1001)),
        (Some(42), None),
        (Some(-7), None),
        (None, Some(250)),
        (None, Some(-3)),
        (Some(0), None),
    ];
    for (lo, hi) in ranges {
        let mut schema = json!({"type": "integer"});
        if let Some(lo) = lo {
            schema["minimum"] = json!(lo);
        }
        if let Some(hi) = hi {
            schema["maximum"] = json!(hi);
        }
        let g = json_schema::to_grammar(&schema).unwrap();
        for n in -1300i64..1300 {
            let want = lo.is_none_or(|l| n >= l) && hi.is_none_or(|h| n <= h);
            assert_eq!(accepts(&g, &n.to_string()), want, "{n} in {lo:?}..={hi:?}");
        }
        assert!(!accepts(&g, "007"), "leading zeros");
    }
    // Exclusive and fractional bounds round inwards.
    let s = json!({"type": "integer", "exclusiveMinimum": 2, "maximum": 5.5});
    assert!(!schema_accepts(&s, "2") && schema_accepts(&s, "3") && schema_accepts(&s, "5"));
    assert!(!schema_accepts(&s, "6"));
}

#[test]
fn objects_keep_property_order_and_optionality() {
    let s = json!({"type": "object", "properties": {
        "name": {"type": "string"}, "age": {"type": "integer"}, "tag": {"enum": ["x", 2, null]}},
        "required": ["age"], "additionalProperties": false});
    assert!(schema_accepts(&s, r#"{"age":3}"#));
    assert!(schema_accepts(
        &s,
        r#"{ "age": 3, "name": "Al", "tag": 2 }"#
    ));
    assert!(schema_accepts(&s, "{\n  \"age\": -1,\n  \"tag\": null\n}"));
    assert!(
        !schema_accepts(&s, r#"{"name":"Al","age":3}"#),
        "required first"
    );
    assert!(!schema_accepts(&s, r#"{"name":"Al"}"#), "age is required");
    assert!(
        !schema_accepts(&s, r#"{"age":3,"tag":"y"}"#),
        "not in the enum"
    );
    assert!(
        !schema_accepts(&s, r#"{"age":3,"zz":1}"#),
        "no additional properties"
    );
    // Additional properties: any key but the named ones, after them.
    let s = json!({"properties": {"a": {"type": "boolean"}}, "additionalProperties": {"type": "integer"}});
    assert!(schema_accepts(&s, r#"{"a":true,"b":1,"ab":2}"#));
    assert!(schema_accepts(&s, r#"{"b":1}"#));
    assert!(!schema_accepts(&s, r#"{"b":true}"#));
    // Any object; an empty schema is any value.
    assert!(schema_accepts(
        &json!({"type": "object"}),
        r#"{"k":[1,{"z":null}]}"#
    ));
    assert!(schema_accepts(&json!({}), "[1, \"x\"]"));
}

#[test]
fn strings_arrays_consts_refs_and_unions() {
    assert!(schema_accepts(&json!({"const": "42"}), "\"42\""));
    assert!(!schema_accepts(&json!({"const": "42"}), "42"));
    let s = json!({"type": "string", "minLength": 2, "maxLength": 3});
    assert!(schema_accepts(&s, "\"ab\"") && schema_accepts(&s, "\"a\\n\""));
    assert!(!schema_accepts(&s, "\"a\"") && !schema_accepts(&s, "\"abcd\""));
    let s = json!({"type": "array", "items": {"type": "number"}, "minItems": 1, "maxItems": 2});
    assert!(schema_accepts(&s, "[1.5]") && schema_accepts(&s, "[ -2e10, 0 ]"));
    assert!(!schema_accepts(&s, "[]") && !schema_accepts(&s, "[1,2,3]"));
    let s = json!({"items": [{"type": "integer"}, {"type": "string", "format": "date"}]});
    assert!(schema_accepts(&s, "[7, \"2024-02-29\"]"));
    assert!(!schema_accepts(&s, "[7, \"2024-13-01\"]"));
    let tree = json!({"$ref": "#/$defs/node", "$defs": {"node": {"type": "object",
        "properties": {"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
        "required": ["v"], "additionalProperties": false}}});
    assert!(schema_accepts(
        &tree,
        r#"{"v":1,"kids":[{"v":2},{"v":3,"kids":[]}]}"#
    ));
    assert!(!schema_accepts(&tree, r#"{"v":1,"kids":[{"w":2}]}"#));
    let s = json!({"anyOf": [{"type": "boolean"}, {"type": "null"}], "type": "string"});
    assert!(
        schema_accepts(&s, "true") && schema_accepts(&s, "null") && !schema_accepts(&s, "\"s\"")
    );
    let s = json!({"type": ["integer", "null"]});
    assert!(schema_accepts(&s, "5") && schema_accepts(&s, "null") && !schema_accepts(&s, "5.5"));
    let s = json!({"format": "uuid"});
    assert!(schema_accepts(
        &s,
        "\"123e4567-e89b-12d3-a456-426614174000\""
    ));
}

#[test]
fn patterns_become_grammars() {
    let s = json!({"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3,4}$"});
    assert!(schema_accepts(&s, "\"AB-123\"") && schema_accepts(&s, "\"QQ-0000\""));
    assert!(!schema_accepts(&s, "\"AB-12\"") && !schema_accepts(&s, "\"aB-123\""));
    let s = json!({"pattern": "^(?:cat|dog)s? \\(x\\)\\.$"});
    assert!(schema_accepts(&s, "\"cats (x).\"") && schema_accepts(&s, "\"dog (x).\""));
    assert!(!schema_accepts(&s, "\"cow (x).\"") && !schema_accepts(&s, "\"dogss (x).\""));
    let s = json!({"pattern": "^a.c|xy*$"});
    assert!(
        schema_accepts(&s, "\"abc\"")
            && schema_accepts(&s, "\"xyyy\"")
            && schema_accepts(&s, "\"x\"")
    );
    assert!(!schema_accepts(&s, "\"ac\"") && !schema_accepts(&s, "\"abcx\""));
    // Not converted (as in llama.cpp): any string.
    for p in ["^\\d+$", "no anchors", "^(?=x)y$"] {
        let s = json!({"pattern": p});
        assert!(schema_accepts(&s, "\"anything\""), "{p}");
    }
}

#[test]
fn bad_schemas_are_refused_with_the_reason() {
    let cases = [
        (json!(123), "must be an object"),
        (json!({"type": 123}), "type must be a string"),
        (json!({"type": "hiccup"}), "unrecognized type hiccup"),
        (json!({"enum": []}), "enum must be a non-empty array"),
        (
            json!({"$ref": "http://x/y"}),
            "only references into the same document",
        ),
        (json!({"$ref": "#/$defs/missing"}), "not found"),
        (
            json!({"type": "string", "pattern": "^(a$"}),
            "unbalanced parentheses",
        ),
        (json!({"pattern": "^[ab$"}), "unterminated character class"),
        (json!({"pattern": "^*a$"}), "nothing to repeat"),
        (
            json!({"type": "array", "maxItems": -1}),
            "maxItems must be a non-negative integer",
        ),
        (
            json!({"type": "integer", "minimum": 5, "maximum": 1}),
            "no integer fits",
        ),
    ];
    for (s, want) in cases {
        let e = json_schema::to_grammar(&s)
            .expect_err(&s.to_string())
            .to_string();
        assert!(e.contains(want), "{s}: {e:?} lacks {want:?}");
    }
}

/// A grammar that allows every token leaves the draws alone; one that rejects the
/// chain's first pick makes it pick again among the allowed tokens.
#[test]
fn sampler_resamples_only_rejected_picks() {
    use crate::sample::{Sampler, SamplerParams};
    let v = byte_vocab();
    let n = 257;
    let mut rng = Lcg(11);
    let rows: Vec<Vec<f32>> = (0..40)
        .map(|_| (0..n).map(|_| (rng.next() % 1000) as f32 / 100.0).collect())
        .collect();
    let params = SamplerParams {
        seed: 1234,
        ..SamplerParams::default()
    };
    let mut plain = Sampler::new(params.clone(), n);
    let any = state("root ::= [\\x01-\\xFF]*", &v);
    let mut free = Sampler::with_grammar(params.clone(), n, Some(any));
    let digits = state("root ::= [0-9]+", &v);
    let mut strict = Sampler::with_grammar(params, n, Some(digits));
    for row in &rows {
        // NUL, the bytes of multi-byte characters and the end are out of reach, so
        // every pick of the chain fits the permissive grammar.
        let mut row = row.clone();
        row[0] = -100.0;
        for l in &mut row[0x80..] {
            *l = -100.0;
        }
        let a = plain.sample(&row);
        let b = free.sample(&row);
        assert_eq!(a, b);
        plain.accept(a);
        let _ = free.accept_generated(b);
        let t = strict.sample(&row);
        assert!(t < 256 && (t as u8).is_ascii_digit(), "{t}");
        strict.accept_generated(t).unwrap();
    }
}

// Grammars a request controls: each is refused or stopped with a reason, on the test
// thread's ordinary stack, in bounded time and memory.

fn parse_err(g: &str) -> String {
    match Grammar::parse(g, None) {
        Ok(_) => panic!("accepted: {}", &g[..g.len().min(200)]),
        Err(e) => e.to_string(),
    }
}

#[test]
fn deeply_nested_groups_are_refused_not_a_stack_overflow() {
    let deep = format!(
        "root ::= {}\"a\"{}",
        "(".repeat(100_000),
        ")".repeat(100_000)
    );
    let e = parse_err(&deep);
    assert!(e.contains("nested more than"), "{e}");
    // Unclosed too: the depth is checked on the way in.
    let e = parse_err(&format!("root ::= {}", "(".repeat(100_000)));
    assert!(e.contains("nested more than"), "{e}");
    // Nesting within the bound works as before.
    let n = gbnf::MAX_NESTING;
    let ok = format!("root ::= {}\"a\"{}", "(".repeat(n), ")".repeat(n));
    assert!(accepts(&ok, "a"));
    assert!(!accepts(&ok, "aa"));
}

#[test]
fn long_rule_chains_are_checked_without_recursion() {
    // r0 ::= r1, r1 ::= r2, ...: the left-recursion check walks the whole chain (a
    // recursive walk overflowed the test thread's 2 MiB stack well before this).
    let n = 50_000;
    let mut g = String::from("root ::= r0\n");
    for i in 0..n {
        g.push_str(&format!("r{i} ::= r{}\n", i + 1));
    }
    g.push_str(&format!("r{n} ::= \"x\"\n"));
    assert!(accepts(&g, "x"));
    // The same chain closed into a cycle is left-recursive.
    let cyc = g.replace(&format!("r{n} ::= \"x\""), &format!("r{n} ::= r0 | \"x\""));
    let e = parse_err(&cyc);
    assert!(e.contains("left recursion"), "{e}");
    // Each link leaving a character to match afterwards: the start's stack would be the
    // chain's length deep.
    let mut g = String::from("root ::= r0\n");
    for i in 0..n {
        g.push_str(&format!("r{i} ::= r{} \"a\"\n", i + 1));
    }
    g.push_str(&format!("r{n} ::= \"x\"\n"));
    let e = parse_err(&g);
    assert!(e.contains("simplify the grammar"), "{e}");
}

#[test]
fn exponential_start_expansions_are_refused() {
    // Every level doubles the leftmost derivations of root: 2^40 distinct stacks.
    let mut g = String::from("root ::= r0\n");
    for i in 0..40 {
        g.push_str(&format!("r{i} ::= r{0} | r{0} \"x\"\n", i + 1));
    }
    g.push_str("r40 ::= \"y\"\n");
    let e = parse_err(&g);
    assert!(e.contains("simplify the grammar"), "{e}");
}

#[test]
fn repetition_that_multiplies_past_the_budget_is_refused() {
    let item = "x".repeat(3000);
    let e = parse_err(&format!("root ::= \"{item}\"{{2000}}"));
    assert!(e.contains("elements"), "{e}");
    // Many repetitions each within llama.cpp's limits, together over the budget.
    let g = format!("root ::= {}", "[a-z]{0,2000} ".repeat(2000));
    let e = parse_err(&g);
    assert!(e.contains("elements"), "{e}");
    // Within the budget the count still holds.
    assert!(accepts(&format!("root ::= \"{}\"{{3}}", "ab"), "ababab"));
}

#[test]
fn ambiguous_grammar_ends_the_generation_instead_of_growing() {
    // Each 'a' doubles the stacks (a 'b' or a 'c' owed per level).
    let v = byte_vocab();
    let mut s = state(r#"root ::= "a" root "b" | "a" root "c" | """#, &v);
    let mut stopped = None;
    for i in 0..64 {
        match s.accept(b'a' as u32) {
            Ok(()) => assert!(s.stacks.len() <= stacks::MAX_STACKS),
            Err(e) => {
                stopped = Some((i, e));
                break;
            }
        }
    }
    let (i, e) = stopped.expect("the stacks kept growing");
    assert!(i > 8, "stopped too early, after {i}");
    assert_eq!(e, GrammarError::TooComplex);
    assert!(s.must_end(), "after the stop only the end may follow");
    let mut allowed = vec![true; 257];
    let all: Vec<u32> = (0..257).collect();
    s.check(&all, &mut allowed);
    assert!(allowed[..256].iter().all(|&a| !a));
}

#[test]
fn overlong_token_pieces_are_not_walked() {
    let mut pieces: Vec<Vec<u8>> = vec![b"a".to_vec(), vec![b'a'; 100_000]];
    pieces.push(b"</s>".to_vec());
    let v = Arc::new(TokenPieces::from_pieces(pieces, vec![false, false, true]));
    let s = state(r#"root ::= "a"*"#, &v);
    assert!(s.allows(0));
    assert!(!s.allows(1), "a piece longer than the bound is refused");
}

// Schemas a request controls: refused with a reason or converted in bounded work.

fn schema_err(schema: &serde_json::Value) -> String {
    match json_schema::to_grammar(schema) {
        Ok(g) => panic!("converted ({} bytes)", g.len()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn schema_ref_chains_and_cycles_are_bounded() {
    let mut defs = serde_json::Map::new();
    for i in 0..20_000 {
        defs.insert(
            format!("d{i}"),
            json!({"$ref": format!("#/$defs/d{}", i + 1)}),
        );
    }
    defs.insert("d20000".into(), json!({"type": "string"}));
    let e = schema_err(&json!({"$ref": "#/$defs/d0", "$defs": defs}));
    assert!(e.contains("deep"), "{e}");
    // A reference to itself through allOf contributes nothing (it used to recurse for
    // ever); one through its own properties is nested past the bound.
    let g = json_schema::to_grammar(
        &json!({"allOf": [{"$ref": "#/$defs/a"}], "$defs": {"a": {"$ref": "#/$defs/a"}}}),
    )
    .unwrap();
    assert!(Grammar::parse(&g, None).is_ok(), "{g}");
    let e = schema_err(&json!({"$ref": "#/$defs/d", "$defs": {"d": {
        "properties": {"x": {"allOf": [{"$ref": "#/$defs/d"}]}}}}}));
    assert!(e.contains("deep"), "{e}");
}

#[test]
fn schema_expansions_that_multiply_are_refused() {
    // Each level's allOf names the next level twice: 2^40 inlined objects.
    let mut defs = serde_json::Map::new();
    for i in 0..40 {
        let next = format!("#/$defs/d{}", i + 1);
        defs.insert(
            format!("d{i}"),
            json!({"properties": {"x": {"allOf": [{"$ref": next}, {"$ref": next}]}}}),
        );
    }
    defs.insert("d40".into(), json!({"type": "integer"}));
    let e = schema_err(&json!({"$ref": "#/$defs/d0", "$defs": defs}));
    assert!(e.contains("nodes") || e.contains("deep"), "{e}");
    // Type lists nested: each level doubles the alternatives.
    let mut s = json!({"type": "integer"});
    for _ in 0..40 {
        s = json!({"type": ["object", "object"], "properties": {"a": s}});
    }
    let e = schema_err(&s);
    assert!(e.contains("nodes"), "{e}");
}

#[test]
fn many_optional_properties_cost_linear_work() {
    let props: serde_json::Map<String, serde_json::Value> = (0..4000)
        .map(|i| (format!("p{i}"), json!({"type": "integer"})))
        .collect();
    let g = json_schema::to_grammar(&json!({"type": "object", "properties": props})).unwrap();
    // One kv rule and one rest rule per property, and one alternative each in the object.
    assert!(g.len() < 4000 * 200, "{} bytes", g.len());
    let g = Grammar::parse(&g, None).unwrap();
    let g = Arc::new(g);
    assert!(accepts_text(g.clone(), r#"{"p3": 1, "p3999": 2}"#));
    assert!(
        !accepts_text(g, r#"{"p3999": 2, "p3": 1}"#),
        "order is kept"
    );
}

#[test]
fn overlong_names_and_patterns_are_refused() {
    let name = "n".repeat(100_000);
    let e = schema_err(
        &json!({"type": "object", "properties": {name: {"type": "string"}},
                              "additionalProperties": true}),
    );
    assert!(e.contains("property name"), "{e}");
    let pattern = format!("^{}$", "a{1}".repeat(10_000));
    let e = schema_err(&json!({"type": "string", "pattern": pattern}));
    assert!(e.contains("pattern"), "{e}");
}

#[test]
fn a_quantifier_after_a_quantifier_is_refused_and_laziness_ignored() {
    for p in ["^a{0,4}*$", "^a**$", "^a+{2}$", "^a*??$"] {
        let e = schema_err(&json!({"type": "string", "pattern": p}));
        assert!(e.contains("nothing to repeat"), "{p}: {e}");
    }
    let e = schema_err(&json!({"type": "string", "pattern": "^a[]?b$"}));
    assert!(e.contains("empty character class"), "{e}");
    for (p, yes, no) in [
        ("^a*?b$", "\"aab\"", "\"ba\""),
        ("^(ab)+?c{2}?$", "\"ababcc\"", "\"c\""),
        ("^x[^]y$", "\"x-y\"", "\"xy\""),
    ] {
        assert!(
            schema_accepts(&json!({"type": "string", "pattern": p}), yes),
            "{p}"
        );
        assert!(
            !schema_accepts(&json!({"type": "string", "pattern": p}), no),
            "{p}"
        );
    }
}

#[test]
fn nested_ambiguity_is_matched_within_the_work_of_a_step() {
    // Each level of repetition may end after any 'a': the same stack is reached from
    // many, and is expanded once per character.
    let g = r#"root ::= (((("a")+)+)+)+ "b""#;
    assert!(accepts(g, &format!("{}b", "a".repeat(300))));
    assert!(!accepts(g, &"a".repeat(300)));
    // The fuzzer's grammar: a dozen repetitions stacked on one any-character. Each step
    // either goes on or ends the generation as too complex; it never lets through a
    // byte it then refuses.
    let v = byte_vocab();
    let mut s = state("root ::=(......*..++++++++++++)", &v);
    let all: Vec<u32> = (0..257).collect();
    let mut ended = false;
    for _ in 0..60 {
        let mut allowed = vec![true; all.len()];
        s.check(&all, &mut allowed);
        if s.too_complex() {
            assert!(allowed.iter().all(|&a| !a));
            assert_eq!(s.accept(b'a' as u32), Err(GrammarError::TooComplex));
            ended = true;
            break;
        }
        assert!(allowed[b'a' as usize]);
        match s.accept(b'a' as u32) {
            Ok(()) => {}
            Err(e) => {
                assert_eq!(e, GrammarError::TooComplex);
                ended = true;
                break;
            }
        }
    }
    if ended {
        assert!(s.must_end(), "after the stop only the end may follow");
    }
}

#[test]
fn a_check_past_the_work_of_a_step_allows_nothing_and_ends_the_generation() {
    // 12 'a's leave 12 288 stacks, one per way of owing 'b's and 'c's and per place the
    // next character may be read (either alternative's 'a', or 'z'). 10 000 pieces
    // start with 'a', which 8192 of the stacks take, and go on with 'y', which none of
    // them takes: each is compared with what follows in every one of those stacks.
    let g = r#"root ::= "a" root "b" | "a" root "c" | "z""#;
    let mut pieces: Vec<Vec<u8>> = vec![b"a".to_vec()];
    pieces.extend((0..10_000).map(|i| format!("ay{i}").into_bytes()));
    pieces.push(b"</s>".to_vec());
    let mut eog = vec![false; pieces.len()];
    *eog.last_mut().unwrap() = true;
    let big = Arc::new(TokenPieces::from_pieces(pieces, eog));
    let mut s = state(g, &big);
    for _ in 0..12 {
        s.accept(0).unwrap();
    }
    assert_eq!(s.stacks.len(), 3 << 12);
    let ids: Vec<u32> = (0..big.n_vocab() as u32).collect();
    let mut allowed = vec![true; ids.len()];
    s.check(&ids, &mut allowed);
    assert!(
        s.too_complex(),
        "12 288 stacks x 10 000 pieces is past the work of a step"
    );
    assert!(allowed.iter().all(|&a| !a));
    assert_eq!(s.accept(0), Err(GrammarError::TooComplex));
    assert!(s.must_end());
    // The same state with the byte vocabulary is well within it: 'a' goes on.
    let v = byte_vocab();
    let mut s = state(g, &v);
    for _ in 0..12 {
        s.accept(b'a' as u32).unwrap();
    }
    let all: Vec<u32> = (0..257).collect();
    let mut allowed = vec![true; all.len()];
    s.check(&all, &mut allowed);
    assert!(!s.too_complex());
    assert!(
        allowed[b'a' as usize]
            && allowed[b'z' as usize]
            && !allowed[b'y' as usize]
            && !allowed[EOG as usize]
    );
}
