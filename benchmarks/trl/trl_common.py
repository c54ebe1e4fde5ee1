"""What the TRL benchmarks in this folder share, without TRL itself.

Only torch and transformers are used here, so the definitions (the digit reward, the
held-out evaluation, peak RSS, step and generation timers, the CPU other processes use) are
the same ones ``benchmarks/bench_*.py`` measure rlhfkit against. Importing this module sets
the offline variables before any Hugging Face import, so nothing is fetched from the hub.

The assets (tokenizer, models, data) come from ``make_assets.py``; their directory is
``--assets DIR``, else ``$TRL_BENCH_ASSETS``, else ``runs/trl-assets`` in the repository.
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_DISABLED", "true")
os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")

import json
import platform
import re
import resource
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
DEFAULT_ASSETS = os.environ.get("TRL_BENCH_ASSETS", str(REPO / "runs" / "trl-assets"))
OUT_ROOT = REPO / "runs" / "trl-out"  # where a bench writes its trainer's output_dir by default
_DIGIT = re.compile(r"\d")


# ---------------------------------------------------------------- rewards
def digit_reward(completion: str) -> float:
    """Programmatic reward matching the preference data: more digits is better.

    min(#digit characters, 8) / 8, i.e. in [0, 1].
    """
    return min(len(_DIGIT.findall(completion)), 8) / 8.0


# ---------------------------------------------------------------- io
def load_jsonl(path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def assets(path=None) -> Path:
    p = Path(path or DEFAULT_ASSETS)
    if not (p / "manifest.json").exists():
        sys.exit(f"assets not found in {p}: run benchmarks/trl/make_assets.py --out {p} first")
    return p


def peak_rss_mib() -> float:
    # Linux: ru_maxrss is in KiB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def stats(xs) -> dict:
    xs = list(xs)
    if not xs:
        return {"n": 0}
    return {
        "n": len(xs),
        "min": min(xs),
        "median": statistics.median(xs),
        "max": max(xs),
        "mean": statistics.fmean(xs),
    }


def env_info() -> dict:
    import transformers

    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
    }
    for mod in ("trl", "datasets", "accelerate", "peft", "tokenizers"):
        try:
            info[mod] = __import__(mod).__version__
        except Exception:  # pragma: no cover
            info[mod] = None
    return info


def emit(result: dict, json_path=None):
    """Print a single machine-readable line (and optionally write it to a file)."""
    result = dict(result)
    result.setdefault("peak_rss_mib", peak_rss_mib())
    result["env"] = env_info()
    line = json.dumps(result, default=float)
    print("RESULT " + line, flush=True)
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(result, indent=1, default=float) + "\n")


# ---------------------------------------------------------------- contention
def _proc_stat_busy_s() -> float:
    """Machine-wide busy CPU seconds (all cores) from /proc/stat."""
    with open("/proc/stat") as f:
        parts = f.readline().split()[1:]
    vals = [int(x) for x in parts]
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)  # idle + iowait
    return (sum(vals[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _own_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime + c.ru_utime + c.ru_stime


class ContentionMeter:
    """Estimates how much CPU *other* processes used while we ran (a shared machine is noisy).

    foreign_cores = (machine busy CPU-seconds - our CPU-seconds) / wall seconds, i.e. the average number
    of cores busy with someone else's work.  ~0 means a quiet machine; ~1 on a 2-core box means the
    numbers are heavily disturbed.
    """

    def __init__(self):
        self.t0 = time.perf_counter()
        self.busy0 = _proc_stat_busy_s()
        self.own0 = _own_cpu_s()

    def read(self) -> dict:
        wall = time.perf_counter() - self.t0
        busy = _proc_stat_busy_s() - self.busy0
        own = _own_cpu_s() - self.own0
        return {
            "wall_s": wall,
            "own_cores": own / wall if wall else None,
            "foreign_cores": max(0.0, busy - own) / wall if wall else None,
            "loadavg_1m": os.getloadavg()[0],
        }


# ---------------------------------------------------------------- timing
class GenerateTimer:
    """Wraps ``model.generate`` (instance attribute) to time generation and count new tokens."""

    def __init__(self, model, pad_token_id: int, eos_token_id: int):
        self.model = model
        self.pad = pad_token_id
        self.eos = eos_token_id
        self.calls = []  # (seconds, batch, new_len, non_pad_new_tokens)
        self._orig = model.generate

        def timed_generate(*args, **kwargs):
            inp = kwargs.get("input_ids", args[0] if args else None)
            in_len = inp.shape[1] if inp is not None else 0
            t0 = time.perf_counter()
            out = self._orig(*args, **kwargs)
            dt = time.perf_counter() - t0
            seqs = out.sequences if hasattr(out, "sequences") else out
            new = seqs[:, in_len:]
            self.calls.append((dt, new.shape[0], new.shape[1], int((new != self.pad).sum())))
            return out

        model.generate = timed_generate

    def restore(self):
        self.model.generate = self._orig

    def summary(self, skip_first_calls: int = 0) -> dict:
        calls = self.calls[skip_first_calls:]
        secs = sum(c[0] for c in calls)
        slots = sum(c[1] * c[2] for c in calls)
        real = sum(c[3] for c in calls)
        return {
            "generate_calls": len(calls),
            "generate_seconds": secs,
            "generated_token_slots": slots,
            "generated_tokens_nonpad": real,
            "gen_tokens_per_s": slots / secs if secs else None,
            "gen_nonpad_tokens_per_s": real / secs if secs else None,
        }


def make_step_callback():
    """A transformers TrainerCallback that records wall time at every step end and every log."""
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.t_begin = None
            self.step_ends = []
            self.logs = []

        def on_train_begin(self, args, state, control, **kw):
            self.t_begin = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            self.step_ends.append(time.perf_counter())

        def on_log(self, args, state, control, logs=None, **kw):
            if logs is not None:
                self.logs.append({"step": state.global_step, **logs})

        def step_times(self):
            ts = [self.t_begin] + self.step_ends
            return [b - a for a, b in zip(ts, ts[1:], strict=False)]

    return StepTimer()


# ---------------------------------------------------------------- eval protocol
@torch.no_grad()
def eval_policy(
    policy,
    tok,
    prompts,
    reward_model=None,
    max_new_tokens=32,
    seed=1234,
    batch_size=32,
    temperature=1.0,
):
    """Library-agnostic rollout eval: sample completions for fixed prompts with a fixed seed.

    Returns mean digit_reward and (if given) mean reward-model score of prompt+completion(+EOS).
    """
    was_training = policy.training
    policy.eval()
    torch.manual_seed(seed)
    old_side = tok.padding_side
    tok.padding_side = "left"
    completions, rm_scores = [], []
    for i in range(0, len(prompts), batch_size):
        chunk = prompts[i : i + batch_size]
        enc = tok(chunk, return_tensors="pt", padding=True)
        out = policy.generate(
            **enc,
            max_new_tokens=max_new_tokens,
            do_sample=True,
            temperature=temperature,
            top_k=0,
            top_p=1.0,
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
        )
        new = out[:, enc["input_ids"].shape[1] :]
        for row in new:
            ids = row.tolist()
            if tok.eos_token_id in ids:
                ids = ids[: ids.index(tok.eos_token_id) + 1]
            ids = [t for t in ids if t != tok.pad_token_id]
            completions.append(ids)
    texts = [tok.decode(c, skip_special_tokens=True) for c in completions]
    if reward_model is not None:
        reward_model.eval()
        tok.padding_side = "right"
        for i in range(0, len(prompts), batch_size):
            seqs = []
            for p, c in zip(
                prompts[i : i + batch_size], completions[i : i + batch_size], strict=True
            ):
                seqs.append(tok(p)["input_ids"] + c)
            L = max(len(s) for s in seqs)
            ids = torch.full((len(seqs), L), tok.pad_token_id)
            mask = torch.zeros((len(seqs), L), dtype=torch.long)
            for j, s in enumerate(seqs):
                ids[j, : len(s)] = torch.tensor(s)
                mask[j, : len(s)] = 1
            rm_scores.extend(reward_model(input_ids=ids, attention_mask=mask).logits[:, 0].tolist())
    tok.padding_side = old_side
    if was_training:
        policy.train()
    res = {
        "digit_reward": sum(digit_reward(t) for t in texts) / len(texts),
        "mean_completion_tokens": sum(len(c) for c in completions) / len(completions),
        "sample": texts[:2],
    }
    if rm_scores:
        res["rm_score"] = sum(rm_scores) / len(rm_scores)
    return res


@torch.no_grad()
def rm_pair_accuracy(rm, tok, rows, batch_size=64):
    """Fraction of (prompt, chosen, rejected) rows where score(chosen) > score(rejected)."""
    rm.eval()
    old = tok.padding_side
    tok.padding_side = "right"

    def score(texts):
        out = []
        for i in range(0, len(texts), batch_size):
            enc = tok(texts[i : i + batch_size], return_tensors="pt", padding=True)
            out.append(rm(**enc).logits[:, 0])
        return torch.cat(out)

    eos = tok.eos_token
    ch = score([r["prompt"] + r["chosen"] + eos for r in rows])
    rj = score([r["prompt"] + r["rejected"] + eos for r in rows])
    tok.padding_side = old
    return {"accuracy": (ch > rj).float().mean().item(), "margin": (ch - rj).mean().item()}


# ---------------------------------------------------------------- Trainer-based bench summary
def common_training_args(args, **overrides) -> dict:
    """Settings shared by the offline (DPO/RM/SFT) benches: fp32 on CPU, constant LR, plain AdamW,
    file-order batches (train_sampling_strategy='sequential') so a loss curve can be compared with
    another library fed the same batches in the same order."""
    kw = dict(
        output_dir=args.out_dir,
        per_device_train_batch_size=args.batch,
        gradient_accumulation_steps=1,
        max_steps=args.steps,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        optim="adamw_torch",
        adam_beta1=0.9,
        adam_beta2=0.999,
        adam_epsilon=1e-8,
        weight_decay=0.0,
        max_grad_norm=1.0,
        logging_steps=1,
        logging_first_step=True,
        save_strategy="no",
        eval_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=args.seed,
        data_seed=args.seed,
        use_cpu=True,
        dataloader_num_workers=0,
        train_sampling_strategy="random" if getattr(args, "shuffle", False) else "sequential",
    )
    if not getattr(args, "trl_defaults", False):
        kw.update(bf16=False, fp16=False, gradient_checkpointing=False)
    kw.update(overrides)
    return kw


def step_summary(timer, logs_key="loss") -> dict:
    st = timer.step_times()
    train_logs = [log for log in timer.logs if logs_key in log and "train_runtime" not in log]
    losses = [log[logs_key] for log in train_logs]
    out = {
        "steps": len(st),
        "first_step_s": st[0] if st else None,
        "sec_per_step": stats(st[1:]),
        "sec_per_step_median": stats(st[1:]).get("median"),
        "loss_first": losses[0] if losses else None,
        "loss_last": losses[-1] if losses else None,
        "loss_last5_mean": sum(losses[-5:]) / len(losses[-5:]) if losses else None,
        "losses": losses,
        "first_step_logs": train_logs[0] if train_logs else None,
    }
    return out
