#!/usr/bin/env bash
# On the lent machine, at the start of each device call: install the wheels that the call
# carried (.gpu/, from benchmarks/gpu/pack.sh) and keep its GGUF parts in FERRY (default
# /tmp/ferry), which outlives the call while the machine stays warm; once every part has come,
# join them and check the SHA-256. It exports, for run_all.sh:
#
#   PYTHONPATH (FERRY/site first), TRL112_PATH, TRL116_PATH, TOKENIZER_PATH
#   SMOLLM2_GGUF (only once the GGUF is whole; until then it says which parts have come)
#
#   source benchmarks/gpu/unpack.sh
#
# Each device call begins so; `carry` names .gpu/wheels, .gpu/trl112 and .gpu/trl116 in the
# first call and one .gpu/gguf part (with .gpu/gguf/SHA256SUMS) in each call after it.
FERRY=${FERRY:-/tmp/ferry}
PYTHON=${PYTHON:-python3}
mkdir -p "$FERRY"
for pair in wheels:site trl112:trl112 trl116:trl116; do
  from=.gpu/${pair%%:*} to=$FERRY/${pair##*:}
  if ls "$from"/*.whl > /dev/null 2>&1; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --root-user-action=ignore --target "$to" "$from"/*.whl \
      || echo "unpack: installing $from failed" >&2
  fi
done
if [ -f .gpu/gguf/SHA256SUMS ]; then
  cp .gpu/gguf/SHA256SUMS "$FERRY/"
  cp .gpu/gguf/*.part-* "$FERRY/" 2>/dev/null
fi
export PYTHONPATH="$FERRY/site${PYTHONPATH:+:$PYTHONPATH}"
export TRL112_PATH=$FERRY/trl112 TRL116_PATH=$FERRY/trl116 TOKENIZER_PATH=$FERRY/site
if [ -f "$FERRY/SHA256SUMS" ]; then
  name=$(awk '{print $2}' "$FERRY/SHA256SUMS")
  if [ ! -f "$FERRY/$name" ]; then
    cat "$FERRY/$name".part-* > "$FERRY/$name.joined"
    joined=$(sed "s/ $name\$/ $name.joined/" "$FERRY/SHA256SUMS")
    if (cd "$FERRY" && echo "$joined" | sha256sum -c --quiet > /dev/null 2>&1); then
      mv "$FERRY/$name.joined" "$FERRY/$name" && rm -f "$FERRY/$name".part-*
    else
      rm -f "$FERRY/$name.joined"
      echo "unpack: $name incomplete: parts $(cd "$FERRY" && ls "$name".part-* 2>/dev/null \
        | sed 's/.*part-//' | tr '\n' ' ')here so far" >&2
    fi
  fi
  if [ -f "$FERRY/$name" ]; then
    export SMOLLM2_GGUF=$FERRY/$name
  fi
fi
