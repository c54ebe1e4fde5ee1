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

Integrity: the last file written into a directory before its rename is `manifest.json`, the
size and SHA-256 of every other file in it. `verify` holds a directory to it, so that bytes
damaged after the write (a disk, a copy, a hand) are caught before anything trains on them or
reports a run complete: resume skips a damaged checkpoint for the newest one that verifies
(`intact_checkpoint`), `final/` counts as complete only when it verifies (`is_complete`), and
every model a stage loads from a local directory is checked (`models/loading.py`). A directory
without a manifest (another tool's, the hub's, an older rlhfkit's) loads unchecked, as before.

Disk errors: a write that fails for a reason of the disk (full, quota, I/O) is a
`DiskWriteError` naming the file, the bytes being written and the space left, and a directory
whose writing failed is removed at once rather than holding its space until the next start.
"""

from __future__ import annotations

import hashlib
import json
import logging
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

from rlhfkit.errors import DamagedError, DiskWriteError, disk_errors, disk_reason, is_disk_error

logger = logging.getLogger(__name__)

CHECKPOINT_PREFIX = "checkpoint-"
STATE_FILE = "trainer_state.json"
# Names of directories being written or replaced; whatever a killed run left is removed on start.
TEMPORARY_PREFIX = ".tmp-"
ASIDE_PREFIX = ".old-"
MANIFEST_FILE = "manifest.json"
MANIFEST_FORMAT = "rlhfkit.manifest"
DAMAGED_SUFFIX = ".damaged"  # a checkpoint that failed its check, kept for a look, never loaded
_HASH_CHUNK = 1 << 20  # bytes read at a time: the hash never holds a whole file in memory
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
    metadata = {"structure": json.dumps(structure)}
    size = sum(t.numel() * t.element_size() for t in tensors.values()) + len(metadata["structure"])
    with disk_errors(path, size):
        save_file(tensors, str(path), metadata=metadata)


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
    text = json.dumps(data, indent=2) + "\n"
    try:
        with disk_errors(path, len(text.encode())), tmp.open("w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
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
    """Whether `output_dir` holds a finished run: `final/` with a complete trainer state, whose
    files match its manifest. A damaged `final/` is no finished run, said in a warning."""
    final = Path(output_dir) / "final"
    if not (final / STATE_FILE).is_file():
        return False
    try:
        verify(final)
        return bool(read_json(final / STATE_FILE).get("complete"))
    except ValueError as error:  # DamagedError, or JSON that does not parse (no manifest)
        logger.warning("%s is not a finished run: %s", final, error)
        return False


def intact_checkpoint(output_dir: str | Path) -> Path | None:
    """The newest checkpoint in `output_dir` that verifies (or has no manifest to check), or
    None. Each newer one that fails is renamed `checkpoint-N.damaged`, so that neither this
    resume nor a later one, nor rotation counting it among the newest, takes it again; a
    warning names it, the file and why."""
    for path in reversed(checkpoint_dirs(output_dir)):
        try:
            verify(path)
            return path
        except DamagedError as error:
            aside = path.with_name(path.name + DAMAGED_SUFFIX)
            shutil.rmtree(aside, ignore_errors=True)
            os.replace(path, aside)
            logger.warning(
                "skipping checkpoint %s: %s. Resuming from the newest checkpoint before it "
                "that verifies; the damaged one is kept as %s (delete it when done)",
                path.name,
                f"{error.name}: {error.reason}",
                aside,
            )
    return None


def stale_temporaries(output_dir: str | Path) -> list[Path]:
    """Directories an interrupted write left in `output_dir` (temporary or moved-aside ones)."""
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return []
    prefixes = (TEMPORARY_PREFIX, ASIDE_PREFIX)
    return sorted(p for p in output_dir.iterdir() if p.is_dir() and p.name.startswith(prefixes))


def replace_dir(tmp: Path, path: Path) -> None:
    """Put the complete directory `tmp` in the place of `path`, with its manifest written
    last: an earlier `path` is moved aside, not deleted, until the new one is in place (and
    back if the rename fails). `tmp` is on the disk before the rename, the rename before the
    old copy goes."""
    write_manifest(tmp)
    fsync_tree(tmp)
    old = path.parent / f"{ASIDE_PREFIX}{path.name}"
    shutil.rmtree(old, ignore_errors=True)
    if path.exists():
        os.replace(path, old)
    try:
        os.replace(tmp, path)
    except BaseException:
        if old.exists():
            os.replace(old, path)
        raise
    fsync(path.parent)
    shutil.rmtree(old, ignore_errors=True)


@contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Yield a temporary directory that replaces `path` only if the block finishes; if it
    fails, the temporary is removed at once (`removed_on_error`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f"{TEMPORARY_PREFIX}{path.name}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    with removed_on_error(tmp):
        yield tmp
        replace_dir(tmp, path)


# --------------------------------------------------------------------------- manifests
def file_sha256(path: Path) -> str:
    """The SHA-256 of a file's bytes, read a chunk at a time."""
    digest = hashlib.sha256()
    buffer = bytearray(_HASH_CHUNK)
    view = memoryview(buffer)
    with path.open("rb", buffering=0) as f:
        while count := f.readinto(buffer):
            digest.update(view[:count])
    return digest.hexdigest()


def write_manifest(root: Path) -> None:
    """Write `root/manifest.json`: the size and SHA-256 of every file under `root`, by its
    path relative to `root` ("/"-separated)."""
    files = sorted(p for p in root.rglob("*") if p.is_file() and p != root / MANIFEST_FILE)
    entries = {
        p.relative_to(root).as_posix(): {"size": p.stat().st_size, "sha256": file_sha256(p)}
        for p in files
    }
    manifest = {"format": MANIFEST_FORMAT, "version": 1, "files": entries}
    write_json(manifest, root / MANIFEST_FILE)


# Directories that verified, with the size, time and inode of each file then: a model loaded
# three times (tokenizer, policy, reference) is hashed once, and a file written since is not
# taken for verified.
_verified: dict[Path, tuple] = {}


def verify(directory: str | Path) -> bool:
    """Hold `directory` to its manifest: True when every file it lists is there with its size
    and SHA-256, False when there is no rlhfkit manifest (another tool's directory: nothing to
    check), a `DamagedError` naming the first file that fails otherwise (sizes are compared
    first, all of them, before any file is read). A subdirectory of a directory with a manifest
    (a PPO `final/critic`) is held to its parent's entries. Files the manifest does not list
    are not looked at."""
    directory = Path(directory)
    found = _manifest_entries(directory)
    if found is None:
        return False
    stats = {}
    for name, entry in found.items():
        path = directory / name
        if not path.is_file():
            raise DamagedError(directory, name, "it is missing")
        stats[name] = path.stat()
        if stats[name].st_size != entry["size"]:
            reason = (
                f"it holds {stats[name].st_size} bytes where its manifest says "
                f"{entry['size']} (truncated, or written over)"
            )
            raise DamagedError(directory, name, reason)
    signature = tuple((name, s.st_size, s.st_mtime_ns, s.st_ino) for name, s in stats.items())
    key = directory.resolve()
    if _verified.get(key) == signature:
        return True
    for name, entry in found.items():
        if file_sha256(directory / name) != entry["sha256"]:
            reason = "its SHA-256 is not the one in its manifest: its bytes changed after the write"
            raise DamagedError(directory, name, reason)
    _verified[key] = signature
    return True


def _manifest_entries(directory: Path) -> dict[str, dict[str, Any]] | None:
    """The manifest entries of the files in `directory` (its own manifest, else its parent's
    entries below it), or None where no rlhfkit manifest covers it."""
    for manifest, prefix in [
        (directory / MANIFEST_FILE, ""),
        (directory.parent / MANIFEST_FILE, f"{directory.name}/"),
    ]:
        if not manifest.is_file():
            continue
        try:
            content = read_json(manifest)
            if not isinstance(content, dict) or content.get("format") != MANIFEST_FORMAT:
                continue  # another tool's manifest.json
            entries = {
                name[len(prefix) :]: {"size": int(e["size"]), "sha256": str(e["sha256"])}
                for name, e in content["files"].items()
                if name.startswith(prefix)
            }
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            reason = f"it does not read as a manifest ({type(error).__name__}: {error})"
            raise DamagedError(manifest.parent, MANIFEST_FILE, reason) from error
        if entries or not prefix:
            return entries
    return None


# --------------------------------------------------------------------------- disk errors
@contextmanager
def removed_on_error(tmp: Path, remove: bool = True) -> Iterator[None]:
    """Writing the temporary directory `tmp`: on any failure it is removed at once (where
    `remove`: the process that owns it), so that it does not hold its space until the next
    start; a disk error that does not yet name its file names the one being written (the
    error's own, or the newest file in `tmp`) and what `tmp` held by then."""
    try:
        yield
    except BaseException as error:
        message = _disk_error_in(tmp, error) if is_disk_error(error) else None
        if remove:
            shutil.rmtree(tmp, ignore_errors=True)
        if message is None:
            raise
        removal = "; it is removed" if remove else ""
        raise DiskWriteError(f"{message}{removal})") from error


def _disk_error_in(tmp: Path, error: BaseException) -> str:
    """What a disk error while writing `tmp` was writing: the file the error names, else the
    newest in `tmp`, with its bytes and all of `tmp`'s by then (the message's last parenthesis
    is left open for the caller)."""
    named = getattr(error, "filename", None)
    files = [p for p in tmp.rglob("*") if p.is_file()]
    path = Path(named) if named else max(files, key=lambda p: p.stat().st_mtime_ns, default=tmp)
    partial = f"{path.stat().st_size:,} bytes of it and " if path.is_file() else ""
    held = sum(p.stat().st_size for p in files)
    return (
        f"writing {path} failed: {disk_reason(path, error)} ({partial}{held:,} bytes in all "
        f"written into {tmp} by then"
    )
