"""`report_to`: the checks of the field, and tiny SFT runs that report to wandb (offline) and
MLflow (a local file store), read back from what those libraries wrote. Each tracker's test
skips when its package is not installed."""

import glob
import importlib.util
import json
import struct
from pathlib import Path

import pytest

from helpers import stage_config
from rlhfkit.cli import main
from rlhfkit.config import ConfigError, SFTConfig
from rlhfkit.data import Demonstration, encode_demonstrations
from rlhfkit.errors import UsageError
from rlhfkit.tracking import RUNS_FILE, Tracker, read_jsonl
from rlhfkit.trainers.sft import SFTTrainer

DEMOS = [Demonstration(f"Q: {i} plus one?", f" A: {i + 1}") for i in range(16)]


def _config(tmp_path, report_to, **overrides):
    return stage_config(
        SFTConfig, tmp_path / "tiny-sft",
        **{"eval_data": None, "batch_size": 4, "max_steps": 4, "log_every": 1, "max_length": 32,
           "report_to": report_to, "resume": True, "lr_scheduler": "cosine", **overrides},
    )  # fmt: skip


def _train(config, tiny_model, tiny_tokenizer, stop_after=None):
    examples, _ = encode_demonstrations(DEMOS, tiny_tokenizer, 32)
    SFTTrainer(config, tiny_model, tiny_tokenizer, examples, []).train(stop_after=stop_after)


def _losses(run_dir: Path) -> dict[int, float]:
    return {int(r["step"]): r["train/loss"] for r in read_jsonl(run_dir / "metrics.jsonl")}


@pytest.mark.parametrize(
    ("report_to", "expected"),
    [
        (["tensorboard", "comet"], "a list of tensorboard, wandb, mlflow, or [none]"),
        (["none", "tensorboard"], "a list of tensorboard, wandb, mlflow, or [none]"),
        ("tensorboard", "a list of tensorboard"),
    ],
)
def test_report_to_names_what_is_allowed(tmp_path, report_to, expected):
    with pytest.raises(ConfigError, match="SFTConfig.report_to = ") as info:
        _config(tmp_path, report_to)
    assert expected in str(info.value)


def test_a_tracker_not_installed_stops_the_command_at_once(tmp_path, monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a)
    )
    with pytest.raises(SystemExit) as info:
        main(["sft", "--report_to", "wandb", "--output_dir", str(tmp_path / "never")])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "SFTConfig.report_to = ['wandb']" in err and "`pip install wandb`" in err
    assert not (tmp_path / "never").exists()
    with pytest.raises(UsageError, match="pip install wandb"):
        Tracker(tmp_path, report_to=["wandb"])  # the library's own check, without a config


def test_none_turns_tensorboard_off(tmp_path, tiny_model, tiny_tokenizer):
    config = _config(tmp_path, ["none"], max_steps=2)
    _train(config, tiny_model, tiny_tokenizer)
    run = Path(config.output_dir)
    assert sorted(_losses(run)) == [1, 2] and not (run / "tb").exists()


# --------------------------------------------------------------------------- wandb, offline
def _wandb_records(path: Path) -> list[bytes]:
    """The records of a `.wandb` file: LevelDB's log format (32 KiB blocks, each record a
    7-byte header: checksum, length, type FULL/FIRST/MIDDLE/LAST), after a 7-byte file header."""
    data, block, pos = path.read_bytes(), 32768, 7
    assert data[:4] == b":W&B"
    records, pending = [], b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0:
            break
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST
            records.append(pending)
            pending = b""
    return records


def _read_wandb_run(run_file: Path) -> dict:
    """Run name, project, config and per-step history of one offline run file."""
    from wandb.proto import wandb_internal_pb2 as pb

    run = {"config": {}, "history": {}}
    for raw in _wandb_records(run_file):
        record = pb.Record()
        record.ParseFromString(raw)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run |= {"name": record.run.display_name, "project": record.run.project}
            run |= {"id": record.run.run_id}
        elif kind == "config":
            run["config"] |= {i.key: json.loads(i.value_json) for i in record.config.update}
        elif kind == "history":
            row = {
                i.key or "/".join(i.nested_key): json.loads(i.value_json)
                for i in record.history.item
            }
            run["history"][row["_step"]] = row
    return run


def test_a_tiny_sft_run_writes_an_offline_wandb_run(
    tmp_path, tiny_model, tiny_tokenizer, monkeypatch
):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_DIR", raising=False)
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    config = _config(tmp_path, ["wandb"], project="rlhfkit-tests")
    _train(config, tiny_model, tiny_tokenizer, stop_after=2)  # then resumed: the same run
    _train(config, tiny_model, tiny_tokenizer)
    run_dir = Path(config.output_dir)
    run_id = json.loads((run_dir / RUNS_FILE).read_text())["wandb"]
    files = sorted(glob.glob(str(run_dir / "wandb" / "offline-run-*" / "run-*.wandb")))
    assert len(files) == 2 and all(f.endswith(f"run-{run_id}.wandb") for f in files)
    # Both runs start in the same second when fast: wandb then names the second "<dir>-1".
    first, resumed = sorted(
        (_read_wandb_run(Path(f)) for f in files), key=lambda r: min(r["history"])
    )
    assert first["name"] == "tiny-sft" and first["project"] == "rlhfkit-tests"
    assert first["config"]["learning_rate"] == config.learning_rate
    assert first["config"]["report_to"] == ["wandb"]
    logged = {s: r["train/loss"] for r in (first, resumed) for s, r in r["history"].items()}
    assert logged == pytest.approx(_losses(run_dir)) and sorted(logged) == [1, 2, 3, 4]
    assert not (run_dir / "tb").exists()


# --------------------------------------------------------------------------- MLflow, file store
def test_a_tiny_sft_run_writes_an_mlflow_run(tmp_path, tiny_model, tiny_tokenizer, monkeypatch):
    mlflow = pytest.importorskip("mlflow")
    for name in ("MLFLOW_EXPERIMENT_NAME", "MLFLOW_RUN_ID", "MLFLOW_TAGS", "MLFLOW_NESTED_RUN"):
        monkeypatch.delenv(name, raising=False)
    uri = (tmp_path / "mlruns").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # the file store, for a test
    config = _config(tmp_path, ["mlflow", "tensorboard"])
    _train(config, tiny_model, tiny_tokenizer, stop_after=2)
    _train(config, tiny_model, tiny_tokenizer)
    run_dir = Path(config.output_dir)
    client = mlflow.tracking.MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("rlhfkit").experiment_id])
    assert run.info.run_id == json.loads((run_dir / RUNS_FILE).read_text())["mlflow"]
    assert run.info.run_name == "tiny-sft" and run.info.status == "FINISHED"
    assert float(run.data.params["learning_rate"]) == config.learning_rate
    history = client.get_metric_history(run.info.run_id, "train/loss")
    assert {m.step: m.value for m in history} == pytest.approx(_losses(run_dir))
    assert list((run_dir / "tb").glob("events.out.tfevents.*"))
