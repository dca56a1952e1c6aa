//! `tokensieve apply`: each row through its chain once; the processed logits to OUT.npy.

use crate::args::ApplyArgs;
use crate::error::{bad, lib};
use crate::input::{load_history, load_logits, ChainPlan};
use anyhow::Result;
use npyz::WriterBuilder;
use std::io::Write;

/// Runs `apply`.
pub fn run(args: &ApplyArgs) -> Result<()> {
    let input = load_logits(&args.input)?;
    let history = load_history(args.chain.history.as_deref(), input.vocab)?;
    let plan = ChainPlan::new(&args.chain, history.len())?;
    plan.refuse_grammar("apply")?;
    let batch = input.batch()?;
    let mut chains = plan.build_rows(input.rows, input.vocab, false, &history)?;
    let mut out = vec![0.0f32; input.rows * input.vocab];
    for (row, (chain, dense)) in chains.iter_mut().zip(out.chunks_exact_mut(input.vocab)).enumerate() {
        let candidates = chain.apply(batch.row(row)).map_err(|e| lib(format!("row {row}"), e))?;
        candidates.write_dense(dense);
    }
    write_npy(&args.out, &input.shape, &out)
}

fn write_npy(path: &std::path::Path, shape: &[u64], data: &[f32]) -> Result<()> {
    let file = std::fs::File::create(path).map_err(|e| bad(format!("--out: cannot create {}: {e}", path.display())))?;
    let failed = |e: std::io::Error| anyhow::anyhow!("--out: writing {}: {e}", path.display());
    let mut w = std::io::BufWriter::new(file);
    {
        let mut npy =
            npyz::WriteOptions::<f32>::new().default_dtype().shape(shape).writer(&mut w).begin_nd().map_err(failed)?;
        npy.extend(data.iter().copied()).map_err(failed)?;
        npy.finish().map_err(failed)?;
    }
    w.flush().map_err(failed)
}
