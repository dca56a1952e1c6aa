//! An order-preserving JSON tree for the converter.
//!
//! llama.cpp reads schemas with `nlohmann::ordered_json`, so object keys keep the order they
//! have in the document, and that order decides the order of properties in the grammar.
//! `serde_json::Value` sorts keys unless serde_json's `preserve_order` feature is enabled, so
//! the converter works on this small tree instead. [`Json::parse`] reads text in document
//! order whatever serde_json's features; [`Json::from_value`] takes the keys in whatever order
//! the `Value` iterates them.
//!
//! [`Json::dump`] writes compact JSON the way nlohmann's `dump()` does: the converter embeds
//! `const` and `enum` values in the grammar as their JSON text, so the spelling of numbers
//! matters (`1e+20`, `100.0`, `0.0001`).

use std::collections::HashMap;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

use crate::error::{Error, Result};

/// How deeply a schema may nest before it is refused: objects and arrays in the JSON, schemas
/// inside schemas (`$ref` and `allOf` chains included) and groups in a `pattern`. The walks
/// over these are recursive; 256 levels keep them within about 1 MiB of stack even in
/// unoptimised builds, so a conversion is safe on a 2 MiB thread.
pub(crate) const MAX_NESTING: usize = 256;

/// A JSON value whose objects keep their keys in insertion order.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Json {
    Null,
    Bool(bool),
    /// A negative integer (non-negative integers are always [`Json::UInt`]).
    Int(i64),
    UInt(u64),
    Float(f64),
    Str(String),
    Array(Vec<Json>),
    Object(JsonObject),
}

/// A JSON object: entries in insertion order plus an index by key.
#[derive(Clone, Debug, Default)]
pub(crate) struct JsonObject {
    entries: Vec<(String, Json)>,
    index: HashMap<String, usize>,
}

impl PartialEq for JsonObject {
    fn eq(&self, other: &Self) -> bool {
        self.entries == other.entries
    }
}

impl JsonObject {
    /// The value under `key`.
    pub(crate) fn get(&self, key: &str) -> Option<&Json> {
        self.index.get(key).and_then(|&i| self.entries.get(i)).map(|(_, v)| v)
    }

    /// The value under `key`, mutably.
    pub(crate) fn get_mut(&mut self, key: &str) -> Option<&mut Json> {
        match self.index.get(key) {
            Some(&i) => self.entries.get_mut(i).map(|(_, v)| v),
            None => None,
        }
    }

    /// Whether `key` is present.
    pub(crate) fn contains(&self, key: &str) -> bool {
        self.index.contains_key(key)
    }

    /// Sets `key` to `value`. A new key goes last; an existing key keeps its position (as
    /// nlohmann's `operator[]` does, so with duplicate keys in a document the last value wins).
    pub(crate) fn insert(&mut self, key: String, value: Json) {
        match self.index.get(&key) {
            Some(&i) => {
                if let Some(slot) = self.entries.get_mut(i) {
                    slot.1 = value;
                }
            }
            None => {
                self.index.insert(key.clone(), self.entries.len());
                self.entries.push((key, value));
            }
        }
    }

    /// Removes `key`, returning its value.
    pub(crate) fn remove(&mut self, key: &str) -> Option<Json> {
        let i = self.index.remove(key)?;
        let (_, value) = self.entries.remove(i);
        for slot in self.index.values_mut() {
            if *slot > i {
                *slot -= 1;
            }
        }
        Some(value)
    }

    /// Entries in order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&String, &Json)> {
        self.entries.iter().map(|(k, v)| (k, v))
    }

    /// Values in order, mutably.
    pub(crate) fn values_mut(&mut self) -> impl Iterator<Item = &mut Json> {
        self.entries.iter_mut().map(|(_, v)| v)
    }

    /// Number of entries.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are no entries.
    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

impl Json {
    /// Parses JSON text, keeping object keys in document order.
    pub(crate) fn parse(text: &str) -> Result<Json> {
        let mut de = serde_json::Deserializer::from_str(text);
        let value = Json::deserialize(&mut de).map_err(|e| parse_error(&e))?;
        de.end().map_err(|e| parse_error(&e))?;
        check_depth(&value, 0)?;
        Ok(value)
    }

    /// Converts a `serde_json::Value`, refusing nesting deeper than [`MAX_NESTING`].
    pub(crate) fn from_value(value: &serde_json::Value) -> Result<Json> {
        from_value_at(value, 0)
    }

    /// The object, if this is one.
    pub(crate) fn as_object(&self) -> Option<&JsonObject> {
        match self {
            Json::Object(o) => Some(o),
            _ => None,
        }
    }

    /// The string, if this is one.
    pub(crate) fn as_str(&self) -> Option<&str> {
        match self {
            Json::Str(s) => Some(s),
            _ => None,
        }
    }

    /// `self[key]` for objects; `None` for a missing key or a value that is not an object
    /// (nlohmann's `contains` is false for non-objects).
    pub(crate) fn get(&self, key: &str) -> Option<&Json> {
        self.as_object().and_then(|o| o.get(key))
    }

    /// nlohmann's `contains(key)`.
    pub(crate) fn contains(&self, key: &str) -> bool {
        self.as_object().is_some_and(|o| o.contains(key))
    }

    /// nlohmann's `empty()`: true for null and for an empty array or object.
    pub(crate) fn is_empty_like(&self) -> bool {
        match self {
            Json::Null => true,
            Json::Array(a) => a.is_empty(),
            Json::Object(o) => o.is_empty(),
            _ => false,
        }
    }

    /// nlohmann's `size()`: 0 for null, the length of an array or object, 1 otherwise.
    pub(crate) fn size_like(&self) -> usize {
        match self {
            Json::Null => 0,
            Json::Array(a) => a.len(),
            Json::Object(o) => o.len(),
            _ => 1,
        }
    }

    /// What a range-for over an nlohmann value visits: nothing for null, the elements of an
    /// array, the values of an object, and the value itself for anything else.
    pub(crate) fn elements(&self) -> Vec<&Json> {
        match self {
            Json::Null => Vec::new(),
            Json::Array(a) => a.iter().collect(),
            Json::Object(o) => o.iter().map(|(_, v)| v).collect(),
            other => vec![other],
        }
    }

    /// What nlohmann's `items()` visits: `(key, value)` for objects, `(index, element)` for
    /// arrays, nothing for null and `("", value)` for anything else.
    pub(crate) fn items(&self) -> Vec<(String, &Json)> {
        match self {
            Json::Null => Vec::new(),
            Json::Array(a) => a.iter().enumerate().map(|(i, v)| (i.to_string(), v)).collect(),
            Json::Object(o) => o.iter().map(|(k, v)| (k.clone(), v)).collect(),
            other => vec![(String::new(), other)],
        }
    }

    /// A short name for the value's type, for error messages.
    pub(crate) fn type_name(&self) -> &'static str {
        match self {
            Json::Null => "null",
            Json::Bool(_) => "boolean",
            Json::Int(_) | Json::UInt(_) | Json::Float(_) => "number",
            Json::Str(_) => "string",
            Json::Array(_) => "array",
            Json::Object(_) => "object",
        }
    }

    /// Compact JSON text as nlohmann's `dump()` writes it.
    pub(crate) fn dump(&self) -> String {
        let mut out = String::new();
        self.dump_into(&mut out);
        out
    }

    /// [`Json::dump`], cut to about `max` characters for error messages.
    pub(crate) fn dump_short(&self, max: usize) -> String {
        let text = self.dump();
        if text.chars().count() <= max {
            return text;
        }
        let mut cut: String = text.chars().take(max).collect();
        cut.push_str("...");
        cut
    }

    fn dump_into(&self, out: &mut String) {
        match self {
            Json::Null => out.push_str("null"),
            Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Json::Int(i) => out.push_str(&i.to_string()),
            Json::UInt(u) => out.push_str(&u.to_string()),
            Json::Float(f) => dump_float(*f, out),
            Json::Str(s) => dump_string(s, out),
            Json::Array(a) => {
                out.push('[');
                for (i, v) in a.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    v.dump_into(out);
                }
                out.push(']');
            }
            Json::Object(o) => {
                out.push('{');
                for (i, (k, v)) in o.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    dump_string(k, out);
                    out.push(':');
                    v.dump_into(out);
                }
                out.push('}');
            }
        }
    }
}

/// The error for JSON text serde_json cannot read.
pub(crate) fn parse_error(e: &serde_json::Error) -> Error {
    if e.to_string().contains("recursion limit") {
        Error::schema(format!("malformed JSON schema: nested more than 128 levels deep ({e})"))
    } else {
        Error::schema(format!("malformed JSON schema: {e}"))
    }
}

fn check_depth(value: &Json, depth: usize) -> Result<()> {
    if depth > MAX_NESTING {
        return Err(too_deep());
    }
    match value {
        Json::Array(a) => a.iter().try_for_each(|v| check_depth(v, depth + 1)),
        Json::Object(o) => o.iter().try_for_each(|(_, v)| check_depth(v, depth + 1)),
        _ => Ok(()),
    }
}

fn too_deep() -> Error {
    Error::schema(format!("JSON schema nests deeper than {MAX_NESTING} levels"))
}

fn from_value_at(value: &serde_json::Value, depth: usize) -> Result<Json> {
    use serde_json::Value;
    if depth > MAX_NESTING {
        return Err(too_deep());
    }
    Ok(match value {
        Value::Null => Json::Null,
        Value::Bool(b) => Json::Bool(*b),
        Value::Number(n) => {
            if let Some(u) = n.as_u64() {
                Json::UInt(u)
            } else if let Some(i) = n.as_i64() {
                Json::Int(i)
            } else {
                Json::Float(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        Value::String(s) => Json::Str(s.clone()),
        Value::Array(a) => Json::Array(a.iter().map(|v| from_value_at(v, depth + 1)).collect::<Result<_>>()?),
        Value::Object(m) => {
            let mut o = JsonObject::default();
            for (k, v) in m {
                o.insert(k.clone(), from_value_at(v, depth + 1)?);
            }
            Json::Object(o)
        }
    })
}

/// Writes a JSON string literal with the escapes nlohmann (and serde_json) use: `\"`, `\\`,
/// `\b`, `\f`, `\n`, `\r`, `\t`, `\u00xx` (lower-case hex) for other control characters, and
/// everything else (DEL and non-ASCII included) as is.
fn dump_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0C}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Writes a double the way nlohmann's `dump()` does: the shortest digits that read back
/// exactly, as `123.0`, `1.5`, `0.001` when the decimal point falls within 15 digits (or at
/// most 3 zeros after it), and as `1e+20`, `1.5e-05` otherwise. Non-finite values are `null`.
fn dump_float(x: f64, out: &mut String) {
    if !x.is_finite() {
        out.push_str("null");
        return;
    }
    if x == 0.0 {
        out.push_str(if x.is_sign_negative() { "-0.0" } else { "0.0" });
        return;
    }
    if x < 0.0 {
        out.push('-');
    }
    // Rust's `{:e}` gives the shortest round-trip digits: "1.2345e-5", "1e20".
    let sci = format!("{:e}", x.abs());
    let (mantissa, exponent) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exponent: i64 = exponent.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(|c| c.is_ascii_digit()).collect();
    let k = digits.len() as i64;
    // The decimal point sits after `n` digits.
    let n = exponent + 1;
    const MIN_EXP: i64 = -4;
    const MAX_EXP: i64 = 15;
    if k <= n && n <= MAX_EXP {
        out.push_str(&digits);
        out.extend(std::iter::repeat_n('0', (n - k) as usize));
        out.push_str(".0");
    } else if 0 < n && n <= MAX_EXP {
        let (int_part, frac) = digits.split_at(n as usize);
        out.push_str(int_part);
        out.push('.');
        out.push_str(frac);
    } else if MIN_EXP < n && n <= 0 {
        out.push_str("0.");
        out.extend(std::iter::repeat_n('0', (-n) as usize));
        out.push_str(&digits);
    } else {
        let (first, rest) = digits.split_at(1);
        out.push_str(first);
        if !rest.is_empty() {
            out.push('.');
            out.push_str(rest);
        }
        out.push('e');
        let e = n - 1;
        out.push(if e < 0 { '-' } else { '+' });
        out.push_str(&format!("{:02}", e.abs()));
    }
}

impl<'de> Deserialize<'de> for Json {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Json, D::Error> {
        deserializer.deserialize_any(JsonVisitor)
    }
}

struct JsonVisitor;

impl<'de> Visitor<'de> for JsonVisitor {
    type Value = Json;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> std::result::Result<Json, E> {
        Ok(Json::Bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> std::result::Result<Json, E> {
        Ok(if v >= 0 { Json::UInt(v as u64) } else { Json::Int(v) })
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> std::result::Result<Json, E> {
        Ok(Json::UInt(v))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> std::result::Result<Json, E> {
        Ok(Json::Float(v))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<Json, E> {
        Ok(Json::Str(v.to_owned()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> std::result::Result<Json, E> {
        Ok(Json::Str(v))
    }

    fn visit_unit<E: de::Error>(self) -> std::result::Result<Json, E> {
        Ok(Json::Null)
    }

    fn visit_none<E: de::Error>(self) -> std::result::Result<Json, E> {
        Ok(Json::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> std::result::Result<Json, D::Error> {
        Json::deserialize(deserializer)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<Json, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<Json>()? {
            items.push(item);
        }
        Ok(Json::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<Json, A::Error> {
        let mut object = JsonObject::default();
        while let Some((key, value)) = map.next_entry::<String, Json>()? {
            object.insert(key, value);
        }
        Ok(Json::Object(object))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_document_order() {
        let j = Json::parse(r#"{"b": 1, "a": 2, "c": {"z": null, "y": true}}"#).unwrap();
        assert_eq!(j.dump(), r#"{"b":1,"a":2,"c":{"z":null,"y":true}}"#);
    }

    #[test]
    fn duplicate_keys_keep_first_position_last_value() {
        let j = Json::parse(r#"{"a": 1, "b": 2, "a": 3}"#).unwrap();
        assert_eq!(j.dump(), r#"{"a":3,"b":2}"#);
    }

    #[test]
    fn floats_dump_like_nlohmann() {
        let cases = [
            ("1.5", "1.5"),
            ("100.0", "100.0"),
            ("1e15", "1e+15"),
            ("1e14", "100000000000000.0"),
            ("0.0001", "0.0001"),
            ("0.00001", "1e-05"),
            ("-2.5e-7", "-2.5e-07"),
            ("1.25e100", "1.25e+100"),
            ("123456.789", "123456.789"),
            ("0.0", "0.0"),
            ("100000000000000000000", "1e+20"),
            ("-7", "-7"),
            ("18446744073709551615", "18446744073709551615"),
        ];
        for (text, want) in cases {
            assert_eq!(Json::parse(text).unwrap().dump(), want, "{text}");
        }
    }

    #[test]
    fn strings_dump_like_nlohmann() {
        let j = Json::Str("a\"b\\c\n\t\u{1}\u{7f}é".to_owned());
        assert_eq!(j.dump(), "\"a\\\"b\\\\c\\n\\t\\u0001\u{7f}é\"");
    }

    #[test]
    fn remove_reindexes() {
        let mut o = JsonObject::default();
        o.insert("a".into(), Json::Null);
        o.insert("b".into(), Json::Bool(true));
        o.insert("c".into(), Json::UInt(1));
        assert_eq!(o.remove("a"), Some(Json::Null));
        assert_eq!(o.get("c"), Some(&Json::UInt(1)));
        assert_eq!(o.get("b"), Some(&Json::Bool(true)));
        assert!(!o.contains("a"));
    }

    #[test]
    fn value_conversion_is_depth_limited() {
        let mut v = serde_json::Value::Null;
        for _ in 0..(MAX_NESTING + 5) {
            v = serde_json::Value::Array(vec![v]);
        }
        let err = Json::from_value(&v).unwrap_err();
        assert!(err.message().contains("deeper"), "{err}");
    }
}
