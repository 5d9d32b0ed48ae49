#!/usr/bin/env bash
# Builds and runs the moving-step latency probe (needs nvcc, cuBLAS and an
# sm_90 GPU; set ARCH for another). See README.md. Arguments go to the probe
# (layers width batch steps); with none, mlp-large and mlp, each bare and
# with the bench's harness around it (H2D=1 GATE=1).
set -euo pipefail
cd "$(dirname "$0")"
nvcc="${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
bin=${TMPDIR:-/tmp}/movelatency-probe
"$nvcc" -O3 -arch="sm_${ARCH:-90}" -rdc=true -o "$bin" probe.cu -lcublas -lcuda -lcudadevrt
if [ $# -gt 0 ]; then
  exec "$bin" "$@"
fi
for shape in "8 1024 64" "8 256 8"; do
  for env in "H2D=0 GATE=0" "H2D=1 GATE=1"; do
    env $env "$bin" $shape 400
  done
done
