"""What rlhfkit writes is checked when read: manifests of checkpoints and `final/`, resume
falling back past a damaged checkpoint, damaged models refused by name, and disk errors that
name their file and never hide behind the failure handler's own."""

import errno
import json
import logging
import os
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from rlhfkit import checkpoint as ckpt
from rlhfkit.cli import main
from rlhfkit.errors import DamagedError, DiskWriteError, RunError, UsageError
from rlhfkit.models.loading import load_causal_lm
from rlhfkit.tracking import read_jsonl
from rlhfkit.trainers import loop
from test_loop import _trainer, _weights
from test_ppo import _trainer as _ppo_trainer


def flip_byte(path, offset=None):
    """Change one byte in the middle of ``path`` (its size unchanged), as a bad disk would."""
    data = bytearray(path.read_bytes())
    offset = len(data) // 2 if offset is None else offset
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


@pytest.mark.parametrize(
    ("name", "damage", "reason"),
    [
        ("model.safetensors", flip_byte, "SHA-256"),
        ("optimizer.safetensors", truncate, "bytes where its manifest says"),
    ],
)
def test_resume_skips_a_damaged_checkpoint_and_ends_as_the_uninterrupted_run(
    tiny_model_dir, tiny_tokenizer, tmp_path, caplog, name, damage, reason
):
    straight = _trainer(tiny_model_dir, tiny_tokenizer, tmp_path / "a")
    straight.train()

    first = _trainer(tiny_model_dir, tiny_tokenizer, tmp_path / "b", save_every=2)
    first.train(stop_after=4)
    damage(tmp_path / "b" / "checkpoint-4" / name)
    torch.manual_seed(123)  # a fresh process: other weights and streams until the resume
    second = _trainer(tiny_model_dir, tiny_tokenizer, tmp_path / "b", save_every=2)
    with caplog.at_level(logging.WARNING):
        assert second.train().complete
    warning = next(r.getMessage() for r in caplog.records if "skipping" in r.getMessage())
    assert "checkpoint-4" in warning and name in warning and reason in warning
    assert (tmp_path / "b" / "checkpoint-4.damaged").is_dir()  # set aside, not loaded again

    expected, resumed = _weights(straight), _weights(second)
    assert all(torch.equal(resumed[k], v) for k, v in expected.items())
    steps = [r["step"] for r in read_jsonl(tmp_path / "b" / "metrics.jsonl") if "train/loss" in r]
    assert steps == [1, 2, 3, 4, 5, 6]
    assert ckpt.verify(tmp_path / "b" / "checkpoint-6") and ckpt.verify(tmp_path / "b" / "final")


def test_a_damaged_ppo_checkpoint_is_not_trained_on(tiny_tokenizer, tmp_path, caplog):
    """PPO's own checkpoint file (trainable.safetensors: policy and critic) is covered too:
    damaged, the resume starts over rather than train a garbage critic."""
    first = _ppo_trainer(tiny_tokenizer, tmp_path / "a", max_steps=2)
    first.train(stop_after=1)
    flip_byte(tmp_path / "a" / "run" / "checkpoint-1" / "trainable.safetensors")
    again = _ppo_trainer(tiny_tokenizer, tmp_path / "a", max_steps=2, resume=True)
    with caplog.at_level(logging.WARNING):
        again.train(stop_after=1)
    assert "trainable.safetensors" in caplog.text
    a, b = first.trainable.state_dict(), again.trainable.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)  # the same first step, made afresh


def test_a_truncated_file_without_a_manifest_names_its_checkpoint(
    tiny_model_dir, tiny_tokenizer, tmp_path
):
    """A checkpoint of an older rlhfkit (no manifest) still never fails as a bare
    SafetensorError: the error names the checkpoint."""
    _trainer(tiny_model_dir, tiny_tokenizer, tmp_path).train(stop_after=2)
    (tmp_path / "checkpoint-2" / ckpt.MANIFEST_FILE).unlink()
    truncate(tmp_path / "checkpoint-2" / "optimizer.safetensors")
    with pytest.raises(RunError, match="checkpoint-2 does not load: SafetensorError"):
        _trainer(tiny_model_dir, tiny_tokenizer, tmp_path).train()


def test_a_damaged_final_is_no_finished_run(tiny_model_dir, tiny_tokenizer, tmp_path, caplog):
    done = _trainer(tiny_model_dir, tiny_tokenizer, tmp_path, max_steps=2)
    done.train()
    assert ckpt.is_complete(tmp_path)
    flip_byte(tmp_path / "final" / "model.safetensors")
    with caplog.at_level(logging.WARNING):
        assert not ckpt.is_complete(tmp_path)
    assert "final: model.safetensors is damaged" in caplog.text
    # Not skipped as "already complete": resumed from its last checkpoint, final/ written anew.
    again = _trainer(tiny_model_dir, tiny_tokenizer, tmp_path, max_steps=2)
    assert again.train().complete and ckpt.is_complete(tmp_path)
    saved = load_causal_lm(tmp_path / "final").state_dict()
    assert all(torch.equal(saved[k], v) for k, v in _weights(done).items())


def test_a_damaged_model_is_refused_naming_the_file(tiny_model_dir, tmp_path, capsys):
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    assert not ckpt.verify(model)  # another tool's directory: no manifest, loads unchecked
    load_causal_lm(model)
    ckpt.write_manifest(model)
    assert ckpt.verify(model)
    truncate(model / "model.safetensors")
    with pytest.raises(DamagedError, match="model.safetensors is damaged: it holds"):
        load_causal_lm(model)
    argv = ["sample", "--model", str(model), "--prompt", '["the cat"]', "--max_new_tokens", "2"]
    assert main(argv) == 2
    assert "model.safetensors is damaged" in capsys.readouterr().err


def _nan_in(path, tensor_name):
    """Write NaN into the first values of one tensor of the safetensors file ``path``."""
    tensors = load_file(path)
    tensors[tensor_name] = tensors[tensor_name].clone()
    tensors[tensor_name].view(-1)[:4] = float("nan")
    save_file(tensors, path)


def test_a_model_without_a_manifest_is_said_so_once_and_refused_if_not_finite(
    tiny_model_dir, tmp_path, capsys, caplog
):
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    with caplog.at_level(logging.WARNING):
        load_causal_lm(model)
        load_causal_lm(model)
    said = [r for r in caplog.records if "has no manifest.json" in r.getMessage()]
    assert len(said) == 1 and str(model) in said[0].getMessage()
    _nan_in(model / "model.safetensors", "transformer.h.0.mlp.c_fc.weight")
    with pytest.raises(UsageError, match="model.safetensors holds 4 NaN or inf values in "):
        load_causal_lm(model)
    argv = ["eval", "--models", f"{{m: {model}}}", "--reference", str(tiny_model_dir),
            "--reward_model", "null", "--task", "sentiment", "--max_prompts", "2"]  # fmt: skip
    assert main(argv) == 2  # no NaN in any result: the model is refused
    assert "h.0.mlp.c_fc.weight" in capsys.readouterr().err


def test_a_checkpoint_without_a_manifest_is_refused_if_its_weights_are_not_finite(
    tiny_model_dir, tiny_tokenizer, tmp_path, caplog
):
    _trainer(tiny_model_dir, tiny_tokenizer, tmp_path).train(stop_after=2)
    (tmp_path / "checkpoint-2" / ckpt.MANIFEST_FILE).unlink()
    weights = tmp_path / "checkpoint-2" / "model.safetensors"
    _nan_in(weights, next(iter(load_file(weights))))
    with pytest.raises(RunError, match="checkpoint-2: its weights .* hold NaN or inf values"):
        _trainer(tiny_model_dir, tiny_tokenizer, tmp_path).train()
    assert "checkpoint-2 has no manifest.json" in caplog.text


def test_a_subdirectory_is_held_to_its_parents_manifest(tmp_path):
    """PPO's final/critic has no manifest of its own: final's covers it."""
    with ckpt.atomic_dir(tmp_path / "final") as tmp:
        (tmp / "critic").mkdir()
        (tmp / "critic" / "config.json").write_text("{}")
        (tmp / "config.json").write_text("{}")
    assert ckpt.verify(tmp_path / "final" / "critic")
    (tmp_path / "final" / "critic" / "config.json").unlink()
    with pytest.raises(DamagedError, match="critic: config.json is damaged: it is missing"):
        ckpt.verify(tmp_path / "final" / "critic")
    other = tmp_path / "other"
    other.mkdir()
    (other / ckpt.MANIFEST_FILE).write_text(json.dumps({"files": "another tool's"}))
    assert not ckpt.verify(other)  # not ours
    (tmp_path / "final" / ckpt.MANIFEST_FILE).write_text('{"format": "rlhfkit.man')
    with pytest.raises(DamagedError, match="manifest.json is damaged"):
        ckpt.verify(tmp_path / "final")


def no_space(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_names_the_file_and_bytes_and_removes_the_temporary(
    tiny_model_dir, tiny_tokenizer, tmp_path, monkeypatch
):
    trainer = _trainer(tiny_model_dir, tiny_tokenizer, tmp_path, save_every=1)
    monkeypatch.setattr(ckpt, "save_file", no_space)  # the optimiser's and RNG's writer
    write_json = ckpt.write_json

    def failed_json_too(data, path):  # the failure handler's write fails as well
        if path.name == loop.FAILED_FILE:
            no_space()
        write_json(data, path)

    monkeypatch.setattr(ckpt, "write_json", failed_json_too)
    with pytest.raises(DiskWriteError) as caught:
        trainer.train()
    message = str(caught.value)
    assert f"to {tmp_path / '.tmp-checkpoint-1' / 'optimizer.safetensors'} failed" in message
    assert "No space left on device (ENOSPC)" in message and "bytes free on its disk" in message
    size = int(message.split("writing ")[1].split(" bytes")[0].replace(",", ""))
    assert size > 2 * sum(p.numel() * 4 for p in trainer.model.parameters())  # AdamW's moments
    assert not (tmp_path / ".tmp-checkpoint-1").exists()  # removed at once


def test_a_disk_error_in_a_writer_of_another_library_names_its_file(
    tiny_model_dir, tiny_tokenizer, tmp_path
):
    trainer = _trainer(tiny_model_dir, tiny_tokenizer, tmp_path, save_every=1)

    def full_after_a_little(path, copies):  # as save_pretrained fails: no file name in it
        (path / "model.safetensors").write_bytes(b"x" * 1000)
        no_space()

    trainer.checkpoints.write_models = full_after_a_little
    with pytest.raises(DiskWriteError, match="model.safetensors failed") as caught:
        trainer.train()
    assert "1,000 bytes of it" in str(caught.value) and "it is removed" in str(caught.value)
    assert not (tmp_path / ".tmp-checkpoint-1").exists()
    assert json.loads((tmp_path / loop.FAILED_FILE).read_text())["step"] == 1


WRITES_PAST_A_LIMIT = """
import resource, signal, sys, torch
from rlhfkit import checkpoint as ckpt
from rlhfkit.errors import DiskWriteError
from rlhfkit.runtime.output_lock import output_lock
from rlhfkit.tracking import Tracker
where, writer, limit = sys.argv[1], sys.argv[2], int(sys.argv[3])
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))  # after the imports, which write
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
try:
    if writer == "checkpoint":
        ckpt.save_state({"weights": torch.zeros(100_000)}, where + "/state.safetensors")
    elif writer == "metrics":
        Tracker(where, report_to=[]).log({"loss": 1.0}, step=1)
    else:
        with output_lock(where):
            pass
except DiskWriteError as error:
    print(error)
"""


@pytest.mark.parametrize(
    ("writer", "limit", "written"),
    [
        ("checkpoint", 65_536, "writing 400,0"),  # safetensors' error: "(os error 27)"
        ("metrics", 100, "bytes to {where}/metrics.jsonl failed"),
        ("lock", 0, "bytes to {where}/run.lock failed"),
    ],
)
def test_a_write_past_a_real_file_size_limit_names_its_file_and_errno(
    writer, limit, written, tmp_path
):
    """Each writer in a process whose files may not grow past ``limit`` bytes: the failure
    names the file, the bytes and the errno (EFBIG), never a bare OSError."""
    where = tmp_path / "run"
    where.mkdir()
    (where / "metrics.jsonl").write_text("x" * 90 + "\n")  # near the metrics' limit
    env = dict(os.environ, OMP_NUM_THREADS="1")
    result = subprocess.run(
        [sys.executable, "-c", WRITES_PAST_A_LIMIT, str(where), writer, str(limit)],
        capture_output=True, text=True, env=env, timeout=120, check=True,
    )  # fmt: skip
    assert written.format(where=where) in result.stdout, result.stdout + result.stderr
    assert "File too large (EFBIG)" in result.stdout and "bytes free on its disk" in result.stdout
