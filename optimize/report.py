"""Reports: markdown + JSON with the numbers, and PNG plots (compile: accuracy over (lower, upper);
evaluate: accuracy per variant)."""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from crag_dspy.routing import DEFAULT_THRESHOLDS

from .metrics import is_abstention, mcnemar_exact, sign_test, truthfulness_score, wilson_interval

__all__ = [
    "OutputPathError",
    "check_writable",
    "plot_accuracy_bars",
    "plot_landscape",
    "write_evaluation_report",
    "write_report",
]


class OutputPathError(ValueError):
    """An output path where nothing can be written (a folder, a path under a file, no permission)."""


def check_writable(path: Path, what: str) -> None:
    """Check that ``what`` (e.g. "the program") can be written at ``path``: a long run checks where
    its results go before any work starts. Nothing is created: the nearest existing folder on the
    way takes a probe file, removed at once (permissions alone can mislead, e.g. for root)."""
    if path.is_dir():
        raise OutputPathError(f"{path}: is a folder; --out names the file {what} is written to")
    existing = next(p for p in path.absolute().parents if p.exists())
    if not existing.is_dir():
        raise OutputPathError(f"{path}: cannot write {what} there ({existing} is a file, not a folder)")
    try:
        with tempfile.NamedTemporaryFile(dir=existing, prefix=f".{path.name}.", suffix=".check"):
            pass
    except OSError as exc:
        raise OutputPathError(f"{path}: cannot write {what} there ({exc.strerror or exc})") from None


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only; no display on servers
    import matplotlib.pyplot as plt

    return plt


def plot_landscape(
    axis: list[float],
    grid: list[list[float]],
    chosen: tuple[float, float],
    default: tuple[float, float],
    path: Path,
    title: str,
) -> Path:
    import numpy as np

    plt = _pyplot()
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
        weights = calibration.get("weights") or {}
        fit = f"yes from raw P ≥ {calibration['cut']:.3f}"
        if weights:
            weighed = ", ".join(f"{name} {w:+.2f}" for name, w in weights.items())
            fit += f" when all terms are present; evidence weights {weighed}"
        fit += f" ({calibration['pairs']} train ex.)"
    else:
        fit = "-" if calibration is None else f"not fitted: {calibration.get('reason')}"
    auc = "-" if m["roc_auc"] is None else f"{m['roc_auc']:.3f}"
    return (
        f"| {name} | {demos} | {fit} | {_pct(m['accuracy'])}{_wilson(m)} | {_pct(m['precision'])} | "
        f"{_pct(m['recall'])} | {auc} |"
    )


def _wilson(m: dict) -> str:
    """The 95% Wilson interval of a measured accuracy (``accuracy`` of ``n`` items)."""
    return _interval(wilson_interval(round(m["accuracy"] * m["n"]), m["n"]))


def _interval(ci: Sequence[float] | None, pct: bool = True) -> str:
    if ci is None:
        return ""
    low, high = ci
    return f" [{100 * low:.1f}, {100 * high:.1f}]" if pct else f" [{low:.3f}, {high:.3f}]"


def _grade_source_lines(g: dict[str, Any] | None) -> list[str]:
    """The grade sources measured on the same val pairs, with 95% intervals, and which one shipped."""
    if not g:
        return []
    lines = [
        f"## grade source (shipped: {g['shipped']})",
        "",
        f"Why: {g['why']}.",
        "",
        "| val | accuracy [95% CI] | precision | recall | ROC AUC [95% CI] |",
        "|---|---|---|---|---|",
    ]
    for name, m in g["candidates"].items():
        auc = (
            "-" if m["roc_auc"] is None else f"{m['roc_auc']:.3f}{_interval(m.get('roc_auc_ci'), pct=False)}"
        )
        lines.append(
            f"| {name} | {_pct(m['accuracy'])}{_interval(m.get('accuracy_ci'))} | {_pct(m['precision'])} | "
            f"{_pct(m['recall'])} | {auc} |"
        )
    t = g.get("training")
    if t:
        epochs = ", ".join(f"{e['epoch']}: {e['holdout_auc']:.3f}" for e in t["epochs"])
        how = "reused from the cache" if t.get("cached") else f"{t['seconds']:.0f} s"
        frozen = t.get("frozen_layers", 0)
        layers = f"the lowest {frozen} encoder layers frozen" if frozen else "every layer trained"
        lines += [
            "",
            (
                f"Evaluator: fine-tuned on {t['train_pairs']} train pairs ({layers}), epoch chosen on {t['holdout_pairs']} "
                f"pairs of held-out train questions (held-out AUC by epoch {epochs}; kept epoch {t['best_epoch']}); "
                f"{how}. Intervals: Wilson for accuracy, bootstrap over questions for AUC."
            ),
        ]
    d = g.get("distillation")
    if d:
        verdict = "kept" if d["kept"] else "not kept: the evaluator above is trained on labelled pairs alone"
        lines += [
            "",
            (
                f"Distillation: the LLM judge labelled {d['pairs']} passages ({d['relevant']} relevant) among the "
                f"top-k no label covers of {d['questions']} train questions ({d['combinations']} passages, "
                f"{d['failed']} the judge failed on; {d['seconds']:.0f} s). Trained with them too, the evaluator "
                f"ranks the held-out pairs at AUC {d['held_out_auc_with']:.3f} against "
                f"{d['held_out_auc_without']:.3f} without: {verdict}."
            ),
        ]
    lines.append("")
    return lines


def write_report(report: dict[str, Any], out_prefix: Path) -> tuple[Path, Path]:
    """Write ``<prefix>.report.json`` and ``<prefix>.report.md``."""
    json_path = out_prefix.with_suffix(".report.json")
    md_path = out_prefix.with_suffix(".report.md")
    json_path.write_text(json.dumps(report, indent=2, default=str), encoding="utf-8")
    lines = [
        f"# Compile report: domain `{report['domain']}`",
        "",
        (
            f"LM `{report['lm']}`, optimizer `{report['optimizer']}`, seed {report['seed']}, "
            f"{report['seconds']:.0f} s, {report['lm_usage']['calls']} LM calls "
            f"({report['lm_usage']['prompt_tokens']} prompt tokens, {report['lm_usage']['cached_prompt_tokens']} cached)."
        ),
        "",
    ]
    if report.get("stage_seconds"):  # reports written before stage times were recorded have none
        times = ", ".join(f"{stage} {seconds:.0f} s" for stage, seconds in report["stage_seconds"].items())
        lines += [f"Wall time by stage: {times}.", ""]
    engine = report.get("engine")
    if engine:  # embedded LM only: the engine's build says how fast those seconds could be
        lines += [
            f"Engine: {engine.get('name', 'xllamacpp')} {engine['version'] or '(unknown version)'}, CPU features {', '.join(engine['features'])}."
        ]
        if engine.get("hint"):
            lines += [f"Note: {engine['hint']}"]
        lines += [""]
    for stage in ("grader", "strip_filter"):
        if stage in report["stages"]:
            s = report["stages"][stage]
            lines += [
                f"## {stage} ({s['train']} train / {s['val']} val examples; shipped: {s['kept']})",
                "",
                "| val | demos | calibration | accuracy [95% CI] | precision | recall | ROC AUC |",
                "|---|---|---|---|---|---|---|",
                _judge_row("uncompiled", 0, None, s["before"]),
            ]
            for plan, candidate in s.get("candidates", {}).items():
                lines.append(_judge_row(plan, candidate["demos"], candidate["calibration"], candidate["val"]))
            if s["kept"] == "uncompiled":
                lines.append("\nNo compiled candidate beat the uncompiled judge on val, so it was kept.")
            shared = s.get("grader_evaluator")
            if shared and shared["roc_auc"] is not None:
                lines.append(
                    f"\nThe grader's trained evaluator ranks these {shared['n']} val strips at ROC AUC "
                    f"{shared['roc_auc']:.3f}{_interval(shared['roc_auc_ci'], pct=False)} (one model for both judges?)."
                )
            lines.append("")
    lines += _grade_source_lines(report["stages"].get("grade_source"))
    g = report["stages"].get("generation")
    if g:
        demos = ", ".join(f"{name} {n}" for name, n in g["demos"].items())
        lines += [f"## rewriter / answerer (demos bootstrapped from QA train; shipped: {g['kept']})", ""]
        lines.append(f"Demos bootstrapped: {demos}.")
        if "val_accuracy" in g:
            acc = g["val_accuracy"]
            lines.append(
                f"QA val accuracy, each with its own tuned thresholds: with demos {_pct(acc['with demos'])}, "
                f"without {_pct(acc['without demos'])} (a tie keeps the shorter prompts)."
            )
        lines.append("")
    t = report.get("thresholds")
    if t:
        lines += _threshold_lines(t)
    retry = report.get("internal_retry")
    if retry:
        lines += [
            f"## internal retry (shipped: {'yes' if retry['shipped'] else 'no'})",
            "",
            (
                f"{retry['why']}. Without{_interval(retry['intervals']['without'])}, with"
                f"{_interval(retry['intervals']['with'])} (95% Wilson)."
            ),
            "",
        ]
    if report.get("test"):
        lines += [
            "## QA test split (same LM, same run)",
            "",
            (
                "| program | accuracy [95% CI] | vs compiled: only this right / only compiled right, McNemar p "
                "| vs compiled: truthfulness wins / losses / ties, sign test p | s/question | LM calls/question "
                "| actions |"
            ),
            "|---|---|---|---|---|---|---|",
        ]
        compiled = report["test"][0]
        for row in report["test"]:
            calls = row["usage"]["calls"] / max(row["n"], 1)
            actions = ", ".join(f"{k} {v}" for k, v in sorted(row["actions"].items())) or "-"
            right = sum(r["correct"] for r in row["rows"])
            paired = "-" if row is compiled else _paired(row["rows"], compiled["rows"])
            signs = "-" if row is compiled else _signs(row["rows"], compiled["rows"])
            lines.append(
                f"| {row['name']} | {_pct(row['accuracy'])}{_interval(wilson_interval(right, row['n']))} | {paired} | "
                f"{signs} | {row['seconds_per_question']:.1f} | {calls:.1f} | {actions} |"
            )
        lines += [
            "",
            (
                'Truthfulness per question: right +1, "I don\'t know" 0, wrong -1; a win is a question this '
                "program scores higher on. A difference is a difference only at p < 0.05; otherwise there is "
                "no measured difference."
            ),
            "",
        ]
    md_path.write_text("\n".join(lines), encoding="utf-8")
    return json_path, md_path


def _paired(rows: list[dict], reference: list[dict]) -> str:
    this, other = [r["correct"] for r in rows], [r["correct"] for r in reference]
    only_this = sum(a and not b for a, b in zip(this, other, strict=True))
    only_other = sum(b and not a for a, b in zip(this, other, strict=True))
    return f"{only_this} / {only_other}, p={mcnemar_exact(this, other):.3f}"


def _score(row: dict[str, Any]) -> int:
    """A question row's truthfulness score: its own, or (rows that predate it, e.g. the compile's test
    rows) from its answer: abstaining needs no gold, and an abstention that is right is +1 anyway."""
    if "score" in row:
        return row["score"]
    return truthfulness_score(bool(row["correct"]), is_abstention(row.get("answer")))


def _signs(rows: list[dict], reference: list[dict]) -> str:
    """The paired sign test of two programs' truthfulness on the same questions, as a cell."""
    test = sign_test([_score(r) for r in rows], [_score(r) for r in reference])
    return f"{test.wins} / {test.losses} / {test.ties}, p={test.p_value:.3f}"


def _defaults(t: dict) -> str:
    """The defaults a threshold stage compared against (on the grader's scale; reports from before that
    compared against the constants)."""
    lower, upper = (
        t.get("default_lower", DEFAULT_THRESHOLDS[0]),
        t.get("default_upper", DEFAULT_THRESHOLDS[1]),
    )
    return f"{lower:.3g}/{upper:.3g}"


def _threshold_lines(t: dict) -> list[str]:
    """The threshold stage: the exact optimum with its interval, how much of the grid ties, what ships
    and the out-of-fold test that decided it."""
    cv = t["cross_validation"]
    speed = (
        f"{t['trials_per_second']:.0f} grid points/s"
        if not math.isnan(t["trials_per_second"])  # NaN: every trial was resumed, none ran
        else "all resumed from the study's journal"
    )
    lines = [
        "## thresholds (exact search on QA val)",
        "",
        (
            f"Objective: {t.get('objective', 'accuracy')}. Shipped: **{t['shipped']}**, lower={t['lower']:.3f}, "
            f"upper={t['upper']:.3f}, val accuracy {_pct(t['accuracy'])} on {t['questions']} questions, "
            f"{t.get('web_per_question', 0.0):.2f} web searches per question (defaults "
            f"{t.get('default_web_per_question', 0.0):.2f}). Why: {t['reason']}."
        ),
        "",
        *([f"Defaults: {t['defaults_note']}.", ""] if t.get("defaults_note") else []),
        *([f"**Warning**: {t['collapse']}.", ""] if t.get("collapse") else []),
        "| thresholds | val accuracy [95% CI] | LM requests/q |",
        "|---|---|---|",
        (
            f"| optimum {t['tuned_lower']:.3f}/{t['tuned_upper']:.3f} ({t['tie_rule']}) | "
            f"{_pct(t['tuned_accuracy'])}{_interval(t['tuned_interval'])} | - |"
        ),
        (
            f"| defaults {_defaults(t)} | {_pct(t['default_accuracy'])}{_interval(t['default_interval'])} | "
            f"{t['default_requests_per_question']:.2f} |"
        ),
        (
            f"| shipped {t['lower']:.3f}/{t['upper']:.3f} | {_pct(t['accuracy'])}"
            f"{_interval(wilson_interval(round(t['accuracy'] * t['questions']), t['questions']))} | "
            f"{t['requests_per_question']:.2f} |"
        ),
        "",
        f"The optimum is exact: {t['grid_points']} valid cells between the observed grades, each one trial of "
        f"an Optuna study over the valid cells ({speed}; {t['lm_calls_during_trials']} LM calls during trials); "
        f"{t['tied_fraction'] * 100:.1f}% of the cells tie at the optimum. Ties go to the defaults when they "
        "are optimal, else to the point deepest inside the optimal region"
        + ("" if math.isnan(t["depth"]) else f" (depth {t['depth']:.3f})")
        + ", then to fewer LM requests.",
        "",
    ]
    if "p" in cv:
        lines += [
            (
                f"Out-of-fold check ({cv['folds']}-fold over the val questions, exact McNemar, ships at "
                f"p < {cv['alpha']:.3f}): tuning on the other folds answered {cv['tuned_out_of_fold']} of "
                f"{cv['questions']} right, the defaults {cv['defaults']} (p={cv['p']:.3f})."
            ),
            "",
        ]
    if "sign_test" in cv:
        st = cv["sign_test"]
        lines += [
            (
                f"Out-of-fold check ({cv['folds']}-fold over the val questions, sign test on truthfulness, ships "
                f"at p < {cv['alpha']:.3f}): tuning on the other folds scored {st['wins']} questions higher and "
                f"{st['losses']} lower than the defaults (p={st['p_value']:.3f})."
            ),
            "",
        ]
    per_type = t.get("per_type") or {}
    if per_type:
        counts = ", ".join(f"{k} {v}" for k, v in per_type["types"].items())
        verdict = per_type.get("verdict") or f"shipped: {t['by_type']}"
        lines += [f"Per question type ({counts}): {verdict}.", ""]
    lines += [
        f"Precomputing the {t['questions']} questions' routes took {t['precompute_lm_calls']} LM calls"
        + (f", the baselines' answers {t['baseline_lm_calls']}." if "baseline_lm_calls" in t else "."),
        "",
        f"![accuracy over thresholds]({Path(t['plot']).name})",
        "",
        f"Study: `optuna-dashboard {t['storage']}`",
        "",
    ]
    if t.get("frontier"):
        lines += frontier_lines(t["frontier"], t["frontier"].get("plot"))
    return lines


_GROUP_COLORS = {"baseline": "#9e9e9e", "crag": "#1f77b4", "ablation": "#ff7f0e"}


def plot_accuracy_bars(table: list[dict[str, Any]], path: Path, title: str) -> Path:
    """Horizontal bars of answer accuracy per variant, coloured by group (baseline, CRAG, ablation)."""
    plt = _pyplot()
    names = [row["name"] for row in table][::-1]
    values = [100 * (row["accuracy"] or 0.0) for row in table][::-1]
    colors = [_GROUP_COLORS[row["group"]] for row in table][::-1]
    fig, ax = plt.subplots(figsize=(7.2, 0.42 * len(names) + 1.4), dpi=110)
    # 95% Wilson intervals as error bars (rows from before intervals were recorded have none).
    low = [
        v - 100 * row.get("interval", [v / 100, v / 100])[0]
        for v, row in zip(values, table[::-1], strict=True)
    ]
    high = [
        100 * row.get("interval", [v / 100, v / 100])[1] - v
        for v, row in zip(values, table[::-1], strict=True)
    ]
    bars = ax.barh(names, values, color=colors, xerr=[low, high], ecolor="#444444", capsize=2)
    # Rows that set their own internal retries (None: the program's own) are variations of the program.
    crag = [row for row in table if row["group"] == "crag" and row.get("internal_retries") is None]
    if crag:  # the program the ablations are of: a reference line for every other row
        ax.axvline(100 * (crag[-1]["accuracy"] or 0.0), color=_GROUP_COLORS["crag"], linestyle="--", lw=1)
    for bar, value, above in zip(bars, values, high, strict=True):  # labels past the error bars
        ax.text(
            value + above + 1.5, bar.get_y() + bar.get_height() / 2, f"{value:.1f}%", va="center", fontsize=8
        )
    ax.set_xlim(0, 118)
    ax.set_xlabel(f"answer accuracy (%) with 95% Wilson intervals, n = {table[0]['n'] if table else 0}")
    ax.set_title(title)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in _GROUP_COLORS.values()]
    ax.legend(handles, list(_GROUP_COLORS), loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _cell(share: dict[str, Any]) -> str:
    if not share["of"]:
        return "-"
    return f"{share['n']}/{share['of']} ({_pct(share['rate'])}){_interval(wilson_interval(share['n'], share['of']))}"


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _verdict(p: float, ahead: bool) -> str:
    return ("better" if ahead else "worse") if p < 0.05 else "no measured difference"


def _paired_lines(report: dict[str, Any]) -> list[str]:
    """Each CRAG row against every other row on the same questions: exact McNemar p-values on
    right/wrong and sign tests on the truthfulness scores, a difference stated only at p < 0.05."""
    outcomes: dict[str, dict[str, tuple[bool, int]]] = {}
    for r in report.get("rows", []):
        outcomes.setdefault(r["variant"], {})[r["id"]] = (bool(r["correct"]), _score(r))
    crag_rows = [v["name"] for v in report["variants"] if v["kind"] == "crag" and v["group"] == "crag"]
    if not crag_rows or not outcomes:
        return []
    lines = [
        "## Paired differences",
        "",
        (
            "Each CRAG row against every other row on the same questions: right/wrong where the two "
            'differ, exact McNemar p (two-sided); and truthfulness (right +1, "I don\'t know" 0, wrong -1) '
            "where the two differ, sign test p (two-sided; wins: the CRAG row scores higher). A difference "
            "is a difference only at p < 0.05."
        ),
        "",
        (
            "| CRAG row | against | only CRAG row right | only other right | McNemar p | verdict "
            "| truthfulness wins / losses / ties | sign test p | verdict |"
        ),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name in crag_rows:
        mine = outcomes.get(name, {})
        for other in (v["name"] for v in report["variants"] if v["name"] != name):
            theirs = outcomes.get(other, {})
            ids = sorted(mine.keys() & theirs.keys())
            a, b = [mine[i][0] for i in ids], [theirs[i][0] for i in ids]
            only_a = sum(x and not y for x, y in zip(a, b))
            only_b = sum(y and not x for x, y in zip(a, b))
            p = mcnemar_exact(a, b)
            signs = sign_test([mine[i][1] for i in ids], [theirs[i][1] for i in ids])
            lines.append(
                f"| {name} | {other} | {only_a} | {only_b} | {p:.3f} | {_verdict(p, only_a > only_b)} "
                f"| {signs.wins} / {signs.losses} / {signs.ties} | {signs.p_value:.3f} "
                f"| {_verdict(signs.p_value, signs.wins > signs.losses)} |"
            )
    return [*lines, ""]


def _signed(value: float) -> str:
    return f"{value:+.2f}"  # signed: a truthfulness of +0.20 and one of -0.20 are told apart at a glance


def _truthfulness_cell(t: dict[str, Any]) -> str:
    if t["mean"] is None:
        return "-"
    interval = t["interval"]
    return _signed(t["mean"]) + (f" [{_signed(interval[0])}, {_signed(interval[1])}]" if interval else "")


def _abstained_cell(row: dict[str, Any], split: bool) -> str:
    """Abstentions over all questions; with unanswerable questions in the split, where they fell."""
    a = row["abstained"]
    cell = f"{a['n']} ({_pct(a['rate'])})"
    if split:
        yes, no = row["answerable_abstained"], row["unanswerable_abstained"]
        cell += f": {yes['n']}/{yes['of']} answerable, {no['n']}/{no['of']} unanswerable"
    return cell


def _hallucinated_cell(h: dict[str, Any]) -> str:
    return f"{_pct(h['rate'])}{_interval(h['interval'])} ({h['n']}/{h['of']})"


def _cited_cell(cited: dict[str, Any] | None) -> str:
    if cited is None:
        return "n/a"  # a baseline: it cites nothing
    if not cited["of"]:
        return "-"
    return f"{cited['n']}/{cited['of']} ({_pct(cited['rate'])})"


def write_evaluation_report(report: dict[str, Any], out_prefix: Path) -> tuple[Path, Path]:
    """Write ``<prefix>.json`` and ``<prefix>.md`` for a :func:`optimize.evaluate.evaluate_domain` report."""
    json_path, md_path = out_prefix.with_suffix(".json"), out_prefix.with_suffix(".md")
    json_path.write_text(json.dumps(report, indent=2, default=str), encoding="utf-8")
    cost, n = report["cost"], report["questions"]
    main = report["thresholds"]["main"]
    program = (
        f"program `{report['program']}` (lower={main['lower']:.3f}, upper={main['upper']:.3f})"
        if report["program"]
        else "no program: the ablations are of CRAG with the default thresholds "
        f"(lower={main['lower']:.2f}, upper={main['upper']:.2f})"
    )
    saved = cost["standalone_lm_requests"] / cost["lm_requests"] if cost["lm_requests"] else None
    lines = [
        f"# Evaluation: domain `{report['domain']}`, split `{report['split']}` ({n} questions)",
        "",
        f"LM `{report['lm']}`; {program}; {report['created']}.",
        "",
        (
            "Accuracy (Wilson 95% interval): a gold alias occurs in the answer as whole words after "
            "normalization (lower case, punctuation, articles and thousands separators dropped); an "
            "unanswerable question is right "
            "only when the answer abstains. Correction success: answerable questions whose first "
            "retrieval held no gold alias, answered right. Cost per variant is standalone (every piece "
            "it used, shared or not): LM requests per question, of which served by DSPy's cache; LM "
            "tokens per question of all those requests (counted from their text, so the same warm or "
            'cold); prompt and completion tokens and seconds of the requests really made; "new '
            'requests" are the LM requests the variant added to the table, in row order.'
        ),
        "",
    ]
    # Cited right is a column only when some question has gold evidence; the breakdown of abstentions
    # only when the split has unanswerable questions (else all abstentions are on answerable ones).
    cites = any(row.get("cited") is not None for row in report["variants"])
    split = any(row["unanswerable_abstained"]["of"] for row in report["variants"])
    header = ["variant", "accuracy", "abstained", "hallucinated", "truthfulness [95% CI]"]
    header += ["cited right"] if cites else []
    header += ["correction success", "LM requests/q (cached)", "LM tokens/q"]
    header += ["prompt tok/q served", "completion tok/q served"]
    header += ["s/q p50", "s/q p95", "new requests", "errors"]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in report["variants"]:
        s, n = row["standalone"], max(row["n"], 1)
        requests = f"{s['requests'] / n:.1f} ({(s['requests'] - s['calls']) / n:.1f})"
        ci = _interval(wilson_interval(row["correct"], row["n"]))
        cells = [
            row["name"],
            f"{_pct(row['accuracy'])}{ci} ({row['correct']}/{row['n']})",
            _abstained_cell(row, split),
            _hallucinated_cell(row["hallucination"]),
            _truthfulness_cell(row["truthfulness"]),
        ]
        cells += [_cited_cell(row.get("cited"))] if cites else []
        tokens = f"{s['tokens'] / n:.0f}" if "tokens" in s else "-"  # reports from before tokens counted
        cells += [_cell(row["correction"]), requests, tokens, f"{s['prompt_tokens'] / n:.0f}"]
        cells += [f"{s['completion_tokens'] / n:.0f}", _seconds(s["seconds_p50"]), _seconds(s["seconds_p95"])]
        cells += [str(row["marginal"]["requests"]), str(row["errors"])]
        lines.append("| " + " | ".join(cells) + " |")
    definitions = (
        "Truthfulness (Meta's CRAG benchmark): per question right +1 / \"I don't know\" 0 / wrong -1, the "
        "mean with a 95% percentile bootstrap interval over questions; hallucinated = wrong and not "
        '"I don\'t know" (failed questions included), with 95% Wilson intervals'
    )
    if cites:
        definitions += (
            "; cited right = right answers to answerable questions with gold evidence that cite an "
            "evidence document (and its page, when the evidence gives one); n/a: the row cites nothing"
        )
    cached = cost["lm_requests"] - cost["lm_calls"]
    lines += [
        "",
        definitions + ".",
        "",
        f"The whole table made {cost['lm_requests']} LM requests ({cost['lm_calls']} served by the LM, "
        f"{cached} by DSPy's disk cache; {cost['prompt_tokens']} prompt and {cost['completion_tokens']} "
        f"completion tokens) in {cost['seconds']:.0f} s, {cost['grader_quality_lm_requests']} of them for "
        f"grader quality and {cost.get('frontier_lm_requests', 0)} for the frontier (the actions no row took, "
        "the baselines' answers when no row gave them). Run one by one, the variants would make "
        f"{cost['standalone_lm_requests']} LM requests"
        + (f" ({saved:.1f}x as many)." if saved else ".")
        + (
            " Requests served from the cache cost ~0 s and no served tokens here (the LM tokens column "
            "counts them all): `--no-cache` measures cold costs."
            if cached
            else ""
        ),
        "",
        f"![accuracy per variant]({Path(report['plot']).name})",
        "",
        *_paired_lines(report),
        *(
            frontier_lines(report["frontier"], report["frontier"].get("plot"))
            if report.get("frontier")
            else []
        ),
        "## Actions",
        "",
        "Questions that took each action, and how many of them were answered right (95% Wilson interval).",
        "",
        "| variant | CORRECT | AMBIGUOUS | INCORRECT |",
        "|---|---|---|---|",
    ]
    for row in report["variants"]:
        if row["kind"] == "crag":
            cells = [_cell(row["actions"][a]) for a in ("CORRECT", "AMBIGUOUS", "INCORRECT")]
            lines.append(f"| {row['name']} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "## Grader quality (P(relevant) >= 0.5)",
        "",
        "| grader | data | n | accuracy [95% CI] | precision | recall | ROC AUC | failed |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for g in report["grader"]:
        auc = "-" if g["roc_auc"] is None else f"{g['roc_auc']:.3f}"
        lines.append(
            f"| {g['grader']} | {g['data']} | {g['n']} | {_pct(g['accuracy'])}{_wilson(g)} | {_pct(g['precision'])} "
            f"| {_pct(g['recall'])} | {auc} | {g['unknown']} |"
        )
    lines.append("")
    md_path.write_text("\n".join(lines), encoding="utf-8")
    return json_path, md_path


def plot_frontier(summary: dict[str, Any], path: Path, title: str) -> Path:
    """Accuracy and truthfulness against web searches and against LM tokens per question over every
    pair of thresholds (:func:`optimize.frontier.frontier_summary`): the points, their frontier, the
    baselines, the uninformed line between them and the program's point. Without web search (no
    point searches) only the LM-tokens row is drawn."""
    plt = _pyplot()
    baselines = summary["baselines"]
    costs = [("tokens", "LM tokens per question (prompt + completion)")]
    if "RAG + web always" in baselines or any(p["web"] for p in summary["points"]):
        costs.insert(0, ("web", "web searches per question"))
    fig, axes = plt.subplots(len(costs), 2, figsize=(10.5, 3.9 * len(costs)), dpi=110, squeeze=False)
    for row, (cost, xlabel) in enumerate(costs):
        for col, metric in enumerate(("accuracy", "truthfulness")):
            ax = axes[row][col]
            points = summary["points"]
            ax.scatter(
                [p[cost] for p in points],
                [p[metric] for p in points],
                s=6,
                color="#bbbbbb",
                label="thresholds",
            )
            key = f"{metric}_frontier" if cost == "web" else f"{metric}_{cost}_frontier"
            frontier = summary.get(key, [])
            ax.plot(
                [p[cost] for p in frontier],
                [p[metric] for p in frontier],
                color="#1f77b4",
                lw=1.5,
                drawstyle="steps-post",
                label="frontier",
            )
            if cost == "web" and "RAG + web always" in baselines:
                ends = [baselines["plain RAG"], baselines["RAG + web always"]]
                ax.plot(
                    [e["web"] for e in ends],
                    [e[metric] for e in ends],
                    color="#888888",
                    ls="--",
                    lw=1,
                    label="no-information router",
                )
            for name, point in baselines.items():
                if cost in point:  # a baseline's tokens are unknown when its answers were not measured
                    ax.scatter([point[cost]], [point[metric]], marker="s", s=36, label=name)
            for key, marker, label in (("at", "*", "program"), ("defaults", "D", "default thresholds")):
                if key in summary:
                    at = summary[key]
                    ax.scatter(
                        [at[cost]],
                        [at[metric]],
                        marker=marker,
                        s=120 if marker == "*" else 40,
                        color="#d62728" if key == "at" else "#2ca02c",
                        zorder=5,
                        label=label,
                    )
            ax.set_xlabel(xlabel)
            ax.set_ylabel(metric)
            if cost == "web":
                ax.set_xlim(-0.05, 1.05)
    axes[0][0].legend(fontsize=7, loc="lower right")
    fig.suptitle(f"{title}: cost-quality frontier over the thresholds (n = {summary['questions']})")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _tokens(point: dict[str, Any]) -> str:
    """A point's LM tokens per question, or "-" when they were not measured (a report from before)."""
    return f"{point['tokens']:.0f}" if point.get("tokens") is not None else "-"


def frontier_lines(summary: dict[str, Any], plot: str | None) -> list[str]:
    """The markdown section of a report on routing: lift, oracle headroom and the frontier plot."""

    def est(e: dict[str, float], pct: bool = True) -> str:
        f = (lambda v: f"{100 * v:+.1f} pts") if pct else (lambda v: f"{v:+.3f}")
        return f"{f(e['value'])} [{f(e['low'])}, {f(e['high'])}]"

    rows = [("program", summary["at"])] + (
        [("default thresholds", summary["defaults"])] if "defaults" in summary else []
    )
    lines = [
        "## What routing buys",
        "",
        (
            "From one precompute (every question answered once per action; drawing this made no LM call). "
            "Routing lift: accuracy (truthfulness) minus that of a router with no information at the same "
            "web share, on the line from plain RAG (never searches) to RAG + web always (always searches); "
            "without web search, minus plain RAG's. Oracle: the best action per question, the most any "
            "evaluator could reach with these answers; headroom: oracle minus the routed accuracy. 95% "
            "bootstrap intervals over questions."
        ),
        "",
        "| thresholds | accuracy | truthfulness | web searches/q | LM requests/q | LM tokens/q | CORRECT / AMBIGUOUS / INCORRECT | routing lift (accuracy) | routing lift (truthfulness) | oracle | headroom |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, at in rows:
        mix = " / ".join(str(at["actions"][a]) for a in ("CORRECT", "AMBIGUOUS", "INCORRECT"))
        lines.append(
            f"| {name} ({at['lower']:.2f}, {at['upper']:.2f}) | {_pct(at['accuracy'])} | {at['truthfulness']:+.2f} "
            f"| {at['web']:.2f} | {at['requests']:.1f} | {_tokens(at)} | {mix} | {est(at['lift'])} "
            f"| {est(at['truthfulness_lift'], pct=False)} | {_pct(at['oracle']['value'])} | {est(at['headroom'])} |"
        )
    for name, b in summary["baselines"].items():
        lines.append(
            f"| {name} | {_pct(b['accuracy'])} | {b['truthfulness']:+.2f} | {b['web']:.2f} | {b['requests']:.1f} "
            f"| {_tokens(b)} | - | - | - | - | - |"
        )
    front = summary["accuracy_frontier"]
    lines += [
        "",
        "Accuracy frontier (the best accuracy each web budget buys): "
        + ", ".join(f"{p['web']:.2f} -> {_pct(p['accuracy'])}" for p in front)
        + ".",
        "",
    ]
    if by_tokens := summary.get("accuracy_tokens_frontier"):
        lines += [
            "Against LM tokens per question (prompt + completion of every request, cached or not): "
            + ", ".join(f"{p['tokens']:.0f} -> {_pct(p['accuracy'])}" for p in by_tokens)
            + ".",
            "",
        ]
    if plot:
        lines += [f"![cost-quality frontier]({Path(plot).name})", ""]
    return lines
