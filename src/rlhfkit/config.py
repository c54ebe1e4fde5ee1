"""One dataclass config per training stage, loaded from YAML plus command-line overrides.

`TrainConfig` holds the fields of the shared training loop (`rlhfkit.trainers.loop`); each stage
adds its own (`SFTConfig`, `RewardConfig` here; PPO's, DPO's and GRPO's next to their trainers,
`trainers/*_config.py`). Every field carries a docstring,
which jsonargparse turns into `rlhfkit <stage> --help`. `__post_init__` checks every value and
raises `ConfigError` naming the field, the value and what is allowed; values computed from the
fields are properties, never written back into the config.

`load_config(SFTConfig, "configs/sft.yaml", ["--learning_rate", "3e-4"])` is what the CLI does;
in Python, `SFTConfig(model=..., train_data=...)` works the same way.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

import torch

from rlhfkit import errors, trl_names
from rlhfkit.experience.generation import SamplingConfig
from rlhfkit.experience.scorer_loading import REWARD_FUNCTION_SPECS, build_scorer
from rlhfkit.experience.scorers import Scorer
from rlhfkit.ops import ENSEMBLE_RULES
from rlhfkit.tracking import report_to_problem

# The bundled default (rlhfkit/assets), found from the package so any working directory works.
ASSETS = str(Path(__file__).resolve().parent / "assets")
DEMO_DATA = f"{ASSETS}/data/demo"

C = TypeVar("C", bound="TrainConfig")


class ConfigError(ValueError):
    """A config field has a value that is not allowed."""


def require(cfg: object, field: str, ok: bool, allowed: str) -> None:
    """Raise `ConfigError` naming the class, field, value and what is allowed unless `ok`."""
    errors.require(cfg, field, ok, allowed, ConfigError)


def _check_literals(cfg: object) -> None:
    """Check every `Literal[...]` field against its choices (`errors.check_literals`)."""
    errors.check_literals(cfg, ConfigError)


def checked_sampling(config: Any) -> SamplingConfig:
    """The sampling settings of a command's config (its ``max_new_tokens``, ``temperature``,
    ``top_k``, ``top_p`` and, where it has one, ``greedy``), checked by ``SamplingConfig``; an
    error names the config and the field."""
    try:
        return SamplingConfig(
            max_new_tokens=config.max_new_tokens,
            temperature=config.temperature,
            top_k=config.top_k,
            top_p=config.top_p,
            greedy=getattr(config, "greedy", False),
        )
    except ValueError as error:
        raise ConfigError(f"{type(config).__name__}.{error}") from error


# Evaluation metrics whose smaller values are better, by the end of their names.
SMALLER_IS_BETTER = ("loss", "nll", "perplexity")


@dataclass
class TrainConfig:
    """Fields of the shared training loop: optimiser, schedule, batching, checkpoints, logging."""

    model: str = f"{ASSETS}/base"
    """Hugging Face model name or local directory to start from."""
    output_dir: str = "runs/train"
    """Directory for checkpoints, metrics, TensorBoard events and the final model (`final/`)."""
    seed: int = 42
    """Seed for weights of new heads, data shuffling and dropout (python, numpy, torch)."""
    batch_size: int = 8
    """Examples per micro-batch on each device."""
    gradient_accumulation_steps: int = 1
    """Micro-batches whose gradients are summed before each optimiser step."""
    eval_batch_size: int = 32
    """Examples per batch during evaluation."""
    num_epochs: int = 1
    """Passes over the training data (ignored when `max_steps` is set)."""
    max_steps: int | None = None
    """Optimiser steps to run; None runs `num_epochs` epochs."""
    learning_rate: float = 5e-5
    """Peak learning rate of AdamW (reached after warmup)."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay, applied to weight matrices only (not biases, norms)."""
    adam_beta1: float = 0.9
    """AdamW beta1 (momentum of the gradient mean)."""
    adam_beta2: float = 0.999
    """AdamW beta2 (momentum of the squared gradient)."""
    adam_epsilon: float = 1e-8
    """AdamW epsilon added to the denominator."""
    max_grad_norm: float = 1.0
    """Clip the global gradient L2 norm to this value; 0 turns clipping off."""
    lr_scheduler: Literal["linear", "cosine", "constant"] = "cosine"
    """Learning-rate decay after warmup: linear to 0, cosine to 0, or constant."""
    warmup_steps: int = 0
    """Optimiser steps of linear warmup from 0 to `learning_rate`."""
    warmup_ratio: float = 0.0
    """Warmup as a fraction of all optimiser steps (used when `warmup_steps` is 0)."""
    log_every: int = 10
    """Log training metrics every this many optimiser steps."""
    eval_every: int = 0
    """Evaluate every this many optimiser steps; 0 evaluates only at the end."""
    save_every: int = 0
    """Write a checkpoint every this many optimiser steps; 0 only at the end."""
    keep_last: int = 2
    """Checkpoints to keep in `output_dir` (older ones are deleted)."""
    metric_for_best_model: str | None = None
    """An evaluation metric as logged ('eval/loss', 'eval/accuracy', 'eval/gold'; the 'eval/'
    may be left out) by which each evaluation's model is compared with the best so far: the
    best is written to `output_dir`/best/ like `final/`, its `trainer_state.json` naming the
    step and the value. Needs `eval_every` >= 1. None keeps no best model."""
    greater_is_better: bool | None = None
    """Whether a larger `metric_for_best_model` is the better model; None: False for a metric
    whose name ends in 'loss', 'nll' or 'perplexity', True for any other."""
    load_best_model_at_end: bool = False
    """Write the best evaluated model (`metric_for_best_model`) as `final/` instead of the last
    step's: the stage's result is then the step before over-fitting or over-optimisation. The
    last step's model stays in the newest checkpoint."""
    resume: bool = True
    """Continue from the newest checkpoint in `output_dir` (and skip a finished run); False starts
    over and deletes earlier checkpoints there. A resumed run may change its learning rate and
    schedule, length, cadences and KL weight (applied from the resumed step, logged, and kept
    in trainer_state.json); a change of anything else is refused naming it."""
    resume_override: bool = False
    """Resume even where settings that shape the run's steps changed since its checkpoint (the
    model, the data, batch sizes, the seed): the run goes on with the new ones."""
    mixed_precision: Literal["no", "bf16"] = "no"
    """Autocast precision: 'no' (fp32) or 'bf16'."""
    skip_nonfinite_steps: int = 0
    """Skip up to this many steps whose loss or gradient norm is NaN or inf (counted in the
    metrics as train/skipped_steps) instead of stopping the run: a skipped step changes neither
    the weights nor the optimiser state nor the learning-rate schedule. 0 stops at the first.
    A step of several optimiser steps (an RL iteration's minibatches) keeps a copy of the
    trained weights and optimiser state while skips are left, to undo itself: memory for a
    second copy of both, and the time to make it each step."""
    cpu: bool = False
    """Train on the CPU even if an accelerator is available."""
    gradient_checkpointing: bool = False
    """Recompute each transformer block's activations in the backward pass instead of
    keeping them from the forward pass (activation checkpointing): the activations of one
    block at a time instead of all, for about one more forward pass of compute."""
    fsdp: bool = False
    """Shard the trained models' weights, gradients and optimiser state over the processes
    (torch FSDP2, one unit per transformer block) instead of holding a whole copy on each
    (DDP). Also on when launched with accelerate's FSDP config (ACCELERATE_USE_FSDP=true)."""
    attn_implementation: Literal["eager", "sdpa"] | None = None
    """Attention kernel of every model the stage runs; None picks 'eager' for bf16 on a CPU
    (torch's CPU flash-attention is several times slower in bf16 than in fp32 on short
    sequences: benchmarks/bench_ppo.py) and keeps the model's own otherwise."""
    report_to: list[str] = dataclasses.field(default_factory=lambda: ["tensorboard"])
    """Where metrics go besides metrics.jsonl (always written: resume and the report read
    it): any of tensorboard (events in `output_dir`/tb), wandb, mlflow, or [none] for none.
    wandb and MLflow get one run per stage, named after `output_dir`, with the config as its
    hyperparameters; their packages are not installed with rlhfkit (`pip install wandb`,
    `pip install mlflow`). One name on the command line is a list of one: `--report_to wandb`."""
    project: str = "rlhfkit"
    """The wandb project (or MLflow experiment) the run is reported to."""
    chat_template: bool = True
    """Give plain-string prompts to a tokenizer that has a chat template as one user message
    through that template (what an instruct model was trained on); False keeps them raw text.
    Chat messages always go through the template; without one nothing changes."""
    trust_remote_code: bool = False
    """Run the Python code a hub model ships for its architecture or tokenizer (`auto_map` in
    its config), for every model the stage loads. Off by default: that code runs with your
    rights, so turn it on only for a model whose source you trust."""

    def __post_init__(self) -> None:
        _check_literals(self)
        for name in ("batch_size", "gradient_accumulation_steps", "eval_batch_size", "num_epochs"):
            require(self, name, getattr(self, name) >= 1, "an integer >= 1")
        require(self, "max_steps", self.max_steps is None or self.max_steps >= 1, "None or >= 1")
        require(self, "learning_rate", 0 < self.learning_rate < math.inf, "a number > 0")
        require(self, "weight_decay", self.weight_decay >= 0, "a number >= 0")
        for name in ("adam_beta1", "adam_beta2"):
            require(self, name, 0 <= getattr(self, name) < 1, "a number in [0, 1)")
        require(self, "adam_epsilon", self.adam_epsilon > 0, "a number > 0")
        require(self, "max_grad_norm", self.max_grad_norm >= 0, "a number >= 0 (0 = no clipping)")
        require(self, "warmup_steps", self.warmup_steps >= 0, "an integer >= 0")
        require(self, "skip_nonfinite_steps", self.skip_nonfinite_steps >= 0, "an integer >= 0")
        require(self, "warmup_ratio", 0 <= self.warmup_ratio < 1, "a number in [0, 1)")
        require(
            self,
            "warmup_ratio",
            self.warmup_ratio == 0 or self.warmup_steps == 0,
            "0 when warmup_steps is set (give one of the two)",
        )
        for name in ("eval_every", "save_every"):
            require(self, name, getattr(self, name) >= 0, "an integer >= 0 (0 = only at the end)")
        require(self, "log_every", self.log_every >= 1, "an integer >= 1")
        require(self, "keep_last", self.keep_last >= 1, "an integer >= 1")
        self._check_best_model()
        require(self, "model", bool(self.model), "a model name or directory")
        require(self, "output_dir", bool(self.output_dir), "a directory path")
        problem = report_to_problem(self.report_to)
        require(self, "report_to", problem is None, problem or "")
        require(self, "project", bool(self.project), "a wandb project / MLflow experiment name")

    def _check_best_model(self) -> None:
        metric = self.metric_for_best_model
        require(
            self,
            "metric_for_best_model",
            metric is None or bool(metric.removeprefix("eval/")),
            "None or the name of an evaluation metric, e.g. 'eval/loss'",
        )
        require(
            self,
            "eval_every",
            metric is None or self.eval_every >= 1,
            "an integer >= 1 when metric_for_best_model is set (the evaluations it compares)",
        )
        require(
            self,
            "load_best_model_at_end",
            metric is not None or not self.load_best_model_at_end,
            "False when metric_for_best_model is None (nothing says which model is best)",
        )

    @property
    def best_metric_key(self) -> str | None:
        """`metric_for_best_model` as `evaluate()` names it (without 'eval/')."""
        metric = self.metric_for_best_model
        return None if metric is None else metric.removeprefix("eval/")

    def is_better(self, value: float, best: float | None) -> bool:
        """Whether an evaluation giving `value` beats the best so far (`best`, None: none
        yet); a value that is not a finite number never does, a tie keeps the earlier."""
        if not math.isfinite(value):
            return False
        if best is None:
            return True
        greater = self.greater_is_better
        if greater is None:
            greater = not self.best_metric_key.endswith(SMALLER_IS_BETTER)
        return value > best if greater else value < best

    @property
    def effective_batch_size(self) -> int:
        """Examples per optimiser step on one device (micro-batch x accumulation)."""
        return self.batch_size * self.gradient_accumulation_steps

    @property
    def attention(self) -> str | None:
        """The attention kernel to set on every model (None: leave the model's)."""
        if self.attn_implementation is not None:
            return self.attn_implementation
        on_cpu = self.cpu or not torch.cuda.is_available()
        return "eager" if self.mixed_precision == "bf16" and on_cpu else None

    @property
    def final_dir(self) -> Path:
        """Where the finished model (loadable with `from_pretrained`) is written."""
        return Path(self.output_dir) / "final"

    def loop_batch_size(self, world: int) -> int:
        """Examples a step of the loop draws from the training data at a time, on each of
        ``world`` processes."""
        return self.batch_size

    def loop_steps(self, num_examples: int, batches_per_epoch: int) -> int:
        """Steps of the loop a run makes over ``num_examples`` examples, of which each process
        sees ``batches_per_epoch`` batches an epoch."""
        if self.max_steps is not None:
            return self.max_steps
        return max(self.num_epochs * batches_per_epoch // self.gradient_accumulation_steps, 1)

    def optimizer_steps(self, loop_steps: int, world: int) -> int:
        """Optimiser steps of a run of ``loop_steps`` (the learning-rate schedule's length)."""
        return loop_steps

    def warmup_for(self, total_steps: int) -> int:
        """Warmup steps for a run of `total_steps` optimiser steps."""
        return self.warmup_steps or int(self.warmup_ratio * total_steps)

    def to_dict(self) -> dict[str, Any]:
        """The fields as a JSON-able dict (saved next to checkpoints)."""
        return dataclasses.asdict(self)


def _check_best_needs_eval(cfg: Any) -> None:
    """A best model is chosen on evaluations, which need held-out data."""
    require(
        cfg,
        "metric_for_best_model",
        cfg.metric_for_best_model is None or cfg.eval_data is not None,
        "None when eval_data is None (there is no evaluation to compare)",
    )


@dataclass
class DataOptions:
    """Fields of the stages that train on a fixed dataset (SFT, reward model, DPO); each stage
    documents its own `train_data` and `eval_data`."""

    train_split: str = "train"
    """Split to read from `train_data` when it is a dataset with splits."""
    eval_split: str = "test"
    """Split to read from `eval_data` when it is a dataset with splits."""
    max_length: int = 256
    """Maximum tokens of prompt + response; longer examples are truncated (and counted)."""
    max_train_samples: int | None = None
    """Use only the first this many training records; None uses all."""
    max_eval_samples: int | None = None
    """Use only the first this many evaluation records; None uses all."""
    columns: dict[str, str] | None = None
    """Map our field names to the data's column names, e.g. {"response": "completion"}."""
    degenerate_comparisons: Literal["drop", "error"] = "drop"
    """A comparison whose chosen equals its rejected (or a ranking with two identical
    responses) carries no preference: 'drop' skips it, counted in the log; 'error' stops."""
    padding_free: bool = False
    """Run the training and evaluation passes on each batch's real tokens only, packed into one
    row (``runtime/packing.py``), and the LM head only where a scored token is predicted: the
    same numbers up to float rounding, without the padding's compute. Off by default, as in
    TRL, so that a run's figures stay those of the padded passes; on, it saves what a batch
    pads (a quarter of the reward model's positions on the instructions task, timings in
    docs/results/instructions.md). Models other than GPT-2, Llama and Qwen2 with eager or SDPA
    attention stay padded."""

    def _check_data(self) -> None:
        require(self, "train_data", bool(self.train_data), "a data file, directory or hub name")
        _check_best_needs_eval(self)
        require(self, "max_length", self.max_length >= 2, "an integer >= 2 (prompt + response)")
        for name in ("max_train_samples", "max_eval_samples"):
            value = getattr(self, name)
            require(self, name, value is None or value >= 1, "None or an integer >= 1")


@dataclass
class LoRAOptions:
    """Fields of the stages that can train LoRA adapters only (peft)."""

    lora: bool = False
    """Train LoRA adapters only; the reference is then the same model with its adapter disabled
    (never a second copy in memory)."""
    lora_r: int = 8
    """LoRA rank."""
    lora_alpha: float = 16
    """LoRA scaling numerator (the update is scaled by alpha / r)."""
    lora_dropout: float = 0.0
    """Dropout on the LoRA input."""
    lora_target_modules: list[str] | None = None
    """Module names to adapt; None uses peft's default for the architecture (GPT-2: c_attn)."""

    @property
    def lora_settings(self) -> dict | None:
        """``lora.add_lora`` keyword arguments, or None without LoRA."""
        if not self.lora:
            return None
        return {
            "r": self.lora_r,
            "alpha": self.lora_alpha,
            "dropout": self.lora_dropout,
            "target_modules": self.lora_target_modules,
        }

    def _check_lora(self) -> None:
        require(self, "lora_r", self.lora_r >= 1, "an integer >= 1")
        require(self, "lora_alpha", self.lora_alpha > 0, "a number > 0")
        require(self, "lora_dropout", 0 <= self.lora_dropout < 1, "a number in [0, 1)")


@dataclass
class ReferenceOptions:
    """The field of the stages that hold a frozen reference model (DPO, PPO, GRPO, RLOO)."""

    reference: str | None = None
    """Reference model name or directory; None uses the starting model `model` itself. Set
    it to go on from a trained policy with the penalty still measured from the SFT model."""

    def _check_reference(self) -> None:
        require(
            self,
            "reference",
            not (self.lora and self.reference),
            "None with lora=True (the reference is the model with its adapter disabled)",
        )


@dataclass
class SamplingOptions:
    """Fields of the stages that sample responses (PPO, GRPO, RLOO)."""

    max_new_tokens: int = 32
    """Most tokens per response."""
    temperature: float = 1.0
    """Sampling temperature; log-probs are computed at the same temperature."""
    top_k: int = 0
    """Top-k filtering while sampling (0 = off; the log-probs ignore it, keep 0 for RL)."""
    top_p: float = 1.0
    """Nucleus filtering while sampling (1 = off; the log-probs ignore it, keep 1 for RL)."""
    padding_free: bool = True
    """Run the passes over query + response on their real tokens only, packed into one row
    (``runtime/packing.py``): the same numbers up to float rounding, without the padding's
    compute (how much that saves: docs/ppo.md). Models other than GPT-2, Llama and Qwen2 with
    eager or SDPA attention stay padded."""

    @property
    def sampling(self) -> SamplingConfig:
        """The sampling settings as ``generation`` takes them."""
        return SamplingConfig(self.max_new_tokens, self.temperature, self.top_k, self.top_p)

    def _check_sampling(self) -> None:
        require(self, "max_new_tokens", self.max_new_tokens >= 1, "an integer >= 1")
        require(self, "temperature", 0 < self.temperature < math.inf, "a number > 0")
        require(self, "top_k", self.top_k >= 0, "an integer >= 0 (0 = off)")
        require(self, "top_p", 0 < self.top_p <= 1, "a number in (0, 1]")


@dataclass
class EvalPromptOptions:
    """Fields of the RL stages that evaluate on held-out prompts (PPO, GRPO, RLOO)."""

    eval_data: str | None = f"{DEMO_DATA}/prompts"
    """Held-out prompts: one sampled response each (fixed seed) is scored at evaluation;
    None skips evaluation."""
    eval_split: str = "test"
    """Split to read from `eval_data` when it is a dataset with splits."""
    max_eval_samples: int | None = 64
    """Use only the first this many evaluation prompts; None uses all."""
    gold_functions: list[str] = dataclasses.field(default_factory=list)
    """Reward functions named as in `reward_functions` (digits, gold, ifeval, instructions,
    math, math_format, calculator, guessing, sentiment, unasked_case, module:function) that
    score the held-out samples at each evaluation beside the training scorer, their sum logged
    as `eval/gold`. Never trained on: the true measure, where the training reward is a learnt
    proxy (a reward model), so that over-optimisation shows while the run goes (the gold falls
    while `eval/score` rises). Needs `eval_data`."""

    def _check_eval_prompts(self) -> None:
        limit = self.max_eval_samples
        require(self, "max_eval_samples", limit is None or limit >= 1, "None or an integer >= 1")
        require(
            self,
            "gold_functions",
            self.eval_data is not None or not self.gold_functions,
            "[] when eval_data is None (they score the held-out samples)",
        )
        _check_best_needs_eval(self)
        require(
            self,
            "metric_for_best_model",
            self.best_metric_key != "gold" or bool(self.gold_functions),
            "a metric the evaluation logs: 'gold' needs gold_functions",
        )

    def gold_scorer(self, tokenizer) -> Scorer | None:
        """The scorer of `gold_functions` (texts decoded with the policy's ``tokenizer``), or
        None when there are none."""
        if not self.gold_functions:
            return None
        return build_scorer(None, self.gold_functions, tokenizer=tokenizer)


@dataclass
class RewardModelOptions:
    """The reward model of a command: one directory, or several as an ensemble."""

    reward_model: str | list[str] | None = None
    """Reward model directory (from `rlhfkit rm`); a list of directories is an ensemble whose
    scores `reward_ensemble` combines into one; None: none."""
    reward_ensemble: Literal["mean", "min", "mean_minus_var"] = "mean"
    """How an ensemble's scores make one (Coste et al. 2023): their mean; the lowest (worst
    case); or the mean less `reward_ensemble_coef` times their variance (the members'
    disagreement, uncertainty-weighted)."""
    reward_ensemble_coef: float = 1.0
    """The weight of the members' variance under `reward_ensemble: mean_minus_var`."""

    @property
    def reward_models(self) -> list[str]:
        """The reward model directories: none, one, or an ensemble's."""
        if self.reward_model is None:
            return []
        return [self.reward_model] if isinstance(self.reward_model, str) else self.reward_model

    def _check_reward_models(self) -> None:
        require(
            self,
            "reward_model",
            self.reward_model is None or bool(self.reward_models),
            "a directory or a list of directories (an ensemble), not an empty list",
        )
        rules = ", ".join(ENSEMBLE_RULES)
        require(self, "reward_ensemble", self.reward_ensemble in ENSEMBLE_RULES, f"one of {rules}")
        require(
            self,
            "reward_ensemble_coef",
            0 <= self.reward_ensemble_coef < math.inf,
            "a number >= 0",
        )


@dataclass
class RewardOptions(RewardModelOptions):
    """What scores a response, with the same fields in every command that scores (ppo, grpo,
    rloo, bon, chat, sample): a reward model (or an ensemble) and/or reward functions, summed
    with weights (``scorer``)."""

    reward_functions: list[str] = dataclasses.field(default_factory=list)
    """Reward functions by name: digits, gold, instructions, sentiment (the bundled tasks),
    ifeval (the share of a prompt's IFEval instructions met, by IFEval's own checkers, from
    its columns instruction_id_list and kwargs, or ground_truth), unasked_case (-1 for a
    letter case the prompt did not ask for, beside instructions), math (1 where the final
    answer equals the row's answer column, by Math-Verify), math_format (1 where the last line
    is "Answer: <number>"), calculator (1 where the final number is the row's answer),
    guessing (1 for a won guessing game, read from the episode's environment),
    perplexity (under the policy), perplexity:PATH (under the causal LM at PATH), or
    module:function, a Python reward function (imported and run: name only code you trust)
    written TRL's way, `f(prompts, completions, completion_ids, **columns)`, which gets the
    prompts as the data wrote them and every other column of their rows by name, or
    rlhfkit's `f(prompts, responses) -> list[float]` on the decoded texts. One name on the
    command line is a list of one: `--reward_functions gold`."""
    reward_weights: list[float] | None = None
    """Weights of [reward_model, *reward_functions] in the total score; None = all 1."""

    @property
    def has_scorer(self) -> bool:
        """Whether a reward model or a reward function is named."""
        return self.reward_model is not None or bool(self.reward_functions)

    def scorer(
        self, *, tokenizer=None, model: torch.nn.Module | None = None, trust: bool = False
    ) -> Scorer:
        """The scorer these fields name (``scorer_loading.build_scorer``). ``tokenizer`` is the
        policy's, ``model`` the causal LM bare perplexity is measured under; ``trust`` lets the
        code a reward model ships run."""
        return build_scorer(
            self.reward_model,
            self.reward_functions,
            self.reward_weights,
            ensemble=self.reward_ensemble,
            ensemble_coef=self.reward_ensemble_coef,
            tokenizer=tokenizer,
            model=model,
            trust_remote_code=trust,
        )

    def _check_rewards(self, required: bool = True) -> None:
        require(
            self,
            "reward_model",
            self.has_scorer or not required,
            "a directory, unless reward_functions (or an environment's rewards) are given",
        )
        self._check_reward_models()
        n_scorers = (self.reward_model is not None) + len(self.reward_functions)
        require(
            self,
            "reward_weights",
            self.reward_weights is None or len(self.reward_weights) == n_scorers,
            f"None or {n_scorers} numbers (one per scorer: reward_model, *reward_functions)",
        )


@dataclass
class ScorerOptions(RewardOptions):
    """`RewardOptions` of the RL stages, with how their raw scores are processed before they
    are learned from (`experience.rewards.process_scores`)."""

    missing_eos_penalty: float | None = None
    """Subtract this from the score of responses that hit max_new_tokens without EOS."""
    missing_eos_replace: bool = False
    """Set such scores to -missing_eos_penalty instead (lm-human-preferences)."""
    score_normalize: Literal["none", "scale", "standardize"] = "none"
    """Divide scores by their running std ('scale'), also subtract the running mean."""
    score_clip: float | None = None
    """Clip processed scores to [-score_clip, score_clip]; None = no clipping."""

    def _check_scorers(self, required: bool = True) -> None:
        """The score options, and a scorer named unless not ``required`` (an environment's
        rewards may be the only ones)."""
        penalty = self.missing_eos_penalty
        require(self, "missing_eos_penalty", penalty is None or penalty >= 0, "None or >= 0")
        require(
            self,
            "missing_eos_replace",
            not self.missing_eos_replace or penalty is not None,
            "False unless missing_eos_penalty is set",
        )
        require(self, "score_clip", self.score_clip is None or self.score_clip > 0, "None or > 0")
        self._check_rewards(required)


@dataclass
class SFTConfig(DataOptions, LoRAOptions, TrainConfig):
    """Supervised fine-tuning on prompt/response demonstrations (InstructGPT step 1)."""

    output_dir: str = "runs/sft"
    """Directory for checkpoints, metrics, TensorBoard events and the final model (`final/`)."""
    learning_rate: float = 1e-4
    """Peak learning rate of AdamW (reached after warmup)."""
    train_data: str = f"{DEMO_DATA}/sft"
    """Demonstrations to train on: .jsonl/.json/.parquet file, dataset directory or hub name."""
    eval_data: str | None = f"{DEMO_DATA}/sft"
    """Held-out demonstrations for response NLL and perplexity; None skips evaluation."""
    disable_dropout: bool = False
    """Turn dropout off in the model (the RL and preference stages do; SFT keeps it)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_data()
        self._check_lora()


@dataclass
class RewardConfig(DataOptions, LoRAOptions, TrainConfig):
    """Reward model on chosen/rejected pairs or K-way rankings (InstructGPT step 2)."""

    output_dir: str = "runs/rm"
    """Directory for checkpoints, metrics, TensorBoard events and the final model (`final/`)."""
    train_data: str = f"{DEMO_DATA}/comparisons"
    """Comparisons (prompt/chosen/rejected) or rankings (prompt/responses/ranking) to train on."""
    eval_data: str | None = f"{DEMO_DATA}/comparisons"
    """Held-out comparisons for pairwise (and ranking) accuracy; None skips evaluation."""
    loss: Literal["logsigmoid", "logexp"] = "logsigmoid"
    """Pairwise loss: -log sigmoid(r_chosen - r_rejected [- margin]) or log(1 + exp(r_rej - r_ch))."""
    margin: float | None = None
    """Margin the chosen reward must exceed the rejected one by (logsigmoid loss only)."""
    normalize_data: str | None = None
    """Demonstrations (e.g. the SFT data) whose mean reward is shifted to 0 after training, as in
    InstructGPT; None leaves the rewards as trained."""
    center_rewards_coef: float = 0.0
    """Weight of the centring term mean((r_chosen + r_rejected)^2) added to the loss
    (Eisenstein et al. 2023; TRL's center_rewards_coefficient, which suggests 0.01), so the
    rewards of each pair sum to about 0; 0 turns it off. Rankings: over each prompt's pairs."""
    disable_dropout: bool = True
    """Turn dropout off in the reward model (as TRL's RewardConfig does), so a pair's scores
    are a deterministic function of the weights during training as at scoring time."""
    group_by_prompt: bool = False
    """Train and evaluate on each prompt's comparisons as one example, as InstructGPT does
    with its K-choose-2 pairs: each distinct response is scored once per step, not once per
    pair it is in (with every pair of K responses a prompt, K - 1 times fewer rows). Rankings
    join their prompt's group as their pairs. `batch_size` then counts prompts; the loss stays
    the mean over the batch's pairs, so each pair weighs the same as without grouping."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_data()
        self._check_lora()
        require(
            self,
            "margin",
            self.margin is None or self.loss == "logsigmoid",
            "None with loss='logexp' (the margin belongs to the logsigmoid loss)",
        )
        require(
            self,
            "center_rewards_coef",
            0 <= self.center_rewards_coef < math.inf,
            "a number >= 0 (0 = no centring term)",
        )


def config_parser(
    cls: type[TrainConfig], defaults: dict[str, Any] | None = None, **parser_kwargs: Any
):
    """A jsonargparse parser with `--config FILE.yaml` and one `--field` per field of `cls`,
    its defaults `cls`'s own but for ``defaults`` (a preset's: `rlhfkit grpo` is `RLConfig`
    with GRPO's)."""
    from jsonargparse import ActionConfigFile, ArgumentParser, set_parsing_settings

    # Field docstrings (the string under each field) become the `--help` texts.
    set_parsing_settings(docstring_parse_attribute_docstrings=True)
    # No abbreviations: a misspelt option would otherwise set the field it abbreviates.
    parser = ArgumentParser(description=cls.__doc__, allow_abbrev=False, **parser_kwargs)
    parser.add_argument("--config", action=ActionConfigFile, help="YAML file with field values.")
    parser.add_class_arguments(cls, nested_key=None, fail_untyped=True)
    if defaults:
        parser.set_defaults(**defaults)
    _group_by_option_class(parser, cls)
    return parser


def _group_by_option_class(parser: Any, cls: type) -> None:
    """`--help` in sections: each field under the option group (a dataclass ``cls`` is
    composed of, `TrainConfig`'s loop fields included) that first declares it, titled by that
    class's name, its docstring the section's description; the fields ``cls`` itself adds
    stay in its own."""
    owners: dict[str, type] = {}
    for klass in reversed(cls.__mro__):
        for name in vars(klass).get("__annotations__", {}):
            owners.setdefault(name, klass)
    fields = {f.name for f in dataclasses.fields(cls)}
    home = next(g for g in parser._action_groups if any(a.dest in fields for a in g._group_actions))
    sections: dict[type, Any] = {}
    for action in list(home._group_actions):
        owner = owners.get(action.dest, cls)
        if owner is cls:
            continue
        if owner not in sections:
            about = " ".join((owner.__doc__ or "").split())
            sections[owner] = parser.add_argument_group(owner.__name__, about)
        home._group_actions.remove(action)
        sections[owner]._group_actions.append(action)


def config_from_namespace(cls: type[C], namespace: Any) -> C:
    """Build `cls` from a parsed jsonargparse namespace (runs the `__post_init__` checks)."""
    values = {f.name: namespace[f.name] for f in dataclasses.fields(cls) if f.name in namespace}
    return cls(**values)


def load_config(
    cls: type[C],
    path: str | Path | None = None,
    args: Sequence[str] = (),
    defaults: dict[str, Any] | None = None,
    **overrides: Any,
) -> C:
    """`cls` from its ``defaults`` (a preset's), a YAML file, then command-line style `args`,
    then keyword `overrides`."""
    argv = (["--config", str(path)] if path is not None else []) + list(args)
    namespace = config_parser(cls, defaults).parse_args(argv)
    config = config_from_namespace(cls, namespace)
    return dataclasses.replace(config, **overrides) if overrides else config


_SCORER = (
    f"--reward_model DIR (a reward model) or --reward_functions NAME ({REWARD_FUNCTION_SPECS})"
)

OLD_NAMES = {
    "reward": ("reward_functions", _SCORER),
    "scorer": ("reward_functions", _SCORER),
    "tensorboard": ("report_to", "--report_to tensorboard, or --report_to none"),
    "out": ("output", "--output"),
    "iterations": ("max_steps", "--max_steps (the PPO/GRPO iterations, one step each)"),
    "advantage": ("advantage_estimator", "--advantage_estimator"),
    "beta": ("kl_coef", "--kl_coef (the KL's weight, in the loss with --kl_in_loss true)"),
    "kl_in_reward": ("kl_in_loss", "--kl_in_loss false (the KL in the rewards)"),
    "num_iterations": ("ppo_epochs", "--ppo_epochs (passes over each iteration's experience)"),
    "steps_per_generation": (
        "rollout_batch_size",
        "--rollout_batch_size (prompts per iteration; its optimiser steps per pass are "
        "rollout_batch_size x num_generations / (batch_size x gradient_accumulation_steps x "
        "processes))",
    ),
}
"""rlhfkit's own former names of options -> (our field, what to write); refused as TRL's are."""

_PARSER_OPTIONS = {"config", "help", "print_config"}  # the parser's own, no field of a config


def spelling_problem(command: str, given: str, where: str, fields: set[str]) -> str | None:
    """Why ``given`` (an option or config key, as ``where`` says: "option --x", "key 'x' in
    f.yaml") is not a field of ``command`` (``fields``), with what to write: TRL's name for one
    of ours (or for what rlhfkit lacks), a former name of ours, or a near miss of a field
    ("did you mean"). None where it is a field or nothing is known of it (the parser then
    refuses it as unrecognized)."""
    key = given.replace("-", "_")
    if given in fields or key in fields or key in _PARSER_OPTIONS:
        return None
    listing = f"`rlhfkit {command} --help` lists every option"
    trl = _trl_answer(command, key, fields)
    if trl is not None and trl.kind == "ours":
        note = f" ({trl.note})" if trl.note else ""
        return f"unrecognized {where} (TRL's name); did you mean {trl.spelling}?{note} {listing}"
    if trl is not None and trl.kind == "missing":
        return (
            f"unrecognized {where} (TRL's name), not an option of rlhfkit {command}: "
            f"{trl.note}. {listing}; docs/trl_options.md answers every TRL option"
        )
    ours = OLD_NAMES.get(key)
    if ours is not None and ours[0] in fields:
        return f"unrecognized {where} (a former name); did you mean {ours[1]}? {listing}"
    near = difflib.get_close_matches(key, sorted(fields), n=1, cutoff=0.88)
    if near:
        return f"unrecognized {where}; did you mean --{near[0]}? {listing}"
    return None


def _trl_answer(command: str, key: str, fields: set[str]) -> trl_names.Answer | None:
    """rlhfkit's answer to TRL's option `key` in `command`: its TRL counterpart's table for a
    training stage; for another command, a name of ours that it has (`fields`)."""
    if command in trl_names.STAGES:
        return trl_names.answer(command, key)
    return next((a for a in trl_names.renamed(key) if a.field in fields), None)


# The pipeline's sections by the command each one's config is of, where the names differ.
_SECTION_COMMANDS = {"reward": "rm", "round_reward": "rm", "round_ppo": "ppo"}


def check_section_keys(cls: type, section: str, keys: Sequence[str]) -> None:
    """A `ConfigError` for a key of a pipeline's ``section`` (a stage's fields, ``cls``) that
    is TRL's name, a former one of ours or a misspelling, answered as the stage's command
    answers that option ("did you mean"); other keys are left to the parser."""
    fields = {f.name for f in dataclasses.fields(cls)}
    command = _SECTION_COMMANDS.get(section, section)
    for key in keys:
        problem = spelling_problem(command, key, f"key {key!r}", fields)
        if problem is not None:
            raise ConfigError(f"PipelineConfig.{section}: {problem}")
