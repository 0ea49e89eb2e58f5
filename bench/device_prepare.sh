#!/usr/bin/env bash
# Run HERE (not on the GPU machine) before a device session that measures `python -m bench grammar`
# on a GPU with the real default model (see bench/device_grammar.sh). The GPU machine cannot fetch
# anything and each device call carries at most 64 MiB, so this puts into .devcarry/ (which
# .git/info/exclude must ignore):
#   .devcarry/model/part-a, part-b, SHA256   the default model's GGUF (~94 MiB) cut in two
#   .devcarry/wheels/                        wheels (cp312, manylinux) of what the GPU image lacks
#   .devcarry/tokenizer/                     the tokenizer files (bench/device_check.sh uses them)
# and prints the two device calls to make, back to back (a warm machine keeps the ignored
# files of the first call for the second; it goes back after 30 s idle).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
grep -qx '/.devcarry/' .git/info/exclude 2>/dev/null || echo '/.devcarry/' >> .git/info/exclude

gguf="$("$PY" -c 'from runtime.model.loader import default_model_path; print(default_model_path())')"
rm -rf .devcarry/model .devcarry/wheels
mkdir -p .devcarry/model .devcarry/wheels .devcarry/tokenizer
half=$(( ($(stat -c %s "$gguf") + 1) / 2 ))
split -b "$half" -a 1 "$gguf" .devcarry/model/part-
(cd "$(dirname "$gguf")" && sha256sum "$(basename "$gguf")") > .devcarry/model/SHA256

# Versions pinned to what this venv runs, so the GPU machine runs the same grammar code.
pkgs=()
for name in xgrammar apache-tvm-ffi pydantic pydantic-core annotated-types typing-inspection jsonschema \
            jsonschema-specifications referencing rpds-py gguf; do
  pkgs+=("$name==$("$PY" -c "import importlib.metadata as m; print(m.version('$name'))")")
done
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .devcarry/wheels "${pkgs[@]}"

tokdir="$("$PY" -c 'from runtime.model.loader import resolve_model_dir; print(resolve_model_dir())')"
for f in tokenizer.json tokenizer_config.json chat_template.jinja special_tokens_map.json generation_config.json; do
  [[ -f "$tokdir/$f" ]] && cp "$tokdir/$f" .devcarry/tokenizer/
done

du -sh .devcarry/model/part-a .devcarry/model/part-b .devcarry/wheels
cat <<'EOF'
Device calls (back to back; the second within 30 s of the first's reply):
  1. carry [".devcarry/model/part-a"]                                   command: ls -l .devcarry/model
  2. carry [".devcarry/model/part-b", ".devcarry/model/SHA256", ".devcarry/wheels"]
                                                                        command: bash bench/device_grammar.sh
EOF
