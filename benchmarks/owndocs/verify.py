"""Check the owndocs benchmark: corpus, SOURCES.md, splits.json and qa.jsonl against its rules.

    python benchmarks/owndocs/verify.py        # prints a summary table; exit 1 and the failures if any

The rules (README.md): every corpus file loads with crag_dspy.loaders.load_document and has >= 300 words;
>= 28 documents, >= 9 PDF, >= 9 HTML, >= 6 DOCX, >= 6 Markdown/text, >= 12 tools; SOURCES.md lists exactly
the corpus files; >= 130 questions, >= 15% unanswerable, unique ids and questions; every answerable
question's evidence exists and holds one of its aliases and its quote (for a PDF in the page given, as
pypdf extracts it; otherwise in the loaded document text, with the section heading present); the split
is by document (splits.json) and both splits hold every format and an unanswerable question.
"""

from __future__ import annotations

import json
import re
import string
import sys
import unicodedata
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent
CORPUS = ROOT / "corpus"
REPO = ROOT.parent.parent
if str(REPO) not in sys.path:  # run as a script from anywhere: the project's packages are importable
    sys.path.insert(0, str(REPO))

FORMATS = {".pdf": "pdf", ".html": "html", ".htm": "html", ".docx": "docx", ".md": "md/txt", ".txt": "md/txt"}
MIN_FORMAT = {"pdf": 9, "html": 9, "docx": 6, "md/txt": 6}
MIN_DOCS, MIN_TOOLS, MIN_WORDS = 28, 12, 300
MIN_QUESTIONS, MIN_UNANSWERABLE_SHARE, MIN_QUESTIONS_PER_DOC = 130, 0.15, 2
UNKNOWN = ["I don't know"]

try:  # the evaluation's own normalisation, so that "alias found" means what the metric means
    from optimize.metrics import normalize_answer
except ImportError:  # pragma: no cover - same rule, for a checkout without the package importable
    _ARTICLES = re.compile(r"\b(a|an|the)\b")
    _PUNCT = str.maketrans({c: " " for c in string.punctuation if c not in "%"})

    def normalize_answer(text: str) -> str:
        text = re.sub(r"(?<=\d)[,\u202f\u00a0](?=\d{3}\b)", "", text)
        text = unicodedata.normalize("NFKC", text).lower().replace("\u2019", "'")
        return " ".join(_ARTICLES.sub(" ", text.translate(_PUNCT)).split())


_QUOTES = str.maketrans(
    {
        "\u2018": "'",
        "\u2019": "'",
        "\u201c": '"',
        "\u201d": '"',
        "\u00b4": "'",
        "\u2010": "-",
        "\u2011": "-",
        "\u2212": "-",
        "\u00ad": "",
    }
)


def _plain(text: str) -> str:
    """NFKC (ligatures), ASCII quotes and hyphens, markdown escapes dropped."""
    text = unicodedata.normalize("NFKC", text).translate(_QUOTES)
    return re.sub(r"\\([\\`*_{}\[\]()#+\-.!<>|])", r"\1", text)


def variants(text: str) -> list[str]:
    """The forms a text is searched in: whitespace collapsed, with a word hyphenated across a line break
    joined (both without and with its hyphen), each lower-cased and also with punctuation removed."""
    text = _plain(text)
    joined = re.sub(r"(\w)-[ \t]*\n\s*(\w)", r"\1\2", text)
    kept = re.sub(r"(\w)-[ \t]*\n\s*(\w)", r"\1-\2", text)
    out = []
    for t in (text, joined, kept):
        out.append(" ".join(t.lower().split()))
        out.append(normalize_answer(t))
    return out


def contains(haystack_variants: list[str], needle: str) -> bool:
    """``needle`` (normalised the same two ways) occurs in one of ``haystack_variants``."""
    needle = _plain(needle)
    forms = {" ".join(needle.lower().split()), normalize_answer(needle)} - {""}
    return any(f in h for f in forms for h in haystack_variants)


def alias_found(haystack_variants: list[str], alias: str) -> bool:
    """An alias counts as found when its normalised form occurs as whole words (the metric's rule)."""
    gold = normalize_answer(_plain(alias))
    return bool(gold) and any(f" {gold} " in f" {h} " for h in haystack_variants[1::2])


@cache
def doc_text(doc_id: str) -> str:
    from crag_dspy.loaders import load_document

    return load_document(CORPUS / doc_id, doc_id=doc_id).text


@cache
def pdf_pages(doc_id: str) -> tuple[str, ...]:
    import pypdf

    return tuple((p.extract_text() or "") for p in pypdf.PdfReader(CORPUS / doc_id).pages)


@cache
def _variants_of(doc_id: str, page: int | None) -> list[str]:
    return variants(pdf_pages(doc_id)[page - 1] if page else doc_text(doc_id))


def fmt(doc_id: str) -> str:
    return FORMATS.get(Path(doc_id).suffix.lower(), "other")


def corpus_files() -> list[str]:
    return sorted(
        str(p.relative_to(CORPUS))
        for p in CORPUS.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(CORPUS).parts)
    )


def read_sources() -> dict[str, dict[str, str]]:
    """SOURCES.md's table: file id -> its row (columns by header name, lower case)."""
    rows, header = {}, None
    for line in (ROOT / "SOURCES.md").read_text(encoding="utf-8").splitlines():
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header = [c.lower() for c in cells]
            continue
        if set("".join(cells)) <= set("-: "):
            continue
        row = dict(zip(header, cells))
        rows[row["file"].strip("`")] = row
    return rows


def read_qa() -> list[dict]:
    lines = (ROOT / "qa.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


@dataclass
class Report:
    failures: list[str] = field(default_factory=list)
    table: str = ""

    def fail(self, message: str) -> None:
        self.failures.append(message)


def check(load_words: bool = True) -> Report:
    """Every rule; the returned report lists what fails (empty: the benchmark holds)."""
    r = Report()
    docs = corpus_files()
    splits: dict[str, str] = json.loads((ROOT / "splits.json").read_text(encoding="utf-8"))
    sources = read_sources()

    # corpus: formats, loading, size
    for d in docs:
        if fmt(d) == "other":
            r.fail(f"{d}: not a PDF, HTML, DOCX, Markdown or text file")
        if load_words:
            try:
                words = len(doc_text(d).split())
            except Exception as exc:  # noqa: BLE001 - any loader error is a failure to report
                r.fail(f"{d}: load_document fails: {exc}")
                continue
            if words < MIN_WORDS:
                r.fail(f"{d}: {words} words < {MIN_WORDS}")
    by_format = Counter(fmt(d) for d in docs)
    if len(docs) < MIN_DOCS:
        r.fail(f"{len(docs)} documents < {MIN_DOCS}")
    for name, least in MIN_FORMAT.items():
        if by_format[name] < least:
            r.fail(f"{by_format[name]} {name} documents < {least}")

    # SOURCES.md <-> corpus, tools
    for d in sorted(set(docs) - set(sources)):
        r.fail(f"{d}: not listed in SOURCES.md")
    for d in sorted(set(sources) - set(docs)):
        r.fail(f"SOURCES.md lists {d}, which is not in corpus/")
    tools = {row.get("tool", "").lower() for row in sources.values()} - {""}
    if len(tools) < MIN_TOOLS:
        r.fail(f"{len(tools)} tools in SOURCES.md < {MIN_TOOLS}")
    for d, row in sources.items():
        for col in ("tool", "package", "version", "path in package", "licence", "derivation"):
            if not row.get(col):
                r.fail(f"SOURCES.md row {d}: empty '{col}'")

    # splits.json <-> corpus
    for d in docs:
        if splits.get(d) not in ("val", "test"):
            r.fail(f"{d}: no split in splits.json")
    for d in set(splits) - set(docs):
        r.fail(f"splits.json names {d}, which is not in corpus/")

    # questions
    qa = read_qa()
    n, none = len(qa), [q for q in qa if q.get("kind") == "none"]
    if n < MIN_QUESTIONS:
        r.fail(f"{n} questions < {MIN_QUESTIONS}")
    if n and len(none) / n < MIN_UNANSWERABLE_SHARE:
        r.fail(f"{len(none)}/{n} unanswerable < {MIN_UNANSWERABLE_SHARE:.0%}")
    for key in ("id", "question"):
        for value, count in Counter(q.get(key) for q in qa).items():
            if count > 1:
                r.fail(f"{key} {value!r} used {count} times")
    per_doc: Counter[str] = Counter()
    split_formats: dict[str, set[str]] = defaultdict(set)
    split_none: Counter[str] = Counter()
    for d in docs:
        if splits.get(d):
            split_formats[splits[d]].add(fmt(d))
    for q in qa:
        qid = q.get("id", "?")
        if q.get("split") not in ("val", "test"):
            r.fail(f"{qid}: split {q.get('split')!r} is not val or test")
        if not q.get("question") or not q.get("answers"):
            r.fail(f"{qid}: empty question or answers")
            continue
        if q.get("kind") == "none":
            split_none[q.get("split")] += 1
            if q["answers"] != UNKNOWN:
                r.fail(f"{qid}: unanswerable but answers {q['answers']!r} != {UNKNOWN!r}")
            if q.get("evidence"):
                r.fail(f"{qid}: unanswerable with evidence")
            continue
        if q.get("kind") != "kb":
            r.fail(f"{qid}: kind {q.get('kind')!r} is neither 'kb' nor 'none'")
        if any(normalize_answer(a) in ("i don't know", "i do not know") for a in q["answers"]):
            r.fail(f"{qid}: answerable question with an 'I don't know' alias")
        evidence = q.get("evidence") or []
        if not evidence:
            r.fail(f"{qid}: answerable without evidence")
        ev_splits = set()
        for ev in evidence:
            d = ev.get("doc_id")
            if d not in docs:
                r.fail(f"{qid}: evidence doc_id {d!r} is not in corpus/")
                continue
            per_doc[d] += 1
            ev_splits.add(splits.get(d))
            page = ev.get("page")
            if fmt(d) == "pdf":
                pages = len(pdf_pages(d))
                if not isinstance(page, int) or not 1 <= page <= pages:
                    r.fail(f"{qid}: {d} page {page!r} not in 1..{pages}")
                    continue
                if "section" in ev:
                    r.fail(f"{qid}: a PDF's evidence takes 'page', not 'section'")
                where = f"{d} page {page}"
            else:
                if page is not None:
                    r.fail(f"{qid}: 'page' given for non-PDF {d}")
                    page = None
                where = d
                section = ev.get("section")
                if section is not None and not contains(_variants_of(d, None), section):
                    r.fail(f"{qid}: section {section!r} not found in {d}")
            hay = _variants_of(d, page)
            if not any(alias_found(hay, a) for a in q["answers"]):
                r.fail(f"{qid}: no alias of {q['answers']!r} found in {where}")
            quote = ev.get("quote")
            if not quote:
                r.fail(f"{qid}: evidence without a quote")
            elif not contains(hay, quote):
                r.fail(f"{qid}: quote {quote!r} not found in {where}")
        if len(ev_splits) > 1:
            r.fail(f"{qid}: evidence spans documents of splits {sorted(ev_splits)}")
        elif ev_splits and q.get("split") not in ev_splits:
            r.fail(f"{qid}: split {q.get('split')!r} but its evidence is in {ev_splits.pop()!r}")
    for d in docs:
        if per_doc[d] < MIN_QUESTIONS_PER_DOC:
            r.fail(f"{d}: {per_doc[d]} questions < {MIN_QUESTIONS_PER_DOC}")
    for split in ("val", "test"):
        missing = set(MIN_FORMAT) - split_formats[split]
        if missing:
            r.fail(f"split {split} has no document of format(s) {sorted(missing)}")
        if not split_none[split]:
            r.fail(f"split {split} has no unanswerable question")

    r.table = summary(docs, splits, qa, tools)
    return r


def summary(docs: list[str], splits: dict[str, str], qa: list[dict], tools: set[str]) -> str:
    lines = [f"{'':12}{'val':>6}{'test':>6}{'all':>6}"]
    for name in MIN_FORMAT:
        counts = [sum(1 for d in docs if fmt(d) == name and splits.get(d) == s) for s in ("val", "test")]
        lines.append(f"{name + ' docs':12}{counts[0]:>6}{counts[1]:>6}{sum(counts):>6}")
    counts = [sum(1 for d in docs if splits.get(d) == s) for s in ("val", "test")]
    lines.append(f"{'documents':12}{counts[0]:>6}{counts[1]:>6}{len(docs):>6}")
    for label, kinds in (("answerable", {"kb"}), ("unanswerable", {"none"})):
        counts = [
            sum(1 for q in qa if q.get("kind") in kinds and q.get("split") == s) for s in ("val", "test")
        ]
        lines.append(f"{label:12}{counts[0]:>6}{counts[1]:>6}{sum(counts):>6}")
    lines.append(
        f"{'questions':12}{sum(q.get('split') == 'val' for q in qa):>6}"
        f"{sum(q.get('split') == 'test' for q in qa):>6}{len(qa):>6}"
    )
    lines.append(f"tools: {len(tools)}; corpus words: {sum(len(doc_text(d).split()) for d in docs)}")
    return "\n".join(lines)


def main() -> int:
    report = check()
    print(report.table)
    if report.failures:
        print(f"\n{len(report.failures)} failure(s):")
        for failure in report.failures:
            print(f"  - {failure}")
        return 1
    print("\nowndocs benchmark: all checks pass")
    return 0


if __name__ == "__main__":
    sys.exit(main())
