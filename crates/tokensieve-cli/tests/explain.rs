//! `tokensieve explain`: the table's numbers, and the funnel SVG (valid XML, one band per stage).

use npyz::WriterBuilder;
use std::path::{Path, PathBuf};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_tokensieve");

struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Dir {
        let d = std::env::temp_dir().join(format!("tokensieve-explain-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Dir(d)
    }
    fn s(&self, file: &str) -> String {
        self.0.join(file).to_str().unwrap().to_string()
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn write_npy(path: &str, shape: &[u64], data: &[f32]) {
    let mut buf = Vec::new();
    let mut w = npyz::WriteOptions::<f32>::new().default_dtype().shape(shape).writer(&mut buf).begin_nd().unwrap();
    w.extend(data.iter().copied()).unwrap();
    w.finish().unwrap();
    std::fs::write(path, buf).unwrap();
}

fn run(args: &[&str]) -> (i32, String, String) {
    let o = Command::new(BIN).args(args).output().unwrap();
    (o.status.code().unwrap_or(-1), String::from_utf8(o.stdout).unwrap(), String::from_utf8(o.stderr).unwrap())
}

fn ok(args: &[&str]) -> String {
    let (code, out, err) = run(args);
    assert_eq!(code, 0, "{args:?}: {err}");
    out
}

fn fails(args: &[&str], needle: &str) {
    let (code, _, err) = run(args);
    assert_eq!(code, 2, "{args:?}: {err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("error: ") && err.contains(needle), "{args:?}: `{err}` lacks `{needle}`");
}

/// The table's stage lines: those that start with a stage number.
fn stage_lines(table: &str) -> Vec<Vec<String>> {
    table
        .lines()
        .filter(|l| l.split_whitespace().next().is_some_and(|w| w.parse::<usize>().is_ok()))
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .collect()
}

const ROW: [f32; 5] = [1.0, 4.0, 3.5, 0.2, -2.0];

fn softmax(row: &[f32]) -> Vec<f64> {
    let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let e: Vec<f64> = row.iter().map(|&v| (v as f64 - m).exp()).collect();
    let s: f64 = e.iter().sum();
    e.iter().map(|x| x / s).collect()
}

#[test]
fn the_table_reports_counts_mass_and_entropy_per_stage() {
    let d = Dir::new("table");
    write_npy(&d.s("row.npy"), &[5], &ROW);
    let out = ok(&["explain", "--chain", "top_k(3);min_p(0.3);temperature(0.5);greedy", "--logits", &d.s("row.npy")]);
    let lines = stage_lines(&out);
    assert_eq!(lines.len(), 4, "{out}");
    // top_k(3): 5 -> 3, keeps the mass of ids 1, 2, 0.
    let p = softmax(&ROW);
    assert_eq!(&lines[0][1..5], ["top_k(3)", "5", "→", "3"], "{out}");
    let kept: f64 = lines[0][5].trim_end_matches('%').parse().unwrap();
    assert!((kept - 100.0 * (p[0] + p[1] + p[2])).abs() < 0.006, "{kept} {out}");
    // min_p(0.3): keeps logits >= 4 + ln 0.3 = 2.796: ids 1 and 2.
    assert_eq!(&lines[1][1..5], ["min_p(0.3)", "3", "→", "2"], "{out}");
    let p3 = softmax(&ROW[..3]);
    let kept: f64 = lines[1][5].trim_end_matches('%').parse().unwrap();
    assert!((kept - 100.0 * (p3[1] + p3[2])).abs() < 0.006, "{kept} {out}");
    // temperature keeps everything; entropy drops.
    assert_eq!(&lines[2][1..6], ["temperature(0.5)", "2", "→", "2", "100.00%"], "{out}");
    let entropy = |l: &[String]| -> f64 { l[6].parse().unwrap() };
    assert!(entropy(&lines[2]) < entropy(&lines[1]));
    let p2 = softmax(&[4.0 / 0.5, 3.5 / 0.5]);
    let h: f64 = -p2.iter().map(|p| p * p.log2()).sum::<f64>();
    assert!((entropy(&lines[2]) - h).abs() < 0.006, "{out}");
    assert!(out.contains("selected: #1 (id 1)"), "{out}");
    // Top tokens with probabilities before -> after.
    assert!(out.contains(&format!("#1 {:.3}→{:.3}", p3[1], p3[1] / (p3[1] + p3[2]))), "{out}");
}

#[test]
fn the_example_row_explains_llama_cpp_s_default_chain() {
    let out = ok(&["explain", "--example"]);
    let lines = stage_lines(&out);
    assert_eq!(lines.len(), 10, "{out}");
    assert_eq!(lines[0][1], "penalties(64,1,0,0)");
    assert!(out.contains("(no-op)"), "inert stages are marked: {out}");
    assert!(out.contains("selected: #7042 (id 7042)"), "{out}");
    assert!(out.contains("input") && out.contains("49152"), "{out}");
}

#[test]
fn params_bodies_are_labelled_with_their_chain() {
    let d = Dir::new("params");
    std::fs::write(d.s("body.json"), r#"{"temperature": 0.7, "top_k": 3, "seed": 1}"#).unwrap();
    let out = ok(&["explain", "--params", &d.s("body.json"), "--example", "--top", "2"]);
    assert!(out.contains("chain:   penalties(64,1,0,0);"), "{out}");
    let lines = stage_lines(&out);
    assert_eq!(lines[3][1..5], ["top_k(3)", "49152", "→", "3"], "{out}");
}

#[test]
fn rows_of_a_batch_and_bad_input() {
    let d = Dir::new("rows");
    write_npy(&d.s("b.npy"), &[2, 3], &[0.0, 1.0, 2.0, 2.0, 1.0, 0.0]);
    let out = ok(&["explain", "--chain", "greedy", "--logits", &d.s("b.npy"), "--row", "1"]);
    assert!(out.contains("row 1 of") && out.contains("selected: #0 (id 0)"), "{out}");
    fails(&["explain", "--chain", "greedy", "--logits", &d.s("b.npy"), "--row", "2"], "--row 2");
    fails(&["explain", "--chain", "greedy"], "--logits");
    fails(&["explain", "--chain", "top_k(x);greedy", "--example"], "--chain");
}

fn svg_of(args: &[&str]) -> (String, String) {
    let d = Dir::new(&format!("svg-{}", args.len()));
    let path = d.s("funnel.svg");
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["--svg", &path]);
    let table = ok(&all);
    (std::fs::read_to_string(&path).unwrap(), table)
}

#[test]
fn the_svg_is_xml_with_one_band_per_stage() {
    let (svg, table) = svg_of(&["explain", "--example"]);
    let doc = roxmltree::Document::parse(&svg).unwrap_or_else(|e| panic!("invalid XML: {e}\n{svg}"));
    let root = doc.root_element();
    assert_eq!(root.tag_name().name(), "svg");
    assert_eq!(root.tag_name().namespace(), Some("http://www.w3.org/2000/svg"));
    let bands: Vec<_> = doc.descendants().filter(|n| n.attribute("class") == Some("band")).collect();
    assert_eq!(bands.len(), stage_lines(&table).len());
    assert_eq!(bands.len(), 10);
    // Each band's rectangle is as wide as the log of what the stage kept: never wider than
    // the band before it, and the input is the widest.
    let width = |g: roxmltree::Node| -> f64 {
        g.children().find(|c| c.has_tag_name("rect")).unwrap().attribute("width").unwrap().parse().unwrap()
    };
    let input = doc.descendants().find(|n| n.attribute("class") == Some("input")).unwrap();
    let mut last = width(input);
    for (i, b) in bands.iter().enumerate() {
        assert_eq!(b.attribute("data-stage"), Some((i + 1).to_string().as_str()));
        let w = width(*b);
        assert!(w <= last + 1e-9, "band {i} is wider than the one before");
        last = w;
        let texts: String = b.descendants().filter(|n| n.is_text()).map(|n| n.text().unwrap()).collect();
        assert!(texts.contains("of the mass"), "band {i} has its mass kept labelled: {texts}");
    }
    assert!(svg.contains("#7042"), "top tokens are labelled");
}

#[test]
fn svg_text_is_escaped() {
    let d = Dir::new("escape");
    write_npy(&d.s("r<&>.npy"), &[3], &[0.0, 1.0, 2.0]);
    let path = d.s("f.svg");
    ok(&["explain", "--chain", "top_k(2);dist", "--logits", &d.s("r<&>.npy"), "--svg", &path]);
    let svg = std::fs::read_to_string(&path).unwrap();
    let doc = roxmltree::Document::parse(&svg).unwrap();
    assert_eq!(doc.descendants().filter(|n| n.attribute("class") == Some("band")).count(), 2);
    assert!(svg.contains("r&lt;&amp;&gt;.npy"));
    fails(&["explain", "--chain", "greedy", "--example", "--svg", "/nonexistent-dir/f.svg"], "--svg");
    let _ = Path::new(&path);
}
