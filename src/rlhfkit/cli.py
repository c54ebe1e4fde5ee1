"""`rlhfkit <command>`: every stage of the pipeline from the command line.

    rlhfkit --help                                   the commands
    rlhfkit sft --help                               every field of SFTConfig, documented
    rlhfkit sft --config configs/sft.yaml --learning_rate 3e-4 --max_steps 100
    rlhfkit rm  --config configs/rm.yaml             (alias: rlhfkit reward)
    rlhfkit --verbose sft ...                        also the libraries' own progress bars
    rlhfkit --debug sft ...                          a failure's traceback too (or RLHFKIT_DEBUG=1)
    rlhfkit --bounded-memory ppo ...                 on a CPU, a lower peak for a little speed
    rlhfkit label serve --db runs/label/labels.db    a command of a group (`rlhfkit label --help`)

Each command is one line in `COMMANDS`: a config dataclass and a `run(config)` function, both
named as "module:attribute" and imported only when that command runs, so `rlhfkit --help`
answers without loading torch. Options come from jsonargparse: a YAML file (`--config`), then
`--field value` overrides, then the dataclass's own checks (`ConfigError` names the field). One
value for a list field is a list of one (`--report_to wandb`); a TRL option name stops with
rlhfkit's answer to it (`trl_names`: "did you mean" ours, or why there is none and what to do
instead), and so does a name rlhfkit used before (`config.OLD_NAMES`) or a misspelt one; no
option is ever taken for an abbreviation of another.

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
import json
import logging
import os
import sys
import traceback
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlhfkit.errors import RunError, Terminated, UsageError
from rlhfkit.runtime.termination import sigterm_raises
from rlhfkit.text import terminal_text

DEBUG_ENV = "RLHFKIT_DEBUG"
FLAGS = ("--verbose", "--debug", "--bounded-memory")  # before the command


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
    distributed: bool = False
    """Whether it runs as one of several processes under a launcher (the training stages)."""
    preset: str | None = None
    """The preset of its config's defaults (`RLConfig.preset`: the RL commands are one config
    with each algorithm's defaults)."""
    light: bool = False
    """Whether it runs without the ML libraries (a server of a SQLite file): its options are
    parsed without `rlhfkit.config` (which imports torch), so it starts at once and stays
    small; its config raises `UsageError` (exit 2) where others raise `ConfigError`."""


COMMANDS: dict[str, Command] = {
    "sft": Command(
        "rlhfkit.config:SFTConfig",
        "rlhfkit.trainers.sft:run_sft",
        "supervised fine-tuning on demonstrations (InstructGPT step 1)",
        distributed=True,
    ),
    "rm": Command(
        "rlhfkit.config:RewardConfig",
        "rlhfkit.trainers.reward:run_reward",
        "reward model on comparisons or K-way rankings (InstructGPT step 2)",
        aliases=("reward",),
        distributed=True,
    ),
    "ppo": Command(
        "rlhfkit.trainers.rl_config:RLConfig",
        "rlhfkit.trainers.rl:run_rl",
        "PPO against the reward model with a KL penalty to the SFT model (InstructGPT step 3)",
        distributed=True,
        preset="ppo",
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
        distributed=True,
    ),
    "grpo": Command(
        "rlhfkit.trainers.rl_config:RLConfig",
        "rlhfkit.trainers.rl:run_rl",
        "RL without a critic, group-relative advantages (GRPO, Dr. GRPO, DAPO, GSPO)",
        distributed=True,
        preset="grpo",
    ),
    "rloo": Command(
        "rlhfkit.trainers.rl_config:RLConfig",
        "rlhfkit.trainers.rl:run_rl",
        "RL without a critic, the leave-one-out baseline (RLOO)",
        distributed=True,
        preset="rloo",
    ),
    "reinforce++": Command(
        "rlhfkit.trainers.rl_config:RLConfig",
        "rlhfkit.trainers.rl:run_rl",
        "RL without a critic, whitened returns with the KL per token (REINFORCE++)",
        distributed=True,
        preset="reinforce++",
    ),
    "export": Command(
        "rlhfkit.trainers.export:CheckpointExportConfig",
        "rlhfkit.trainers.export:run_checkpoint_export",
        "an RL run's checkpoint as a model directory (keep the step before the reward model "
        "was over-optimised)",
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
        light=True,
    ),
    "label assign": Command(
        "rlhfkit.labelling.assign:AssignConfig",
        "rlhfkit.labelling.assign:run_assign",
        "give tasks to named labellers, each task to as many of them as it needs votes",
        light=True,
    ),
    "label export": Command(
        "rlhfkit.labelling.export:ExportConfig",
        "rlhfkit.labelling.export:run_export",
        "the votes as comparisons and rankings for `rlhfkit rm` and `rlhfkit dpo`",
        light=True,
    ),
}

GROUPS: dict[str, str] = {
    "label": "human preference labelling: prepare the tasks, assign them, serve the web app, "
    "export the votes",
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
        allow_abbrev=False,
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
        allow_abbrev=False,
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
    parser.add_argument(
        "--bounded-memory",
        action="store_true",
        help="on a CPU, hold less memory for a little speed: one malloc arena for every thread "
        "and 128 of oneDNN's compiled kernels instead of 1,024 (docs/ppo.md, 'Peak memory'); "
        "before the command",
    )
    commands = parser.add_subparsers(dest="command", metavar="<command>", required=True)
    for name, command in COMMANDS.items():
        commands.add_parser(name, help=command.help, aliases=list(command.aliases))
    commands.add_parser(
        "launch",
        help="a training stage on several processes: torchrun's options, then the stage "
        "(`rlhfkit launch --nproc_per_node 2 sft ...`); it exits as the run did",
    )
    return parser


def _refuse_other_spellings(name: str, args: Sequence[str], fields: set[str]) -> None:
    """A name given as an option or as a key of a `--config` file that this command does not
    take under that name: TRL's, a former one of ours, or a misspelling of one of `fields`
    stops with a usage error saying what to write (`config.spelling_problem`)."""
    from rlhfkit.config import spelling_problem

    for given, where in _given_names(args):
        problem = spelling_problem(name, given, where, fields)
        if problem is not None:
            raise UsageError(problem)


def _given_names(args: Sequence[str]) -> list[tuple[str, str]]:
    """(name, where it was given) of every option of `args` and every key of its config files."""
    given = []
    for i, arg in enumerate(args):
        flag, equals, value = arg.partition("=")
        if not flag.startswith("--"):
            continue
        given.append((flag[2:], f"option {flag}"))
        if flag == "--config" and (equals or i + 1 < len(args)):
            path = value if equals else args[i + 1]
            given += [(key, f"key {key!r} in {path}") for key in _yaml_keys(path)]
    return given


def _yaml_keys(path: str) -> list[str]:
    """The top-level keys of a YAML file; none if it does not read (jsonargparse says why)."""
    import yaml

    try:
        loaded = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return []
    return [str(key) for key in loaded] if isinstance(loaded, dict) else []


def _list_fields(config_cls: type) -> set[str]:
    """The fields of `config_cls` that hold a list (or None); not those that take one value as
    well (`reward_model`: a directory, or an ensemble's list of them)."""
    hints = typing.get_type_hints(config_cls)
    return {name for name, hint in hints.items() if _holds_lists(hint)}


def _holds_lists(hint: Any) -> bool:
    """Whether every type of ``hint`` but None is a list."""
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    kinds = [a for a in typing.get_args(hint) if a is not type(None)] if union else [hint]
    return all(typing.get_origin(kind) is list for kind in kinds)


def _lists_of_one(args: Sequence[str], list_fields: set[str]) -> list[str]:
    """`--field value` (or `--field=value`) for a list field, the value one item, read as the
    list of that item: `--reward_functions gold` is `--reward_functions '[gold]'`."""
    out = list(args)
    for i, arg in enumerate(out):
        flag, equals, value = arg.partition("=")
        if not flag.startswith("--") or flag[2:] not in list_fields:
            continue
        if equals:
            out[i] = f"{flag}={_as_list(value)}"
        elif i + 1 < len(out) and not out[i + 1].startswith("--"):
            out[i + 1] = _as_list(out[i + 1])
    return out


def _as_list(value: str) -> str:
    """One YAML scalar as a one-item list; anything else (a list, null, a mapping) as it is."""
    import yaml

    try:
        item = yaml.safe_load(value)
    except yaml.YAMLError:
        return value
    return json.dumps([item]) if isinstance(item, str | int | float) else value


def run_command(name: str, args: Sequence[str]) -> Any:
    """Parse `args` into the command's config, run it, and return what it returned."""
    command, config = parse_command(name, args)
    return _load(command.run)(config), config


def parse_command(name: str, args: Sequence[str]) -> tuple[Command, Any]:
    """The command named `name` and its config from `args`; what `run_command` runs."""
    resolved = _resolve(name)
    if resolved is None:
        raise SystemExit(f"rlhfkit: unknown command {name!r}; see `rlhfkit --help`")
    name, command = resolved
    _refuse_several_processes(name, command)
    if command.light:
        return command, _parse_light(name, _load(command.config), args)
    from rlhfkit.config import ConfigError, config_from_namespace, config_parser

    config_cls = _load(command.config)
    _refuse_other_spellings(name, args, {f.name for f in dataclasses.fields(config_cls)})
    defaults = config_cls.preset_defaults(command.preset) if command.preset else None
    parser = config_parser(config_cls, defaults, prog=f"rlhfkit {name}")
    namespace = parser.parse_args(_lists_of_one(args, _list_fields(config_cls)))
    try:
        config = config_from_namespace(config_cls, namespace)
    except ConfigError as error:
        parser.error(str(error))
    return command, config


def _parse_light(name: str, config_cls: type, args: Sequence[str]) -> Any:
    """A light command's config from `args`: the parser of `config.config_parser` (the same
    options, help and YAML files), built here because `rlhfkit.config` imports torch."""
    from jsonargparse import ActionConfigFile, ArgumentParser, set_parsing_settings

    set_parsing_settings(docstring_parse_attribute_docstrings=True)
    parser = ArgumentParser(
        prog=f"rlhfkit {name}", description=config_cls.__doc__, allow_abbrev=False
    )
    parser.add_argument("--config", action=ActionConfigFile, help="YAML file with field values.")
    parser.add_class_arguments(config_cls, nested_key=None, fail_untyped=True)
    namespace = parser.parse_args(_lists_of_one(args, _list_fields(config_cls)))
    values = {f.name: namespace[f.name] for f in dataclasses.fields(config_cls)}
    try:
        return config_cls(**values)
    except UsageError as error:
        parser.error(str(error))


def _refuse_several_processes(name: str, command: Command) -> None:
    """Only the training stages divide their work over processes; any other command run by
    each of several processes would repeat its work and race on its files."""
    processes = int(os.environ.get("WORLD_SIZE", "1"))
    if processes > 1 and not command.distributed:
        stages = ", ".join(n for n, c in COMMANDS.items() if c.distributed)
        raise UsageError(
            f"`rlhfkit {name}` runs in one process, and it was started in {processes} "
            f"(WORLD_SIZE={processes}); launch only the training stages ({stages}) with "
            "torchrun or accelerate launch, and run the others as plain commands"
        )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `rlhfkit` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    flags = set()
    while argv and argv[0] in FLAGS:
        flags.add(argv.pop(0))
    if argv[:1] == ["launch"]:
        return _launch(argv[1:], flags)
    found = _command_of(argv)
    if found is None:  # print the help, or the error, and exit
        if argv and argv[0] in GROUPS:
            _group_parser(argv[0]).parse_args(argv[1:])
        else:
            _top_parser().parse_args(argv)
        return 2
    name, args = found
    # Under a launcher (torchrun, accelerate launch) every process runs this; the first one
    # tells what happens, the others only warn.
    main_process = os.environ.get("RANK", "0") == "0"
    logging.basicConfig(
        level=logging.INFO if main_process else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    debug = "--debug" in flags or os.environ.get(DEBUG_ENV, "0") not in ("", "0")
    resolved = _resolve(name)
    light = resolved is not None and resolved[1].light
    try:
        with sigterm_raises():
            result, config = _run(name, args, flags, light)
    except KeyboardInterrupt:
        print(f"\nrlhfkit {name}: interrupted", file=sys.stderr)
        return _exit(130)
    except Terminated as stop:  # every process stopped at one step; the first one says so
        if main_process:
            print(f"rlhfkit {name}: {terminal_text(str(stop))}", file=sys.stderr)
        return _exit(Terminated.exit_code)
    except Exception as error:  # the one error path
        return _exit(_fail(name, error, debug))
    if main_process:
        _print_summary(name, config, result)
    return _exit(0)


def _launch(argv: list[str], flags: set[str]) -> int:
    """`rlhfkit launch`: a training stage under torchrun (`runtime/launch.py`)."""
    from rlhfkit.runtime.launch import help_text, launch

    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    stages = [n for n, c in COMMANDS.items() if c.distributed]
    stages += [alias for n in stages for alias in COMMANDS[n].aliases]
    if {"-h", "--help"} & set(argv) and not set(stages) & set(argv):
        print(help_text())
        return 0
    try:
        return launch(argv, stages, sorted(flags))
    except UsageError as error:
        print(f"rlhfkit launch: error: {terminal_text(str(error))}", file=sys.stderr)
        return 2


def _exit(code: int) -> int:
    """``code``, to return from ``main``; a process that was one of several in a process
    group ends here instead (``distributed.exit_without_finalizing``: gloo's threads would
    abort it in the interpreter's finalization)."""
    distributed = sys.modules.get("rlhfkit.runtime.distributed")  # loaded by every trainer
    if distributed is not None and distributed.was_in_a_group():
        distributed.exit_without_finalizing(code)
    return code


def _run(name: str, args: list[str], flags: set[str], light: bool) -> tuple[Any, Any]:
    """Run command ``name`` on ``args``: its result and config."""
    if "--verbose" not in flags and not light:
        from rlhfkit.tracking import hide_library_progress_bars

        hide_library_progress_bars()
    if "--bounded-memory" in flags:  # before any model is loaded, or too late
        from rlhfkit.runtime.allocator import bound_held_memory

        bound_held_memory()
    result, config = run_command(name, args)
    if not light:
        from rlhfkit.runtime.distributed import leave_process_group

        leave_process_group()  # under a launcher: every process done before any exits
    return result, config


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


def _print_summary(name: str, config: Any, result: Any) -> None:
    """Tell the user where the results are. A run that stopped to wait (the pipeline for
    people's labels) returns an object with a `headline()` and the `path` to look at."""
    headline = getattr(result, "headline", None)
    print(f"\nrlhfkit {name}: {headline() if headline else 'done.'}")
    result = getattr(result, "path", result)
    if isinstance(result, str | Path):
        print(f"  result:         {Path(result).resolve()}")
    output_dir = getattr(config, "output_dir", None)
    if output_dir is not None:
        run_dir = Path(output_dir).resolve()
        print(f"  run directory:  {run_dir} (metrics.jsonl, curves.png, checkpoints)")
        # The directory itself: TensorBoard finds every stage's events below it (a pipeline
        # writes <run>/<stage>/tb).
        if "tensorboard" in getattr(config, "report_to", ["tensorboard"]):
            print(f"  TensorBoard:    tensorboard --logdir {run_dir}")


if __name__ == "__main__":
    sys.exit(main())
