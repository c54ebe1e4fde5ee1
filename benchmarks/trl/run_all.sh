#!/usr/bin/env bash
# Run every TRL bench of this folder REPS times (default 3), then summarize them as tables.
# usage (from anywhere): bash benchmarks/trl/run_all.sh [REPS] [bench ...]
#   e.g. bash benchmarks/trl/run_all.sh 3 dpo rm
#   benches: ppo_rm ppo_digits dpo rm sft grpo_digits grpo_rm rloo_digits rloo_rm
# The venvs are `make trl`'s (.venv-trl: TRL 1.16.0; .venv-trl-ppo: TRL 1.12.0, the last with
# PPOTrainer); the assets are built first if missing.
# env: RESULTS=dir (default runs/trl-results), EXTRA_ARGS="--trl-defaults" (passed to every
#      bench), TRL_BENCH_ASSETS (default runs/trl-assets), TRL_VENV, TRL_PPO_VENV
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
cd "$HERE/../.."
REPS=${1:-3}; shift || true
ALL="ppo_rm ppo_digits dpo rm sft grpo_digits grpo_rm rloo_digits rloo_rm"
BENCHES=${*:-$ALL}
V=${TRL_VENV:-.venv-trl}              # TRL 1.16.0
V112=${TRL_PPO_VENV:-.venv-trl-ppo}   # TRL 1.12.0: the last release with PPOTrainer
ASSETS=${TRL_BENCH_ASSETS:-runs/trl-assets}
OUT=${RESULTS:-runs/trl-results}
EXTRA_ARGS=${EXTRA_ARGS:-}
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false \
       TRL_EXPERIMENTAL_SILENCE=1 TRL_BENCH_ASSETS="$ASSETS"
[ -f "$ASSETS/manifest.json" ] || "$V/bin/python" "$HERE/make_assets.py" --out "$ASSETS"

cmd_for() {
  case "$1" in
    ppo_rm)      echo "$V112/bin/python $HERE/trl_ppo_bench.py --reward rm" ;;
    ppo_digits)  echo "$V112/bin/python $HERE/trl_ppo_bench.py --reward digits" ;;
    dpo)         echo "$V/bin/python $HERE/trl_dpo_bench.py" ;;
    rm)          echo "$V/bin/python $HERE/trl_rm_bench.py" ;;
    sft)         echo "$V/bin/python $HERE/trl_sft_bench.py" ;;
    grpo_digits) echo "$V/bin/python $HERE/trl_grpo_bench.py --algo grpo --reward digits" ;;
    grpo_rm)     echo "$V/bin/python $HERE/trl_grpo_bench.py --algo grpo --reward rm" ;;
    rloo_digits) echo "$V/bin/python $HERE/trl_grpo_bench.py --algo rloo --reward digits" ;;
    rloo_rm)     echo "$V/bin/python $HERE/trl_grpo_bench.py --algo rloo --reward rm" ;;
    *) echo "unknown bench $1" >&2; return 1 ;;
  esac
}

for b in $BENCHES; do
  for r in $(seq 1 "$REPS"); do
    c=$(cmd_for "$b") || exit 1
    python3 "$HERE/wait_quiet.py" --timeout 240
    echo "=== $b rep $r: $c"
    start=$(date +%s)
    timeout 900 $c $EXTRA_ARGS --assets "$ASSETS" --json "$OUT/${b}_${r}.json" > "$OUT/${b}_${r}.log" 2>&1
    rc=$?
    echo "    rc=$rc $(( $(date +%s) - start ))s  $(grep -A1 -E '^\[(ppo|dpo|rm|sft|grpo|rloo)' "$OUT/${b}_${r}.log" | head -2 | tr '\n' ' ' | cut -c1-300)"
  done
done
python3 "$HERE/summarize.py" "$OUT"
