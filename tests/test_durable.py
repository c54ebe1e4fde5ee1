"""Writes that survive: files and directories flushed to the disk before they are renamed into
place, and TensorBoard curves without a gap where a run was resumed."""

import os
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rlhfkit import checkpoint
from rlhfkit.tracking import Tracker


def record_disk_events(monkeypatch) -> list[tuple[str, str]]:
    """("fsync", path) and ("replace", destination) in the order checkpoint.py makes them."""
    events = []
    fsync, replace = os.fsync, os.replace

    def recording_fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        fsync(fd)

    def recording_replace(source, destination):
        events.append(("replace", str(Path(destination).resolve())))
        replace(source, destination)

    monkeypatch.setattr(checkpoint.os, "fsync", recording_fsync)
    monkeypatch.setattr(checkpoint.os, "replace", recording_replace)
    return events


def test_atomic_dir_flushes_everything_before_the_rename(tmp_path, monkeypatch):
    tmp_path = tmp_path.resolve()
    target = tmp_path / "checkpoint-3"
    target.mkdir()
    (target / "old.txt").write_text("the previous checkpoint")
    events = record_disk_events(monkeypatch)
    with checkpoint.atomic_dir(target) as tmp:
        (tmp / "weights.safetensors").write_bytes(b"\0" * 64)
        (tmp / "nested").mkdir()
        (tmp / "nested" / "state.json").write_text("{}")
        written = [tmp / "weights.safetensors", tmp / "nested" / "state.json", tmp / "nested", tmp]
    written.append(tmp / "manifest.json")  # written last, by atomic_dir
    into_place = events.index(("replace", str(target)))
    flushed = {path for kind, path in events[:into_place] if kind == "fsync"}
    assert {str(p) for p in written} <= flushed
    assert ("fsync", str(tmp_path)) in events[into_place:]  # the rename itself, on the disk
    names = ["manifest.json", "nested", "weights.safetensors"]
    assert sorted(p.name for p in target.iterdir()) == names
    manifest = checkpoint.read_json(target / "manifest.json")
    assert sorted(manifest["files"]) == ["nested/state.json", "weights.safetensors"]
    assert manifest["files"]["weights.safetensors"]["size"] == 64
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint-3"]  # nothing left aside


def test_write_json_flushes_the_file_then_its_directory(tmp_path, monkeypatch):
    tmp_path = tmp_path.resolve()
    events = record_disk_events(monkeypatch)
    checkpoint.write_json({"step": 3}, tmp_path / "trainer_state.json")
    assert events == [
        ("fsync", str(tmp_path / ".trainer_state.json.tmp")),
        ("replace", str(tmp_path / "trainer_state.json")),
        ("fsync", str(tmp_path)),
    ]
    assert checkpoint.read_json(tmp_path / "trainer_state.json") == {"step": 3}


def scalars(run_dir: Path, tag: str) -> list[tuple[int, float]]:
    events = EventAccumulator(str(run_dir / "tb"))
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars(tag)]


def test_tensorboard_keeps_every_step_across_a_resume(tmp_path):
    """A run logs steps 1-5 and dies after its checkpoint at 3; resumed from 3, it logs 4-6.
    TensorBoard shows 1-3 of the first run and 4-6 of the second: no step lost, none twice."""
    with Tracker(tmp_path) as first:
        for step in range(1, 6):
            first.log({"loss": float(step)}, step)
    with Tracker(tmp_path, resume_step=3) as resumed:
        for step in range(4, 7):
            resumed.log({"loss": 10.0 * step}, step)
    assert scalars(tmp_path, "loss") == [
        (1, 1.0),
        (2, 2.0),
        (3, 3.0),
        (4, 40.0),
        (5, 50.0),
        (6, 60.0),
    ]
