"""The pipeline's report: ``report.md`` with the results table, PNG plots and sample texts.

Plots: per stage, the training curves from its ``metrics.jsonl`` (drawn by
``tracking.Tracker.plot``); and gold and proxy (reward-model) score against KL to the SFT
model, for PPO at its evaluation points and for best-of-n at several n, the picture of
Gao et al. 2022 ("Scaling Laws for Reward Model Overoptimization", figure 1): the proxy keeps
rising with KL while the gold score rises, then stalls or falls. Gao et al. put sqrt(KL) on the
x-axis; we plot KL itself in nats, which reads more directly at the small KLs of the demo.
With rounds of iterated RLHF, a section per round: the reward model's accuracy on the new
policy's comparisons before and after retraining, every round's PPO curve on one plot, and
labelled samples of each round.

Every text of the tables (sample prompts and responses, model names) is escaped for markdown
and HTML (`text.markdown_cell`): a sample cannot break its row or put a tag in the report.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rlhfkit.text import markdown_cell
from rlhfkit.tracking import Tracker, read_jsonl, save_figure

logger = logging.getLogger(__name__)

REPORT_FILE = "report.md"
PLOTS = "plots"  # the PNGs, next to the report
OVEROPT_PNG = "gold_proxy_vs_kl.png"
ROUNDS_PNG = "rounds_gold_proxy_vs_kl.png"
EPISODE_COLUMNS = (
    "turns",
    "turns_se",
    "turns_to_success",
    "turns_to_success_se",
    "tool_calls",
    "tool_calls_se",
    "tool_errors",
    "tool_errors_se",
    "truncated",
)
"""The results table's columns of episodes (tools or an environment), where rows have them."""
TABLE_COLUMNS = (
    "model",
    "gold",
    "gold_se",
    "gold_gain",
    "gold_gain_se",
    "ifeval_prompt_strict",
    "ifeval_prompt_loose",
    "ifeval_instruction_strict",
    "ifeval_instruction_loose",
    *EPISODE_COLUMNS,
    "reward",
    "kl",
    "win_rate_rm",
    "win_rate_gold",
    "length",
    "distinct_1",
    "distinct_2",
)
STAGE_KEYS = {
    "sft": ("train/loss", "eval/nll", "eval/perplexity"),
    "reward": ("train/loss", "train/accuracy", "eval/accuracy", "eval/margin"),
    "ppo": (
        "train/score/mean",
        "train/kl/ref",
        "train/policy/entropy",
        "train/response/length",
        "train/policy/clipfrac",
    ),
    "dpo": ("train/loss", "train/accuracy", "train/margin", "eval/accuracy"),
    "grpo": (
        "train/score/mean",
        "train/kl/ref",
        "train/policy/entropy",
        "train/response/length",
    ),
}


def load_eval(path: str | Path) -> dict:
    """The results ``evaluate.evaluate`` wrote (``eval.json``)."""
    return json.loads(Path(path).read_text(encoding="utf-8"))


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}"
    return markdown_cell(str(value))


def results_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The results table of an evaluation: ``TABLE_COLUMNS``, those its rows have (IFEval's
    figures only where the prompts carry IFEval's columns, the episodes' where the policy
    played episodes)."""
    return format_table(rows, [c for c in TABLE_COLUMNS if any(c in r for r in rows)])


def format_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> str:
    """Rows as a markdown table (floats to 3 decimals, '-' for a missing value)."""
    columns = list(columns or rows[0].keys())
    lines = ["| " + " | ".join(map(_cell, columns)) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(row.get(c)) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


# --------------------------------------------------------------------------- plots
def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # headless: no display on servers and in CI
    import matplotlib.pyplot as plt

    return plt


def plot_stage(stage: str, stage_dir: str | Path, png_path: str | Path) -> Path | None:
    """The stage's curves (``STAGE_KEYS``, those it logged) from its ``metrics.jsonl``."""
    rows = read_jsonl(Path(stage_dir) / "metrics.jsonl")
    logged = {key for row in rows for key in row}
    keys = [k for k in STAGE_KEYS.get(stage, ()) if k in logged]
    if not keys:
        return None
    return Tracker(stage_dir, report_to=[]).plot(keys, png_path)


def plot_overoptimization(
    ppo_points: Sequence[Mapping[str, Any]],
    best_of_n: Sequence[Mapping[str, Any]],
    rows: Sequence[Mapping[str, Any]],
    png_path: str | Path,
) -> Path:
    """Gold (left) and proxy (right) score against KL to the SFT model: PPO's evaluation
    points, the best-of-n curve, and every other model of the table as a labelled dot."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    panels = (("gold", "gold score"), ("reward", "proxy (reward model)"))
    curves = (
        (ppo_points, "PPO", "o", lambda p: f"it {p['iteration']}"),
        (best_of_n, "best-of-n", "s", lambda p: f"n={p['n']}"),
    )
    for ax, (key, title) in zip(axes, panels, strict=True):
        for points, label, marker, name in curves:
            points = [p for p in points if p.get(key) is not None]
            if points:
                ax.plot(
                    [p["kl"] for p in points], [p[key] for p in points], marker=marker, label=label
                )
            for p in points:
                _label(ax, p["kl"], p[key], name(p), size=7, below=True)
        for row in rows:
            if row.get(key) is not None and row.get("kl") is not None:
                ax.scatter([row["kl"]], [row[key]], marker="x", color="black", zorder=3)
                _label(ax, row["kl"], row[key], row["model"], size=8, below=False)
        ax.set_xlabel("KL(policy || SFT), nats")
        ax.set_ylabel(title)
        ax.set_title(f"{title} against KL")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:  # a panel with no curve needs no legend
            ax.legend(loc="best", fontsize=8)
    return save_figure(fig, png_path)


def _label(ax, x: float, y: float, text: str, *, size: int, below: bool) -> None:
    """A small text label next to a point (below-right for curves, above-right for models)."""
    offset = (3, -9) if below else (4, 4)
    ax.annotate(text, (x, y), fontsize=size, textcoords="offset points", xytext=offset)


def plot_rounds(rounds: Sequence[Mapping[str, Any]], png_path: str | Path) -> Path:
    """Gold (left) and proxy (right) score against KL to the SFT model at the PPO evaluation
    points of every round, one curve per round (each round's proxy is its own reward model)."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    panels = (("gold", "gold score"), ("reward", "proxy (the round's reward model)"))
    for ax, (key, title) in zip(axes, panels, strict=True):
        for summary in rounds:
            points = [p for p in summary.get("points", ()) if p.get(key) is not None]
            if points:
                ax.plot(
                    [p["kl"] for p in points],
                    [p[key] for p in points],
                    marker="o",
                    label=f"round {summary['round']}",
                )
        ax.set_xlabel("KL(policy || SFT), nats")
        ax.set_ylabel(title)
        ax.set_title(f"{title} against KL, per round")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:  # a panel with no curve needs no legend
            ax.legend(loc="best", fontsize=8)
    return save_figure(fig, png_path)


# --------------------------------------------------------------------------- markdown
def _samples_table(samples: Sequence[Mapping[str, Any]]) -> str:
    """Prompt, then each model's continuation with its gold score, one row per prompt."""
    if not samples:
        return "(no samples)"
    models = list(samples[0]["responses"])
    rows = []
    for sample in samples:
        row = {"prompt": sample["prompt"]}
        for name in models:
            response = sample["responses"][name]
            gold = response.get("gold")
            suffix = "" if gold is None else f" **({gold:+.2f})**"
            row[name] = response["text"].strip() + suffix
        rows.append(row)
    return format_table(rows, ["prompt", *models])


def reward_model_lines(accuracy: Mapping[str, float] | None, parts: bool = True) -> list[str]:
    """The reward model's accuracy on held-out comparisons, as markdown bullets, with the
    table per part of the gold score when ``parts``."""
    if not accuracy:
        return ["No held-out comparisons were given: accuracy not measured."]
    lines = [
        f"- accuracy against the held-out labels: {accuracy['accuracy']:.3f} "
        f"({accuracy['pairs']} pairs)"
    ]
    if "accuracy_gold" in accuracy:
        lines += [
            f"- accuracy against the gold judge's order: {accuracy['accuracy_gold']:.3f}",
            f"- the labels themselves agree with the gold order: "
            f"{accuracy['label_gold_agreement']:.3f} (simulated labeller noise)",
        ]
    if "pick_gold" in accuracy:
        lines.append(
            f"- gold of its pick among each record's responses: {accuracy['pick_gold']:.3f} "
            f"(their mean {accuracy['mean_gold']:.3f}, the best {accuracy['best_gold']:.3f})"
        )
    if parts and accuracy.get("by_part"):
        rows = [
            {"part": part, "pairs": a["gold_pairs"], "accuracy_gold": a["accuracy_gold"]}
            for part, a in accuracy["by_part"].items()
        ]
        lines += [
            "",
            "Against the gold order, per part of the gold score the comparison's prompt asks "
            "for (pairs the gold judge ties left out):",
            "",
            format_table(rows),
        ]
    return lines


def _pass_rate_lines(rows: Sequence[Mapping[str, Any]] | None) -> list[str]:
    """Per part of the gold score, the share of each model's responses that meet it."""
    if not rows:
        return []
    models = [k for k in rows[0] if k not in ("part", "held_out", "asked")]
    cells = [{**r, "held_out": "yes" if r["held_out"] else ""} for r in rows]
    return [
        "## Pass rate per part of the gold score",
        "",
        format_table(cells, ["part", "held_out", "asked", *models]),
        "",
        "Each part (a constraint kind) counts the prompts that ask for it (`asked`) and the "
        "share of each model's responses that meet it. `held_out`: the part never appears in "
        "the training prompts, so its row measures generalisation to an unseen kind.",
        "",
    ]


def _unasked_lines(rows: Sequence[Mapping[str, Any]] | None) -> list[str]:
    """Per shape a prompt can leave unasked, the share of each model's responses that take it."""
    if not rows:
        return []
    models = [k for k in rows[0] if k not in ("shape", "unasked")]
    return [
        "## Shapes nobody asked for",
        "",
        format_table(rows, ["shape", "unasked", *models]),
        "",
        "Each shape counts the prompts that do not ask for it (`unasked`) and the share of each "
        "model's responses to them that take it anyway: all in lowercase, all in capitals, a "
        "list of two or more items. The gold score does not charge for them; a rise over the "
        "SFT model is a side effect of training on it.",
        "",
    ]


TIMING_NOTE = (
    "`peak_memory_gib`: the most resident memory the process that ran the stage had held by "
    "its end; the pipeline runs its stages in one process, so this includes every stage before "
    "it (an arm of `parallel_arms` runs in its own)."
)


def _timing_table(timings: Mapping[str, Mapping[str, Any]]) -> str:
    """Each stage's seconds, status and the peak memory of the process that ran it by then."""
    rows = [{"stage": stage, **t} for stage, t in timings.items()]
    total = sum(t.get("seconds") or 0.0 for t in timings.values())
    peaks = [t["peak_memory_gib"] for t in timings.values() if t.get("peak_memory_gib")]
    peak = max(peaks, default=None)
    rows.append({"stage": "total", "seconds": total, "status": "", "peak_memory_gib": peak})
    return format_table(rows, ["stage", "seconds", "status", "peak_memory_gib"])


def _results_lines(result: Mapping[str, Any], title: str) -> list[str]:
    """The heading, what was evaluated, the results table and the reward model's accuracy."""
    cfg, rows = result.get("config", {}), result["rows"]
    return [
        f"# {title}: report",
        "",
        f"Written {time.strftime('%Y-%m-%d %H:%M')}. Held-out prompts: "
        f"{cfg.get('max_prompts', '?')} of `{cfg.get('prompts', '?')}` ({cfg.get('split', '?')}), "
        f"{cfg.get('max_new_tokens', '?')} new tokens at temperature {cfg.get('temperature', '?')}, "
        f"seed {cfg.get('seed', '?')}; gold judge: `{cfg.get('task')}`.",
        "",
        "## Results",
        "",
        results_table(rows),
        "",
        "`gold`: the gold judge's mean score (it stands for the human; training never sees it). "
        "`reward`: the reward model's mean score (the proxy). `kl`: KL to the SFT model in nats, "
        "sum over response tokens of log pi - log ref averaged over samples "
        "(best-of-n: the analytic log n - (n-1)/n). `win_rate_*`: share of prompts where the "
        "model's response beats the SFT model's, by the reward model / by the gold judge (ties "
        "count 1/2). `length`: response tokens, EOS included. `distinct_n`: distinct word n-grams "
        "over all n-grams of all responses.",
        "",
        "## Reward model",
        "",
        *reward_model_lines(result.get("reward_model")),
        "",
    ]


def overoptimization(points: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """Where the gold score stops following the proxy along PPO's evaluation points.

    ``peak``: the point of highest gold (the earliest of equals). ``fall``: after the peak, the
    point of lowest gold among those whose proxy is above the peak's, i.e. where optimising
    the reward model further made the gold worse; None where no such point exists. ``z``: the
    fall in standard errors of the difference, where both points carry ``gold_se``.
    None without gold scores or with fewer than two points."""
    scored = [p for p in points if p.get("gold") is not None]
    if len(scored) < 2:
        return None
    peak = max(scored, key=lambda p: p["gold"])  # max keeps the first of equals
    later = [p for p in scored[scored.index(peak) + 1 :] if p["reward"] > peak["reward"]]
    fall = min(later, key=lambda p: p["gold"], default=None)
    if fall is None or fall["gold"] == peak["gold"]:
        return {"peak": peak, "fall": None, "z": None}
    ses = (peak.get("gold_se"), fall.get("gold_se"))
    z = None
    if None not in ses and (ses[0] ** 2 + ses[1] ** 2) > 0:
        z = (peak["gold"] - fall["gold"]) / (ses[0] ** 2 + ses[1] ** 2) ** 0.5
    return {"peak": peak, "fall": fall, "z": z}


def overoptimization_sentence(points: Sequence[Mapping[str, Any]]) -> str | None:
    """``overoptimization`` in words, as the report states it."""
    found = overoptimization(points)
    if found is None:
        return None
    peak, fall, z = found["peak"], found["fall"], found["z"]
    iterations = [p["iteration"] for p in points if p.get("gold") is not None]
    at = f"iteration {peak['iteration']} (KL {peak['kl']:.2f}, gold {peak['gold']:.3f})"
    if fall is None:
        if peak["iteration"] == iterations[-1]:
            return f"No over-optimisation within this run: gold is highest at the last point, {at}."
        return f"Gold peaks at {at}; no later point has both a higher proxy and a lower gold."
    start = (
        f"from the start: gold is highest at {at}, and"
        if peak["iteration"] == iterations[0]
        else f"after {at}:"
    )
    noise = " (no standard errors recorded: it may be noise)"
    if z is not None:
        noise = f", {z:.1f} standard errors of the difference" + (
            " (within noise)" if z < 2 else ""
        )
    return (
        f"Over-optimisation {start} by iteration {fall['iteration']} (KL {fall['kl']:.2f}) the "
        f"proxy rose from {peak['reward']:.3f} to {fall['reward']:.3f} while gold fell from "
        f"{peak['gold']:.3f} to {fall['gold']:.3f}{noise}."
    )


def _chosen_step_sentence(stage: str, final_dir: str | Path) -> str | None:
    """What a stage's ``final/`` holds where it is the best evaluation's model and not the
    last step's (``load_best_model_at_end``); None otherwise."""
    path = Path(final_dir) / "trainer_state.json"
    if not path.is_file():
        return None
    state = json.loads(path.read_text(encoding="utf-8"))
    best = state.get("best")
    if not best or "last_step" not in state:
        return None
    cfg = state.get("config", {})
    prompts = f"{cfg.get('eval_data')} ({cfg.get('eval_split')} split)"
    return (
        f"{stage}'s result is its step {best['step']} of {state['last_step']}: the best "
        f"{best['metric']} ({best['value']:.3f}) of its evaluations on {prompts}, kept by "
        "metric_for_best_model; the last step's model is in its newest checkpoint."
    )


def _overoptimization_lines(
    result: Mapping[str, Any],
    ppo_points: Sequence[Mapping[str, Any]],
    run_dir: Path,
    ppo_dir: str | Path | None,
) -> list[str]:
    """Gold and proxy against KL: the plot, PPO's evaluation points and best-of-n's curve."""
    cfg = result.get("config", {})
    png = plot_overoptimization(
        ppo_points, result.get("best_of_n", ()), result["rows"], run_dir / PLOTS / OVEROPT_PNG
    )
    lines = [
        "## Gold and proxy against KL (over-optimisation, Gao et al. 2022)",
        "",
        f"![gold and proxy against KL]({png.relative_to(run_dir)})",
        "",
    ]
    if ppo_points:
        lines += ["PPO evaluation points:", "", format_table(ppo_points), ""]
        verdict = overoptimization_sentence(ppo_points)
        lines += [verdict, ""] if verdict else []
    chosen = None if ppo_dir is None else _chosen_step_sentence("PPO", Path(ppo_dir) / "final")
    lines += [markdown_cell(chosen), ""] if chosen else []
    if result.get("best_of_n"):
        lines += [
            f"Best-of-n of the SFT model, picked by the reward model, on the first "
            f"{cfg.get('best_of_n_prompts', '?')} prompts: expected scores over every n-subset of "
            f"a pool of {max(p['n'] for p in result['best_of_n'])} samples per prompt.",
            "",
            format_table(result["best_of_n"]),
            "",
        ]
    return lines


def _curves_lines(stage_dirs: Mapping[str, str | Path], run_dir: Path) -> list[str]:
    """Each stage's training curves, drawn from its ``metrics.jsonl``."""
    lines = ["## Training curves", ""]
    for stage, stage_dir in stage_dirs.items():
        png = plot_stage(stage, stage_dir, run_dir / PLOTS / f"{stage}.png")
        if png is not None:
            lines += [f"### {stage}", "", f"![{stage} curves]({png.relative_to(run_dir)})", ""]
    return lines + ["TensorBoard: `tensorboard --logdir " + str(run_dir) + "`.", ""]


def _accuracy_cells(accuracy: Mapping[str, Any] | None, which: str) -> dict[str, Any]:
    """The labels and gold accuracy of the ``which`` ('before'/'after') reward model."""
    measured = (accuracy or {}).get(which) or {}
    return {
        f"rm_{which}": measured.get("accuracy"),
        f"rm_{which}_gold": measured.get("accuracy_gold"),
    }


def _round_row(summary: Mapping[str, Any]) -> dict[str, Any]:
    """One round in a row: its comparisons, reward models and PPO curve's end and peak."""
    points = summary.get("points", ())
    golden = [p for p in points if p.get("gold") is not None]
    best = max(golden, key=lambda p: p["gold"]) if golden else {}
    last = points[-1] if points else {}
    labels, data = summary.get("labels") or {}, summary.get("reward_data") or {}
    accuracy = summary.get("accuracy")
    return {
        "round": summary["round"],
        "comparisons_from": summary.get("comparisons_from"),
        "new_records": sum((labels.get("records") or {}).values()) if labels else None,
        "rm_pairs": data.get("pairs"),
        **_accuracy_cells(accuracy, "before"),
        **_accuracy_cells(accuracy, "after"),
        "accuracy_on": (accuracy or {}).get("on"),
        "policy_from": summary.get("policy_from"),
        "best_gold": best.get("gold"),
        "kl_at_best": best.get("kl"),
        "final_gold": last.get("gold"),
        "final_reward": last.get("reward"),
        "final_kl": last.get("kl"),
        "ppo_kept": summary.get("ppo_kept"),
    }


def _round_samples(summary: Mapping[str, Any]) -> list[str]:
    """A round's labelled samples: prompt, then the responses best first, gold in bold."""
    rows = []
    for sample in summary.get("samples", ()):
        golds = sample.get("gold") or [None] * len(sample["responses"])
        for rank, (text, gold) in enumerate(zip(sample["responses"], golds, strict=True), 1):
            suffix = "" if gold is None else f" **({gold:+.2f})**"
            prompt = sample["prompt"] if rank == 1 else ""
            rows.append({"prompt": prompt, "rank": rank, "response": text.strip() + suffix})
    if not rows:
        return []
    return [
        f"### Round {summary['round']}: samples of `{markdown_cell(str(summary['comparisons_from']))}`",
        "",
        format_table(rows, ["prompt", "rank", "response"]),
        "",
    ]


def _rounds_lines(rounds: Sequence[Mapping[str, Any]], run_dir: Path) -> list[str]:
    """Iterated RLHF: per round the comparisons, the reward models before and after, the PPO
    curve on one plot, and labelled samples of each round's policy."""
    png = plot_rounds(rounds, run_dir / PLOTS / ROUNDS_PNG)
    lines = [
        "## Rounds (iterated RLHF)",
        "",
        "Each round >= 2 labels K samples per prompt of the previous round's policy on new "
        "prompts, trains a reward model on every comparison so far and runs PPO again "
        "(docs/iterated_rlhf.md).",
        "",
        format_table([_round_row(r) for r in rounds]),
        "",
        "`comparisons_from`: the policy (round 1: the data) the round's comparisons were "
        "sampled from. `new_records`: its labelled records; `rm_pairs`: the (better, worse) "
        "pairs its reward model trained on, all rounds' so far. `rm_before` / `rm_after`: "
        "accuracy of the previous and of the retrained reward model on the round's "
        "comparisons (`accuracy_on` says held-out or training ones) against the labels, "
        "`_gold` against the gold judge's order. `best_gold`, `kl_at_best`: the PPO "
        "evaluation point with the highest gold score; `final_*`: the last point "
        "(`final_reward` by the round's own reward model). `ppo_kept`: the iteration whose "
        "policy the round's PPO kept as its result (the last, or with "
        "`metric_for_best_model` its best evaluation's), which the next round samples.",
        "",
        f"![gold and proxy against KL per round]({png.relative_to(run_dir)})",
        "",
    ]
    for summary in rounds:
        lines += _round_samples(summary)
    return lines


def write_report(
    run_dir: str | Path,
    result: Mapping[str, Any],
    stage_dirs: Mapping[str, str | Path],
    *,
    ppo_points: Sequence[Mapping[str, Any]] = (),
    timings: Mapping[str, Mapping[str, Any]] | None = None,
    title: str = "rlhfkit pipeline",
    rounds: Sequence[Mapping[str, Any]] = (),
) -> Path:
    """Write ``run_dir/report.md`` and its PNGs (under ``run_dir/plots``); return its path.

    ``result``: what ``evaluate`` wrote; ``stage_dirs``: stage name -> run directory with a
    ``metrics.jsonl``; ``ppo_points``: dicts with iteration, kl, gold, reward; ``rounds``: one
    dict per round of iterated RLHF (``pipeline.rounds.round_summaries``), shown when > 1.
    """
    run_dir = Path(run_dir)
    lines = [
        *_results_lines(result, title),
        *_pass_rate_lines(result.get("pass_rates")),
        *_unasked_lines(result.get("unasked")),
        *_overoptimization_lines(result, ppo_points, run_dir, stage_dirs.get("ppo")),
        *(_rounds_lines(rounds, run_dir) if len(rounds) > 1 else []),
        *_curves_lines(stage_dirs, run_dir),
        "## Samples side by side (gold score in bold)",
        "",
        _samples_table(result.get("samples", ())),
        "",
    ]
    if timings:
        lines += ["## Time per stage", "", _timing_table(timings), "", TIMING_NOTE, ""]
    path = run_dir / REPORT_FILE
    path.write_text("\n".join(lines), encoding="utf-8")
    logger.info("report written to %s", path)
    return path
