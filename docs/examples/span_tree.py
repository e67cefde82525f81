"""Draw the OpenTelemetry span tree of one CRAG question (docs/images/span-tree.png).

    python docs/examples/span_tree.py ["question"] [--out docs/images/span-tree.png]

Runs one question with the shipped program of the bundled default domain with the configured LM (the embedded one by default),
collects its spans in memory through :class:`crag_dspy.tracing.OpenTelemetryCallback`, and draws them
on a time axis, indented by depth: what an OpenTelemetry backend (Jaeger, MLflow) shows for the run.
"""

from __future__ import annotations

import argparse

import dspy
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from crag_dspy.app import load_program
from crag_dspy.tracing import OpenTelemetryCallback

QUESTION = "What is the list price of one AquaProbe 220 sensor?"


def collect_spans(question: str):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    crag = load_program("default")  # the shipped compiled program of the default domain
    with dspy.context(callbacks=[OpenTelemetryCallback(provider)]):
        prediction = crag(question=question)
    return prediction, exporter.get_finished_spans()


def draw(spans, title: str, out: str) -> None:
    by_id = {s.context.span_id: s for s in spans}

    def depth(span) -> int:
        return 0 if span.parent is None else 1 + depth(by_id[span.parent.span_id])

    shown = sorted((s for s in spans if depth(s) <= 3), key=lambda s: s.start_time)
    start = min(s.start_time for s in shown)
    fig, ax = plt.subplots(figsize=(10, 0.28 * len(shown) + 1.2))
    for row, span in enumerate(shown):
        left, width = (span.start_time - start) / 1e9, (span.end_time - span.start_time) / 1e9
        level = depth(span)
        ax.barh(row, width, left=left, color=plt.cm.viridis(level / 4), height=0.7)
        label = span.name
        if "crag.score" in span.attributes:
            label += f"  score {span.attributes['crag.score']:.2f}"
        if span.name == "CRAG":
            label += f"  action {span.attributes.get('crag.action')}"
        ax.text(left + width + 0.05, row, "  " * level + label, va="center", fontsize=7)
    ax.set_yticks([])
    ax.invert_yaxis()
    ax.set_xlabel("seconds since the question arrived")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=130)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("question", nargs="?", default=QUESTION)
    parser.add_argument("--out", default="docs/images/span-tree.png")
    args = parser.parse_args()
    prediction, spans = collect_spans(args.question)
    draw(spans, f"{args.question!r} -> {prediction.answer!r} ({len(spans)} spans)", args.out)
    print(f"{len(spans)} spans, action {prediction.action}, answer {prediction.answer!r}; wrote {args.out}")


if __name__ == "__main__":
    main()
