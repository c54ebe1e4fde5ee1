"""Data parallelism with real processes: `torchrun --standalone --nproc_per_node 2` on the CPU
(gloo), each stage through the command line, against one process doing the same work.

Equality: 2 processes x a micro-batch of b make the same steps as 1 process x 2b (SFT, RM,
DPO, PPO) or as 1 process accumulating 2 micro-batches of b (GRPO, whose generation batches
sample their own groups), up to float summation order. PPO samples with top_k=1 here: each
process samples from its own random stream (`sample_seeds: process`), so with sampling on
the two runs see different (equally random) responses and only the update could be compared;
GRPO's streams are keyed by the generation batch's place in the data (`sample_seeds: data`),
so its samples are the same on any number of processes.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from helpers import sigterm_after_steps
from rlhfkit import checkpoint as ckpt
from rlhfkit.experience.generation import SamplingConfig, generate
from rlhfkit.tracking import read_jsonl

ENV = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
QUIET = ["--report_to", "none", "--cpu", "true", "--log_every", "1"]


def _jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def _command(processes: int, stage: str, args: list[str], launched: bool = False) -> list[str]:
    """``stage`` on ``processes`` processes: one without a launcher unless ``launched``."""
    if processes == 1 and not launched:
        return [sys.executable, "-m", "rlhfkit.cli", stage, *args, *QUIET]
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    return [*launcher, f"--nproc_per_node={processes}", "-m", "rlhfkit.cli", stage, *args, *QUIET]


def _launch(stage: str, args: list[str]) -> list[str]:
    """`rlhfkit launch` of ``stage`` on 2 processes: torchrun with the run's exit code."""
    launcher = [sys.executable, "-m", "rlhfkit.cli", "launch", "--standalone"]
    return [*launcher, "--nproc_per_node=2", stage, *args, *QUIET]


def _run(
    processes: int, stage: str, args: list[str], cwd: Path, launched: bool = False
) -> subprocess.CompletedProcess:
    result = subprocess.run(
        _command(processes, stage, args, launched), cwd=cwd, env=ENV, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    return result


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    final = run_dir / "final"
    weights = {}
    for file in sorted(final.rglob("*.safetensors")):
        prefix = str(file.relative_to(final))
        weights |= {f"{prefix}:{k}": v for k, v in load_file(file).items()}
    assert weights, f"no weights in {final}"
    return weights


def _assert_same_weights(a: Path, b: Path, atol: float) -> None:
    first, second = _weights(a), _weights(b)
    assert first.keys() == second.keys()
    worst = max((first[k].float() - second[k].float()).abs().max().item() for k in first)
    assert worst <= atol, f"weights differ by up to {worst}"


def _assert_moved(run_dir: Path, start: Path) -> None:
    """The run changed the model it started from (so equality is not of two no-ops)."""
    before = load_file(start / "model.safetensors")
    after = load_file(run_dir / "final" / "model.safetensors")
    shared = [k for k in before if k in after]
    assert max((before[k] - after[k]).abs().max().item() for k in shared) > 1e-4


def _steps(run_dir: Path) -> list[int]:
    """The step of every row of `metrics.jsonl` (written by the main process alone)."""
    return [row["step"] for row in read_jsonl(run_dir / "metrics.jsonl")]


@pytest.fixture(scope="module")
def model(tiny_model_dir, tmp_path_factory) -> Path:
    """The tiny GPT-2 without dropout, whose masks would differ between the two runs."""
    path = tmp_path_factory.mktemp("no_dropout")
    lm = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    lm.config.update({"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0})
    lm.save_pretrained(path)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("distributed_data")
    words = ["red", "blue", "cat", "dog", "tree", "sky", "book", "food"]
    demos = [  # responses of 3 to 6 tokens: SFT weighs its micro-batches by their tokens
        {"prompt": f"The {words[i % 8]} number {i}",
         "response": f" is {words[(i + 3) % 8]}" + " very" * (i % 4) + "."}
        for i in range(24)
    ]  # fmt: skip
    pairs = [
        {"prompt": d["prompt"], "chosen": d["response"], "rejected": f" was {words[i % 8]} {i}"}
        for i, d in enumerate(demos)
    ]
    prompts = [{"prompt": d["prompt"]} for d in demos]
    return {
        "demos": _jsonl(root / "demos.jsonl", demos),
        "pairs": _jsonl(root / "pairs.jsonl", pairs),
        "prompts": _jsonl(root / "prompts.jsonl", prompts),
    }


def _stage_args(stage: str, model: Path, data: dict[str, str], batch: int) -> list[str]:
    common = ["--model", str(model), "--eval_data", "null", "--batch_size", str(batch),
              "--max_steps", "3", "--learning_rate", "1e-4", "--seed", "3"]  # fmt: skip
    train = data["demos"] if stage == "sft" else data["pairs"]
    return [*common, "--train_data", train, "--max_length", "32"]


@pytest.mark.parametrize("padding_free", ["false", "true"], ids=["padded", "padding_free"])
@pytest.mark.parametrize("stage", ["sft", "rm", "dpo"])
def test_two_processes_train_as_one_with_twice_the_batch(
    stage, padding_free, model, data, tmp_path
):
    packing = ["--padding_free", padding_free]
    _run(1, stage, [*_stage_args(stage, model, data, 8), *packing, "--output_dir", "one"],
         tmp_path)  # fmt: skip
    _run(2, stage, [*_stage_args(stage, model, data, 4), *packing, "--output_dir", "two"],
         tmp_path)  # fmt: skip
    _assert_same_weights(tmp_path / "one", tmp_path / "two", atol=1e-5)
    assert _steps(tmp_path / "two") == [1, 2, 3]


def _rl_args(stage: str, model: Path, data: dict[str, str]) -> list[str]:
    common = ["--model", str(model), "--train_data", data["prompts"], "--eval_data", "null",
              "--reward_model", "null", "--reward_functions", "[rlhfkit.tasks:digits_reward]",
              "--max_new_tokens", "6", "--learning_rate", "1e-4", "--seed", "5"]  # fmt: skip
    if stage == "ppo":
        return [*common, "--rollout_batch_size", "8", "--ppo_epochs", "2", "--top_k", "1",
                "--critic", "value_head"]  # fmt: skip
    # 4 prompts an iteration x 4 responses: 8 sequences on each of 2 processes
    return [*common, "--num_generations", "4", "--kl_coef", "0.1", "--rollout_batch_size", "4",
            "--batch_size", "8"]  # fmt: skip


def test_ppo_on_two_processes_makes_the_update_of_one_with_the_whole_batch(model, data, tmp_path):
    args = [*_rl_args("ppo", model, data), "--max_steps", "3"]
    _run(1, "ppo", [*args, "--batch_size", "8", "--output_dir", "one"], tmp_path)
    _run(2, "ppo", [*args, "--batch_size", "4", "--output_dir", "two"], tmp_path)
    _assert_same_weights(tmp_path / "one", tmp_path / "two", atol=1e-5)
    _assert_moved(tmp_path / "two", model)
    one = read_jsonl(tmp_path / "one" / "metrics.jsonl")
    two = read_jsonl(tmp_path / "two" / "metrics.jsonl")
    assert _steps(tmp_path / "two") == [1, 2, 3]
    for key in ("train/score/mean", "train/kl/ref", "train/kl/coef"):
        assert [r[key] for r in two] == pytest.approx([r[key] for r in one], abs=1e-5), key


def test_grpo_on_two_processes_learns_as_one_accumulating_two_micro_batches(model, data, tmp_path):
    args = [*_rl_args("grpo", model, data), "--max_steps", "3", "--generation_prompts", "2"]
    _run(1, "grpo", [*args, "--gradient_accumulation_steps", "2", "--output_dir", "one"],
         tmp_path)  # fmt: skip
    _run(2, "grpo", [*args, "--output_dir", "two"], tmp_path)
    _assert_same_weights(tmp_path / "one", tmp_path / "two", atol=1e-5)
    _assert_moved(tmp_path / "two", model)
    assert _steps(tmp_path / "two") == [1, 2, 3]


@pytest.mark.parametrize("stage", ["sft", "grpo", "ppo"])
def test_fsdp_shards_the_trained_models_and_trains_as_ddp(stage, model, data, tmp_path):
    if stage == "sft":
        args = [*_stage_args("sft", model, data, 4), "--save_every", "3"]
    elif stage == "grpo":  # with a sharded reference
        args = [*_rl_args("grpo", model, data), "--max_steps", "2", "--save_every", "2"]
    else:
        args = [*_rl_args("ppo", model, data), "--max_steps", "2", "--batch_size", "4",
                "--save_every", "2", "--critic", "separate", "--critic_model", str(model)]  # fmt: skip
    _run(2, stage, [*args, "--output_dir", "ddp"], tmp_path)
    _run(2, stage, [*args, "--output_dir", "fsdp", "--fsdp", "true"], tmp_path)
    _assert_same_weights(tmp_path / "ddp", tmp_path / "fsdp", atol=1e-5)
    # Each process saved its own half of the optimiser state: the shards of every tensor.
    checkpoint = max((tmp_path / "fsdp").glob("checkpoint-*"))
    halves = [load_file(checkpoint / f"optimizer_{rank}.safetensors") for rank in (0, 1)]
    whole = load_file(max((tmp_path / "ddp").glob("checkpoint-*")) / "optimizer.safetensors")
    assert sum(t.numel() for half in halves for t in half.values()) == pytest.approx(
        sum(t.numel() for t in whole.values()), abs=64
    )
    assert all(sum(t.numel() for t in half.values()) < 0.6 * sum(
        t.numel() for t in whole.values()) for half in halves)  # fmt: skip


def test_two_processes_keep_the_best_model_one_process_keeps(model, data, tmp_path):
    # nll falls at every step here; the highest is asked for, so that final/ is a copy of an
    # earlier step's best/ and not the last step's model.
    best = ["--eval_data", data["demos"], "--max_eval_samples", "8", "--eval_every", "1",
            "--metric_for_best_model", "eval/nll", "--greater_is_better", "true",
            "--load_best_model_at_end", "true"]  # fmt: skip
    _run(1, "sft", [*_stage_args("sft", model, data, 8), *best, "--output_dir", "one"], tmp_path)
    for name, fsdp in (("ddp", "false"), ("fsdp", "true")):
        args = [*_stage_args("sft", model, data, 4), *best, "--fsdp", fsdp]
        _run(2, "sft", [*args, "--output_dir", name], tmp_path)
        _assert_same_weights(tmp_path / "one", tmp_path / name, atol=1e-5)
        state = json.loads((tmp_path / name / "final" / "trainer_state.json").read_text())
        assert state["best"]["step"] == 1 and state["last_step"] == 3, name
        assert (tmp_path / name / "best" / "manifest.json").is_file()


def test_fsdp_with_lora_writes_a_merged_model(model, data, tmp_path):
    args = [*_stage_args("sft", model, data, 4), "--lora", "true", "--lora_r", "4"]
    _run(2, "sft", [*args, "--output_dir", "lora", "--fsdp", "true"], tmp_path)
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "lora" / "final")
    assert not any("lora" in name for name, _ in merged.named_parameters())
    _assert_moved(tmp_path / "lora", model)


def _kill_after_checkpoint(command: list[str], cwd: Path, checkpoint: Path) -> None:
    """Start `command` and kill -9 it with every process it started once `checkpoint` is
    complete (renamed into place). torchrun starts each worker in a session of its own, so
    killing its process group would leave the workers running."""
    process = subprocess.Popen(command, cwd=cwd, env=ENV, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 240
    while not checkpoint.is_dir() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    launcher = psutil.Process(process.pid)
    workers = launcher.children(recursive=True)
    for each in [*workers, launcher]:
        with contextlib.suppress(psutil.NoSuchProcess):
            each.kill()
    psutil.wait_procs([*workers, launcher], timeout=30)
    assert checkpoint.is_dir(), "the run ended or timed out before its checkpoint"
    assert workers, "no worker processes to kill"


@pytest.mark.parametrize(("stage", "fsdp"), [("ppo", "false"), ("grpo", "false"), ("ppo", "true")])
def test_a_two_process_run_killed_and_resumed_ends_as_the_uninterrupted_one(
    stage, fsdp, model, data, tmp_path
):
    args = [*_rl_args(stage, model, data), "--max_steps", "4", "--save_every", "1",
            "--batch_size", "4" if stage == "ppo" else "8", "--top_k", "0", "--fsdp", fsdp]  # fmt: skip
    _run(2, stage, [*args, "--output_dir", "straight"], tmp_path)
    resumed = [*args, "--output_dir", "killed", "--resume", "true"]
    _kill_after_checkpoint(_command(2, stage, resumed), tmp_path, tmp_path / "killed/checkpoint-2")
    assert not (tmp_path / "killed" / "final").exists()
    assert "resumed from" in _run(2, stage, resumed, tmp_path).stderr
    _assert_same_weights(tmp_path / "straight", tmp_path / "killed", atol=0.0)
    assert _steps(tmp_path / "killed") == [1, 2, 3, 4]


def test_sigterm_to_the_launcher_stops_both_processes_at_one_step_with_a_checkpoint(
    model, data, tmp_path
):
    """torchrun passes its SIGTERM on to its workers, each at its own moment: they agree on
    one step, write its checkpoint together (FSDP: each process its optimiser shard), and the
    run resumes from it to the uninterrupted run's model. `rlhfkit launch` exits 143, as one
    process stopped by SIGTERM does (torchrun itself exits 1)."""
    args = [*_rl_args("ppo", model, data), "--max_steps", "12", "--batch_size", "4",
            "--top_k", "0", "--fsdp", "true"]  # fmt: skip
    _run(2, "ppo", [*args, "--output_dir", "straight"], tmp_path)
    stopped = [*args, "--output_dir", "stopped"]
    process = subprocess.Popen(_launch("ppo", stopped), cwd=tmp_path, env=ENV,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    stderr = sigterm_after_steps(process, tmp_path / "stopped")
    assert process.returncode == 143, stderr[-4000:]
    assert "Traceback" not in stderr
    assert stderr.count("rlhfkit ppo: stopped by SIGTERM after step") == 1, stderr[-4000:]
    checkpoint = ckpt.latest_checkpoint(tmp_path / "stopped")
    step = ckpt.read_json(checkpoint / ckpt.STATE_FILE)["step"]
    assert sorted(p.name for p in checkpoint.glob("rng_state_*")) == [
        "rng_state_0.safetensors",
        "rng_state_1.safetensors",
    ]
    assert _steps(tmp_path / "stopped")[-1] == step < 12
    assert "resumed from" in _run(2, "ppo", stopped, tmp_path).stderr
    _assert_same_weights(tmp_path / "straight", tmp_path / "stopped", atol=0.0)
    assert _steps(tmp_path / "stopped") == list(range(1, 13))


def _two_nodes(stage: str, args: list[str], cwd: Path) -> list[subprocess.Popen]:
    """``stage`` on two nodes of one process each, as a cluster of two machines runs it: two
    torchrun launchers (``--nnodes 2``) meeting at a c10d rendezvous, here both on localhost."""
    with socket.socket() as sock:  # a free port for the rendezvous
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1",
                "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}", f"--rdzv_id=r{port}"]  # fmt: skip
    command = [*launcher, "-m", "rlhfkit.cli", stage, *args, *QUIET]
    return [
        subprocess.Popen(
            command, cwd=cwd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )  # fmt: skip
        for _ in range(2)
    ]


def _finished(launchers: list[subprocess.Popen]) -> list[int]:
    """Each launcher's exit code, once all have ended; the output of one that failed."""
    codes = [launcher.wait(300) for launcher in launchers]
    for launcher, code in zip(launchers, codes, strict=True):
        assert code == 0, launcher.stdout.read()[-4000:]
    return codes


@pytest.mark.parametrize("stage", ["sft", "rm", "dpo", "grpo", "ppo"])
def test_two_nodes_train_as_one_node_of_two_processes(stage, model, data, tmp_path):
    if stage in ("grpo", "ppo"):
        args = [*_rl_args(stage, model, data), "--max_steps", "2", "--batch_size", "4"]
    else:
        args = _stage_args(stage, model, data, 4)
    _run(2, stage, [*args, "--output_dir", "one_node"], tmp_path)
    _finished(_two_nodes(stage, [*args, "--output_dir", "two_nodes"], tmp_path))
    _assert_same_weights(tmp_path / "one_node", tmp_path / "two_nodes", atol=0.0)


def test_a_node_whose_launcher_is_killed_stops_both_and_a_restart_resumes_exactly(
    model, data, tmp_path
):
    args = [*_rl_args("ppo", model, data), "--max_steps", "4", "--save_every", "1",
            "--batch_size", "4", "--top_k", "0"]  # fmt: skip
    _run(2, "ppo", [*args, "--output_dir", "straight"], tmp_path)
    resumed = [*args, "--output_dir", "nodes", "--resume", "true"]
    first, second = _two_nodes("ppo", resumed, tmp_path)
    checkpoint, deadline = tmp_path / "nodes" / "checkpoint-2", time.monotonic() + 240
    while not checkpoint.is_dir() and time.monotonic() < deadline:
        time.sleep(0.02)
    second.kill()  # kill -9 of one machine's launcher; its worker and the other node go on
    assert first.wait(120) != 0 and second.wait(30) != 0  # both stop, neither trains on
    assert not (tmp_path / "nodes" / "final").exists()
    _finished(_two_nodes("ppo", resumed, tmp_path))
    _assert_same_weights(tmp_path / "straight", tmp_path / "nodes", atol=0.0)


def test_a_checkpoint_resumes_only_on_the_launch_that_wrote_it(model, data, tmp_path):
    """Another number of processes would not continue the data positions and random streams
    of the run, and a sharded optimiser state fits only its own launch: a usage error before
    anything is loaded, the checkpoint left as it was."""
    args = [*_stage_args("sft", model, data, 4), "--max_steps", "40", "--save_every", "1",
            "--output_dir", "run", "--resume", "true"]  # fmt: skip
    _kill_after_checkpoint(_command(2, "sft", args), tmp_path, tmp_path / "run/checkpoint-1")
    launches = [(1, [], "1 process without fsdp"), (2, ["--fsdp", "true"], "2 processes with fsdp")]
    for processes, extra, now in launches:
        result = subprocess.run(_command(processes, "sft", [*args, *extra]), cwd=tmp_path,
                                env=ENV, capture_output=True, text=True, timeout=300)  # fmt: skip
        assert result.returncode != 0
        error = next(line for line in result.stderr.splitlines() if "rlhfkit sft: error" in line)
        assert "written by a run on 2 processes without fsdp" in error and now in error
    assert not (tmp_path / "run" / "final").exists()
    _run(2, "sft", args, tmp_path)  # the launch that wrote it goes on
    assert _steps(tmp_path / "run")[-1] == 40


def test_a_launch_on_a_directory_another_run_holds_is_refused_by_every_process(
    model, data, tmp_path
):
    """The main process holds the lock; its refusal reaches the other process too, so each
    says who holds it and the launch exits 2, as one refused process does. Once the first has
    exited the launcher stops the other, on a busy machine at times before it has said so."""
    args = [*_stage_args("sft", model, data, 4), "--max_steps", "1000000", "--output_dir", "run"]
    holder = subprocess.Popen(_command(1, "sft", args), cwd=tmp_path, env=ENV,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        metrics = tmp_path / "run" / "metrics.jsonl"
        deadline = time.monotonic() + 120
        while not metrics.is_file() and holder.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert holder.poll() is None, "the first run ended before the second started"
        second = subprocess.run(_launch("sft", args), cwd=tmp_path, env=ENV,
                                capture_output=True, text=True, timeout=300)  # fmt: skip
    finally:
        holder.kill()
        holder.wait()
    refusals = [line for line in second.stderr.splitlines() if "rlhfkit sft: error" in line]
    assert second.returncode == 2, second.stderr[-4000:]
    assert refusals and all(f"pid {holder.pid}" in line for line in refusals), refusals
    assert len(refusals) <= 2, refusals
    assert "Connection closed" not in second.stderr and "Traceback" not in second.stderr


def test_a_rollout_that_does_not_split_over_the_processes_fails_naming_field_and_world(
    model, data, tmp_path
):
    args = [*_rl_args("ppo", model, data), "--max_steps", "1", "--batch_size", "4",
            "--rollout_batch_size", "4", "--output_dir", "bad"]  # fmt: skip
    result = subprocess.run(
        _command(2, "ppo", args), cwd=tmp_path, env=ENV, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert result.returncode != 0
    message = next(line for line in result.stderr.splitlines() if "rlhfkit ppo: error" in line)
    assert "rollout_batch_size" in message and "2 processes" in message


def test_data_too_small_for_one_batch_per_process_fails_naming_it(model, tmp_path):
    demos = _jsonl(tmp_path / "two.jsonl", [{"prompt": "The cat", "response": " is red."}] * 2)
    args = ["--model", str(model), "--train_data", demos, "--eval_data", "null",
            "--batch_size", "2", "--max_steps", "1", "--output_dir", "small"]  # fmt: skip
    result = subprocess.run(_command(2, "sft", args), cwd=tmp_path, env=ENV,
                            capture_output=True, text=True, timeout=300)  # fmt: skip
    assert result.returncode != 0
    error = next(line for line in result.stderr.splitlines() if "rlhfkit sft: error" in line)
    assert "train_data: 2 examples make 1 batch(es) of 2, fewer than the 2 processes" in error


SHARDED_GENERATION = """
import datetime, json, os, sys
import torch, torch.distributed as dist
from transformers import AutoModelForCausalLM
from rlhfkit.experience.generation import SamplingConfig, generate
from rlhfkit.runtime.sharding import shard

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
model = AutoModelForCausalLM.from_pretrained(sys.argv[1]).eval()
config = SamplingConfig(max_new_tokens=8, greedy=True)
# Process 0 stops at once (its EOS is its first greedy token); process 1 runs all 8 steps.
query = torch.tensor([[5, 6, 7]] if dist.get_rank() == 0 else [[5, 6, 7], [8, 9, 10]])
first = generate(model, query, torch.ones_like(query), config, eos_token_id=1, pad_token_id=0)
eos = int(first.response[0, 0]) if dist.get_rank() == 0 else 1
shard(model)
out = generate(model, query, torch.ones_like(query), config, eos_token_id=eos, pad_token_id=0)
with open(f"{sys.argv[2]}/rank{dist.get_rank()}.json", "w") as f:
    json.dump(out.response.tolist(), f)
dist.barrier()  # both done before either tears its connections down
dist.destroy_process_group()
# On a loaded host gloo's threads can still be joinable when the interpreter's C++ destructors
# run, and the process aborts after its work is done and written: leave without them.
sys.stdout.flush()
os._exit(0)
"""


def test_sharded_generation_runs_every_forward_on_every_process(model, tmp_path):
    """Under FSDP each decoding step gathers weights from all processes: a process whose rows
    all stopped keeps stepping until every process's rows have, instead of leaving the others
    waiting on a gather that never comes."""
    script = tmp_path / "generate.py"
    script.write_text(SHARDED_GENERATION)
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    result = subprocess.run([*launcher, str(script), str(model), str(tmp_path)], env=ENV,
                            capture_output=True, text=True, timeout=180)  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    responses = [torch.tensor(json.loads((tmp_path / f"rank{r}.json").read_text())) for r in (0, 1)]
    query = torch.tensor([[5, 6, 7], [8, 9, 10]])
    whole = generate(AutoModelForCausalLM.from_pretrained(model).eval(), query,
                     torch.ones_like(query), SamplingConfig(max_new_tokens=8, greedy=True),
                     eos_token_id=1, pad_token_id=0).response  # fmt: skip
    assert torch.equal(responses[1], whole)  # decoded through the shards as by the whole model
    assert responses[0][0, 0] == whole[0, 0]  # process 0 emitted its EOS at once


@pytest.mark.parametrize("command", [["eval"], ["pipeline"], ["label", "export"]])
def test_a_command_that_runs_in_one_process_refuses_a_launcher(command, tmp_path):
    """What torchrun tells every process it starts (WORLD_SIZE) stops a command that would
    repeat its work in each, before it touches a file."""
    env = dict(ENV, WORLD_SIZE="2", RANK="0")
    result = subprocess.run([sys.executable, "-m", "rlhfkit.cli", *command], cwd=tmp_path,
                            env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 2
    assert "runs in one process" in result.stderr and "WORLD_SIZE=2" in result.stderr
    assert "sft, rm, ppo, dpo, grpo, rloo" in result.stderr
    assert "Traceback" not in result.stderr and not list(tmp_path.iterdir())


def test_fsdp_in_one_process_trains_the_whole_model_and_says_so(model, data, tmp_path):
    args = [*_stage_args("sft", model, data, 8), "--output_dir", "one"]
    _run(1, "sft", args, tmp_path)
    alone = _run(1, "sft", [*args[:-1], "fsdp_alone", "--fsdp", "true"], tmp_path)
    assert "one process has no others to shard its models over" in alone.stderr
    _assert_same_weights(tmp_path / "one", tmp_path / "fsdp_alone", atol=0)


def test_fsdp_under_a_launcher_of_one_process_shards_over_a_group_of_one(model, data, tmp_path):
    """The whole FSDP path in one process, as one GPU runs it: the trained model held as shards
    of its full size, the optimiser state saved per process, the same weights as without."""
    args = [*_stage_args("sft", model, data, 8), "--save_every", "3"]
    _run(1, "sft", [*args, "--output_dir", "one"], tmp_path)
    alone = _run(1, "sft", [*args, "--output_dir", "fsdp", "--fsdp", "true"], tmp_path, True)
    assert "no others to shard" not in alone.stderr
    _assert_same_weights(tmp_path / "one", tmp_path / "fsdp", atol=1e-6)
    checkpoint = max((tmp_path / "fsdp").glob("checkpoint-*"))
    assert (checkpoint / "optimizer_0.safetensors").is_file()
    assert not (checkpoint / "optimizer.safetensors").exists()


def test_leaving_closes_the_process_group(tmp_path):
    # The CLI leaves the group once its command is done, so that no process exits with gloo's
    # threads still running (which aborted one process of a finished run in CI).
    import torch.distributed as dist

    from rlhfkit.runtime.distributed import leave_process_group

    store = f"file://{tmp_path / 'store'}"
    dist.init_process_group("gloo", init_method=store, rank=0, world_size=1)
    leave_process_group()
    assert not dist.is_initialized()
    leave_process_group()  # no group: nothing to do


def test_a_process_that_was_in_a_group_ends_without_the_interpreters_finalization(tmp_path):
    """How every process of a launched run ends (cli._exit): its atexit functions run and its
    output is flushed, the exit code is the command's, and the interpreter's finalization,
    where gloo's threads could abort a finished process, is skipped: an object's __del__ that
    finalization would call never runs (it does in the control, a normal exit)."""
    script = tmp_path / "end.py"
    script.write_text(
        "import atexit, sys\n"
        "from rlhfkit.runtime import distributed\n"
        "class Finalized:\n"
        "    def __del__(self):\n"
        "        print('finalized', flush=True)\n"
        "kept = Finalized()\n"
        "atexit.register(lambda: print('atexit ran'))\n"
        "sys.stdout.write('unflushed ')\n"
        "sys.exit(7) if sys.argv[1] == 'normal' else distributed.exit_without_finalizing(7)\n"
    )
    ended = {
        how: subprocess.run(
            [sys.executable, str(script), how], capture_output=True, text=True, env=ENV
        )
        for how in ("normal", "without")
    }
    assert ended["normal"].returncode == ended["without"].returncode == 7
    assert ended["normal"].stdout.split() == ["unflushed", "atexit", "ran", "finalized"]
    assert ended["without"].stdout.split() == ["unflushed", "atexit", "ran"]
    assert ended["without"].stderr == ""
