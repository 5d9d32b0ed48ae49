#!/usr/bin/env bash
# gen.sh: compile kernels.cu to the PTX that package kernels embeds.
#
#   kernels/ptx/sm90.ptx       PTX for compute_90 (H100/H200), chosen by
#                              kernels.PTXFor on 9.x devices
#   kernels/ptx/sm75.ptx       portable PTX for compute_75, the oldest target
#                              nvcc 13 accepts; the driver JIT-compiles it
#                              forward for any newer GPU
#   kernels/ptx/SOURCE_SHA256  sha256sum of kernels.cu, so that a test in
#                              package kernels catches PTX older than its source
#
# nvcc is needed (not Go). On this project's GPU machine:
#   kernels/cuda/gen.sh                      # nvcc from $NVCC, PATH or /usr/local/cuda/bin
# then commit the three files in kernels/ptx together with kernels.cu.
# The script also assembles each PTX into a cubin (thrown away) so that a
# ptxas error shows up here rather than at the first module load.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="$here/../ptx"
nvcc="${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
if [ ! -x "$nvcc" ]; then
  echo "gen.sh: nvcc not found (set NVCC=/path/to/nvcc)" >&2
  exit 1
fi
mkdir -p "$out"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

"$nvcc" --version | tail -n 2
for arch in 90 75; do
  "$nvcc" -ptx -O3 -arch=compute_$arch -o "$tmp/sm$arch.ptx" "$here/kernels.cu"
  "$nvcc" -cubin -O3 -arch=sm_$arch -Xptxas -v -o "$tmp/sm$arch.cubin" "$here/kernels.cu" 2>&1 | grep -E 'registers|error' || true
  mv "$tmp/sm$arch.ptx" "$out/sm$arch.ptx"
done
(cd "$here" && sha256sum kernels.cu) >"$out/SOURCE_SHA256"
echo "gen.sh: wrote $(ls "$out" | tr '\n' ' ')"
