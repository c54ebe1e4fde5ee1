"""`rlhfkit <command>`: every stage of the pipeline from the command line.

    rlhfkit --help                                   the commands
    rlhfkit sft --help                               every field of SFTConfig, documented
    rlhfkit sft --config configs/sft.yaml --learning_rate 3e-4 --max_steps 100
    rlhfkit rm  --config configs/rm.yaml             (alias: rlhfkit reward)
    rlhfkit --verbose sft ...                        also the libraries' own progress bars
    rlhfkit --debug sft ...                          a failure's traceback too (or RLHFKIT_DEBUG=1)
    rlhfkit label serve --db runs/label/labels.db    a command of a group (`rlhfkit label --help`)

Each command is one line in `COMMANDS`: a config dataclass and a `run(config)` function, both
named as "module:attribute" and imported only when that command runs, so `rlhfkit --help`
answers without loading torch. Options come from jsonargparse: a YAML file (`--config`), then
`--field value` overrides, then the dataclass's own checks (`ConfigError` names the field).

One error path: a failure is one paragraph on stderr (what, where, what is allowed, what to do)
and an exit code, 2 for what the user gave (an option, a config value, a data file, a model
path, a reward function spec: `config.ConfigError`, `errors.UsageError`) and 1 for a failure
while running (`errors.RunError`, an OS error, anything unforeseen); a traceback only with
`--debug` or RLHFKIT_DEBUG=1.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import logging
import os
import sys
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlhfkit.errors import RunError, UsageError
from rlhfkit.text import terminal_text

DEBUG_ENV = "RLHFKIT_DEBUG"
FLAGS = ("--verbose", "--debug")  # before the command


@dataclass(frozen=True)
class Command:
    """A CLI command: its config dataclass, the function that runs it, and its help line."""

    config: str
    """The config dataclass, as "module:Class"."""
    run: str
    """The function run(config) -> main output path (or None), as "module:function"."""
    help: str
    """One line for `rlhfkit --help`."""
    aliases: tuple[str, ...] = ()
    """Other names for the command."""


COMMANDS: dict[str, Command] = {
    "sft": Command(
        "rlhfkit.config:SFTConfig",
        "rlhfkit.trainers.sft:run_sft",
        "supervised fine-tuning on demonstrations (InstructGPT step 1)",
    ),
    "rm": Command(
        "rlhfkit.config:RewardConfig",
        "rlhfkit.trainers.reward:run_reward",
        "reward model on comparisons or K-way rankings (InstructGPT step 2)",
        aliases=("reward",),
    ),
    "ppo": Command(
        "rlhfkit.trainers.ppo_config:PPOConfig",
        "rlhfkit.trainers.ppo:run_ppo",
        "PPO against the reward model with a KL penalty to the SFT model (InstructGPT step 3)",
    ),
    "chat": Command(
        "rlhfkit.interact.chat:ChatConfig",
        "rlhfkit.interact.chat:run_chat",
        "talk to a checkpoint in the terminal, each reply's reward shown",
    ),
    "sample": Command(
        "rlhfkit.interact.chat:SampleConfig",
        "rlhfkit.interact.chat:run_sample",
        "print sampled continuations of prompts, to see what a checkpoint writes",
    ),
    "pipeline": Command(
        "rlhfkit.pipeline.config:PipelineConfig",
        "rlhfkit.pipeline.run:run_pipeline",
        "SFT -> reward model -> PPO, with DPO and best-of-n, then evaluation and the report",
    ),
    "demo": Command(
        "rlhfkit.pipeline.config:DemoConfig",
        "rlhfkit.pipeline.run:run_demo",
        "the pipeline on the bundled tiny English model (configs/demo.yaml), in minutes",
    ),
    "eval": Command(
        "rlhfkit.evaluation.evaluate:EvalConfig",
        "rlhfkit.pipeline.run:run_eval",
        "gold score, reward, KL, win rate and diversity of models on held-out prompts",
    ),
    "dpo": Command(
        "rlhfkit.trainers.dpo_config:DPOConfig",
        "rlhfkit.trainers.dpo:run_dpo",
        "direct preference optimisation (DPO, IPO, cDPO) on comparisons",
    ),
    "grpo": Command(
        "rlhfkit.trainers.grpo_config:GRPOConfig",
        "rlhfkit.trainers.grpo:run_grpo",
        "critic-free RL with group-relative advantages (GRPO, Dr. GRPO)",
    ),
    "rloo": Command(
        "rlhfkit.trainers.grpo_config:RLOOConfig",
        "rlhfkit.trainers.grpo:run_grpo",
        "critic-free RL with the leave-one-out baseline (RLOO)",
    ),
    "bon": Command(
        "rlhfkit.interact.sampling:BestOfNConfig",
        "rlhfkit.interact.sampling:run_bon",
        "best-of-n sampling; writes the picks as demonstrations",
    ),
    "label prepare": Command(
        "rlhfkit.labelling.prepare:PrepareConfig",
        "rlhfkit.labelling.prepare:run_prepare",
        "K >= 2 responses per prompt, from models or a file, into a labelling database",
    ),
    "label serve": Command(
        "rlhfkit.labelling.serve:ServeConfig",
        "rlhfkit.labelling.serve:run_serve",
        "the labelling web app: people compare or rank the responses",
    ),
    "label export": Command(
        "rlhfkit.labelling.export:ExportConfig",
        "rlhfkit.labelling.export:run_export",
        "the votes as comparisons and rankings for `rlhfkit rm` and `rlhfkit dpo`",
    ),
}

GROUPS: dict[str, str] = {
    "label": "human preference labelling: prepare the tasks, serve the web app, export the votes",
}
"""Command groups and their help lines: a group's commands are the two-word names
"<group> <command>" in `COMMANDS`."""


def _load(target: str) -> Any:
    """The attribute named by "module:attribute"."""
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)


def _resolve(name: str) -> tuple[str, Command] | None:
    for command_name, command in COMMANDS.items():
        if name == command_name or name in command.aliases:
            return command_name, command
    return None


def _command_of(argv: Sequence[str]) -> tuple[str, list[str]] | None:
    """The command `argv` starts with (two words for a group's command) and its arguments."""
    words = 2 if argv and argv[0] in GROUPS else 1
    name = " ".join(argv[:words])
    if len(argv) < words or _resolve(name) is None:
        return None
    return name, list(argv[words:])


def _group_parser(group: str) -> argparse.ArgumentParser:
    """The `rlhfkit <group> --help` listing (each command parses its own options)."""
    parser = argparse.ArgumentParser(
        prog=f"rlhfkit {group}",
        description=GROUPS[group],
        epilog=f"`rlhfkit {group} <command> --help` documents every option of a command.",
    )
    commands = parser.add_subparsers(dest="command", metavar="<command>", required=True)
    for name, command in COMMANDS.items():
        if name.startswith(f"{group} "):
            commands.add_parser(name.removeprefix(f"{group} "), help=command.help)
    return parser


def _top_parser() -> argparse.ArgumentParser:
    """The `rlhfkit --help` listing (each command parses its own options)."""
    parser = argparse.ArgumentParser(
        prog="rlhfkit",
        description="RLHF on Hugging Face causal LMs: SFT, reward model, PPO, DPO and more.",
        epilog="`rlhfkit <command> --help` documents every option of a command.",
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="also show the progress bars of transformers, datasets and the hub (loading and "
        "saving models); before the command",
    )
    parser.add_argument(
        "--debug",
        action="store_true",
        help=f"on a failure, also print the traceback (as {DEBUG_ENV}=1 does); before the "
        "command. Exit codes: 2 for a bad option, config, data file, path or reward function "
        "spec, 1 for a failure while running",
    )
    commands = parser.add_subparsers(dest="command", metavar="<command>", required=True)
    for name, command in COMMANDS.items():
        commands.add_parser(name, help=command.help, aliases=list(command.aliases))
    return parser


# TRL's names for options rlhfkit spells otherwise -> (our field, what to write). No alias is
# accepted: a run reads one spelling, and the error teaches it.
TRL_NAMES = {
    "model_name_or_path": ("model", "--model"),
    "sft_model_path": ("model", "--model"),
    "reward_model_path": ("reward_model", "--reward_model"),
    "dataset_name": ("train_data", "--train_data"),
    "dataset_train_split": ("train_split", "--train_split"),
    "dataset_test_split": ("eval_split", "--eval_split"),
    "per_device_train_batch_size": ("batch_size", "--batch_size"),
    "per_device_eval_batch_size": ("eval_batch_size", "--eval_batch_size"),
    "num_train_epochs": ("num_epochs", "--num_epochs"),
    "lr_scheduler_type": ("lr_scheduler", "--lr_scheduler"),
    "logging_steps": ("log_every", "--log_every"),
    "save_steps": ("save_every", "--save_every"),
    "eval_steps": ("eval_every", "--eval_every"),
    "save_total_limit": ("keep_last", "--keep_last"),
    "resume_from_checkpoint": ("resume", "--resume true"),
    "bf16": ("mixed_precision", "--mixed_precision bf16"),
    "use_cpu": ("cpu", "--cpu true"),
    "report_to": ("tensorboard", "--tensorboard true|false (metrics.jsonl is always written)"),
    "use_peft": ("lora", "--lora true"),
    "max_completion_length": ("max_new_tokens", "--max_new_tokens"),
    "response_length": ("max_new_tokens", "--max_new_tokens"),
    "num_ppo_epochs": ("ppo_epochs", "--ppo_epochs"),
    "cliprange": ("clip_range", "--clip_range"),
    "cliprange_value": ("clip_range_value", "--clip_range_value"),
    "local_rollout_forward_batch_size": ("forward_batch_size", "--forward_batch_size"),
    "total_episodes": ("max_steps", "--max_steps (PPO iterations)"),
}


def _refuse_trl_spellings(name: str, args: Sequence[str], fields: set[str]) -> None:
    """A TRL option name that this command has under another name: a usage error naming ours."""
    for arg in args:
        flag = arg.split("=", 1)[0]
        if not flag.startswith("--") or flag[2:] in fields:
            continue
        ours = TRL_NAMES.get(flag[2:].replace("-", "_"))
        if ours is not None and ours[0] in fields:
            raise UsageError(
                f"unrecognized option {flag} (TRL's name); did you mean {ours[1]}? "
                f"`rlhfkit {name} --help` lists every option"
            )


def run_command(name: str, args: Sequence[str]) -> Any:
    """Parse `args` into the command's config, run it, and return what it returned."""
    from rlhfkit.config import ConfigError, config_from_namespace, config_parser

    resolved = _resolve(name)
    if resolved is None:
        raise SystemExit(f"rlhfkit: unknown command {name!r}; see `rlhfkit --help`")
    name, command = resolved
    config_cls = _load(command.config)
    _refuse_trl_spellings(name, args, {f.name for f in dataclasses.fields(config_cls)})
    parser = config_parser(config_cls, prog=f"rlhfkit {name}")
    namespace = parser.parse_args(list(args))
    try:
        config = config_from_namespace(config_cls, namespace)
    except ConfigError as error:
        parser.error(str(error))
    return _load(command.run)(config), config


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `rlhfkit` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    flags = set()
    while argv and argv[0] in FLAGS:
        flags.add(argv.pop(0))
    found = _command_of(argv)
    if found is None:  # print the help, or the error, and exit
        if argv and argv[0] in GROUPS:
            _group_parser(argv[0]).parse_args(argv[1:])
        else:
            _top_parser().parse_args(argv)
        return 2
    name, args = found
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    debug = "--debug" in flags or os.environ.get(DEBUG_ENV, "0") not in ("", "0")
    try:
        if "--verbose" not in flags:
            _hide_library_progress_bars()
        result, config = run_command(name, args)
    except KeyboardInterrupt:
        print(f"\nrlhfkit {name}: interrupted", file=sys.stderr)
        return 130
    except Exception as error:  # the one error path
        return _fail(name, error, debug)
    _print_summary(name, config, result)
    return 0


def _fail(name: str, error: Exception, debug: bool) -> int:
    """Tell the user what failed in one paragraph on stderr; return the exit code."""
    if debug:
        traceback.print_exception(error)
    # Looked up, not imported: a ConfigError exists only once rlhfkit.config imported, and
    # importing it again here would fail again if that import was what failed.
    config = sys.modules.get("rlhfkit.config")
    usage = (UsageError, config.ConfigError) if config is not None else (UsageError,)
    message = terminal_text(str(error).strip() or type(error).__name__)
    if isinstance(error, usage):
        print(f"rlhfkit {name}: error: {message}", file=sys.stderr)
        return 2
    kind = "failed" if isinstance(error, RunError | OSError) else type(error).__name__
    hint = "" if debug else f" (`rlhfkit --debug {name} ...` or {DEBUG_ENV}=1 shows the traceback)"
    print(f"rlhfkit {name}: {kind}: {message}{hint}", file=sys.stderr)
    return 1


def _hide_library_progress_bars() -> None:
    """One bar per stage: transformers draws its own for every model it loads or saves
    ("Loading weights", "Writing model shards"), datasets and the hub theirs."""
    import datasets
    import huggingface_hub
    import transformers

    transformers.utils.logging.disable_progress_bar()
    datasets.disable_progress_bars()
    huggingface_hub.utils.disable_progress_bars()


def _print_summary(name: str, config: Any, result: Any) -> None:
    """Tell the user where the results are."""
    print(f"\nrlhfkit {name}: done.")
    if isinstance(result, str | Path):
        print(f"  result:         {Path(result).resolve()}")
    output_dir = getattr(config, "output_dir", None)
    if output_dir is not None:
        run_dir = Path(output_dir).resolve()
        print(f"  run directory:  {run_dir} (metrics.jsonl, curves.png, checkpoints)")
        # The directory itself: TensorBoard finds every stage's events below it (a pipeline
        # writes <run>/<stage>/tb).
        print(f"  TensorBoard:    tensorboard --logdir {run_dir}")


if __name__ == "__main__":
    sys.exit(main())
