"""The compile report: markdown + JSON with the numbers, and a PNG of accuracy over (lower, upper)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

__all__ = ["plot_landscape", "write_report"]


def plot_landscape(
    axis: list[float],
    grid: list[list[float]],
    chosen: tuple[float, float],
    default: tuple[float, float],
    path: Path,
    title: str,
) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # files only; no display on servers
    import matplotlib.pyplot as plt
    import numpy as np

    data = np.array([[np.nan if math.isnan(v) else v for v in row] for row in grid])
    fig, ax = plt.subplots(figsize=(6.4, 5.2), dpi=110)
    image = ax.imshow(
        data,
        origin="lower",
        extent=(axis[0], axis[-1], axis[0], axis[-1]),
        aspect="auto",
        cmap="viridis",
        interpolation="nearest",
    )
    fig.colorbar(image, ax=ax, label="answer accuracy (val)")
    ax.set_xlabel("upper threshold")
    ax.set_ylabel("lower threshold")
    ax.plot(
        chosen[1], chosen[0], marker="*", markersize=16, color="red", markeredgecolor="white", label="tuned"
    )
    ax.plot(
        default[1],
        default[0],
        marker="o",
        markersize=9,
        color="white",
        markeredgecolor="black",
        label="default",
    )
    ax.legend(loc="lower right")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _judge_row(name: str, demos: int, calibration: dict | None, m: dict) -> str:
    if calibration and calibration.get("fitted"):
        fit = f"yes from raw P ≥ {calibration['cut']:.3f} ({calibration['pairs']} train ex.)"
    else:
        fit = "-" if calibration is None else f"not fitted: {calibration.get('reason')}"
    auc = "-" if m["roc_auc"] is None else f"{m['roc_auc']:.3f}"
    return (
        f"| {name} | {demos} | {fit} | {_pct(m['accuracy'])} | {_pct(m['precision'])} | "
        f"{_pct(m['recall'])} | {auc} |"
    )


def write_report(report: dict[str, Any], out_prefix: Path) -> tuple[Path, Path]:
    """Write ``<prefix>.report.json`` and ``<prefix>.report.md``."""
    json_path = out_prefix.with_suffix(".report.json")
    md_path = out_prefix.with_suffix(".report.md")
    json_path.write_text(json.dumps(report, indent=2, default=str), encoding="utf-8")
    lines = [
        f"# Compile report: domain `{report['domain']}`",
        "",
        f"LM `{report['lm']}`, optimizer `{report['optimizer']}`, seed {report['seed']}, "
        f"{report['seconds']:.0f} s, {report['lm_usage']['calls']} LM calls "
        f"({report['lm_usage']['prompt_tokens']} prompt tokens, {report['lm_usage']['cached_prompt_tokens']} cached).",
        "",
    ]
    for stage in ("grader", "strip_filter"):
        if stage in report["stages"]:
            s = report["stages"][stage]
            lines += [
                f"## {stage} ({s['train']} train / {s['val']} val examples; shipped: {s['kept']})",
                "",
                "| val | demos | calibration | accuracy | precision | recall | ROC AUC |",
                "|---|---|---|---|---|---|---|",
                _judge_row("uncompiled", 0, None, s["before"]),
            ]
            for plan, candidate in s.get("candidates", {}).items():
                lines.append(_judge_row(plan, candidate["demos"], candidate["calibration"], candidate["val"]))
            if s["kept"] == "uncompiled":
                lines.append("\nNo compiled candidate beat the uncompiled judge on val, so it was kept.")
            lines.append("")
    t = report.get("thresholds")
    if t:
        lines += [
            "## thresholds (Optuna, QA val)",
            "",
            f"tuned lower={t['lower']:.3f}, upper={t['upper']:.3f}: val accuracy {_pct(t['accuracy'])} "
            f"(defaults 0.3/0.7: {_pct(t['default_accuracy'])}); {t['trials']} trials, "
            f"{t['trials_per_second']:.0f} trials/s, {t['lm_calls_during_trials']} LM calls during trials; "
            f"precomputing the {t['questions']} questions' routes took {t['precompute_lm_calls']} LM calls.",
            "",
            f"![accuracy over thresholds]({Path(t['plot']).name})",
            "",
            f"Study: `optuna-dashboard {t['storage']}`",
            "",
        ]
    if report.get("test"):
        lines += [
            "## QA test split (same LM, same run)",
            "",
            "| program | accuracy | s/question | LM calls/question | actions |",
            "|---|---|---|---|---|",
        ]
        for row in report["test"]:
            calls = row["usage"]["calls"] / max(row["n"], 1)
            actions = ", ".join(f"{k} {v}" for k, v in sorted(row["actions"].items())) or "-"
            lines.append(
                f"| {row['name']} | {_pct(row['accuracy'])} | {row['seconds_per_question']:.1f} | {calls:.1f} | {actions} |"
            )
        lines.append("")
    md_path.write_text("\n".join(lines), encoding="utf-8")
    return json_path, md_path
