"""The measurement behind the ``documents`` extra (docs/ingestion.md): markitdown against pypdf +
trafilatura + python-docx, on the same three test documents, each in its own throwaway venv.

    python -m venv /tmp/v-gen && /tmp/v-gen/bin/pip install fpdf2 python-docx
    /tmp/v-gen/bin/python docs/measurements/loader_choice.py make /tmp/loaders
    python -m venv /tmp/v-a && /tmp/v-a/bin/pip install 'markitdown[pdf,docx]'
    python -m venv /tmp/v-b && /tmp/v-b/bin/pip install pypdf trafilatura python-docx lxml_html_clean
    /tmp/v-a/bin/python docs/measurements/loader_choice.py markitdown /tmp/loaders
    python docs/measurements/loader_choice.py separate /tmp/loaders   # crag_dspy.loaders, pip install -e '.[documents]'
    /tmp/v-b/bin/python docs/measurements/loader_choice.py size pypdf trafilatura ...   # installed size of dists

Each converter prints, per file, the title it found and the text it extracted; the quality checks
(title kept, boilerplate dropped, paragraphs and tables kept, corrupt file raises) are read off that.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

P1 = (
    "The Harbour Ferry Authority runs seven routes across the bay. Every ferry carries at most "
    "240 passengers, and the night crossing to Velm Island leaves at 23:40 from pier four."
)
P2 = (
    "Season tickets cost 310 velds a year. Children under twelve travel free when an adult "
    "holding a season ticket accompanies them."
)
P3 = "Lost property is kept for ninety days at the pier four office, which opens at 07:00."
FILES = ("handbook.pdf", "night.html", "rules.docx", "broken.pdf")


def make(out: Path) -> None:
    """A two-page PDF with a metadata title, an HTML page with navigation, a cookie banner, a sidebar
    and a footer around its article, a DOCX with a title, headings and a table, and a corrupt PDF."""
    import docx
    from fpdf import FPDF

    out.mkdir(parents=True, exist_ok=True)
    pdf = FPDF()
    pdf.set_title("Harbour Ferry Handbook")
    pdf.add_page()
    pdf.set_font("Helvetica", "B", 18)
    pdf.cell(0, 12, "Harbour Ferry Handbook", new_x="LMARGIN", new_y="NEXT")
    pdf.set_font("Helvetica", size=11)
    for p in (P1, P2):
        pdf.multi_cell(0, 6, p, new_x="LMARGIN", new_y="NEXT")
        pdf.ln(4)
    pdf.add_page()
    pdf.multi_cell(0, 6, P3, new_x="LMARGIN", new_y="NEXT")
    pdf.output(str(out / "handbook.pdf"))

    d = docx.Document()
    d.core_properties.title = "Ferry Staff Rules"
    d.add_heading("Ferry Staff Rules", level=1)
    d.add_paragraph(P1)
    d.add_heading("Tickets", level=2)
    d.add_paragraph(P2)
    t = d.add_table(rows=2, cols=2)
    t.cell(0, 0).text, t.cell(0, 1).text = "Route", "Departure"
    t.cell(1, 0).text, t.cell(1, 1).text = "Velm Island", "23:40"
    d.save(str(out / "rules.docx"))

    (out / "night.html").write_text(
        f"""<!doctype html><html><head><title>Night crossings | Harbour Ferry Authority</title></head><body>
<header><nav><a href="/">Home</a> <a href="/routes">Routes</a> <a href="/tickets">Tickets</a>
<a href="/contact">Contact us</a></nav></header>
<div class="cookie-banner">We use cookies to improve your experience. Accept all cookies?</div>
<aside class="sidebar"><h3>Related</h3><ul><li><a href="/a">Summer timetable</a></li>
<li><a href="/b">Press releases</a></li></ul></aside>
<main><article><h1>Night crossings</h1><p>{P1}</p><p>{P2}</p><p>{P3}</p></article></main>
<footer><p>Copyright 2026 Harbour Ferry Authority. All rights reserved.</p>
<a href="/privacy">Privacy policy</a> <a href="/terms">Terms</a></footer></body></html>""",
        encoding="utf-8",
    )
    (out / "broken.pdf").write_bytes(b"%PDF-1.4\n1 0 obj <<garbage" + bytes(range(256)))


def markitdown(folder: Path) -> None:
    from markitdown import MarkItDown

    converter = MarkItDown(enable_plugins=False)
    for name in FILES:
        start = time.perf_counter()
        try:
            result = converter.convert(str(folder / name))
            _show(name, result.title, result.text_content, start)
        except Exception as exc:  # noqa: BLE001 - the point of the run: how each converter fails
            print(f"===== {name} ERROR {type(exc).__name__}: {str(exc)[:200]}")


def separate(folder: Path) -> None:
    """pypdf, trafilatura and python-docx as crag_dspy.loaders calls them."""
    from crag_dspy.loaders import load_document

    for name in FILES:
        start = time.perf_counter()
        try:
            doc = load_document(folder / name)
            _show(name, doc.title, doc.text, start)
        except Exception as exc:  # noqa: BLE001 - the point of the run: how each converter fails
            print(f"===== {name} ERROR {type(exc).__name__}: {str(exc)[:200]}")


def _show(name: str, title: str | None, text: str, start: float) -> None:
    ms = (time.perf_counter() - start) * 1000
    print(f"===== {name} title={title!r} ({ms:.0f} ms)\n{text}\n")


def size(dists: list[str]) -> None:
    """Installed bytes of the named distributions, from their RECORD files."""
    from importlib.metadata import distribution

    total = 0
    for name in dists:
        files = distribution(name).files or []
        bytes_ = sum(f.size or 0 for f in files)
        total += bytes_
        print(f"{name:20} {bytes_ / 1e6:6.1f} MB")
    print(f"{'total':20} {total / 1e6:6.1f} MB in {len(dists)} distributions")


if __name__ == "__main__":
    command, *rest = sys.argv[1:]
    if command == "size":
        size(rest)
    else:
        {"make": make, "markitdown": markitdown, "separate": separate}[command](Path(rest[0]))
