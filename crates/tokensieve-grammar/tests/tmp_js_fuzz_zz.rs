use serde_json::{json, Value, Map};
use tokensieve_grammar::json_schema::{json_schema_to_gbnf, json_schema_str_to_gbnf, SchemaOptions};
struct R(u64);
impl R { fn n(&mut self, m: u64) -> u64 { self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407); (self.0 >> 33) % m } }
const KEYS: &[&str] = &["type","properties","required","additionalProperties","items","prefixItems","minItems","maxItems","minLength","maxLength","pattern","format","minimum","maximum","exclusiveMinimum","exclusiveMaximum","anyOf","oneOf","allOf","const","enum","$ref","$defs","definitions","a","b","","number","root","date_time"];
const STRS: &[&str] = &["string","object","array","integer","number","boolean","null","value","char","uuid","date","time","date-time","uuid4","^a(b|c)*[d-f]{2,3}.$","^(?:x)+$","^(?!a)b$","#/$defs/a","#/definitions/b","#/properties/a","#/$defs","a","b","kaboom","^\\d+$","^a{,3}$","^é+$","*","a]","-"];
fn gen(r: &mut R, d: u32) -> Value {
    match if d > 5 { r.n(5) } else { r.n(9) } {
        0 => Value::Null, 1 => json!(r.n(2) == 0), 2 => json!(r.n(40) as i64 - 20), 3 => json!((r.n(1000) as f64) / 7.0 - 50.0),
        4 => json!(STRS[r.n(STRS.len() as u64) as usize]),
        5 | 6 | 7 => { let mut m = Map::new(); for _ in 0..r.n(5) { m.insert(KEYS[r.n(KEYS.len() as u64) as usize].to_string(), gen(r, d+1)); } Value::Object(m) }
        _ => Value::Array((0..r.n(4)).map(|_| gen(r, d+1)).collect()),
    }
}
#[test]
fn fuzz() {
    let mut r = R(12345); let (mut ok, mut err) = (0, 0);
    let t = std::time::Instant::now();
    for i in 0..300000 {
        let v = gen(&mut r, 0);
        let res = std::panic::catch_unwind(|| json_schema_to_gbnf(&v));
        match res { Ok(Ok(_)) => ok += 1, Ok(Err(_)) => err += 1, Err(_) => panic!("panic on {i}: {v}") }
        let s = v.to_string();
        let o = SchemaOptions { dotall: true, prop_order: vec!["b".into()] };
        assert!(std::panic::catch_unwind(|| json_schema_str_to_gbnf(&s, &o)).is_ok(), "{s}");
    }
    eprintln!("ok {ok} err {err} in {:?}", t.elapsed());
}
#[test]
fn fuzz_patterns() {
    let alphabet: Vec<char> = "^$()[]{}|*+?.\\\"a1,:!=<é-".chars().collect();
    let mut r = R(777); let (mut ok, mut err) = (0, 0);
    for _ in 0..300000 {
        let len = r.n(12);
        let body: String = (0..len).map(|_| alphabet[r.n(alphabet.len() as u64) as usize]).collect();
        let p = if r.n(4) == 0 { body } else { format!("^{body}$") };
        let v = json!({"type": "string", "pattern": p});
        match std::panic::catch_unwind(|| json_schema_to_gbnf(&v)) { Ok(Ok(_)) => ok += 1, Ok(Err(_)) => err += 1, Err(_) => panic!("{p}") }
    }
    eprintln!("patterns ok {ok} err {err}");
}
fn deep(kind: u32, n: usize) -> Value {
    let mut v = json!({"type": "string"});
    for i in 0..n { v = match kind { 0 => json!({"items": v}), 1 => json!({"properties": {"a": v}, "required": ["a"]}), 2 => json!({"anyOf": [v]}), 3 => json!({"allOf": [{"anyOf": [v]}], "type": "object", "properties": {}}), _ => json!({"type": ["object"], "properties": {format!("p{i}"): v}}) }; }
    v
}
#[test]
fn stack_use() {
    let kind: u32 = std::env::var("KIND").unwrap().parse().unwrap();
    let stack_kb: usize = std::env::var("STACK").unwrap().parse().unwrap();
    let n: usize = std::env::var("N").unwrap().parse().unwrap();
    let v = deep(kind, n);
    let r = std::thread::Builder::new().stack_size(stack_kb * 1024).spawn(move || json_schema_to_gbnf(&v).map(|_| ()).map_err(|e| e.to_string())).unwrap().join().unwrap();
    eprintln!("RESULT kind {kind} n {n} stack {stack_kb}: {:?}", r.map_err(|e| e.chars().take(60).collect::<String>()));
}
