#!/usr/bin/env bash
# Builds and runs the patcher-variants probe (needs nvcc and an sm_90 GPU;
# set ARCH for another). See README.md.
set -euo pipefail
cd "$(dirname "$0")"
nvcc="${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
"$nvcc" -O3 -arch="sm_${ARCH:-90}" -rdc=true -o /tmp/patcher-probe probe.cu -lcudadevrt
/tmp/patcher-probe
