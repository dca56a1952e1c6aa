//! Criterion benchmarks: every workload, every peer, on the same peaked rows, beside the floor
//! (one SIMD max pass over the row). `TOKENSIEVE_BENCH_VOCAB=32000,151936` picks the sizes
//! (default 32000 and 128256).

use criterion::{criterion_group, criterion_main, Criterion};
use std::hint::black_box;
use tokensieve::arch;
use tokensieve_bench::{row, Peer, Workload};

fn vocabs() -> Vec<usize> {
    std::env::var("TOKENSIEVE_BENCH_VOCAB")
        .ok()
        .map(|s| s.split(',').filter_map(|v| v.trim().parse().ok()).collect())
        .filter(|v: &Vec<usize>| !v.is_empty())
        .unwrap_or_else(|| vec![32_000, 128_256])
}

fn peers(c: &mut Criterion) {
    for v in vocabs() {
        let r = row(v);
        for w in Workload::ALL {
            let mut group = c.benchmark_group(format!("{}/V={v}", w.name()));
            group.bench_function("floor (max pass)", |b| b.iter(|| black_box(arch::max(black_box(&r)))));
            for peer in Peer::all() {
                if let Some(mut step) = peer.runner(w, &r) {
                    group.bench_function(peer.name(), |b| b.iter(&mut step));
                }
            }
            group.finish();
        }
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30).warm_up_time(std::time::Duration::from_millis(300)).measurement_time(std::time::Duration::from_secs(1));
    targets = peers
}
criterion_main!(benches);
