#!/usr/bin/env python
"""Data-parallel scaling on this machine: the same PPO (and SFT) workload on 1 and 2 CPU
processes under ``torchrun``, seconds per step, peak memory per process, and the share of the
step spent in collectives.

Workloads (the bundled base model ``src/rlhfkit/assets/base``, fp32, each stage's YAML in
``configs/`` with the overrides below):
- ``ppo``: ``--rollout`` prompts per iteration over all processes (default 16), 32 new tokens,
  4 PPO epochs x 2 minibatches (so ``batch_size`` = rollout / (2 x processes) per process:
  the same update on any number of processes), a separate critic started from the policy,
  and the gold reward function as the scorer (``--reward_model null --reward_functions
  '[rlhfkit.tasks:gold_reward]'``, no reward model to train first);
- ``sft``: a global batch of ``--sft-batch`` demonstrations (default 16) of up to 128 tokens
  per optimiser step, split over the processes.

Layouts (processes x threads each): ``1x2`` (one process, both cores: what ``rlhfkit`` alone
does on a 2-core machine), ``1x1`` (one process, one thread: the per-process share of ``2x1``)
and ``2x1`` (two processes, one thread each, as torchrun sets ``OMP_NUM_THREADS=1``). A run of
two processes is launched with ``torchrun --standalone --nproc_per_node 2``, one of one process
with plain ``python`` (``torchrun --nproc_per_node 1`` would add accelerate's DDP wrapper around
a world of one); each process runs this script in ``--worker`` mode, which calls
``rlhfkit.cli.main`` after installing two measuring wrappers (in this script only, never in the
library):

- every step (``train_step``) is timed on every process; the first step (warm-up) and the last
  (profiled) are left out of the medians;
- the blocking ``torch.distributed`` calls (all_reduce, all_gather, broadcast, ...) are timed:
  rlhfkit's and accelerate's own reductions, on the main thread ("explicit");
- the last step runs under ``torch.profiler``: gloo's collectives (``gloo:all_reduce``, ...),
  DDP's gradient all-reduce included, run on gloo's worker threads; the union of their
  intervals over the step's wall time is "in flight", and the part of it when the main thread
  runs no operator (it waits, or runs Python) is "exposed".

A collective's time includes waiting for the slower process: PPO's processes sample different
responses of different lengths, so the one that finishes first waits in the next collective.

Prints, per workload and layout, the median over runs of each run's median seconds per step
(min / max over runs), the communication shares, the peak RSS of each process, the CPU that
other processes used meanwhile and the load average before and after (the machine is shared),
the commands, and writes a JSON.

    .venv/bin/python benchmarks/bench_distributed.py --repeats 3 --json /tmp/bench_distributed.json
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import nullcontext
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import MachineLoad  # noqa: E402  (sets the offline settings first)

ROOT = Path(__file__).resolve().parents[1]
BASE = ROOT / "src" / "rlhfkit" / "assets" / "base"
TORCHRUN = Path(sys.executable).with_name("torchrun")
LAYOUTS = {"1x2": (1, 2), "1x1": (1, 1), "2x1": (2, 1)}
COLLECTIVES = [
    "all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor", "broadcast",
    "reduce", "gather", "scatter", "barrier", "all_gather_object", "broadcast_object_list",
    "all_to_all_single",
]  # fmt: skip


# ----------------------------------------------------------------- the workloads
def stage_argv(workload: str, processes: int, args: argparse.Namespace, out: Path) -> list[str]:
    """The ``rlhfkit`` command line of one run (the same work on any number of processes)."""
    steps = args.steps + 2  # + the warm-up step and the profiled step
    quiet = ["--report_to", "[none]", "--eval_data", "null", "--save_every", "0",
             "--log_every", str(steps), "--cpu", "true", "--max_steps", str(steps),
             "--output_dir", str(out)]  # fmt: skip
    if workload == "ppo":
        micro = args.rollout // (2 * processes)
        return ["ppo", "--config", "configs/ppo.yaml", "--model", str(BASE),
                "--reward_model", "null", "--reward_functions", "[rlhfkit.tasks:gold_reward]",
                "--rollout_batch_size", str(args.rollout), "--batch_size", str(micro),
                "--ppo_epochs", "4", "--max_new_tokens", "32", "--sample_every", "1000000",
                *quiet]  # fmt: skip
    micro = args.sft_batch // processes
    return ["sft", "--config", "configs/sft.yaml", "--model", str(BASE),
            "--batch_size", str(micro), *quiet]  # fmt: skip


# ----------------------------------------------------------------- inside each process
class CollectiveClock:
    """Wall seconds spent inside blocking ``torch.distributed`` collectives on this process.
    Calls made from inside another timed call (``all_gather_object`` calls ``all_gather``) are
    counted once; ``async_op=True`` calls (FSDP's) return at once and are counted as calls
    only: the profiler sees them."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls = 0
        self.async_calls = 0
        self._depth = threading.local()

    def install(self) -> None:
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        for name in COLLECTIVES:
            original = getattr(dist, name, None)
            if original is None:
                continue
            timed = self._timed(original)
            setattr(dist, name, timed)
            if getattr(c10d, name, None) is original:
                setattr(c10d, name, timed)

    def _timed(self, function):
        @functools.wraps(function)
        def timed(*args, **kwargs):
            if getattr(self._depth, "value", 0) or kwargs.get("async_op"):
                self.async_calls += bool(kwargs.get("async_op"))
                return function(*args, **kwargs)
            self._depth.value = 1
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - started
                self.calls += 1
                self._depth.value = 0

        return timed


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _length(intervals: list[tuple[float, float]]) -> float:
    return sum(end - start for start, end in intervals)


def _minus(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Length of the union ``a`` outside the union ``b`` (both merged and sorted)."""
    inside, j = 0.0, 0
    for start, end in a:
        while j < len(b) and b[j][1] <= start:
            j += 1
        k = j
        while k < len(b) and b[k][0] < end:
            inside += min(end, b[k][1]) - max(start, b[k][0])
            k += 1
    return _length(a) - inside


def gloo_shares(prof, wall_s: float) -> dict[str, float]:
    """From one profiled step: seconds some gloo collective was in flight, and of those the
    seconds the main thread ran no operator (exposed); each also over the step's wall time."""
    events = list(prof.events())
    gloo = [e for e in events if e.name.startswith("gloo:")]
    by_thread: dict[int, float] = {}
    for e in events:
        if e.cpu_parent is None and not e.name.startswith(("gloo:", "c10d::")):
            by_thread[e.thread] = by_thread.get(e.thread, 0.0) + e.time_range.elapsed_us()
    main = max(by_thread, key=by_thread.get) if by_thread else None
    busy = _union(
        [
            (e.time_range.start, e.time_range.end)
            for e in events
            if e.thread == main and e.cpu_parent is None
            and not e.name.startswith(("gloo:", "c10d::"))
        ]
    )  # fmt: skip
    flight = _union([(e.time_range.start, e.time_range.end) for e in gloo])
    in_flight, exposed = _length(flight) / 1e6, _minus(flight, busy) / 1e6
    counts: dict[str, int] = {}
    for e in gloo:
        counts[e.name] = counts.get(e.name, 0) + 1
    return {
        "gloo_in_flight_s": in_flight,
        "gloo_exposed_s": exposed,
        "gloo_in_flight_share": in_flight / wall_s,
        "gloo_exposed_share": exposed / wall_s,
        "gloo_ops": counts,
    }


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def worker(out: Path, profile_step: int, argv: list[str]) -> int:
    """One process of a run: measure, run ``rlhfkit.cli.main(argv)``, write ``rank<r>.json``."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    import rlhfkit.trainers.rl
    import rlhfkit.trainers.sft  # noqa: F401  (imported before the baseline is read)
    from rlhfkit import cli
    from rlhfkit.trainers.loop import Trainer

    baseline_mib = _rss_mib()
    clock = CollectiveClock()
    clock.install()
    steps: list[dict] = []
    depth = [0]

    def timed_step(function):
        @functools.wraps(function)
        def step(self, *args, **kwargs):
            if depth[0]:  # a subclass's train_step calling the base's
                return function(self, *args, **kwargs)
            index = len(steps) + 1
            profiled = index == profile_step
            seconds, calls = clock.seconds, clock.calls
            context = profile(activities=[ProfilerActivity.CPU]) if profiled else nullcontext()
            depth[0] = 1
            started = time.perf_counter()
            try:
                with context as prof:
                    result = function(self, *args, **kwargs)
            finally:
                depth[0] = 0
            row = {
                "step": index,
                "wall_s": time.perf_counter() - started,
                "explicit_collective_s": clock.seconds - seconds,
                "explicit_collectives": clock.calls - calls,
                "profiled": profiled,
            }
            if profiled:
                row |= gloo_shares(prof, row["wall_s"])
            steps.append(row)
            return result

        return step

    for cls in (Trainer, rlhfkit.trainers.rl.RLTrainer):
        if "train_step" in vars(cls):
            cls.train_step = timed_step(vars(cls)["train_step"])
    code = cli.main(argv)
    rank = int(os.environ.get("RANK", "0"))
    record = {
        "rank": rank,
        "world": int(os.environ.get("WORLD_SIZE", "1")),
        "threads": torch.get_num_threads(),
        "exit_code": code,
        "baseline_rss_mib": baseline_mib,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "async_collectives": clock.async_calls,
        "steps": steps,
    }
    (out / f"rank{rank}.json").write_text(json.dumps(record, indent=1) + "\n")
    return code


# ----------------------------------------------------------------- the runs
def one_run(workload: str, layout: str, args: argparse.Namespace, scratch: Path) -> dict:
    processes, threads = LAYOUTS[layout]
    run_dir = Path(tempfile.mkdtemp(prefix=f"{workload}_{layout}_", dir=scratch))
    argv = stage_argv(workload, processes, args, run_dir / "output")
    launcher = [sys.executable]  # one process: what `rlhfkit` alone runs
    if processes > 1:
        launcher = [str(TORCHRUN), "--standalone", f"--nproc_per_node={processes}"]
    command = [*launcher, str(Path(__file__).resolve()), "--worker", str(run_dir),
               "--profile-step", str(args.steps + 2), "--", *argv]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="false")
    load, started = MachineLoad(), time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    wall, foreign = time.perf_counter() - started, load.foreign_cores()
    if done.returncode != 0:
        sys.exit(f"run failed ({done.returncode}): {shlex.join(command)}\n{done.stderr[-3000:]}")
    ranks = [json.loads((run_dir / f"rank{r}.json").read_text()) for r in range(processes)]
    timed = [s for s in ranks[0]["steps"] if s["step"] > 1 and not s["profiled"]]
    profiled = [next(s for s in r["steps"] if s["profiled"]) for r in ranks]
    explicit = [sum(s["explicit_collective_s"] for s in r["steps"][1:-1]) for r in ranks]
    timed_wall = sum(s["wall_s"] for s in timed)
    shutil.rmtree(run_dir / "output", ignore_errors=True)
    return {
        "sec_per_step_median": statistics.median(s["wall_s"] for s in timed),
        "steps_timed": len(timed),
        "first_step_s": ranks[0]["steps"][0]["wall_s"],
        "explicit_collective_share": [e / timed_wall for e in explicit],
        "gloo_in_flight_share": [p.get("gloo_in_flight_share", 0.0) for p in profiled],
        "gloo_exposed_share": [p.get("gloo_exposed_share", 0.0) for p in profiled],
        "gloo_ops": profiled[0].get("gloo_ops", {}),
        "peak_rss_mib": [r["peak_rss_mib"] for r in ranks],
        "baseline_rss_mib": [r["baseline_rss_mib"] for r in ranks],
        "threads": [r["threads"] for r in ranks],
        "wall_s": wall,
        "foreign_cores": foreign,
        "command": f"OMP_NUM_THREADS={threads} {shlex.join(command)}",
    }


def summarise(runs: list[dict]) -> dict:
    def med(key):
        return statistics.median(statistics.median(r[key]) for r in runs)

    per_run = [r["sec_per_step_median"] for r in runs]
    return {
        "sec_per_step_median": statistics.median(per_run),
        "sec_per_step_min": min(per_run),
        "sec_per_step_max": max(per_run),
        "explicit_collective_share": med("explicit_collective_share"),
        "gloo_in_flight_share": med("gloo_in_flight_share"),
        "gloo_exposed_share": med("gloo_exposed_share"),
        "peak_rss_mib_per_process": max(max(r["peak_rss_mib"]) for r in runs),
        "baseline_rss_mib": med("baseline_rss_mib"),
        "foreign_cores_median": statistics.median(r["foreign_cores"] for r in runs),
        "runs": runs,
    }


def _loads(loads: tuple[float, float, float]) -> str:
    return " ".join(f"{load:.2f}" for load in loads)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--workloads", nargs="+", default=["ppo", "sft"], choices=["ppo", "sft"])
    ap.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS))
    ap.add_argument("--repeats", type=int, default=3, help="runs of each (workload, layout)")
    ap.add_argument(
        "--steps", type=int, default=6, help="timed steps per run (+ warm-up + profiled)"
    )
    ap.add_argument(
        "--rollout", type=int, default=16, help="PPO prompts per iteration, all processes"
    )
    ap.add_argument(
        "--sft-batch", type=int, default=16, help="SFT sequences per step, all processes"
    )
    ap.add_argument("--json", type=Path, default=None, help="also write the result here")
    ap.add_argument("--worker", type=Path, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--profile-step", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("stage", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker is not None:
        stage = args.stage[1:] if args.stage[:1] == ["--"] else args.stage
        sys.exit(worker(args.worker, args.profile_step, stage))

    load_before = os.getloadavg()
    print(f"{os.cpu_count()} cores, load average (1, 5, 15 min): {_loads(load_before)}", flush=True)
    scratch = Path(tempfile.mkdtemp(prefix="bench_distributed_"))
    results: dict[str, dict[str, list[dict]]] = {w: {lay: [] for lay in args.layouts}
                                                 for w in args.workloads}  # fmt: skip
    for repeat in range(args.repeats):  # interleaved: the machine's load drifts
        for workload in args.workloads:
            for layout in args.layouts:
                run = one_run(workload, layout, args, scratch)
                results[workload][layout].append(run)
                print(
                    f"[{repeat + 1}/{args.repeats}] {workload} {layout}: "
                    f"{run['sec_per_step_median']:.3f} s/step, gloo in flight "
                    f"{statistics.median(run['gloo_in_flight_share']):.0%}, exposed "
                    f"{statistics.median(run['gloo_exposed_share']):.0%}, peak RSS "
                    f"{max(run['peak_rss_mib']):.0f} MiB, other load "
                    f"{run['foreign_cores']:.2f} cores",
                    flush=True,
                )
    shutil.rmtree(scratch, ignore_errors=True)
    summary = {w: {lay: summarise(runs) for lay, runs in by.items()} for w, by in results.items()}
    print("\nworkload layout  s/step median (min-max)  speed-up vs 1x2  explicit  "
          "gloo in flight  exposed  peak RSS/process  other load")  # fmt: skip
    for workload, by in summary.items():
        reference = by.get("1x2", next(iter(by.values())))["sec_per_step_median"]
        for layout, s in by.items():
            print(
                f"{workload:8} {layout:6}  {s['sec_per_step_median']:.3f} "
                f"({s['sec_per_step_min']:.3f}-{s['sec_per_step_max']:.3f})"
                f"{reference / s['sec_per_step_median']:>12.2f}x"
                f"{s['explicit_collective_share']:>10.1%}{s['gloo_in_flight_share']:>14.1%}"
                f"{s['gloo_exposed_share']:>9.1%}{s['peak_rss_mib_per_process']:>12.0f} MiB"
                f"{s['foreign_cores_median']:>11.2f}"
            )
    load_after = os.getloadavg()
    print(f"\nload average after (1, 5, 15 min): {_loads(load_after)}")
    print("\ncommands (one run of each):")
    for by in summary.values():
        for s in by.values():
            print(f"  {s['runs'][0]['command']}")
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "cpu_cores": os.cpu_count(),
        "load_average_before": load_before,
        "load_average_after": load_after,
        "settings": {k: v for k, v in vars(args).items() if k not in ("worker", "stage")},
        "command": shlex.join([sys.executable, *sys.argv]),
        "summary": summary,
    }
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
