#!/usr/bin/env bash
# Builds the NEON kernel test driver for AArch64 with Debian's cross compiler and runs it under qemu-user:
#   apt-get install -y g++-aarch64-linux-gnu qemu-user
# Usage: tests/arm/run.sh [build dir]   (exit status: the driver's; 77 where the tools are missing)
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
out="${1:-$(mktemp -d)}"
CXX="${CXX_AARCH64:-aarch64-linux-gnu-g++}"
QEMU="${QEMU_AARCH64:-qemu-aarch64}"
for tool in "$CXX" "$QEMU"; do
  command -v "$tool" >/dev/null || { echo "tests/arm/run.sh: $tool not found"; exit 77; }
done
mkdir -p "$out"
# Baseline armv8-a: the dotprod kernels must come only from their target attribute and the run-time check.
"$CXX" -std=gnu++17 -O2 -march=armv8-a -Wall -Wno-sign-compare -I"$root/src" -o "$out/neon_kernels_test" \
  "$root/tests/arm/neon_kernels_test.cpp" "$root/src/core/cpu/isa.cpp" "$root/src/core/cpu/gemm.cpp" \
  "$root/src/core/cpu/threads.cpp" -static -pthread
# qemu's default CPU ("max") has dotprod; a Cortex-A57 has not: both kernel variants run.
"$QEMU" "$out/neon_kernels_test"
"$QEMU" -cpu cortex-a57 "$out/neon_kernels_test"
