"""Checkpoint files without pickle: nested state dicts as safetensors + JSON, RNG states, atomic
directories and rotation.

`torch.save` pickles, and unpickling runs arbitrary code; the accelerate/HF Trainer checkpoints
use it for optimiser and RNG states. Here every tensor of a nested state (an optimiser's
`state_dict()`, RNG states) goes into a safetensors file and the structure around the tensors
(ints, floats, strings, lists, dicts with int keys) into JSON in that file's metadata, so a
checkpoint can be read back with nothing but `safetensors` and `json`.

A checkpoint directory is written under a temporary name and renamed into place when complete
(`atomic_dir`), so a crash never leaves a half-written `checkpoint-N` for resume to trip
over. Its files and directories are flushed to the disk (fsync) before the rename and the
parent directory after it, as `write_json` does for one file, so that a power loss too leaves
the old version or the new one, never a renamed directory of empty files.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file

CHECKPOINT_PREFIX = "checkpoint-"
STATE_FILE = "trainer_state.json"
# Names of directories being written or replaced; whatever a killed run left is removed on start.
TEMPORARY_PREFIX = ".tmp-"
ASIDE_PREFIX = ".old-"
_TENSOR = "__tensor__"  # JSON placeholder {"__tensor__": name} for a tensor stored by name
_ITEMS = "__items__"  # JSON form {"__items__": [[key, value], ...]} of a dict with non-str keys


def flatten_state(obj: Any, tensors: dict[str, torch.Tensor], prefix: str = "t") -> Any:
    """The JSON-able structure of `obj`, moving each tensor into `tensors` under a unique name."""
    if isinstance(obj, torch.Tensor):
        tensors[prefix] = obj.detach().cpu().contiguous()
        return {_TENSOR: prefix}
    if isinstance(obj, dict):
        items = [(k, flatten_state(v, tensors, f"{prefix}.{k}")) for k, v in obj.items()]
        if all(isinstance(k, str) for k, _ in items):
            return dict(items)
        return {_ITEMS: [list(item) for item in items]}
    if isinstance(obj, list | tuple):
        return [flatten_state(v, tensors, f"{prefix}.{i}") for i, v in enumerate(obj)]
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    raise TypeError(f"cannot store {type(obj).__name__} at {prefix!r} without pickle")


def unflatten_state(structure: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """Inverse of `flatten_state` (tuples come back as lists)."""
    if isinstance(structure, dict):
        if _TENSOR in structure:
            return tensors[structure[_TENSOR]]
        if _ITEMS in structure:
            return {k: unflatten_state(v, tensors) for k, v in structure[_ITEMS]}
        return {k: unflatten_state(v, tensors) for k, v in structure.items()}
    if isinstance(structure, list):
        return [unflatten_state(v, tensors) for v in structure]
    return structure


def save_state(obj: Any, path: str | Path) -> None:
    """Write a nested state (dicts, lists, tensors, JSON scalars) to one safetensors file."""
    tensors: dict[str, torch.Tensor] = {}
    structure = flatten_state(obj, tensors)
    save_file(tensors, str(path), metadata={"structure": json.dumps(structure)})


def load_state(path: str | Path, device: str | torch.device = "cpu") -> Any:
    """Read a state written by `save_state`."""
    with safe_open(str(path), framework="pt", device=str(device)) as f:
        structure = json.loads(f.metadata()["structure"])
        tensors = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118 (no __iter__)
    return unflatten_state(structure, tensors)


def rng_state() -> dict[str, Any]:
    """The states of python's, numpy's and torch's (CPU and CUDA) global generators."""
    version, mt, gauss = random.getstate()
    numpy_state = list(np.random.get_state())  # (kind, uint32 keys, pos, has_gauss, gauss)
    numpy_state[1] = torch.from_numpy(numpy_state[1].astype(np.int64))  # exact in int64
    state = {
        "python": [version, torch.tensor(mt, dtype=torch.int64), gauss],
        "numpy": numpy_state,
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore the generators from `rng_state()` output (also after a save/load round trip)."""
    version, mt, gauss = state["python"]
    random.setstate((version, tuple(int(x) for x in mt.tolist()), gauss))
    numpy_state = list(state["numpy"])
    numpy_state[1] = numpy_state[1].numpy().astype(np.uint32)
    np.random.set_state(tuple(numpy_state))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


@contextmanager
def preserved_rng() -> Iterator[None]:
    """Run a block (e.g. evaluation) without advancing the training random streams."""
    state = rng_state()
    try:
        yield
    finally:
        set_rng_state(state)


def fsync(path: Path) -> None:
    """Flush a file's data, or a directory's entries, from the OS cache to the disk."""
    if path.is_dir() and os.name == "nt":
        return  # Windows cannot open a directory; NTFS journals its entries itself
    # Windows flushes only a handle open for writing.
    fd = os.open(path, os.O_RDWR if os.name == "nt" else os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """`fsync` every file under `root`, then each directory after what it holds."""
    for folder, _, files in os.walk(root, topdown=False):
        for name in files:
            fsync(Path(folder, name))
        fsync(Path(folder))


def write_json(data: Any, path: str | Path) -> None:
    """Write JSON via a temporary file, flushed to the disk, and rename, so readers never see
    half a file, even after a power loss."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", encoding="utf-8") as f:
        f.write(json.dumps(data, indent=2) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync(path.parent)


def read_json(path: str | Path) -> Any:
    """Read a JSON file written by `write_json`."""
    return json.loads(Path(path).read_text(encoding="utf-8"))


def checkpoint_dirs(output_dir: str | Path) -> list[Path]:
    """Complete checkpoints in `output_dir` (those with a trainer state), oldest first."""
    pattern = re.compile(rf"{CHECKPOINT_PREFIX}(\d+)$")
    found = []
    for child in Path(output_dir).glob(f"{CHECKPOINT_PREFIX}*"):
        match = pattern.match(child.name)
        if match and (child / STATE_FILE).is_file():
            found.append((int(match.group(1)), child))
    return [path for _, path in sorted(found)]


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    """The newest complete checkpoint in `output_dir`, or None."""
    found = checkpoint_dirs(output_dir)
    return found[-1] if found else None


def rotate_checkpoints(output_dir: str | Path, keep_last: int) -> list[Path]:
    """Delete all but the newest `keep_last` checkpoints; return the deleted paths."""
    stale = checkpoint_dirs(output_dir)[:-keep_last]
    for path in stale:
        shutil.rmtree(path)
    return stale


def is_complete(output_dir: str | Path) -> bool:
    """Whether `output_dir` holds a finished run (`final/` with a complete trainer state)."""
    state_file = Path(output_dir) / "final" / STATE_FILE
    if not state_file.is_file():
        return False
    return bool(read_json(state_file).get("complete"))


def stale_temporaries(output_dir: str | Path) -> list[Path]:
    """Directories an interrupted write left in `output_dir` (temporary or moved-aside ones)."""
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return []
    prefixes = (TEMPORARY_PREFIX, ASIDE_PREFIX)
    return sorted(p for p in output_dir.iterdir() if p.is_dir() and p.name.startswith(prefixes))


def replace_dir(tmp: Path, path: Path) -> None:
    """Put the complete directory `tmp` in the place of `path`: an earlier `path` is moved
    aside, not deleted, until the new one is in place. `tmp` is on the disk before the
    rename, the rename before the old copy goes."""
    fsync_tree(tmp)
    old = path.parent / f"{ASIDE_PREFIX}{path.name}"
    shutil.rmtree(old, ignore_errors=True)
    if path.exists():
        os.replace(path, old)
    os.replace(tmp, path)
    fsync(path.parent)
    shutil.rmtree(old, ignore_errors=True)


@contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Yield a temporary directory that replaces `path` only if the block finishes."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f"{TEMPORARY_PREFIX}{path.name}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
        replace_dir(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
