"""Tracker: JSONL metrics with step and time, TensorBoard events, samples, plots, resume."""

import json
from pathlib import Path

import torch

from rlhfkit.tracking import Tracker, _markdown_table, read_jsonl
from test_instructions import load_script

PLOT_RUNS = Path(__file__).resolve().parents[1] / "scripts" / "plot_runs.py"


def test_log_writes_jsonl_and_tensorboard(tmp_path):
    with Tracker(tmp_path) as tracker:
        tracker.start_progress(total=3)
        tracker.log({"train/loss": torch.tensor(2.5), "train/lr": 0.1}, step=1)
        tracker.advance()
        tracker.log({"train/loss": 1.5}, step=2)
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert [(r["step"], r["train/loss"]) for r in rows] == [(1, 2.5), (2, 1.5)]
    assert rows[0]["train/lr"] == 0.1 and rows[0]["time"] <= rows[1]["time"]
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))


def test_samples_go_to_jsonl_and_markdown(tmp_path):
    with Tracker(tmp_path) as tracker:
        tracker.log_samples([{"prompt": "a|b", "response": "x\ny", "score": 0.5}], step=7)
    (row,) = read_jsonl(tmp_path / "samples.jsonl")
    assert row == {"step": 7, "tag": "samples", "prompt": "a|b", "response": "x\ny", "score": 0.5}
    table = _markdown_table([{"prompt": "a|b", "response": "x\ny"}])
    assert table.splitlines() == ["| prompt | response |", "|---|---|", "| a\\|b | x<br>y |"]


def test_plot_writes_png(tmp_path):
    with Tracker(tmp_path, report_to=[]) as tracker:
        for step in range(1, 5):
            tracker.log({"train/loss": 1.0 / step}, step)
        png = tracker.plot(["train/loss", "eval/missing"], tmp_path / "curves.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_resume_drops_rows_after_the_checkpoint(tmp_path):
    with Tracker(tmp_path, report_to=[]) as tracker:
        for step in range(1, 6):
            tracker.log({"loss": step}, step)
        tracker.log_samples([{"text": "late"}], step=5)
    with Tracker(tmp_path, resume_step=3, report_to=[]) as tracker:
        tracker.log({"loss": 40}, 4)
    assert [r["loss"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [1, 2, 3, 40]
    assert read_jsonl(tmp_path / "samples.jsonl") == []


def test_disabled_tracker_writes_nothing(tmp_path):
    run_dir = tmp_path / "run"
    with Tracker(run_dir, enabled=False) as tracker:
        tracker.start_progress(2)
        tracker.log({"loss": 1.0}, 1)
        tracker.log_samples([{"text": "x"}], 1)
    assert not run_dir.exists()


def test_plot_runs_draws_each_runs_metric_and_warns_of_a_missing_one(tmp_path, caplog):
    plot = load_script(PLOT_RUNS)
    for name, scale in (("a", 1.0), ("b", 2.0)):
        rows = [{"step": s, "eval/score": scale * s} for s in (10, 20)]
        rows.append({"step": 30, "eval/score": float("nan")})  # left out, not drawn
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert plot.points(tmp_path / "b", "eval/score") == [(10, 20.0), (20, 40.0)]
    # On an axis of responses sampled: 64 a step, after a first leg of 640.
    assert plot.points(tmp_path / "b", "eval/score", 64, 640) == [(1280, 20.0), (1920, 40.0)]
    out = plot.plot_runs([tmp_path / "a", tmp_path / "b"], ["a", "b"],
                         ["eval/score", "train/kl/ref"], tmp_path / "img" / "runs.png")  # fmt: skip
    assert out.read_bytes().startswith(b"\x89PNG")
    assert f"{tmp_path / 'a'} logged no train/kl/ref" in caplog.text
    per_response = plot.plot_runs([tmp_path / "a", tmp_path / "b"], ["a", "b"], ["eval/score"],
                                  tmp_path / "img" / "per_response.png", [(64, 0), (32, 640)])  # fmt: skip
    assert per_response.read_bytes().startswith(b"\x89PNG")
