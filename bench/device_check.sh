#!/usr/bin/env bash
# Device check of the CUDA path (see bench/device_check.py): Triton kernels vs the torch backend,
# random ~1.2B Llama prefill/decode tokens/s at batch 1/16/64 (bf16, with and without CUDA graphs),
# the grammar bitmask kernel at 64 x 128k, decode attention vs torch SDPA. One JSON line per result.
# Needs only python + torch + triton; no downloads. Hard limit 9 minutes.
#   bash bench/device_check.sh           # CUDA machine
#   bash bench/device_check.sh --smoke   # CPU, tiny sizes, Triton interpreter (code-path check)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-$(command -v python3 || command -v python)}"
for arg in "$@"; do
  if [[ "$arg" == "--smoke" ]]; then export TRITON_INTERPRET=1; fi
done
export TRITON_DEFAULT_FP_FUSION="${TRITON_DEFAULT_FP_FUSION:-1}"  # silence triton 3.9's default-change warning
exec timeout --signal=INT --kill-after=20 "${DEVICE_CHECK_TIMEOUT:-540}" "$PY" -m bench.device_check "$@"
