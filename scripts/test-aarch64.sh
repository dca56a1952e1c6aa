#!/usr/bin/env bash
# The aarch64 build (NEON kernels) checked from an x86-64 Linux machine: clippy for the
# aarch64 target, then the core library's tests run under qemu-aarch64 (user-mode emulation;
# correctness only, emulated timings mean nothing). `--all`: every test file of the core
# library.
#
# It installs what it needs when it is missing: the Rust standard library for
# aarch64-unknown-linux-gnu (rustup), and the cross linker, the target's C library and
# qemu-user (apt-get, Debian or Ubuntu, as root). Where it cannot, it says so and exits 0
# without testing, unless TOKENSIEVE_REQUIRE_AARCH64=1, which makes that a failure.
# On an aarch64 machine, run `cargo test --workspace` instead.
set -euo pipefail
cd "$(dirname "$0")/.."

target=aarch64-unknown-linux-gnu
sysroot=/usr/aarch64-linux-gnu

skip() {
    echo "test-aarch64: skipped: $1" >&2
    if [ "${TOKENSIEVE_REQUIRE_AARCH64:-0}" = 1 ]; then
        exit 1
    fi
    exit 0
}

if [ "$(uname -m)" != x86_64 ]; then
    skip "this script cross-tests from x86-64 (this machine is $(uname -m))"
fi

if ! rustup target list --installed 2>/dev/null | grep -qx "$target"; then
    echo "test-aarch64: installing the Rust standard library for $target" >&2
    rustup target add "$target" >&2 || skip "rustup could not add $target"
fi

if ! command -v aarch64-linux-gnu-gcc >/dev/null || ! command -v qemu-aarch64 >/dev/null || [ ! -d "$sysroot/lib" ]; then
    command -v apt-get >/dev/null || skip "no apt-get to install the cross linker and qemu-user"
    sudo=""
    if [ "$(id -u)" != 0 ]; then
        command -v sudo >/dev/null || skip "apt-get needs root"
        sudo="sudo -n"
    fi
    echo "test-aarch64: installing gcc-aarch64-linux-gnu, libc6-dev-arm64-cross, qemu-user" >&2
    { $sudo apt-get install -y -qq gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user >/dev/null ||
        { $sudo apt-get update -qq && $sudo apt-get install -y -qq gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user >/dev/null; }; } ||
        skip "apt-get could not install the cross linker and qemu-user"
fi

export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L $sysroot"

echo "== cargo clippy --target $target"
cargo clippy --target "$target" --workspace --all-targets -- -D warnings

# Release: the property tests are slow enough under emulation in a debug build. The unit
# tests (the kernels against the obvious loops among them), the conformance goldens, the
# allocation count and bad input; `--tests` runs every test file (about 7 minutes more, most
# of it fast_paths.rs).
tests=(--lib --test golden_llama_cpp --test golden_transformers --test no_alloc --test bad_input --test properties)
if [ "${1:-}" = --all ]; then
    tests=(--tests)
fi
echo "== cargo test --target $target -p tokensieve ${tests[*]} (under qemu-aarch64)"
cargo test --release --target "$target" -p tokensieve "${tests[@]}"
