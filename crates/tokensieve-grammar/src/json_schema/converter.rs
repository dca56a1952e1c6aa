//! The schema walk: one GBNF rule per schema node, named after its path, collected in a map
//! sorted by name (the order llama.cpp prints them in).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::rc::Rc;

use super::json::{Json, JsonObject, MAX_NESTING};
use super::numeric::{integer_range, repetition};
use super::SchemaOptions;
use crate::error::{Error, Result};

/// The whitespace allowed after every token: nothing, a space, or one or two newlines and up
/// to 20 spaces or tabs of indentation.
const SPACE_RULE: &str = r#"| " " | "\n"{1,2} [ \t]{0,20}"#;

/// A built-in rule: its GBNF body and the built-in rules that body refers to.
#[derive(Clone, Copy, Debug)]
struct Builtin {
    body: &'static str,
    deps: &'static [&'static str],
}

const fn builtin(body: &'static str, deps: &'static [&'static str]) -> Builtin {
    Builtin { body, deps }
}

/// The JSON value rules. A schema's `type` may name any of them.
fn primitive(name: &str) -> Option<Builtin> {
    Some(match name {
        "boolean" => builtin(r#"("true" | "false") space"#, &[]),
        "decimal-part" => builtin("[0-9]{1,16}", &[]),
        "integral-part" => builtin("[0] | [1-9] [0-9]{0,15}", &[]),
        "number" => builtin(
            r#"("-"? integral-part) ("." decimal-part)? ([eE] [-+]? integral-part)? space"#,
            &["integral-part", "decimal-part"],
        ),
        "integer" => builtin(r#"("-"? integral-part) space"#, &["integral-part"]),
        "value" => builtin(
            "object | array | string | number | boolean | null",
            &["object", "array", "string", "number", "boolean", "null"],
        ),
        "object" => builtin(
            r#""{" space ( string ":" space value ("," space string ":" space value)* )? "}" space"#,
            &["string", "value"],
        ),
        "array" => builtin(r#""[" space ( value ("," space value)* )? "]" space"#, &["value"]),
        "uuid" => builtin(
            r#""\"" [0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{12} "\"" space"#,
            &[],
        ),
        "char" => builtin(r#"[^"\\\x7F\x00-\x1F] | [\\] (["\\bfnrt] | "u" [0-9a-fA-F]{4})"#, &[]),
        "string" => builtin(r#""\"" char* "\"" space"#, &["char"]),
        "null" => builtin(r#""null" space"#, &[]),
        _ => return None,
    })
}

/// The rules for the string formats `date`, `time` and `date-time`.
fn string_format(name: &str) -> Option<Builtin> {
    Some(match name {
        "date" => builtin(r#"[0-9]{4} "-" ( "0" [1-9] | "1" [0-2] ) "-" ( "0" [1-9] | [1-2] [0-9] | "3" [0-1] )"#, &[]),
        "time" => builtin(
            r#"([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{3} )? ( "Z" | ( "+" | "-" ) ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] )"#,
            &[],
        ),
        "date-time" => builtin(r#"date "T" time"#, &["date", "time"]),
        "date-string" => builtin(r#""\"" date "\"" space"#, &["date"]),
        "time-string" => builtin(r#""\"" time "\"" space"#, &["time"]),
        "date-time-string" => builtin(r#""\"" date-time "\"" space"#, &["date-time"]),
        _ => return None,
    })
}

/// Names a schema path may not take as is (a `-` is appended): `root` and the built-ins.
fn is_reserved(name: &str) -> bool {
    name == "root" || primitive(name).is_some() || string_format(name).is_some()
}

/// `uuid`, `uuid1` … `uuid5`.
fn is_uuid_format(format: &str) -> bool {
    match format.strip_prefix("uuid") {
        Some("") => true,
        Some(rest) => rest.len() == 1 && matches!(rest.as_bytes()[0], b'1'..=b'5'),
        None => false,
    }
}

/// A rule name from any text: each run of characters outside `[a-zA-Z0-9-]` becomes one `-`.
fn sanitize(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut in_run = false;
    for c in name.chars() {
        if c.is_ascii_alphanumeric() || c == '-' {
            out.push(c);
            in_run = false;
        } else if !in_run {
            out.push('-');
            in_run = true;
        }
    }
    out
}

/// A GBNF string literal for `text`: `"`, `\`, CR and LF are escaped.
fn format_literal(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
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

/// The literal matching exactly the JSON text of `value`.
fn constant_rule(value: &Json) -> String {
    format_literal(&value.dump())
}

/// `prefix-suffix`, or `suffix` alone when there is no prefix.
fn child_name(prefix: &str, suffix: &str) -> String {
    if prefix.is_empty() {
        suffix.to_owned()
    } else {
        format!("{prefix}-{suffix}")
    }
}

/// A character inside a GBNF class, escaped where GBNF would otherwise misread it.
/// `single` is for a one-character class `[c]`, where `^` would mean negation.
fn class_char(c: char, single: bool, last: bool, out: &mut String) {
    match c {
        ']' => out.push_str("\\]"),
        '\\' => out.push_str("\\\\"),
        '-' if !single && !last => out.push_str("\\-"),
        '^' if single => out.push_str("\\x5E"),
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        c if (c as u32) < 0x20 => out.push_str(&format!("\\x{:02X}", c as u32)),
        c => out.push(c),
    }
}

/// nlohmann's `get<int>()` for a count (`minItems`, `minLength`, …), refusing what would make
/// llama.cpp print a broken grammar: negative or out-of-range values. Floats are truncated
/// and booleans count as 0 or 1, as in nlohmann.
fn count_value(value: &Json, key: &str) -> Result<u64> {
    let n: i64 = match value {
        Json::UInt(u) => i64::try_from(*u).unwrap_or(i64::MAX),
        Json::Int(i) => *i,
        Json::Float(f) if f.is_finite() && f.abs() < 9.0e18 => f.trunc() as i64,
        Json::Float(_) => i64::MAX,
        Json::Bool(b) => i64::from(*b),
        other => return Err(Error::schema(format!("{key} must be a number, not {}", other.type_name()))),
    };
    if n < 0 {
        return Err(Error::schema(format!("{key} must not be negative (got {n})")));
    }
    if n > i64::from(i32::MAX) {
        return Err(Error::schema(format!("{key} is too large (got {n})")));
    }
    Ok(n as u64)
}

/// A maximum count: `i32::MAX` is llama.cpp's "unbounded".
fn max_count(value: &Json, key: &str) -> Result<Option<u64>> {
    let n = count_value(value, key)?;
    Ok((n != i32::MAX as u64).then_some(n))
}

/// nlohmann's `get<int64_t>()` for an integer bound.
fn bound_value(value: &Json, key: &str) -> Result<i64> {
    match value {
        Json::UInt(u) => i64::try_from(*u).map_err(|_| Error::schema(format!("{key} {u} is out of range"))),
        Json::Int(i) => Ok(*i),
        Json::Float(f) if f.is_finite() && f.abs() < 9.2e18 => Ok(f.trunc() as i64),
        Json::Float(f) => Err(Error::schema(format!("{key} {f} is out of range"))),
        Json::Bool(b) => Ok(i64::from(*b)),
        other => Err(Error::schema(format!("{key} must be a number, not {}", other.type_name()))),
    }
}

/// Converts one schema. Built fresh for every conversion.
pub(crate) struct Converter {
    dotall: bool,
    /// Position of a property name in [`SchemaOptions::prop_order`].
    prop_order: HashMap<String, usize>,
    rules: BTreeMap<String, String>,
    root: Rc<Json>,
    /// Targets of `$ref`s, by the `$ref` string.
    refs: HashMap<String, Rc<Json>>,
    refs_being_resolved: HashSet<String>,
    depth: usize,
}

impl Converter {
    /// A converter for `root` (hoisting nested `$defs` to the top as llama.cpp does) that has
    /// resolved the `$ref`s llama.cpp resolves up front.
    pub(crate) fn new(mut root: Json, options: &SchemaOptions) -> Result<Converter> {
        hoist_defs(&mut root)?;
        let mut prop_order = HashMap::new();
        for (i, name) in options.prop_order.iter().enumerate() {
            prop_order.insert(name.clone(), i);
        }
        let mut converter = Converter {
            dotall: options.dotall,
            prop_order,
            rules: BTreeMap::from([("space".to_owned(), SPACE_RULE.to_owned())]),
            root: Rc::new(root),
            refs: HashMap::new(),
            refs_being_resolved: HashSet::new(),
            depth: 0,
        };
        let root = Rc::clone(&converter.root);
        converter.register_refs(&root)?;
        Ok(converter)
    }

    /// Converts the whole schema and prints the grammar: `name ::= body` lines sorted by name.
    pub(crate) fn run(mut self) -> Result<String> {
        let root = Rc::clone(&self.root);
        self.visit(&root, "")?;
        let mut out = String::new();
        for (name, body) in &self.rules {
            out.push_str(name);
            out.push_str(" ::= ");
            out.push_str(body);
            out.push('\n');
        }
        Ok(out)
    }

    /// Adds `rule` under `name` (sanitised) and returns the name it got. The same body under
    /// the same name is shared; a different body gets the first free `name0`, `name1`, ….
    pub(super) fn add_rule(&mut self, name: &str, rule: &str) -> String {
        let name = sanitize(name);
        match self.rules.get(&name) {
            None => {
                self.rules.insert(name.clone(), rule.to_owned());
                return name;
            }
            Some(existing) if existing == rule => return name,
            Some(_) => {}
        }
        let mut i = 0usize;
        loop {
            let candidate = format!("{name}{i}");
            match self.rules.get(&candidate) {
                Some(existing) if existing != rule => i += 1,
                Some(_) => return candidate,
                None => {
                    self.rules.insert(candidate.clone(), rule.to_owned());
                    return candidate;
                }
            }
        }
    }

    /// Adds a built-in rule under `name` and, under their own names, the built-ins it uses
    /// that are not there yet.
    fn add_builtin(&mut self, name: &str, rule: Builtin) -> String {
        let added = self.add_rule(name, rule.body);
        for dep in rule.deps {
            if !self.rules.contains_key(*dep) {
                if let Some(dep_rule) = primitive(dep).or_else(|| string_format(dep)) {
                    self.add_builtin(dep, dep_rule);
                }
            }
        }
        added
    }

    /// Adds the primitive `kind` under the name `name`.
    fn add_primitive(&mut self, name: &str, kind: &str) -> Result<String> {
        let rule = primitive(kind).ok_or_else(|| Error::schema(format!("unknown primitive {kind}")))?;
        Ok(self.add_builtin(name, rule))
    }

    /// The `dot` rule: any character but CR and LF, or any character with `dotall`.
    pub(super) fn dot_rule(&mut self) -> String {
        let body = if self.dotall { r"[\U00000000-\U0010FFFF]" } else { r"[^\x0A\x0D]" };
        self.add_rule("dot", body)
    }

    // ---- $ref ----

    /// Records the target of every `$ref` llama.cpp resolves before converting: all of them
    /// except those inside an object that itself has a `$ref`. Fails on the first bad one.
    fn register_refs(&mut self, node: &Json) -> Result<()> {
        match node {
            Json::Array(items) => items.iter().try_for_each(|item| self.register_refs(item)),
            Json::Object(object) => match object.get("$ref") {
                Some(reference) => {
                    let reference = ref_string(reference)?;
                    if !self.refs.contains_key(reference) {
                        let target = self.lookup(reference)?;
                        self.refs.insert(reference.to_owned(), Rc::new(target));
                    }
                    Ok(())
                }
                None => object.iter().try_for_each(|(_, value)| self.register_refs(value)),
            },
            _ => Ok(()),
        }
    }

    /// The subschema a local `$ref` (`#/…`) points at, read as llama.cpp reads it: keys as
    /// written (no `~0`/`~1` decoding), array indices as decimal numbers.
    fn lookup(&self, reference: &str) -> Result<Json> {
        if reference.starts_with("https://") || reference.starts_with("http://") {
            return Err(Error::schema(format!(
                "remote $ref {reference} is not fetched: only local refs such as #/$defs/name are supported"
            )));
        }
        let Some(pointer) = reference.strip_prefix('#').filter(|p| p.starts_with('/')) else {
            return Err(Error::schema(format!(
                "unsupported $ref {reference}: only local refs such as #/$defs/name are supported"
            )));
        };
        let mut target: &Json = &self.root;
        for selector in pointer.split('/').skip(1) {
            let next = match target {
                Json::Object(object) => object.get(selector),
                Json::Array(items) => array_index(selector).and_then(|i| items.get(i)),
                _ => None,
            };
            target = next.ok_or_else(|| {
                Error::schema(format!("cannot resolve $ref {reference}: {selector} not in {}", target.dump_short(200)))
            })?;
        }
        Ok(target.clone())
    }

    /// The target of `reference`, resolving it now if the first pass did not.
    ///
    /// llama.cpp's first pass skips `$ref`s inside an object that has a `$ref` of its own
    /// (for example definitions beside a top-level `$ref`) and then converts such refs as if
    /// they pointed at `null`, which gives the rule `object`. Here they are resolved like any
    /// other; unresolvable ones are errors.
    fn ref_target(&mut self, reference: &str) -> Result<Rc<Json>> {
        if let Some(target) = self.refs.get(reference) {
            return Ok(Rc::clone(target));
        }
        let target = Rc::new(self.lookup(reference)?);
        self.refs.insert(reference.to_owned(), Rc::clone(&target));
        Ok(target)
    }

    /// The rule for `$ref: reference`: `ref` plus the sanitised fragment, converted once. A
    /// reference met again while it is being converted (recursion) refers to that name.
    fn resolve_ref(&mut self, reference: &str) -> Result<String> {
        let fragment = reference.find('#').map_or(reference, |i| &reference[i + 1..]);
        let ref_name = format!("ref{}", sanitize(fragment));
        if self.rules.contains_key(&ref_name) || self.refs_being_resolved.contains(reference) {
            return Ok(ref_name);
        }
        self.refs_being_resolved.insert(reference.to_owned());
        let result = self.ref_target(reference).and_then(|target| self.visit(&target, &ref_name));
        self.refs_being_resolved.remove(reference);
        result
    }

    // ---- the walk ----

    /// Converts `schema`, naming its rule after `name` (the path to it), and returns the rule
    /// name to refer to it by.
    fn visit(&mut self, schema: &Json, name: &str) -> Result<String> {
        if self.depth >= MAX_NESTING {
            return Err(Error::schema(format!(
                "JSON schema nests deeper than {MAX_NESTING} levels (counting $ref and allOf indirections)"
            )));
        }
        self.depth += 1;
        let result = self.visit_node(schema, name);
        self.depth -= 1;
        result
    }

    /// Picks the rule for `schema` (llama.cpp's order of checks) and builds it. Each kind of
    /// rule is built in its own function so that the recursion through nested schemas keeps
    /// small stack frames.
    fn visit_node(&mut self, schema: &Json, name: &str) -> Result<String> {
        let rule_name = if is_reserved(name) {
            format!("{name}-")
        } else if name.is_empty() {
            "root".to_owned()
        } else {
            name.to_owned()
        };
        match classify(schema)? {
            Shape::Ref(reference) => self.ref_rule(reference, &rule_name),
            Shape::Union(alternatives) => self.union_rule(alternatives, name, &rule_name),
            Shape::TypeUnion(types) => self.type_union_rule(schema, types, name, &rule_name),
            Shape::Const(value) => Ok(self.const_rule(value, &rule_name)),
            Shape::Enum(values) => Ok(self.enum_rule(values, &rule_name)),
            Shape::Object => self.object_schema_rule(schema, name, &rule_name),
            Shape::AllOf => self.all_of(schema, name, &rule_name),
            Shape::Array(items) => self.array_rule(schema, items, name, &rule_name),
            Shape::Pattern(pattern) => self.visit_pattern(pattern, &rule_name),
            Shape::Uuid(format) => self.add_primitive(if rule_name == "root" { "root" } else { format }, "uuid"),
            Shape::Format(format_rule, rule) => Ok(self.format_rule(format_rule, rule, &rule_name)),
            Shape::BoundedString => self.bounded_string_rule(schema, &rule_name),
            Shape::BoundedInteger => self.integer_rule(schema, &rule_name),
            Shape::Primitive(kind) => self.primitive_rule(kind, &rule_name),
            Shape::Named(kind) => self.add_primitive(if rule_name == "root" { "root" } else { kind }, kind),
        }
    }

    fn ref_rule(&mut self, reference: &str, rule_name: &str) -> Result<String> {
        let target = self.resolve_ref(reference)?;
        Ok(self.add_rule(rule_name, &target))
    }

    fn union_rule(&mut self, alternatives: &[Json], name: &str, rule_name: &str) -> Result<String> {
        let body = self.union(name, alternatives)?;
        Ok(self.add_rule(rule_name, &body))
    }

    /// `type: [a, b]`: the union of the schema with each type in turn.
    fn type_union_rule(&mut self, schema: &Json, types: &[Json], name: &str, rule_name: &str) -> Result<String> {
        let variants = type_variants(schema, types);
        self.union_rule(&variants, name, rule_name)
    }

    #[inline(never)]
    fn const_rule(&mut self, value: &Json, rule_name: &str) -> String {
        self.add_rule(rule_name, &format!("{} space", constant_rule(value)))
    }

    #[inline(never)]
    fn enum_rule(&mut self, values: &Json, rule_name: &str) -> String {
        let alternatives: Vec<String> = values.elements().into_iter().map(constant_rule).collect();
        self.add_rule(rule_name, &format!("({}) space", alternatives.join(" | ")))
    }

    /// An object with `properties` and/or a restricting `additionalProperties`.
    fn object_schema_rule(&mut self, schema: &Json, name: &str, rule_name: &str) -> Result<String> {
        let (properties, required) = object_parts(schema);
        let additional = schema.get("additionalProperties").unwrap_or(&Json::Null);
        let body = self.object_rule(&properties, &required, name, additional)?;
        Ok(self.add_rule(rule_name, &body))
    }

    #[inline(never)]
    fn format_rule(&mut self, format_rule: &str, rule: Builtin, rule_name: &str) -> String {
        let target = self.add_builtin(format_rule, rule);
        self.add_rule(rule_name, &target)
    }

    #[inline(never)]
    fn bounded_string_rule(&mut self, schema: &Json, rule_name: &str) -> Result<String> {
        let char_rule = self.add_primitive("char", "char")?;
        let min = schema.get("minLength").map(|v| count_value(v, "minLength")).transpose()?.unwrap_or(0);
        let max = schema.get("maxLength").map(|v| max_count(v, "maxLength")).transpose()?.flatten();
        let body = format!("\"\\\"\" {} \"\\\"\" space", repetition(&char_rule, min, max, None));
        Ok(self.add_rule(rule_name, &body))
    }

    /// `{}` and `type: object` (any object), or a schema of annotations only (any value):
    /// `rule_name ::= object` / `value`.
    #[inline(never)]
    fn primitive_rule(&mut self, kind: &str, rule_name: &str) -> Result<String> {
        let target = self.add_primitive(kind, kind)?;
        Ok(self.add_rule(rule_name, &target))
    }

    /// `a | b | …`, each alternative converted under `name-i` (`alternative-i` at the top).
    fn union(&mut self, name: &str, alternatives: &[Json]) -> Result<String> {
        let mut rules = Vec::with_capacity(alternatives.len());
        for (i, alternative) in alternatives.iter().enumerate() {
            let alt_name = if name.is_empty() { format!("alternative-{i}") } else { format!("{name}-{i}") };
            rules.push(self.visit(alternative, &alt_name)?);
        }
        Ok(rules.join(" | "))
    }

    /// `items`/`prefixItems`: a tuple for an array of schemas, else a list with
    /// `minItems`/`maxItems`.
    fn array_rule(&mut self, schema: &Json, items: &Json, name: &str, rule_name: &str) -> Result<String> {
        if let Json::Array(tuple) = items {
            let mut parts = Vec::with_capacity(tuple.len());
            for (i, item) in tuple.iter().enumerate() {
                parts.push(self.visit(item, &child_name(name, &format!("tuple-{i}")))?);
            }
            return Ok(self.add_rule(rule_name, &tuple_body(&parts)));
        }
        let item_rule = self.visit(items, &child_name(name, "item"))?;
        self.list_rule(schema, &item_rule, rule_name)
    }

    #[inline(never)]
    fn list_rule(&mut self, schema: &Json, item_rule: &str, rule_name: &str) -> Result<String> {
        let min = schema.get("minItems").map(|v| count_value(v, "minItems")).transpose()?.unwrap_or(0);
        // Like llama.cpp, only an integer maxItems counts (2.0 is ignored).
        let max = match schema.get("maxItems") {
            Some(v @ (Json::Int(_) | Json::UInt(_))) => max_count(v, "maxItems")?,
            _ => None,
        };
        let body = format!("\"[\" space {} \"]\" space", repetition(item_rule, min, max, Some("\",\" space")));
        Ok(self.add_rule(rule_name, &body))
    }

    /// `type: integer` with bounds.
    #[inline(never)]
    fn integer_rule(&mut self, schema: &Json, rule_name: &str) -> Result<String> {
        let get = |key: &str| schema.get(key).map(|v| bound_value(v, key)).transpose();
        let min = match get("minimum")? {
            Some(v) => Some(v),
            None => get("exclusiveMinimum")?
                .map(|v| v.checked_add(1).ok_or_else(|| Error::schema("exclusiveMinimum is out of range")))
                .transpose()?,
        };
        let max = match get("maximum")? {
            Some(v) => Some(v),
            None => get("exclusiveMaximum")?
                .map(|v| v.checked_sub(1).ok_or_else(|| Error::schema("exclusiveMaximum is out of range")))
                .transpose()?,
        };
        let body = format!("({}) space", integer_range(min, max)?);
        Ok(self.add_rule(rule_name, &body))
    }

    /// `allOf`: the properties of all parts in one object (those under an `anyOf` inside
    /// optional), or, when parts carry `enum`s, the values common to all of them.
    fn all_of(&mut self, schema: &Json, name: &str, rule_name: &str) -> Result<String> {
        let merged = self.merge_all_of(schema)?;
        if let Some(rule) = self.common_enum_rule(schema, &merged, rule_name) {
            return Ok(rule);
        }
        let body = self.object_rule(&merged.properties, &merged.required, name, &Json::Null)?;
        Ok(self.add_rule(rule_name, &body))
    }

    #[inline(never)]
    fn merge_all_of(&mut self, schema: &Json) -> Result<Merged> {
        let null = Json::Null;
        let parts = schema.get("allOf").unwrap_or(&null);
        let mut merged = Merged::default();
        for part in parts.elements() {
            match part.get("anyOf") {
                Some(alternatives) => {
                    for alternative in alternatives.elements() {
                        self.merge_component(alternative, false, &mut merged, 0)?;
                    }
                }
                None => self.merge_component(part, true, &mut merged, 0)?,
            }
        }
        Ok(merged)
    }

    #[inline(never)]
    fn common_enum_rule(&mut self, schema: &Json, merged: &Merged, rule_name: &str) -> Option<String> {
        if merged.enum_counts.is_empty() {
            return None;
        }
        let wanted = schema.get("allOf").map_or(0, Json::size_like);
        let common: Vec<&str> =
            merged.enum_counts.iter().filter(|(_, &n)| n == wanted).map(|(rule, _)| rule.as_str()).collect();
        if common.is_empty() {
            return None;
        }
        Some(self.add_rule(rule_name, &format!("({}) space", common.join(" | "))))
    }

    fn merge_component(&mut self, component: &Json, required: bool, merged: &mut Merged, depth: usize) -> Result<()> {
        if depth >= MAX_NESTING {
            return Err(Error::schema(format!("allOf $ref chain deeper than {MAX_NESTING} levels (a $ref cycle?)")));
        }
        if let Some(reference) = component.get("$ref") {
            let target = self.ref_target(ref_string(reference)?)?;
            return self.merge_component(&target, required, merged, depth + 1);
        }
        if let Some(properties) = component.get("properties") {
            for (key, value) in properties.items() {
                if required {
                    merged.required.insert(key.clone());
                }
                merged.properties.push((key, value.clone()));
            }
        } else if let Some(values) = component.get("enum") {
            for value in values.elements() {
                *merged.enum_counts.entry(constant_rule(value)).or_insert(0) += 1;
            }
        }
        Ok(())
    }

    /// The body of an object rule: required properties in order, then the optional ones (and
    /// `additionalProperties`) in a chain that allows any subset in order.
    fn object_rule(
        &mut self,
        properties: &[(String, Json)],
        required: &HashSet<String>,
        name: &str,
        additional: &Json,
    ) -> Result<String> {
        // Key-value rules, built in document order.
        let mut kv_rules: HashMap<String, String> = HashMap::new();
        for (prop_name, prop_schema) in properties {
            let kv = self.property_kv_rule(prop_name, prop_schema, name)?;
            kv_rules.insert(prop_name.clone(), kv);
        }
        let prop_names: Vec<&str> = properties.iter().map(|(p, _)| p.as_str()).collect();
        let additional_kv = match additional {
            Json::Bool(true) | Json::Object(_) => Some(self.additional_kv_rule(additional, &prop_names, name)?),
            _ => None,
        };
        Ok(self.assemble_object_rule(&prop_names, kv_rules, additional_kv, required, name))
    }

    /// `name-prop-kv ::= "\"prop\"" space ":" space <value rule>`, converting the value.
    fn property_kv_rule(&mut self, prop_name: &str, prop_schema: &Json, name: &str) -> Result<String> {
        let prop_path = child_name(name, prop_name);
        let value_rule = self.visit(prop_schema, &prop_path)?;
        Ok(self.kv_rule(&prop_path, prop_name, &value_rule))
    }

    #[inline(never)]
    fn kv_rule(&mut self, prop_path: &str, prop_name: &str, value_rule: &str) -> String {
        let key_literal = format_literal(&Json::Str(prop_name.to_owned()).dump());
        self.add_rule(&format!("{prop_path}-kv"), &format!("{key_literal} space \":\" space {value_rule}"))
    }

    /// `name-additional-kv`: any key but the declared ones, with the `additionalProperties`
    /// value (any value for `true`).
    fn additional_kv_rule(&mut self, additional: &Json, prop_names: &[&str], name: &str) -> Result<String> {
        let sub_name = child_name(name, "additional");
        let value_rule = match additional {
            Json::Object(_) => self.visit(additional, &format!("{sub_name}-value"))?,
            _ => self.add_primitive("value", "value")?,
        };
        self.additional_kv_finish(&sub_name, prop_names, &value_rule)
    }

    #[inline(never)]
    fn additional_kv_finish(&mut self, sub_name: &str, prop_names: &[&str], value_rule: &str) -> Result<String> {
        let key_rule = if prop_names.is_empty() {
            self.add_primitive("string", "string")?
        } else {
            let body = self.not_strings(prop_names)?;
            self.add_rule(&format!("{sub_name}-k"), &body)
        };
        Ok(self.add_rule(&format!("{sub_name}-kv"), &format!("{key_rule} \":\" space {value_rule}")))
    }

    #[inline(never)]
    fn assemble_object_rule(
        &mut self,
        prop_names: &[&str],
        mut kv_rules: HashMap<String, String>,
        additional_kv: Option<String>,
        required: &HashSet<String>,
        name: &str,
    ) -> String {
        // The order the grammar lists them in: `prop_order` first, then document order.
        let mut ordered = prop_names.to_vec();
        if !self.prop_order.is_empty() {
            let unlisted = self.prop_order.len();
            ordered.sort_by_key(|p| self.prop_order.get(*p).copied().unwrap_or(unlisted));
        }
        let required_props: Vec<&str> = ordered.iter().copied().filter(|p| required.contains(*p)).collect();
        let mut optional_props: Vec<&str> = ordered.iter().copied().filter(|p| !required.contains(*p)).collect();
        if let Some(kv) = additional_kv {
            kv_rules.insert("*".to_owned(), kv);
            optional_props.push("*");
        }

        let kv_of = |key: &str| kv_rules.get(key).cloned().unwrap_or_default();
        let mut rule = String::from("\"{\" space ");
        rule.push_str(&required_props.iter().map(|k| kv_of(k)).collect::<Vec<_>>().join(" \",\" space "));

        if !optional_props.is_empty() {
            rule.push_str(" (");
            if !required_props.is_empty() {
                rule.push_str(" \",\" space ( ");
            }
            // rest[j]: the rule for "any in-order subset of optional_props[j+1..], each after a
            // comma", named after optional_props[j]. Built from the end, which is also the order
            // llama.cpp adds them in.
            let n = optional_props.len();
            let mut rest = vec![String::new(); n];
            for j in (0..n.saturating_sub(1)).rev() {
                let next = optional_props[j + 1];
                let mut body = format!("( \",\" space {} ){}", kv_of(next), if next == "*" { "*" } else { "?" });
                if j + 2 < n {
                    body.push(' ');
                    body.push_str(&rest[j + 1]);
                }
                rest[j] = self.add_rule(&format!("{}-rest", child_name(name, optional_props[j])), &body);
            }
            let alternatives: Vec<String> = optional_props
                .iter()
                .enumerate()
                .map(|(i, &key)| {
                    let kv = kv_of(key);
                    let mut alt = if key == "*" { format!("{kv} ( \",\" space {kv} )*") } else { kv };
                    if i + 1 < n {
                        alt.push(' ');
                        alt.push_str(&rest[i]);
                    }
                    alt
                })
                .collect();
            rule.push_str(&alternatives.join(" | "));
            if !required_props.is_empty() {
                rule.push_str(" )");
            }
            rule.push_str(" )?");
        }
        rule.push_str(" \"}\" space");
        rule
    }

    /// A JSON string rule that matches any string except the given ones, from a trie of them:
    /// `["] ( [a] char+ | [^"a] char* )? ["] space` for `["a"]`.
    fn not_strings(&mut self, strings: &[&str]) -> Result<String> {
        let char_rule = self.add_primitive("char", "char")?;
        let trie = Trie::new(strings);

        enum Step {
            Node(usize),
            Text(String),
        }
        let mut out = String::from("[\"] ( ");
        let mut stack = vec![Step::Node(0)];
        while let Some(step) = stack.pop() {
            let node = match step {
                Step::Text(text) => {
                    out.push_str(&text);
                    continue;
                }
                Step::Node(node) => node,
            };
            // The node's output, as steps, pushed in reverse so they pop in order.
            let mut steps: Vec<Step> = Vec::new();
            let children = &trie.nodes[node].children;
            let mut rejects = String::new();
            for (i, (&c, &child)) in children.iter().enumerate() {
                let mut text = String::new();
                if i > 0 {
                    text.push_str(" | ");
                }
                text.push('[');
                class_char(c, true, true, &mut text);
                text.push(']');
                rejects.push(c);
                if !trie.nodes[child].children.is_empty() {
                    text.push_str(" (");
                    steps.push(Step::Text(text));
                    steps.push(Step::Node(child));
                    steps.push(Step::Text(")".to_owned()));
                } else {
                    if trie.nodes[child].end {
                        text.push_str(&format!(" {char_rule}+"));
                    }
                    steps.push(Step::Text(text));
                }
            }
            if !children.is_empty() {
                let mut text = String::from(" | [^\"");
                let count = rejects.chars().count();
                for (i, c) in rejects.chars().enumerate() {
                    class_char(c, false, i + 1 == count, &mut text);
                }
                text.push_str(&format!("] {char_rule}*"));
                steps.push(Step::Text(text));
            }
            stack.extend(steps.into_iter().rev());
        }
        out.push_str(" )");
        if !trie.nodes[0].end {
            out.push('?');
        }
        out.push_str(" [\"] space");
        Ok(out)
    }
}

/// Which rule a schema becomes, decided in llama.cpp's order of checks.
enum Shape<'s> {
    /// `$ref`.
    Ref(&'s str),
    /// `oneOf` / `anyOf` (`oneOf` first).
    Union(&'s [Json]),
    /// `type` is a list.
    TypeUnion(&'s [Json]),
    Const(&'s Json),
    Enum(&'s Json),
    /// `properties`, or `additionalProperties` other than `true`.
    Object,
    AllOf,
    /// `items`, else `prefixItems`.
    Array(&'s Json),
    Pattern(&'s str),
    /// `format: uuid`… (the format names the rule).
    Uuid(&'s str),
    /// `format: date|time|date-time`: the `<format>-string` rule.
    Format(&'static str, Builtin),
    /// `type: string` with `minLength`/`maxLength`.
    BoundedString,
    /// `type: integer` with bounds.
    BoundedInteger,
    /// `object` for `{}` and `type: object`, `value` for annotations only: `name ::= kind`.
    Primitive(&'static str),
    /// Any other primitive `type`: the rule is named after the type.
    Named(&'s str),
}

#[inline(never)]
fn classify(schema: &Json) -> Result<Shape<'_>> {
    let schema_type = schema.get("type").unwrap_or(&Json::Null);
    let format = match schema.get("format") {
        None => "",
        Some(Json::Str(format)) => format.as_str(),
        Some(other) => {
            return Err(Error::schema(format!("\"format\" must be a string, not {}", other.type_name())));
        }
    };
    let untyped = matches!(schema_type, Json::Null);
    let is_type = |t: &str| schema_type.as_str() == Some(t);

    if let Some(reference) = schema.get("$ref") {
        return Ok(Shape::Ref(ref_string(reference)?));
    }
    if schema.contains("oneOf") || schema.contains("anyOf") {
        let key = if schema.contains("oneOf") { "oneOf" } else { "anyOf" };
        return match schema.get(key) {
            Some(Json::Array(alternatives)) => Ok(Shape::Union(alternatives)),
            _ => Err(Error::schema(format!("\"{key}\" must be an array"))),
        };
    }
    if let Json::Array(types) = schema_type {
        return Ok(Shape::TypeUnion(types));
    }
    if let Some(value) = schema.get("const") {
        return Ok(Shape::Const(value));
    }
    if let Some(values) = schema.get("enum") {
        return Ok(Shape::Enum(values));
    }
    if (untyped || is_type("object"))
        && (schema.contains("properties") || schema.get("additionalProperties").is_some_and(|a| *a != Json::Bool(true)))
    {
        return Ok(Shape::Object);
    }
    if (untyped || is_type("object") || is_type("string")) && schema.contains("allOf") {
        return Ok(Shape::AllOf);
    }
    if untyped || is_type("array") {
        if let Some(items) = schema.get("items").or_else(|| schema.get("prefixItems")) {
            return Ok(Shape::Array(items));
        }
    }
    if untyped || is_type("string") {
        match schema.get("pattern") {
            Some(Json::Str(pattern)) => return Ok(Shape::Pattern(pattern)),
            Some(_) => return Err(Error::schema("\"pattern\" must be a string")),
            None => {}
        }
        if is_uuid_format(format) {
            return Ok(Shape::Uuid(format));
        }
        for name in ["date-string", "time-string", "date-time-string"] {
            if name.strip_suffix("-string") == Some(format) {
                if let Some(rule) = string_format(name) {
                    return Ok(Shape::Format(name, rule));
                }
            }
        }
    }
    if is_type("string") && (schema.contains("minLength") || schema.contains("maxLength")) {
        return Ok(Shape::BoundedString);
    }
    if is_type("integer")
        && ["minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"].iter().any(|k| schema.contains(k))
    {
        return Ok(Shape::BoundedInteger);
    }
    if schema.is_empty_like() || is_type("object") {
        return Ok(Shape::Primitive("object"));
    }
    if untyped && schema.as_object().is_some() {
        // Only annotations such as "description": like {}, any JSON value.
        return Ok(Shape::Primitive("value"));
    }
    match schema_type.as_str() {
        Some(kind) if primitive(kind).is_some() => Ok(Shape::Named(kind)),
        _ => Err(Error::schema(format!("unrecognized schema: {}", schema.dump_short(200)))),
    }
}

/// The schema once per entry of its `type` list, with `type` set to that entry.
#[inline(never)]
fn type_variants(schema: &Json, types: &[Json]) -> Vec<Json> {
    types
        .iter()
        .map(|t| {
            let mut variant = schema.clone();
            if let Json::Object(object) = &mut variant {
                object.insert("type".to_owned(), t.clone());
            }
            variant
        })
        .collect()
}

/// `properties` (as nlohmann's `items()` lists them) and the string entries of `required`.
#[inline(never)]
fn object_parts(schema: &Json) -> (Vec<(String, Json)>, HashSet<String>) {
    let mut required = HashSet::new();
    if let Some(Json::Array(names)) = schema.get("required") {
        required.extend(names.iter().filter_map(Json::as_str).map(str::to_owned));
    }
    let properties = schema
        .get("properties")
        .map(|p| p.items().into_iter().map(|(k, v)| (k, v.clone())).collect())
        .unwrap_or_default();
    (properties, required)
}

#[inline(never)]
fn tuple_body(parts: &[String]) -> String {
    format!("\"[\" space {} \"]\" space", parts.join(" \",\" space "))
}

/// What the parts of an `allOf` add up to.
#[derive(Default)]
struct Merged {
    properties: Vec<(String, Json)>,
    required: HashSet<String>,
    /// How many parts list each enum value, by its GBNF literal (sorted, as llama.cpp
    /// prints the common ones).
    enum_counts: BTreeMap<String, usize>,
}

/// A trie of strings by character, in an arena (no recursion to build or drop it).
struct Trie {
    nodes: Vec<TrieNode>,
}

#[derive(Default)]
struct TrieNode {
    children: BTreeMap<char, usize>,
    end: bool,
}

impl Trie {
    fn new(strings: &[&str]) -> Trie {
        let mut nodes = vec![TrieNode::default()];
        for s in strings {
            let mut node = 0;
            for c in s.chars() {
                node = match nodes[node].children.get(&c) {
                    Some(&child) => child,
                    None => {
                        let child = nodes.len();
                        nodes.push(TrieNode::default());
                        nodes[node].children.insert(c, child);
                        child
                    }
                };
            }
            nodes[node].end = true;
        }
        Trie { nodes }
    }
}

fn ref_string(reference: &Json) -> Result<&str> {
    reference.as_str().ok_or_else(|| Error::schema(format!("\"$ref\" must be a string, not {}", reference.type_name())))
}

/// An array index in a `$ref`, read like C's `strtoull` (leading blanks and digits).
fn array_index(selector: &str) -> Option<usize> {
    let s = selector.trim_start_matches([' ', '\t', '\n', '\r', '\x0B', '\x0C']);
    let s = s.strip_prefix('+').unwrap_or(s);
    let digits = &s[..s.bytes().take_while(u8::is_ascii_digit).count()];
    digits.parse().ok()
}

/// Moves every `$defs` found below the top into the top-level `$defs` (the first definition
/// of a name wins), as llama.cpp does before resolving refs, so `#/$defs/x` finds
/// definitions that sit next to the property using them.
fn hoist_defs(root: &mut Json) -> Result<()> {
    let Json::Object(_) = root else {
        return Ok(());
    };
    let mut collected = JsonObject::default();
    collect_defs(root, &mut collected);
    if collected.is_empty() {
        return Ok(());
    }
    let Json::Object(top) = root else {
        return Ok(());
    };
    match top.get_mut("$defs") {
        None => top.insert("$defs".to_owned(), Json::Object(JsonObject::default())),
        Some(defs @ Json::Null) => *defs = Json::Object(JsonObject::default()),
        Some(Json::Object(_)) => {}
        Some(other) => {
            return Err(Error::schema(format!("\"$defs\" must be an object, not {}", other.type_name())));
        }
    }
    if let Some(Json::Object(defs)) = top.get_mut("$defs") {
        for (name, schema) in collected.iter() {
            if !defs.contains(name) {
                defs.insert(name.clone(), schema.clone());
            }
        }
    }
    Ok(())
}

fn collect_defs(node: &mut Json, collected: &mut JsonObject) {
    let Json::Object(object) = node else {
        return;
    };
    if matches!(object.get("$defs"), Some(Json::Object(_))) {
        if let Some(Json::Object(defs)) = object.remove("$defs") {
            for (name, schema) in defs.iter() {
                if !collected.contains(name) {
                    collected.insert(name.clone(), schema.clone());
                }
            }
        }
    }
    for value in object.values_mut() {
        match value {
            Json::Object(_) => collect_defs(value, collected),
            Json::Array(items) => {
                for item in items.iter_mut().filter(|item| matches!(item, Json::Object(_))) {
                    collect_defs(item, collected);
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sanitizes_runs() {
        assert_eq!(sanitize("a_b"), "a-b");
        assert_eq!(sanitize("a  b"), "a-b");
        assert_eq!(sanitize("héllo wörld"), "h-llo-w-rld");
        assert_eq!(sanitize("/definitions/foo"), "-definitions-foo");
    }

    #[test]
    fn uuid_formats() {
        assert!(is_uuid_format("uuid"));
        assert!(is_uuid_format("uuid4"));
        assert!(!is_uuid_format("uuid6"));
        assert!(!is_uuid_format("uuid44"));
        assert!(!is_uuid_format("xuuid"));
    }

    #[test]
    fn array_indices() {
        assert_eq!(array_index("0"), Some(0));
        assert_eq!(array_index("12"), Some(12));
        assert_eq!(array_index("x"), None);
        assert_eq!(array_index("-1"), None);
    }
}
