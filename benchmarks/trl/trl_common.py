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

import argparse
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


def open_assets(args, **tokenizer_kw):
    """The assets directory of ``--assets`` (checked), torch seeded with ``--seed``, then the
    tokenizer (``tokenizer_kw`` go to ``from_pretrained``). Returns ``(assets_dir, tokenizer)``."""
    from transformers import AutoTokenizer

    a = assets(args.assets)
    torch.manual_seed(args.seed)
    return a, AutoTokenizer.from_pretrained(a / "tokenizer", **tokenizer_kw)


def load_reward_model(path):
    """A one-score sequence classifier (the assets' reward_model/ or reward_model_init/)."""
    from transformers import AutoModelForSequenceClassification

    return AutoModelForSequenceClassification.from_pretrained(path, num_labels=1)


def load_prompts(a, n_eval: int) -> tuple[list[str], list[str]]:
    """The RL prompts (prompts.jsonl) and the first ``n_eval`` held-out ones (preference_test.jsonl)."""
    prompts = [r["prompt"] for r in load_jsonl(a / "prompts.jsonl")]
    eval_prompts = [r["prompt"] for r in load_jsonl(a / "preference_test.jsonl")][:n_eval]
    return prompts, eval_prompts


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


# ---------------------------------------------------------------- command line
def arg_parser(doc: str) -> argparse.ArgumentParser:
    """A bench's parser: its module docstring as the description, and ``--assets``."""
    ap = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--assets", default=DEFAULT_ASSETS)
    return ap


def add_run_args(
    ap,
    *,
    shuffle=False,
    eval_prompts=False,
    trl_defaults_help="keep TRL's bf16/grad-ckpt defaults",
):
    """``--seed`` (42), then ``--shuffle`` (offline benches) or ``--eval-prompts`` (64, online
    ones), then ``--trl-defaults``."""
    ap.add_argument("--seed", type=int, default=42)
    if shuffle:
        ap.add_argument(
            "--shuffle", action="store_true", help="random batch order instead of file order"
        )
    if eval_prompts:
        ap.add_argument("--eval-prompts", type=int, default=64)
    ap.add_argument("--trl-defaults", action="store_true", help=trl_defaults_help)


def add_output_args(ap, name):
    """``--json FILE`` and ``--out-dir`` (the trainer's output_dir, default runs/trl-out/NAME;
    none where ``name`` is None)."""
    ap.add_argument("--json", default=None)
    ap.add_argument("--out-dir", default=None if name is None else str(OUT_ROOT / name))


def dtype_label(args) -> str:
    return "trl-defaults" if args.trl_defaults else "fp32"


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

        def series(self, key):
            """The values TRL logged under ``key``, in step order."""
            return [log[key] for log in self.logs if key in log]

    return StepTimer()


def timed(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` and the seconds it took: ``(result, seconds)``."""
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - t0


def timed_train(trainer, meter, gen_timer=None):
    """``trainer.train()`` with a step timer (``make_step_callback``) attached. Returns
    ``(step timer, train seconds, contention)``: the ``generate()`` timer, if any, is taken off
    first, then ``meter`` (a ContentionMeter) is read."""
    timer = make_step_callback()
    trainer.add_callback(timer)
    _, train_s = timed(trainer.train)
    if gen_timer is not None:
        gen_timer.restore()
    return timer, train_s, meter.read()


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


def eval_rollouts(policy, tok, prompts, reward_model, args):
    """``eval_policy`` with the bench's ``--response-length`` and ``--temperature``."""
    return eval_policy(
        policy,
        tok,
        prompts,
        reward_model,
        max_new_tokens=args.response_length,
        temperature=args.temperature,
    )


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


# ---------------------------------------------------------------- trainer settings
def cpu_args(args) -> dict:
    """Settings every bench gives its TRL config: CPU, ``--seed``, a log every step, nothing
    saved, reported or drawn, no dataloader workers; fp32 without gradient checkpointing unless
    ``--trl-defaults`` (TRL's own bf16 / gradient checkpointing)."""
    kw = dict(
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=args.seed,
        use_cpu=True,
        dataloader_num_workers=0,
    )
    if not getattr(args, "trl_defaults", False):
        kw.update(bf16=False, gradient_checkpointing=False)
    return kw


def common_training_args(args, **overrides) -> dict:
    """Settings shared by the offline (DPO/RM/SFT) benches: ``cpu_args``, no fp16, constant LR,
    plain AdamW, file-order batches (train_sampling_strategy='sequential') so a loss curve can be
    compared with another library fed the same batches in the same order."""
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
        logging_first_step=True,
        eval_strategy="no",
        data_seed=args.seed,
        train_sampling_strategy="random" if getattr(args, "shuffle", False) else "sequential",
        **cpu_args(args),
    )
    if not getattr(args, "trl_defaults", False):
        kw.update(fp16=False)
    kw.update(overrides)
    return kw


# ---------------------------------------------------------------- offline (DPO/RM/SFT) results
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


def offline_result(bench, trainer, args, timer, contention, parity_keys, **head) -> dict:
    """An offline bench's result: its name, TRL trainer, config and dtype, then ``head`` (its
    timings and any other values, in order), ``step_summary``, the step-1 values
    ``parity_keys`` of TRL's first log, tokens/s after step 1 (from TRL's ``num_tokens``), and
    the contention."""
    res = {
        "bench": bench,
        "trainer": trainer,
        "config": dict(vars(args)),
        "dtype": dtype_label(args),
        **head,
    }
    res.update(step_summary(timer))
    first = res["first_step_logs"] or {}
    res["parity_step1"] = {k: first.get(k) for k in parity_keys}
    ntok = timer.series("num_tokens")
    if ntok and len(timer.step_ends) > 1:
        # tokens processed (TRL's count, no padding) after step 1, per second
        res["tokens_per_s"] = (ntok[-1] - ntok[0]) / (timer.step_ends[-1] - timer.step_ends[0])
    res["contention"] = contention
    return res


def step_report(tag, res, per_step, tokens=False) -> str:
    """The start of an offline bench's two-line report, up to the loss of its second line;
    ``per_step`` says what a step takes ("8 pairs"), ``tokens`` adds tokens/s."""
    line = (
        f"[{tag}] {res['steps']} steps x {per_step}; sec/step median {res['sec_per_step_median']:.3f} "
        f"(min {res['sec_per_step']['min']:.3f}, max {res['sec_per_step']['max']:.3f}); first {res['first_step_s']:.2f}s; "
    )
    if tokens:
        line += f"tokens/s {res.get('tokens_per_s', 0):.0f}; "
    return line + (
        f"peak RSS {res['peak_rss_mib']:.0f} MiB; foreign cores {res['contention']['foreign_cores']:.2f}\n"
        f"  loss {res['loss_first']:.6f} -> {res['loss_last']:.6f} (last5 {res['loss_last5_mean']:.4f}); "
    )


# ---------------------------------------------------------------- online (PPO/GRPO/RLOO) results
def iteration_summary(timer, gen_timer, tokens_per_iter, **times) -> dict:
    """Seconds per iteration (one trainer step; the first, with its warm-up, apart), ``times``
    (train_s, ...), generation speed without the first ``generate()`` call, and the end-to-end
    rate of ``tokens_per_iter`` generation slots per iteration after the first."""
    it = timer.step_times()
    after = it[1:]
    gen = gen_timer.summary(skip_first_calls=1)
    return {
        "iterations": len(it),
        "sec_per_iter": stats(after),
        "sec_per_iter_median": stats(after).get("median"),
        "first_iter_s": it[0] if it else None,
        **times,
        "generation": gen,
        "gen_tokens_per_s": gen["gen_tokens_per_s"],
        "e2e_gen_tokens_per_s": tokens_per_iter * len(after) / sum(after) if after else None,
    }


def first_last3(name, xs) -> dict:
    """``{name}_first``, ``{name}_last3`` (the mean of the last three) and ``{name}s`` (all)."""
    return {
        f"{name}_first": xs[0] if xs else None,
        f"{name}_last3": sum(xs[-3:]) / len(xs[-3:]) if xs else None,
        f"{name}s": xs,
    }


def iteration_report(res) -> str:
    """The middle of an online bench's report: speed, memory and contention, to the line's end."""
    return (
        f"sec/iter median {res['sec_per_iter_median']:.3f} "
        f"(min {res['sec_per_iter']['min']:.3f}, max {res['sec_per_iter']['max']:.3f}); first {res['first_iter_s']:.2f}s; "
        f"gen {res['gen_tokens_per_s']:.0f} tok/s; peak RSS {res['peak_rss_mib']:.0f} MiB; "
        f"foreign cores {res['contention']['foreign_cores']:.2f}\n"
    )


def eval_report(pre, post) -> str:
    """The held-out eval before -> after (eval_rollouts), reward model and digit reward."""
    return (
        f"eval rm {pre['rm_score']:.4f} -> {post['rm_score']:.4f}; "
        f"eval digits {pre['digit_reward']:.4f} -> {post['digit_reward']:.4f}"
    )
