//! Everything both commands read: the logits (.npy or the built-in example), the history, and
//! the per-row chains.

use crate::args::{ChainArgs, DtypeArg, InputArgs, RngArg};
use crate::error::{bad, lib};
use crate::grammar::GrammarSource;
use anyhow::Result;
use half::{bf16, f16};
use npyz::{DType, NpyFile, Order, TypeChar};
use std::path::Path;
use tokensieve::params::{GenerationConfig, SamplingParams};
use tokensieve::sampler::BuildContext;
use tokensieve::{Chain, Convention, Logits, LogitsBatch, RngConfig, RngKind};

/// The built-in example row: SmolLM2-135M-Instruct (Q4_1) logits after "The capital of France
/// is" (see `testdata/README.md`).
const EXAMPLE_NPY: &[u8] = include_bytes!("../testdata/example-logits.npy");

/// Logits in the dtype they were stored in.
pub enum Data {
    /// f32.
    F32(Vec<f32>),
    /// f16.
    F16(Vec<f16>),
    /// bf16 (read from uint16 bits).
    Bf16(Vec<bf16>),
}

/// The loaded logits: `rows` rows of `vocab` values, and the shape to write back.
pub struct Input {
    pub data: Data,
    pub shape: Vec<u64>,
    pub rows: usize,
    pub vocab: usize,
}

impl Input {
    /// The logits as a `[rows, vocab]` batch.
    pub fn batch(&self) -> Result<LogitsBatch<'_>> {
        let data = match &self.data {
            Data::F32(d) => Logits::F32(d),
            Data::F16(d) => Logits::F16(d),
            Data::Bf16(d) => Logits::Bf16(d),
        };
        LogitsBatch::new(data, self.rows, self.vocab).map_err(|e| lib("--logits", e))
    }
}

/// Loads `--logits` (or `--example`).
pub fn load_logits(args: &InputArgs) -> Result<Input> {
    let (bytes, name) = match (&args.logits, args.example) {
        (_, true) => (EXAMPLE_NPY.to_vec(), "the example row".to_string()),
        (Some(path), false) => (read(path, "--logits")?, path.display().to_string()),
        (None, false) => return Err(bad("give the logits with --logits IN.npy (or use --example)")),
    };
    parse_logits(&bytes, &name, args.dtype)
}

fn read(path: &Path, flag: &str) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| bad(format!("{flag}: cannot read {}: {e}", path.display())))
}

fn npy<'a>(bytes: &'a [u8], name: &str) -> Result<NpyFile<&'a [u8]>> {
    NpyFile::new(bytes).map_err(|e| bad(format!("{name} is not a valid .npy file: {e}")))
}

fn parse_logits(bytes: &[u8], name: &str, dtype: Option<DtypeArg>) -> Result<Input> {
    let file = npy(bytes, name)?;
    let shape = file.shape().to_vec();
    let (rows, vocab) = match shape.as_slice() {
        [v] => (1u64, *v),
        [b, v] => {
            if file.order() == Order::Fortran && *b > 1 && *v > 1 {
                return Err(bad(format!("{name}: a [B, V] array must be in C order (row-major), not Fortran order")));
            }
            (*b, *v)
        }
        _ => return Err(bad(format!("{name}: logits must have shape [V] or [B, V], got {shape:?}"))),
    };
    if vocab == 0 {
        return Err(bad(format!("{name}: the logits row is empty (vocabulary size 0)")));
    }
    if rows == 0 {
        return Err(bad(format!("{name}: the batch has no rows")));
    }
    let (rows, vocab) = (usize::try_from(rows)?, usize::try_from(vocab)?);
    let DType::Plain(ts) = file.dtype() else {
        return Err(bad(format!("{name}: logits must be a plain numeric array, not a structured one")));
    };
    let stored = match (ts.type_char(), ts.size_field()) {
        (TypeChar::Float, 4) => DtypeArg::F32,
        (TypeChar::Float, 2) => DtypeArg::F16,
        (TypeChar::Uint | TypeChar::Int, 2) if dtype == Some(DtypeArg::Bf16) => DtypeArg::Bf16,
        (TypeChar::Uint | TypeChar::Int, 2) => {
            return Err(bad(format!(
                "{name} holds 16-bit integers ({ts}); pass --dtype bf16 if they are bfloat16 bits"
            )))
        }
        _ => {
            return Err(bad(format!(
                "{name}: logits must be f32 or f16 (or uint16 bfloat16 bits with --dtype bf16), got {ts}"
            )))
        }
    };
    if let Some(want) = dtype {
        if want != stored {
            return Err(bad(format!("{name}: --dtype {} but the file holds {ts}", dtype_name(want))));
        }
    }
    let bad_data = |e: std::io::Error| bad(format!("{name}: cannot read the data: {e}"));
    let data = match stored {
        DtypeArg::F32 => Data::F32(file.into_vec::<f32>().map_err(bad_data)?),
        DtypeArg::F16 => Data::F16(file.into_vec::<f16>().map_err(bad_data)?),
        DtypeArg::Bf16 if ts.type_char() == TypeChar::Int => Data::Bf16(
            file.into_vec::<i16>().map_err(bad_data)?.into_iter().map(|b| bf16::from_bits(b as u16)).collect(),
        ),
        DtypeArg::Bf16 => {
            Data::Bf16(file.into_vec::<u16>().map_err(bad_data)?.into_iter().map(bf16::from_bits).collect())
        }
    };
    Ok(Input { data, shape, rows, vocab })
}

fn dtype_name(d: DtypeArg) -> &'static str {
    match d {
        DtypeArg::F32 => "f32",
        DtypeArg::F16 => "f16",
        DtypeArg::Bf16 => "bf16",
    }
}

/// Parses `--history`: comma-separated ids, or a `.npy` of integers. Every id must be a valid
/// token of a vocabulary of `vocab`.
pub fn load_history(arg: Option<&str>, vocab: usize) -> Result<Vec<u32>> {
    load_ids(arg, vocab, "--history")
}

/// Parses token ids given to `flag`: comma-separated ids, or a `.npy` of integers, each below
/// `vocab`.
pub fn load_ids(arg: Option<&str>, vocab: usize, flag: &'static str) -> Result<Vec<u32>> {
    let Some(arg) = arg else { return Ok(Vec::new()) };
    let ids: Vec<i64> = if arg.ends_with(".npy") {
        let bytes = read(Path::new(arg), flag)?;
        ids_npy(&bytes, arg, flag)?
    } else {
        arg.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| {
                s.parse::<i64>().map_err(|_| {
                    bad(format!("{flag}: `{s}` is not a token id (give comma-separated ids or a .npy file)"))
                })
            })
            .collect::<Result<_>>()?
    };
    ids.into_iter()
        .map(|id| match u32::try_from(id) {
            Ok(t) if (t as usize) < vocab => Ok(t),
            _ => Err(tokensieve::Error::token_out_of_range(flag, id, vocab).into()),
        })
        .collect()
}

fn ids_npy(bytes: &[u8], name: &str, flag: &str) -> Result<Vec<i64>> {
    let file = npy(bytes, name)?;
    if file.shape().len() > 1 {
        return Err(bad(format!("{flag} {name}: must be a 1-D array of token ids, got shape {:?}", file.shape())));
    }
    let DType::Plain(ts) = file.dtype() else {
        return Err(bad(format!("{flag} {name}: must hold integers")));
    };
    let e = |e: std::io::Error| bad(format!("{flag} {name}: cannot read the data: {e}"));
    macro_rules! ints {
        ($t:ty) => {
            file.into_vec::<$t>().map_err(e)?.into_iter().map(|v| v as i64).collect()
        };
    }
    Ok(match (ts.type_char(), ts.size_field()) {
        (TypeChar::Int, 1) => ints!(i8),
        (TypeChar::Int, 2) => ints!(i16),
        (TypeChar::Int, 4) => ints!(i32),
        (TypeChar::Int, 8) => ints!(i64),
        (TypeChar::Uint, 1) => ints!(u8),
        (TypeChar::Uint, 2) => ints!(u16),
        (TypeChar::Uint, 4) => ints!(u32),
        (TypeChar::Uint, 8) => {
            file.into_vec::<u64>().map_err(e)?.into_iter().map(|v| i64::try_from(v).unwrap_or(i64::MAX)).collect()
        }
        _ => return Err(bad(format!("{flag} {name}: must hold integers, got {ts}"))),
    })
}

/// Where the chain comes from.
enum Source {
    Spec(String),
    Params(Box<SamplingParams>),
    /// `--params` (or nothing) under `--convention transformers`: a generation_config.json.
    Generation(Box<GenerationConfig>),
}

/// How to build each row's chain: the same stages and seed for every row, Philox sequence id
/// = row index.
pub struct ChainPlan {
    source: Source,
    rng: RngConfig,
    /// Whose semantics `--chain`'s stage names have.
    convention: Convention,
    /// Token texts by id (a model's vocabulary), for DRY's sequence breakers.
    vocab_text: Option<Vec<Vec<u8>>>,
    /// The body's `grammar`, `json_schema` or `response_format`, compiled by the command.
    grammar: Option<GrammarSource>,
}

impl ChainPlan {
    /// Reads `--chain` / `--params` / `--convention` / `--rng` / `--seed`. `n_ctx` is what a
    /// `-1` window (`repeat_last_n`, `dry_penalty_last_n`) stands for: every token the
    /// sequence will hold (history plus sampled tokens), as llama.cpp's context does.
    ///
    /// Under `--convention transformers`, `--params` is a `generation_config.json` (or a body
    /// with its fields) and the chain is the processor list transformers' `generate()` builds;
    /// without `--chain` or `--params` it is `generate()`'s default (greedy decoding).
    pub fn new(args: &ChainArgs, n_ctx: usize) -> Result<Self> {
        let convention: Convention = args.convention.parse::<Convention>()?;
        let n_ctx = Some(u32::try_from(n_ctx.max(1)).unwrap_or(u32::MAX));
        let mut grammar = None;
        let source = match (&args.chain, &args.params) {
            (Some(spec), _) => Source::Spec(spec.clone()),
            (None, Some(path)) if convention == Convention::Transformers => {
                let body = std::fs::read_to_string(path)
                    .map_err(|e| bad(format!("--params: cannot read {}: {e}", path.display())))?;
                let config =
                    GenerationConfig::from_json(&body).map_err(|e| lib(format!("--params {}", path.display()), e))?;
                Source::Generation(Box::new(config))
            }
            (None, None) if convention == Convention::Transformers => Source::Generation(Box::default()),
            (None, Some(path)) => {
                let body = std::fs::read_to_string(path)
                    .map_err(|e| bad(format!("--params: cannot read {}: {e}", path.display())))?;
                let mut params = SamplingParams::from_json(&body).map_err(|e| {
                    // A generation_config.json read under the default convention: say so.
                    let hint = if GenerationConfig::from_json(&body).is_ok() {
                        " (this looks like a transformers generation config: add --convention transformers)"
                    } else {
                        ""
                    };
                    lib(format!("--params {}{hint}", path.display()), e)
                })?;
                if params.n > 1 {
                    return Err(bad(format!(
                        "--params {}: field `n`: {} choices were asked for; `tokensieve sample` makes one \
                         sequence per row (run it again with another --seed for more)",
                        path.display(),
                        params.n
                    )));
                }
                params.n_ctx = n_ctx;
                grammar = GrammarSource::from_params(&params, &body, &path.display().to_string());
                Source::Params(Box::new(params))
            }
            (None, None) => {
                let mut params = SamplingParams::default();
                params.n_ctx = n_ctx;
                Source::Params(Box::new(params))
            }
        };
        let kind = match args.rng {
            RngArg::Philox => RngKind::Philox,
            RngArg::Mt19937 => RngKind::Mt19937,
        };
        let seed = match (&source, args.seed) {
            (_, Some(seed)) => seed,
            (Source::Params(p), None) => p.seed.unwrap_or(0),
            (Source::Spec(_) | Source::Generation(_), None) => 0,
        };
        let mut plan =
            ChainPlan { source, rng: RngConfig { kind, seed, sequence: 0 }, convention, vocab_text: None, grammar };
        if let Source::Params(p) = &mut plan.source {
            p.seed = Some(seed);
        }
        Ok(plan)
    }

    /// Gives the stages the model's token texts (DRY matches its sequence breakers in them).
    pub fn with_vocab_text(mut self, text: Vec<Vec<u8>>) -> Self {
        self.vocab_text = Some(text);
        self
    }

    /// The grammar the body asks for (`grammar`, `json_schema`, `response_format`), if any.
    pub fn grammar(&self) -> Option<&GrammarSource> {
        self.grammar.as_ref()
    }

    /// For commands that do not apply grammars: an error when the body asks for one.
    pub fn refuse_grammar(&self, command: &str) -> Result<()> {
        match &self.grammar {
            Some(g) => Err(bad(format!(
                "{}: `tokensieve {command}` does not apply grammars (`tokensieve sample --vocab …` and \
                 `tokensieve generate` do)",
                g.origin()
            ))),
            None => Ok(()),
        }
    }

    /// The body's parameters, when the chain comes from `--params` (or the defaults).
    pub fn params(&self) -> Option<&SamplingParams> {
        match &self.source {
            Source::Params(p) => Some(p),
            Source::Spec(_) | Source::Generation(_) => None,
        }
    }

    /// The chain of row `row` for rows of `vocab` tokens. `selecting`: the chain must end with
    /// a selecting stage (`sample`); otherwise it may stop after any stage (`apply`).
    pub fn build(&self, row: usize, vocab: usize, selecting: bool) -> Result<Chain> {
        let sequence = u32::try_from(row).map_err(|_| bad(format!("row {row}: too many rows")))?;
        let ctx = BuildContext {
            vocab: self.vocab_text.as_deref(),
            ..BuildContext::new(vocab, self.rng.with_sequence(sequence)).with_convention(self.convention)
        };
        match &self.source {
            Source::Spec(spec) => {
                let chain =
                    if selecting { Chain::from_spec(spec, &ctx) } else { Chain::from_spec_for_apply(spec, &ctx) };
                chain.map_err(|e| lib("--chain", e))
            }
            Source::Params(p) => p.build_chain(&ctx).map_err(|e| lib("--params", e)),
            Source::Generation(g) => g.build_chain(&ctx).map_err(|e| lib("--params", e)),
        }
    }

    /// One chain per row, each having accepted `history` (oldest first).
    pub fn build_rows(&self, rows: usize, vocab: usize, selecting: bool, history: &[u32]) -> Result<Vec<Chain>> {
        (0..rows)
            .map(|row| {
                let mut chain = self.build(row, vocab, selecting)?;
                for &t in history {
                    chain.accept(t);
                }
                Ok(chain)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_example_row_loads() {
        let input = parse_logits(EXAMPLE_NPY, "example", None).unwrap();
        assert_eq!((input.rows, input.vocab, input.shape.as_slice()), (1, 49152, &[49152u64][..]));
    }

    #[test]
    fn history_ids_are_checked() {
        assert_eq!(load_history(Some("1, 2,3"), 4).unwrap(), [1, 2, 3]);
        assert!(load_history(Some(""), 4).unwrap().is_empty());
        let e = crate::error::one_line(&load_history(Some("1,4"), 4).unwrap_err());
        assert!(e.contains("token id 4"), "{e}");
        assert!(crate::error::one_line(&load_history(Some("1,-1"), 4).unwrap_err()).contains("token id -1"));
        assert!(crate::error::one_line(&load_history(Some("1,x"), 4).unwrap_err()).contains("`x`"));
    }
}
