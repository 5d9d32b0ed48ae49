#!/usr/bin/env bash
# gen-patcher.sh: build the patcher (patcher.cu) into the cubins that package
# kernels embeds.
#
#   kernels/patcher/sm_<NN>.cubin  one per architecture, SASS only: compiled
#                                  with -rdc=true and device-linked with
#                                  cudadevrt (the patcher calls the device
#                                  runtime), so the driver loads it as is
#                                  (cuModuleLoadData) and never JIT-links
#   kernels/patcher/SOURCE_SHA256  sha256sum of patcher.cu, so that a test in
#                                  package kernels catches cubins older than
#                                  their source
#
# A cubin for sm_XY runs on compute capability X.Y and later minors of X;
# kernels.PatcherBinary picks the one for the device. The default list covers
# Ampere (sm_80: A100, and 8.6/8.9 GPUs), Hopper (sm_90), Blackwell (sm_100,
# sm_120) and Thor (sm_110); PATCHER_ARCHS overrides it, and an architecture
# this nvcc does not know is skipped with a warning.
#
# nvcc is needed (not Go). On this project's GPU machine:
#   kernels/cuda/gen-patcher.sh        # nvcc from $NVCC, PATH or /usr/local/cuda/bin
# then commit kernels/patcher/ together with patcher.cu.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="$here/../patcher"
nvcc="${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
if [ ! -x "$nvcc" ]; then
  echo "gen-patcher.sh: nvcc not found (set NVCC=/path/to/nvcc)" >&2
  exit 1
fi
archs="${PATCHER_ARCHS:-80 90 100 110 120}"
mkdir -p "$out"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

"$nvcc" --version | tail -n 2
known="$("$nvcc" --list-gpu-code 2>/dev/null || true)"
rm -f "$out"/sm_*.cubin
built=()
for arch in $archs; do
  if [ -n "$known" ] && ! grep -qx "sm_$arch" <<<"$known"; then
    echo "gen-patcher.sh: this nvcc does not know sm_$arch; skipped" >&2
    continue
  fi
  # Relocatable device code, then a device link with the device runtime into
  # an executable cubin (a single-step -rdc -cubin would leave it relocatable,
  # which cuModuleLoadData refuses).
  "$nvcc" -O3 -arch=sm_$arch -rdc=true -c -o "$tmp/patcher_$arch.o" "$here/patcher.cu"
  "$nvcc" -arch=sm_$arch -dlink -cubin -o "$tmp/sm_$arch.cubin" "$tmp/patcher_$arch.o" -lcudadevrt
  cuobjdump="$(dirname "$nvcc")/cuobjdump"
  if [ -x "$cuobjdump" ]; then
    # grep reads everything (no -q), so that pipefail sees no SIGPIPE.
    if ! "$cuobjdump" -elf "$tmp/sm_$arch.cubin" | grep 'sg_patcher' >/dev/null; then
      echo "gen-patcher.sh: sm_$arch.cubin has no sg_patcher entry" >&2
      exit 1
    fi
  fi
  mv "$tmp/sm_$arch.cubin" "$out/sm_$arch.cubin"
  built+=("sm_$arch")
done
if [ ${#built[@]} -eq 0 ]; then
  echo "gen-patcher.sh: no architecture built" >&2
  exit 1
fi
(cd "$here" && sha256sum patcher.cu) >"$out/SOURCE_SHA256"
echo "gen-patcher.sh: built ${built[*]} into $out ($(du -ch "$out"/sm_*.cubin | tail -n 1 | cut -f1) in all)"
