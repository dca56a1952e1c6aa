//! `tokensieve generate` and `explain --prompt`: on a tiny random-weight llama model written by
//! the test itself (loading, tokenization, generation in seconds), and on the real default
//! model (SmolLM2-135M-Instruct) when `shared/data/models/` has it: skipped with a message
//! otherwise, a failure when TOKENSIEVE_REQUIRE_GOLDENS=1 (CI). The README's first command runs
//! here too.
#![cfg(feature = "model")]

use std::path::{Path, PathBuf};
use std::process::Command;
use tokensieve_testkit::golden::{goldens_required, shared_dir};

const BIN: &str = env!("CARGO_BIN_EXE_tokensieve");
const DEFAULT_MODEL: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Dir {
        let d = std::env::temp_dir().join(format!("tokensieve-generate-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Dir(d)
    }
    fn s(&self, file: &str) -> String {
        self.0.join(file).to_str().unwrap().to_string()
    }
    /// Writes the tiny model and returns its path.
    fn tiny(&self) -> String {
        let path = self.s("tiny.gguf");
        std::fs::write(&path, tokensieve_testkit::gguf::tiny_llama(7)).unwrap();
        path
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

fn run_in(args: &[&str], configure: impl FnOnce(&mut Command)) -> Out {
    let mut cmd = Command::new(BIN);
    cmd.args(args);
    configure(&mut cmd);
    let o = cmd.output().unwrap();
    Out {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8(o.stdout).unwrap(),
        stderr: String::from_utf8(o.stderr).unwrap(),
    }
}

fn run(args: &[&str]) -> Out {
    run_in(args, |_| {})
}

fn ok(args: &[&str]) -> Out {
    let o = run(args);
    assert_eq!(o.code, 0, "{args:?}: {}", o.stderr);
    assert!(!o.stderr.contains("panicked"), "{}", o.stderr);
    o
}

fn fails(o: Out, needle: &str) {
    assert_eq!(o.code, 2, "stdout {} stderr {}", o.stdout, o.stderr);
    assert_eq!(o.stderr.lines().count(), 1, "{}", o.stderr);
    assert!(o.stderr.starts_with("error: ") && o.stderr.contains(needle), "`{}` lacks `{needle}`", o.stderr);
}

/// The final stderr line: `generate: N tokens (why), model X ms/token, sampling Y µs/token, Z% …`.
fn timing_line(stderr: &str) -> &str {
    let last = stderr.lines().last().unwrap_or("");
    assert!(last.starts_with("generate: "), "{stderr}");
    for part in ["ms/token", "µs/token", "% of the time sampling"] {
        assert!(last.contains(part), "`{last}` lacks `{part}`");
    }
    last
}

/// Every token but the three control tokens: the tiny model then never stops early.
const NO_CONTROL: &str = "logit_bias(0:-inf 1:-inf 2:-inf)";

#[test]
fn tiny_model_generates_n_tokens_reproducibly() {
    let d = Dir::new("n");
    let model = d.tiny();
    let chain = format!("{NO_CONTROL};top_k(20);temperature(1.5);dist");
    let args = ["generate", "--model", &model, "--chain", &chain, "-n", "12", "--seed", "5", "hello world"];
    let a = ok(&args);
    assert!(timing_line(&a.stderr).starts_with("generate: 12 tokens (max tokens)"), "{}", a.stderr);
    assert!(a.stdout.ends_with('\n') && a.stdout.len() > 1);
    let b = ok(&args);
    assert_eq!(a.stdout, b.stdout, "same seed, same text");
    let mut other = args;
    other[8] = "6";
    assert_ne!(ok(&other).stdout, a.stdout, "another seed, another text");
    // llama.cpp's random stream works too.
    let mut mt = args.to_vec();
    mt.extend(["--rng", "mt19937"]);
    assert_eq!(ok(&mt).stdout, ok(&mt).stdout);
}

#[test]
fn tiny_model_stops_at_end_of_generation() {
    let d = Dir::new("eos");
    let model = d.tiny();
    let o = ok(&["generate", "--model", &model, "--chain", "logit_bias(2:1000);greedy", "-n", "50", "hi"]);
    assert!(timing_line(&o.stderr).starts_with("generate: 1 token (end of generation)"), "{}", o.stderr);
    assert_eq!(o.stdout, "\n", "the end token is not printed");
    // <|endoftext|> ends generation too.
    let o = ok(&["generate", "--model", &model, "--chain", "logit_bias(0:1000);greedy", "-n", "50", "hi"]);
    assert!(o.stderr.contains("1 token (end of generation)"), "{}", o.stderr);
}

#[test]
fn tiny_model_greedy_agrees_with_explain() {
    let d = Dir::new("greedy");
    let model = d.tiny();
    let e = ok(&["explain", "--model", &model, "--prompt", "hello world", "--chain", "greedy"]).stdout;
    assert!(e.contains("tiny.gguf, the step after \"hello world\" (4 tokens)"), "{e}");
    let selected = e.lines().find_map(|l| l.strip_prefix("selected: ")).unwrap_or_else(|| panic!("{e}"));
    let text = &selected[..selected.rfind(" (id ").unwrap()];
    let g =
        ok(&["generate", "--model", &model, "--chain", "greedy", "-n", "1", "--show-alternatives", "2", "hello world"]);
    let line = g.stdout.lines().nth(1).unwrap();
    assert!(line.trim_start().starts_with(&format!("0  {text}")), "explain chose {text}; generate: {line}");
}

#[test]
fn tiny_model_shows_alternatives_raw_and_processed() {
    let d = Dir::new("alts");
    let model = d.tiny();
    let chain = format!("{NO_CONTROL};top_k(2);dist");
    let o = ok(&[
        "generate",
        "--model",
        &model,
        "--chain",
        &chain,
        "-n",
        "3",
        "--show-alternatives",
        "4",
        "--seed",
        "1",
        "the",
    ]);
    let lines: Vec<&str> = o.stdout.lines().collect();
    assert_eq!(lines.len(), 1 + 3 + 1, "{}", o.stdout);
    assert!(lines[0].contains("alternatives: raw / processed p"));
    assert!(lines[4].starts_with("text: "));
    for line in &lines[1..4] {
        let pairs: Vec<(f64, f64)> = line
            .split_whitespace()
            .filter_map(|w| {
                let (a, b) = w.split_once('/')?;
                Some((a.parse().ok()?, b.parse().ok()?))
            })
            .collect();
        assert_eq!(pairs.len(), 4, "{line}");
        // top_k(2): the two most likely keep all the processed mass, the others none.
        assert!((pairs[0].1 + pairs[1].1 - 1.0).abs() < 2e-4, "{line}");
        assert_eq!((pairs[2].1, pairs[3].1), (0.0, 0.0), "{line}");
        assert!(pairs.windows(2).all(|w| w[0].0 >= w[1].0), "raw p sorted: {line}");
    }
    timing_line(&o.stderr);
}

#[test]
fn tiny_model_chat_applies_the_template() {
    let d = Dir::new("chat");
    let model = d.tiny();
    let e = ok(&["explain", "--model", &model, "--prompt", "hi", "--chat", "--chain", "greedy"]).stdout;
    assert!(
        e.contains("\"<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n<|im_start|>user\\nhi<|im_end|>\\n<|im_start|>assistant\\n\""),
        "{e}"
    );
    let chain = format!("{NO_CONTROL};dist");
    let o = ok(&["generate", "--model", &model, "--chat", "--system", "Be brief.", "--chain", &chain, "-n", "4", "hi"]);
    assert!(o.stderr.contains("4 tokens"), "{}", o.stderr);
    fails(run(&["generate", "--model", &model, "--system", "x", "hi"]), "--chat");
}

#[test]
fn model_errors_are_one_line_with_status_2() {
    let d = Dir::new("errors");
    let model = d.tiny();
    fails(run(&["generate", "--model", &d.s("absent.gguf"), "hi"]), "absent.gguf");
    std::fs::write(d.s("junk.gguf"), b"not a gguf file at all").unwrap();
    fails(run(&["generate", "--model", &d.s("junk.gguf"), "hi"]), "not a valid GGUF file");
    fails(run(&["generate", "--model", &model, "--history", "1,2", "hi"]), "--history");
    fails(run(&["generate", "--model", &model, "--chain", "top_k(40)", "hi"]), "does not select");
    fails(run(&["generate", "--model", &model, "--chain", "top_k(x);greedy", "hi"]), "--chain");
    fails(run(&["generate", "--model", &model, ""]), "empty");
    fails(run(&["generate", "--model", &model, "-n", "2", &"hello ".repeat(200)]), "context");
}

#[test]
fn a_missing_default_model_names_the_fetch_script() {
    let d = Dir::new("missing");
    // The default model is also looked for in `shared/data/models` above the working
    // directory: a checkout whose `shared` sits in the temporary directory's parent (e.g.
    // /tmp/shared) would find it, and there is nothing missing to report.
    if let Some(a) = d.0.ancestors().find(|a| a.join("shared").join("data").join("models").is_dir()) {
        eprintln!("skipped: {} has shared/data/models, so the default model is found", a.display());
        return;
    }
    let o = run_in(&["generate", "hi"], |c| {
        c.current_dir(&d.0).env_remove("TOKENSIEVE_SHARED").env("HOME", &d.0).env("XDG_CACHE_HOME", d.0.join("cache"));
    });
    fails(o, "scripts/fetch-model.sh");
}

#[test]
fn explain_shows_token_texts_from_a_vocabulary() {
    use npyz::WriterBuilder;
    let d = Dir::new("vocab");
    let model = d.tiny();
    let the = tokensieve_testkit::gguf::tiny_merge_id("Ġthe") as usize;
    let mut row = vec![0.0f32; 271];
    row[the] = 5.0;
    let mut buf = Vec::new();
    let mut w = npyz::WriteOptions::<f32>::new().default_dtype().shape(&[271]).writer(&mut buf).begin_nd().unwrap();
    w.extend(row.iter().copied()).unwrap();
    w.finish().unwrap();
    std::fs::write(d.s("row.npy"), buf).unwrap();
    let o = ok(&["explain", "--logits", &d.s("row.npy"), "--vocab", &model, "--chain", "top_k(3);greedy"]);
    assert!(o.stdout.contains(&format!("selected: \" the\" (id {the})")), "{}", o.stdout);
    fails(run(&["explain", "--example", "--vocab", &d.s("absent.gguf"), "--chain", "greedy"]), "--vocab");
}

/// The real default model, or `None` (with a message) when `shared/data/models/` lacks it.
fn real_model() -> Option<String> {
    let path = shared_dir().map(|s| s.join("data").join("models").join(DEFAULT_MODEL));
    match path {
        Some(p) if p.is_file() => Some(p.to_str().unwrap().to_string()),
        _ if goldens_required() => {
            panic!("{DEFAULT_MODEL} is missing from shared/data/models/ and TOKENSIEVE_REQUIRE_GOLDENS=1")
        }
        _ => {
            eprintln!("skipped: {DEFAULT_MODEL} not found in shared/data/models/ (run scripts/fetch-model.sh)");
            None
        }
    }
}

#[test]
fn real_model_greedy_says_paris() {
    let Some(model) = real_model() else { return };
    let o = ok(&["generate", "--model", &model, "--chain", "greedy", "-n", "4", "The capital of France is"]);
    assert!(o.stdout.starts_with(" Paris"), "{}", o.stdout);
    timing_line(&o.stderr);
}

#[test]
fn real_model_seeded_sampling_is_reproducible() {
    let Some(model) = real_model() else { return };
    let args = [
        "generate",
        "--model",
        &model,
        "--seed",
        "1234",
        "-n",
        "24",
        "--chain",
        "top_k(50);temperature(1.0);dist",
        "Once upon a time",
    ];
    let (a, b) = (ok(&args), ok(&args));
    assert!(a.stdout.trim().len() > 10, "{}", a.stdout);
    assert_eq!(a.stdout, b.stdout);
}

#[test]
fn real_model_explain_names_tokens() {
    let Some(model) = real_model() else { return };
    let o = ok(&["explain", "--model", &model, "--prompt", "The capital of France is", "--chain", "top_k(10);greedy"]);
    assert!(o.stdout.contains("(5 tokens)"), "{}", o.stdout);
    assert!(o.stdout.contains("selected: \" Paris\" (id 7042)"), "{}", o.stdout);
    // The built-in example row is that step: the same vocabulary labels it.
    let o = ok(&["explain", "--example", "--vocab", &model, "--chain", "top_k(10);greedy"]);
    assert!(o.stdout.contains("selected: \" Paris\" (id 7042)"), "{}", o.stdout);
}

/// Splits a shell command line: words, '…' and "…" quotes, backslash escapes.
fn shell_words(line: &str) -> Vec<String> {
    let (mut words, mut word, mut in_word) = (Vec::new(), String::new(), false);
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                in_word = true;
                word.extend(chars.by_ref().take_while(|&c| c != '\''));
            }
            '"' => {
                in_word = true;
                while let Some(c) = chars.next() {
                    match c {
                        '"' => break,
                        '\\' => word.extend(chars.next()),
                        c => word.push(c),
                    }
                }
            }
            '\\' => {
                in_word = true;
                word.extend(chars.next());
            }
            c if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            c => {
                in_word = true;
                word.push(c);
            }
        }
    }
    if in_word {
        words.push(word);
    }
    words
}

#[test]
fn shell_words_split_like_a_shell() {
    assert_eq!(shell_words(r#"a 'b c' "d \"e\"" f\ g"#), ["a", "b c", "d \"e\"", "f g"]);
}

/// The README's "Two commands" section: its first command is the main job (fetch the model,
/// then generate). Every command line of the section's code blocks runs here (`cargo run
/// --release -p tokensieve-cli --` as the binary under test), except `cargo test --workspace`,
/// which is what runs this.
#[test]
fn the_readme_commands_run() {
    let Some(model) = real_model() else { return };
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let start = readme.find("## Two commands").expect("a \"Two commands\" section");
    let section = &readme[start..];
    let section = &section[..section[3..].find("\n## ").map_or(section.len(), |i| i + 3)];
    let commands: Vec<&str> = section
        .split("```sh\n")
        .skip(1)
        .flat_map(|block| block.split("```").next().unwrap().lines())
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    assert_eq!(commands[0], "scripts/fetch-model.sh", "the first command fetches the model");
    assert!(commands[1].contains(" -- generate "), "then generates: {}", commands[1]);
    let d = Dir::new("readme");
    let mut ran = 0;
    for command in commands {
        if command == "cargo test --workspace" {
            continue;
        }
        if command == "scripts/fetch-model.sh" {
            let fetched = Command::new("bash").arg(root.join("scripts/fetch-model.sh")).output().unwrap();
            assert!(fetched.status.success(), "{}", String::from_utf8_lossy(&fetched.stderr));
            let path = String::from_utf8(fetched.stdout).unwrap();
            assert_eq!(Path::new(path.trim()).canonicalize().unwrap(), Path::new(&model).canonicalize().unwrap());
            ran += 1;
            continue;
        }
        let command = command.replace("\"$(scripts/fetch-model.sh)\"", &format!("'{model}'"));
        let words = shell_words(&command);
        let dashes = words.iter().position(|w| w == "--").unwrap_or_else(|| panic!("not covered: {command}"));
        assert_eq!(words[..dashes], ["cargo", "run", "--release", "-p", "tokensieve-cli"], "not covered: {command}");
        let args: Vec<&str> = words[dashes + 1..].iter().map(String::as_str).collect();
        let shared = shared_dir().unwrap();
        let o = run_in(&args, |c| {
            c.current_dir(&d.0).env("TOKENSIEVE_SHARED", &shared);
        });
        assert_eq!(o.code, 0, "{args:?}: {}", o.stderr);
        assert!(o.stdout.trim().len() > 5, "{}", o.stdout);
        if args[0] == "generate" {
            timing_line(&o.stderr);
        }
        if let Some(i) = args.iter().position(|&a| a == "--svg") {
            let svg = std::fs::read_to_string(d.0.join(args[i + 1])).unwrap();
            roxmltree::Document::parse(&svg).unwrap();
        }
        ran += 1;
    }
    assert!(ran >= 3, "the fetch, generate and explain commands ran");
}
