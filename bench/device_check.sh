#!/usr/bin/env bash
# Device check of the CUDA path (see bench/probes/device_check.py): Triton kernels vs the torch backend,
# random ~1.2B Llama prefill/decode tokens/s at batch 1/16/64 (bf16, with and without CUDA graphs),
# the grammar bitmask kernel at 64 x 128k, decode attention vs torch SDPA. With --tokenizer-dir DIR
# (the default model's cache folder, for its tokenizer files) it then runs the whole engine on the
# device too (bench/probes/device_engine.py). One JSON line per result. Needs only python + torch + triton
# (+ transformers/safetensors for the engine part); no downloads. Hard limits 5 + 3 minutes.
#   bash bench/device_check.sh [--tokenizer-dir DIR]           # CUDA machine
#   bash bench/device_check.sh --smoke [--tokenizer-dir DIR]   # CPU, tiny sizes, Triton interpreter
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-$(command -v python3 || command -v python)}"
smoke=() tok=""
while (($#)); do
  case "$1" in
    --smoke) smoke=(--smoke); export TRITON_INTERPRET=1 ;;
    --tokenizer-dir) tok="$2"; shift ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
  shift
done
export TRITON_DEFAULT_FP_FUSION="${TRITON_DEFAULT_FP_FUSION:-1}"  # silence triton 3.9's default-change warning
status=0
timeout --signal=INT --kill-after=20 "${DEVICE_CHECK_TIMEOUT:-300}" "$PY" -m bench.probes.device_check "${smoke[@]}" || status=$?
if [[ -n "$tok" ]]; then
  timeout --signal=INT --kill-after=20 "${DEVICE_ENGINE_TIMEOUT:-180}" "$PY" -m bench.probes.device_engine \
    --tokenizer-dir "$tok" "${smoke[@]}" || status=$?
fi
exit $status
