//! Helpers for tests that run the `tokensieve` binary on golden cases: `.npy` I/O, a scratch
//! directory, one run with its outcome classified as the CLI contract defines it, and a small
//! parallel map (each case is a process, so threads mostly wait).

use npyz::WriterBuilder;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// Writes an f32 `.npy` of the given shape.
pub fn write_npy_f32(path: &Path, shape: &[u64], data: &[f32]) {
    let mut buf = Vec::new();
    let mut w = npyz::WriteOptions::<f32>::new().default_dtype().shape(shape).writer(&mut buf).begin_nd().unwrap();
    w.extend(data.iter().copied()).unwrap();
    w.finish().unwrap();
    std::fs::write(path, buf).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
}

/// Reads an f32 `.npy`: its shape and data.
pub fn read_npy_f32(path: &Path) -> (Vec<u64>, Vec<f32>) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let file = npyz::NpyFile::new(&bytes[..]).expect("a valid .npy");
    let shape = file.shape().to_vec();
    (shape, file.into_vec::<f32>().expect("f32 data"))
}

/// A scratch directory under the system temp dir, removed on drop.
pub struct ScratchDir(PathBuf);

impl ScratchDir {
    /// A fresh directory named after `name` and this process.
    pub fn new(name: &str) -> ScratchDir {
        let d = std::env::temp_dir().join(format!("tokensieve-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        ScratchDir(d)
    }

    /// A path inside the directory.
    pub fn path(&self, file: &str) -> PathBuf {
        self.0.join(file)
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// How one run of the binary ended.
#[derive(Debug)]
pub enum Run {
    /// Exit status 0, with this stdout.
    Ok(String),
    /// Exit status 2 with a single `error: …` line on stderr (bad input, as the contract says).
    BadInput(String),
    /// Anything else: a contract violation, described.
    Broken(String),
}

/// Runs `bin` with `args` and classifies the outcome.
pub fn run(bin: &str, args: &[String]) -> Run {
    let o = Command::new(bin).args(args).output().expect("running the binary");
    let stderr = String::from_utf8_lossy(&o.stderr).trim().to_string();
    match o.status.code() {
        Some(0) => Run::Ok(String::from_utf8(o.stdout).expect("utf-8 stdout")),
        Some(2) if stderr.starts_with("error: ") && stderr.lines().count() == 1 => Run::BadInput(stderr),
        code => Run::Broken(format!("exit status {code:?}, stderr: {stderr}")),
    }
}

/// `f` over `items` on a few threads; results in input order.
pub fn par_map<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<(usize, R)>> = Mutex::new(Vec::with_capacity(items.len()));
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get()).clamp(2, 8);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(item) = items.get(i) else { break };
                let r = f(item);
                results.lock().unwrap().push((i, r));
            });
        }
    });
    let mut results = results.into_inner().unwrap();
    results.sort_by_key(|r| r.0);
    results.into_iter().map(|r| r.1).collect()
}
