"""The comparison arms beside the reward model and PPO: ``parallel_arms``.

DPO and the GRPO arm need nothing but the SFT model (and DPO the comparisons), so they can
train while the reward model and PPO do. With ``parallel_arms`` each starts in a process of
its own once ``sft/final`` is saved, and the pipeline waits for both after PPO. A small model
leaves one GPU mostly idle: its steps are bound by the launches of many small kernels, so
processes side by side each lose far less speed than the overlap saves (docs/results/gpu.md
has the measurement). On a CPU they share its cores, and gain nothing.

Each arm process runs the pipeline's own stage runner (``runners.RUNNERS``) on the pipeline's
config, saved as JSON in ``arms/``, so an arm trains exactly what the pipeline would have
trained in-process: same derived config, same seed, same resume from its newest checkpoint.
``arms/<stage>.log`` holds its log, and ``arms/<stage>.json`` the seconds it took and its peak
memory. A failing arm stops the pipeline at the wait with its message and the log's path; a
pipeline that stops, by an error, Ctrl-C or SIGTERM, stops the arms it started (SIGTERM,
then SIGKILL after a grace; their checkpoints are kept, and the next start resumes them).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from rlhfkit import checkpoint as ckpt
from rlhfkit.config import load_config
from rlhfkit.errors import RunError, Terminated, UsageError
from rlhfkit.pipeline.config import PipelineConfig, stage_configs
from rlhfkit.pipeline.runners import RUNNERS
from rlhfkit.runtime.allocator import peak_resident_gib
from rlhfkit.runtime.termination import sigterm_raises
from rlhfkit.tracking import hide_library_progress_bars

logger = logging.getLogger(__name__)

ARMS_DIR = "arms"
CONFIG_FILE = "pipeline_config.json"
STOP_GRACE_SECONDS = 10.0


@dataclass
class _Arm:
    stage: str
    process: subprocess.Popen
    log: Path


class Arms:
    """The arm processes of one pipeline run: started after SFT, waited for after PPO,
    stopped when the pipeline stops first."""

    def __init__(self, config: PipelineConfig) -> None:
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            raise UsageError(
                "parallel_arms: true starts processes of its own, which a launcher of several "
                "processes (torchrun, accelerate launch) cannot share its process group with; "
                "set parallel_arms: false there"
            )
        self.config = config
        self.dir = config.run_dir / ARMS_DIR
        self.running: dict[str, _Arm] = {}

    def start(self, stage: str) -> None:
        """Start ``stage`` in a process of its own, on the pipeline's config."""
        self.dir.mkdir(parents=True, exist_ok=True)
        config_path = self.dir / CONFIG_FILE
        ckpt.write_json(dataclasses.asdict(self.config), config_path)
        log = self.dir / f"{stage}.log"
        command = [sys.executable, "-m", __name__, str(config_path), stage]
        with log.open("a", encoding="utf-8") as out:
            process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        self.running[stage] = _Arm(stage, process, log)
        logger.info(
            "%s: training beside the next stages, in process %d (log: %s)", stage, process.pid, log
        )

    def is_running(self, stage: str) -> bool:
        return stage in self.running

    def join(self, stage: str) -> None:
        """Wait for ``stage``'s process; a `RunError` with its message if it failed."""
        arm = self.running[stage]
        logger.info("%s: waiting for its process %d", stage, arm.process.pid)
        code = arm.process.wait()
        del self.running[stage]
        if code != 0:
            raise RunError(
                f"the {stage} arm, trained in a process of its own (parallel_arms), failed "
                f"with exit code {code}: {_last_error(arm.log)}; its whole log: {arm.log}"
            )

    def measured(self, stage: str) -> dict | None:
        """The seconds ``stage``'s process spent on its stage and its peak memory, as it
        measured them."""
        path = self.dir / f"{stage}.json"
        return ckpt.read_json(path) if path.is_file() else None

    def stop(self) -> None:
        """Stop every arm still running (the pipeline stopped before waiting for them)."""
        for arm in self.running.values():
            arm.process.terminate()
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        for arm in self.running.values():
            try:
                arm.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                arm.process.kill()
                arm.process.wait()
            logger.info("%s: its process stopped; the next start resumes it", arm.stage)
        self.running.clear()


def _last_error(log: Path) -> str:
    """The arm's own account of its failure: its last ERROR line, else its log's last line."""
    lines = [
        line.strip() for line in log.read_text(encoding="utf-8", errors="replace").splitlines()
    ]
    lines = [line for line in lines if line]
    errors = [line for line in lines if " ERROR " in line]
    if errors:
        return errors[-1].split(" ERROR ", 1)[1]
    return lines[-1] if lines else "it wrote nothing"


def run_arm(config_path: str, stage: str) -> int:
    """The arm process: ``stage`` of the pipeline saved at ``config_path``; the exit code."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    hide_library_progress_bars()
    try:
        with sigterm_raises():
            config = load_config(PipelineConfig, config_path)
            started = time.perf_counter()
            RUNNERS[stage](config, stage_configs(config))
            seconds = time.perf_counter() - started
    except Terminated as stop:
        logger.warning("%s: %s", stage, stop)
        return Terminated.exit_code
    except Exception as error:  # the parent reports the message, from this log
        logger.error("%s", str(error).strip() or type(error).__name__)
        logger.info("where it failed:", exc_info=True)
        return 1
    measured = {"seconds": seconds, "peak_memory_gib": peak_resident_gib()}
    ckpt.write_json(measured, config.run_dir / ARMS_DIR / f"{stage}.json")
    logger.info("%s: done in %.1f s", stage, seconds)
    return 0


if __name__ == "__main__":
    sys.exit(run_arm(*sys.argv[1:]))
