"""`rlhfkit launch`: torchrun, with the exit code the run itself gave.

``rlhfkit launch --nproc_per_node 2 sft --config configs/sft.yaml`` is
``torchrun --nproc_per_node 2 -m rlhfkit.cli sft --config configs/sft.yaml``: the same
launcher options (``torch.distributed.run``'s parser reads them), run in this process. What
differs is the ending. torchrun ends with exit code 1 and a traceback whatever stopped the run:
a SIGTERM it passed on to its workers (which saved a checkpoint and exited 143), or a usage
error every worker refused with (exit 2). Here the launch ends as one rlhfkit process would:
with 128 + the signal's number when the launcher was stopped by a signal, else with the exit
code of the worker that failed first (a worker killed by a signal: 128 + its number), after
the workers' own messages; schedulers that requeue on 143 and scripts that tell a bad option (2)
from a failed run (1) read it as they would without a launcher.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence

from rlhfkit.errors import UsageError

logger = logging.getLogger(__name__)

EXAMPLE = "rlhfkit launch --nproc_per_node 2 sft --config configs/sft.yaml"


def help_text() -> str:
    """What ``rlhfkit launch --help`` shows: the usage, then torchrun's options."""
    from torch.distributed import run as torchrun

    options = torchrun.get_args_parser().format_help()
    return f"usage: {EXAMPLE}\n\ntorchrun's options, then a training stage:\n\n{options}"


def launch(argv: Sequence[str], commands: Collection[str], flags: Sequence[str] = ()) -> int:
    """Run ``argv`` (torchrun's options, then an rlhfkit command of ``commands`` and its
    options) under torchrun, each worker with rlhfkit's ``flags``; the exit code (see the
    module docstring)."""
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    split = next((i for i, arg in enumerate(argv) if arg in commands), None)
    if split is None:
        raise UsageError(
            f"name the stage to launch ({', '.join(sorted(commands))}) after torchrun's "
            f"options: `{EXAMPLE}`"
        )
    options = [*argv[:split], "-m", "rlhfkit.cli", *flags, *argv[split:]]
    try:
        torchrun.run(torchrun.parse_args(options))
    except SignalException as stop:
        logger.warning("launch stopped by signal %d", stop.sigval)
        return 128 + int(stop.sigval)
    except ChildFailedError as failed:
        _, failure = failed.get_first_failure()
        return failure.exitcode if failure.exitcode > 0 else 128 - failure.exitcode
    return 0
