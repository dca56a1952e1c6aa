//! Quick timing of the arch kernels (not a benchmark suite; see crates/tokensieve-bench).
use std::hint::black_box;
use std::time::Instant;
use tokensieve::arch;

fn time(name: &str, mut f: impl FnMut()) {
    for _ in 0..50 {
        f();
    }
    let mut v = Vec::new();
    for _ in 0..400 {
        let t = Instant::now();
        f();
        v.push(t.elapsed().as_secs_f64() * 1e6);
    }
    v.sort_by(|a, b| a.total_cmp(b));
    println!("{name:30} median {:8.2} µs", v[v.len() / 2]);
}

fn main() {
    let v = 128_256;
    let row: Vec<f32> = (0..v).map(|i| ((i as f32 * 0.61803).fract() - 1.0) * 20.0).collect();
    let mut out = vec![0.0f32; v];
    let mut bm = Vec::new();
    println!("isa {:?} vectorised exp {}", arch::isa(), arch::vectorised_exp());
    time("max", || {
        black_box(arch::max(black_box(&row)));
    });
    time("summarize", || {
        black_box(arch::summarize(black_box(&row), &mut bm));
    });
    time("argmax", || {
        black_box(arch::argmax(black_box(&row)));
    });
    time("exp_shifted_sum div=1", || {
        black_box(arch::exp_shifted_sum(black_box(&row), 1.0, 0.0));
    });
    time("exp_shifted_sum div=0.8", || {
        black_box(arch::exp_shifted_sum(black_box(&row), 0.8, 0.0));
    });
    time("exp_shifted div=1", || {
        arch::exp_shifted(black_box(&row), 1.0, 0.0, &mut out);
    });
    let mut sums = vec![0.0f64; v.div_ceil(arch::BLOCK)];
    time("exp_block_sums_approx div=1", || {
        black_box(arch::exp_block_sums_approx(black_box(&row), 1.0, 0.0, &mut sums));
    });
    time("exp_block_sums_approx div=0.8", || {
        black_box(arch::exp_block_sums_approx(black_box(&row), 0.8, 0.0, &mut sums));
    });
    time("exp_block_sums exact div=0.8", || arch::exp_block_sums(black_box(&row), 0.8, 0.0, &mut sums));
    time("scalar expf loop", || {
        let mut s = 0.0f64;
        for &x in black_box(&row) {
            s += x.exp() as f64;
        }
        black_box(s);
    });
}
