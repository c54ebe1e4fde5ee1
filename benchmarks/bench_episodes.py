#!/usr/bin/env python
"""Seconds per GRPO iteration on two-turn episodes against one on single responses of the
same total tokens, in one process on the CPU.

Workload: the bundled base GPT-2 (4 layers, width 256), the GRPO preset, 8 prompts x 4
generations a step, one optimiser step over the 32 sequences. Episodes: two policy turns of
``--turn`` tokens each, the environment's reply between them (a user message "Go on.",
``E`` tokens as the template renders it). Bandit: one response of 2 x turn + E tokens. The
lengths are forced so that both sides process the same tokens: a hook on the policy's LM head
bans EOS while sampling and forces it at the turn's last token (the reference, a copy, has no
hook). The episodes' extra cost is the second generation call (the whole context prefilled
again) and the environment's bookkeeping; the passes and the update see the same tokens.

Prints the median seconds per iteration of each side (first iteration excluded), their ratio,
peak RSS and the command:

    .venv/bin/python benchmarks/bench_episodes.py --steps 8
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

import gymnasium
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import peak_rss_mib  # noqa: E402

from rlhfkit.data import encode_turn, load_prompts  # noqa: E402
from rlhfkit.experience.rollout import ExperienceMaker  # noqa: E402
from rlhfkit.models.loading import load_causal_lm, load_tokenizer  # noqa: E402
from rlhfkit.tasks import BASE_MODEL_DIR, DEMO_DATA_DIR  # noqa: E402
from rlhfkit.trainers.rl import RLTrainer  # noqa: E402
from rlhfkit.trainers.rl_config import RLConfig  # noqa: E402

REPLY = "Go on."


class TwoTurns(gymnasium.Env):
    """Replies once, then ends the episode: two turns of the policy."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.turns = 0
        return options["prompt"], {}

    def step(self, action):
        self.turns += 1
        return REPLY, float(len(action) % 2), self.turns == 2, False, {}


class ForcedLength:
    """Makes every sampled turn exactly ``length`` tokens: EOS banned before, forced at it.

    Counts the LM head's calls on one position without gradient (the prefill and each decode
    step of ``generate``); ``ExperienceMaker.sample`` starts each turn's count at 0."""

    def __init__(self, model, eos: int, length: int):
        self.eos, self.length, self.calls = eos, length, 0
        model.lm_head.register_forward_hook(self.hook)

    def hook(self, module, inputs, output):
        if output.shape[1] != 1 or torch.is_grad_enabled():
            return output
        self.calls += 1
        output = output.clone()
        output[..., self.eos] = 1e4 if self.calls == self.length else -1e4
        return output


def run(episodes: bool, steps: int, turn: int, threads: int) -> list[float]:
    """Seconds of each iteration of one side."""
    torch.set_num_threads(threads)
    tokenizer = load_tokenizer(str(BASE_MODEL_DIR), padding_side="left")
    reply = len(encode_turn([{"role": "user", "content": REPLY}], tokenizer))
    length = turn if episodes else 2 * turn + reply
    with tempfile.TemporaryDirectory() as out:
        config = RLConfig.preset(
            "grpo", model=str(BASE_MODEL_DIR), output_dir=out, reward_functions=["m:f"],
            rollout_batch_size=8, num_generations=4, batch_size=32, max_new_tokens=length,
            max_turns=2, max_steps=steps, learning_rate=1e-5, log_every=steps,
            sample_every=steps, cpu=True, seed=0, report_to=[], resume=False,
        )  # fmt: skip
        prompts = load_prompts(str(DEMO_DATA_DIR / "prompts"), "train", tokenizer, 32, limit=64)
        policy = load_causal_lm(str(BASE_MODEL_DIR), tokenizer=tokenizer)
        forced = ForcedLength(policy, tokenizer.eos_token_id, length)
        sample = ExperienceMaker.sample

        def counted(self, *args, **kwargs):
            forced.calls = 0
            return sample(self, *args, **kwargs)

        ExperienceMaker.sample = counted
        try:
            trainer = RLTrainer(
                config, policy, tokenizer, prompts, lambda p, r: [float(len(x) % 2) for x in r],
                environment=TwoTurns if episodes else None,
            )  # fmt: skip
            seconds = []
            for _ in range(steps):
                started = time.perf_counter()
                metrics, _ = trainer.step()
                trainer.state.step += 1
                seconds.append(time.perf_counter() - started)
        finally:
            ExperienceMaker.sample = sample
    tokens = metrics["response/length"] + metrics.get("episode/env_tokens", 0.0)
    turns = metrics.get("episode/turns", 1.0)
    print(
        f"{'episodes' if episodes else 'bandit'}: {tokens:.1f} tokens a sequence, {turns:.1f} turns"
    )
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--turn", type=int, default=24, help="tokens of a policy turn")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    medians = {}
    for name, episodes in (("bandit", False), ("episodes", True)):
        seconds = run(episodes, args.steps, args.turn, args.threads)
        medians[name] = statistics.median(seconds[1:])
        print(f"{name}: median {medians[name]:.3f} s/iteration over {len(seconds) - 1}")
    print(f"episodes / bandit: {medians['episodes'] / medians['bandit']:.2f}x")
    print(f"peak RSS: {peak_rss_mib():.0f} MiB")
    print("command:", shlex.join([sys.executable, *sys.argv]))


if __name__ == "__main__":
    main()
