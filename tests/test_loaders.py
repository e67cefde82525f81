"""Corpus folders of PDF, HTML, DOCX and Markdown: each format's reader, the skip of an unreadable file,
and a question only the PDF answers, on the real embeddings and an embedded Chroma (scripted LM)."""

import os
import shutil
import sys
from pathlib import Path

import pytest
from fakes import ScriptedLM, field

from crag_dspy import loaders
from crag_dspy.cli import main
from crag_dspy.domain import DomainDataError, load_domain
from crag_dspy.loaders import SUFFIXES, MissingExtraError, UnreadableDocumentError, load_document, load_folder

PDF = Path(__file__).parent / "fixtures" / "ferry-handbook.pdf"  # tests/fixtures/make_pdf.py
PDF_FACT = "23:40 from pier four"  # only the PDF says when the night crossing leaves

HTML = """<!doctype html><html><head><title>Tickets | Harbour Ferry Authority</title></head><body>
<header><nav><a href="/">Home</a> <a href="/routes">Routes</a> <a href="/contact">Contact us</a></nav></header>
<div class="cookie-banner">We use cookies to improve your experience. Accept all cookies?</div>
<main><article><h1>Tickets and fares</h1>
<p>Season tickets cost 310 velds a year and are sold at every pier office and on board.</p>
<p>Children under twelve travel free when an adult holding a season ticket accompanies them.</p>
<p>A single crossing costs 4 velds; a day pass for every route costs 11 velds.</p>
</article></main>
<footer><p>Copyright 2026 Harbour Ferry Authority. All rights reserved.</p><a href="/privacy">Privacy policy</a></footer>
</body></html>"""


def write_docx(path: Path) -> None:
    import docx

    document = docx.Document()
    document.core_properties.title = "Ferry Staff Rules"
    document.add_heading("Ferry Staff Rules", level=1)
    document.add_paragraph("Deck crews work shifts of eight hours and rest for twelve between shifts.")
    table = document.add_table(rows=2, cols=2)
    table.cell(0, 0).text, table.cell(0, 1).text = "Rank", "Annual leave"
    table.cell(1, 0).text, table.cell(1, 1).text = "Deckhand", "27 days"
    document.save(str(path))


@pytest.fixture
def domain(tmp_path) -> Path:
    """A domain whose corpus/ folder holds one document of each format."""
    corpus = tmp_path / "ferries" / "corpus"
    corpus.mkdir(parents=True)
    shutil.copy(PDF, corpus / "handbook.pdf")
    (corpus / "pages").mkdir()
    (corpus / "pages" / "tickets.html").write_text(HTML, encoding="utf-8")
    write_docx(corpus / "staff-rules.docx")
    (corpus / "piers.md").write_text(
        "# Piers\n\nPier four has a waiting room and a kiosk.\n\nPier two is closed in winter.\n",
        encoding="utf-8",
    )
    return tmp_path / "ferries"


def test_each_format_keeps_its_title_its_paragraphs_and_its_source(domain):
    docs = {d.id: d for d in load_domain(domain).corpus}
    assert sorted(docs) == ["handbook.pdf", "pages/tickets.html", "piers.md", "staff-rules.docx"]

    pdf = docs["handbook.pdf"]
    assert pdf.title == "Harbour Ferry Handbook"  # the PDF's metadata
    assert pdf.source == str(domain / "corpus" / "handbook.pdf")
    assert "Velm Island leaves at\n23:40 from pier four" in pdf.text  # a wrapped line stays one paragraph
    assert "Lost property" in pdf.text.split("\n\n")[1]  # the second page is its own paragraph

    html = docs["pages/tickets.html"]
    assert html.title == "Tickets and fares"
    assert "Season tickets cost 310 velds" in html.text and "day pass" in html.text
    for boilerplate in ("Contact us", "cookies", "Copyright", "Privacy policy"):
        assert boilerplate not in html.text, boilerplate
    assert len(html.text.split("\n\n")) >= 3  # paragraphs kept apart

    docx = docs["staff-rules.docx"]
    assert docx.title == "Ferry Staff Rules"
    assert "Deck crews work shifts" in docx.text and "Deckhand | 27 days" in docx.text  # tables kept

    md = docs["piers.md"]  # read as the corpus folder always read it: first line is the title
    assert (md.title, md.text) == (
        "Piers",
        "# Piers\n\nPier four has a waiting room and a kiosk.\n\nPier two is closed in winter.",
    )


def test_a_title_falls_back_to_the_file_name(tmp_path):
    import docx

    path = tmp_path / "untitled-note.docx"
    document = docx.Document()
    document.add_paragraph("No heading and no title in the properties.")
    document.save(str(path))
    assert load_document(path).title == "untitled-note"


def test_docx_tables_show_merged_cells_once_per_row_in_linear_work(tmp_path):
    # Probe 6: python-docx's row.cells finds a vertical merge's top cell by recursing one row up at a time,
    # so a 2 KB file of 900-row merged columns took 100 s and 3000 rows raised RecursionError. Here the
    # recursion limit is 150 frames above this one, and a merge of 400 rows is read all the same.
    import inspect
    import sys

    import docx
    from docx.table import _Cell

    document = docx.Document()
    document.add_paragraph("Shift rota")
    table = document.add_table(rows=400, cols=3)
    for number, row in enumerate(table.rows):
        merged, day, start = row._tr.tc_lst
        merged.vMerge = "restart" if number == 0 else "continue"
        _Cell(day, table).text, _Cell(start, table).text = f"day {number}", "06:00"
    _Cell(table.rows[0]._tr.tc_lst[0], table).text = "Deck crew"
    wide = document.add_table(rows=1, cols=3)
    spanned, covered, last = wide.rows[0]._tr.tc_lst
    spanned.grid_span = 2  # one cell over two grid columns
    spanned.getparent().remove(covered)
    _Cell(spanned, wide).text, _Cell(last, wide).text = "Spanned", "end"
    document.save(tmp_path / "rota.docx")
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(len(inspect.stack()) + 150)
    try:
        text = load_document(tmp_path / "rota.docx").text
    finally:
        sys.setrecursionlimit(limit)
    rows = text.split("\n\n")
    assert rows[1] == "Deck crew | day 0 | 06:00" and rows[400] == "Deck crew | day 399 | 06:00"
    assert rows[401] == "Spanned | end"


def test_a_docx_merge_repeating_its_text_past_the_limit_is_skipped_by_name(tmp_path):
    # A vertical merge shows its first cell's text in every row it covers: 100 KB of text merged down 200
    # rows would be 20 MB of text from a file of a few KB. With a 1 MB limit it is skipped by name.
    import docx
    from docx.table import _Cell

    document = docx.Document()
    table = document.add_table(rows=200, cols=1)
    for number, row in enumerate(table.rows):
        (cell,) = row._tr.tc_lst
        cell.vMerge = "restart" if number == 0 else "continue"
    _Cell(table.rows[0]._tr.tc_lst[0], table).text = "pump " * 20_000
    document.save(tmp_path / "merged.docx")
    assert (tmp_path / "merged.docx").stat().st_size < 50_000
    with pytest.raises(UnreadableDocumentError, match=r"merged.docx: its text would be longer than 0.95 MB"):
        load_document(tmp_path / "merged.docx", max_bytes=1_000_000)


def test_a_docx_without_document_properties_is_titled_by_its_file_name(tmp_path):
    # Probe 8: python-docx makes up properties titled "Word Document" for a file without docProps/core.xml,
    # and every such file had that title instead of its name.
    import io
    import re
    import zipfile

    import docx

    document = docx.Document()
    document.add_paragraph("The pump moves 42 velds.")
    made = io.BytesIO()
    document.save(made)
    with zipfile.ZipFile(made) as source, zipfile.ZipFile(tmp_path / "pump-notes.docx", "w") as target:
        for info in source.infolist():
            data = source.read(info.filename)
            if info.filename == "_rels/.rels":
                data = re.sub(rb"<Relationship [^>]*core-properties[^>]*/>", b"", data)
            if info.filename != "docProps/core.xml":
                target.writestr(info, data)
    assert load_document(tmp_path / "pump-notes.docx").title == "pump-notes"


def test_a_docx_without_a_default_paragraph_style_is_read(tmp_path):
    import re
    import zipfile

    import docx

    styled = tmp_path / "styled.docx"
    document = docx.Document()
    document.add_paragraph("Pier four opens at 06:10 on weekdays.")
    document.save(str(styled))
    path = tmp_path / "converted-note.docx"
    with zipfile.ZipFile(styled) as source, zipfile.ZipFile(path, "w") as target:
        for item in source.infolist():
            data = source.read(item.filename)
            if item.filename == "word/styles.xml":
                data = re.sub(rb' w:default="1"', b"", data)
            target.writestr(item, data)
    assert docx.Document(str(path)).paragraphs[0].style is None  # what the reader has to cope with
    doc = load_document(path)
    assert doc.title == "converted-note" and doc.text == "Pier four opens at 06:10 on weekdays."


def test_docx_text_in_content_controls_tracked_changes_fields_and_text_boxes_is_read_once(tmp_path):
    # Probe 8 F3: python-docx reads only the body's direct paragraphs and tables, and a paragraph's direct
    # runs and hyperlinks: text in content controls, tracked insertions, fields, smart tags, custom XML and
    # text boxes was dropped while the file counted as read. Deleted text and the VML copy Word writes of
    # each DrawingML text box (mc:Fallback) are still not read.
    import docx
    from docx.oxml import parse_xml

    ns = (
        'xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main" '
        'xmlns:mc="http://schemas.openxmlformats.org/markup-compatibility/2006"'
    )

    def run(text: str) -> str:
        return f'<w:r><w:t xml:space="preserve">{text}</w:t></w:r>'

    def box(text: str) -> str:
        return f"<w:txbxContent><w:p>{run(text)}</w:p></w:txbxContent>"

    change = 'w:author="a" w:date="2026-01-01T00:00:00Z"'
    body = (
        f'<w:sdt><w:sdtPr/><w:sdtContent><w:p><w:pPr><w:pStyle w:val="Heading1"/></w:pPr>'
        f"{run('Pump rules')}</w:p></w:sdtContent></w:sdt>"
        f'<w:p>{run("The warranty is ")}<w:ins w:id="1" {change}>{run("5 years.")}</w:ins>'
        f'<w:del w:id="2" {change}><w:r><w:delText>2 years.</w:delText></w:r></w:del></w:p>'
        f"<w:p><w:sdt><w:sdtPr/><w:sdtContent>{run('The price is 300 velds.')}</w:sdtContent></w:sdt></w:p>"
        f'<w:p>{run("Page ")}<w:fldSimple w:instr="PAGE">{run("77")}</w:fldSimple></w:p>'
        f'<w:p><w:smartTag w:uri="x" w:element="y">{run("The pump is blue.")}</w:smartTag></w:p>'
        f'<w:customXml w:element="z"><w:p><w:customXml w:element="q">{run("It is quiet.")}</w:customXml>'
        "</w:p></w:customXml>"
        f"<w:tbl><w:tr><w:tc><w:p>{run('Pressure')}</w:p></w:tc><w:tc><w:p>{run('5 bar')}</w:p><w:sdt>"
        f"<w:sdtContent><w:p>{run('6 bar at peak')}</w:p></w:sdtContent></w:sdt></w:tc></w:tr></w:tbl>"
        f'<w:p>{run("See the box.")}<w:r><mc:AlternateContent><mc:Choice Requires="wps"><w:drawing>'
        f"{box('Maximum depth 60 m.')}</w:drawing></mc:Choice><mc:Fallback><w:pict>{box('Maximum depth 60 m.')}"
        "</w:pict></mc:Fallback></mc:AlternateContent></w:r></w:p>"
    )
    document = docx.Document()
    for element in list(parse_xml(f"<w:body {ns}>{body}</w:body>")):
        document.element.body.sectPr.addprevious(element)
    document.save(str(tmp_path / "form.docx"))
    doc = load_document(tmp_path / "form.docx")
    assert doc.title == "Pump rules"  # the heading's style is read inside the content control too
    assert doc.text == (
        "Pump rules\n\nThe warranty is 5 years.\n\nThe price is 300 velds.\n\nPage 77\n\nThe pump is blue."
        "\n\nIt is quiet.\n\nPressure | 5 bar\n6 bar at peak\n\nSee the box.\n\nMaximum depth 60 m."
    )


def test_a_corrupt_pdf_is_named_and_skipped_and_the_ingest_goes_on_and_stays_idempotent(
    domain, tmp_path, capsys
):
    broken = domain / "corpus" / "broken.pdf"
    broken.write_bytes(b"%PDF-1.4\n1 0 obj <<garbage" + bytes(range(256)))
    with pytest.raises(UnreadableDocumentError, match="broken.pdf: cannot read .pdf"):
        load_document(broken)

    argv = ["ingest", str(domain), "--chroma-path", str(tmp_path / "chroma")]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "ferries__kb: 4 documents" in out and "0 unchanged" in out
    assert out.rstrip().splitlines()[-2:] == [
        "skipped 1 unreadable file(s):",
        f"  {broken}: cannot read .pdf (PdfStreamError: Stream has ended unexpectedly)",
    ]
    assert main(argv) == 0  # the rerun changes nothing: chunk ids do not depend on the skipped file
    assert "4 documents" in (out := capsys.readouterr().out) and "(0 added" in out and "0 removed" in out


def test_a_pdf_with_no_text_is_skipped_as_probably_scanned(tmp_path):
    from pypdf import PdfWriter

    writer = PdfWriter()
    writer.add_blank_page(width=200, height=200)
    with open(tmp_path / "scan.pdf", "wb") as f:
        writer.write(f)
    with pytest.raises(UnreadableDocumentError, match=r"scan.pdf: no text found \(a scanned PDF needs OCR"):
        load_document(tmp_path / "scan.pdf")


def test_a_corpus_with_nothing_readable_says_why_for_each_file(tmp_path):
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.docx").write_bytes(b"not a zip file")
    with pytest.raises(DomainDataError) as info:
        load_domain(tmp_path)
    message = str(info.value)
    assert (
        "the corpus is empty; every file was unreadable" in message and "a.docx: cannot read .docx" in message
    )


def test_a_file_no_reader_reads_or_an_empty_file_is_named_and_hidden_files_are_passed_over(tmp_path):
    corpus = tmp_path / "corpus"
    (corpus / ".git").mkdir(parents=True)
    (corpus / "pumps.md").write_text("# Pumps\n\nThe P-40 pump moves 40 litres per minute.\n")
    (corpus / "prices.xlsx").write_bytes(b"PK\x03\x04 a spreadsheet")
    (corpus / "empty.md").write_text("")
    (corpus / ".DS_Store").write_bytes(b"\x00\x01")
    (corpus / ".git" / "config").write_text("[core]\n")
    loaded = load_folder(corpus)
    assert [d.id for d in loaded.docs] == ["pumps.md"]
    # An empty file is listed too: a document the user put there and that is not read is never silent.
    assert loaded.skipped == [
        f"{corpus / 'empty.md'}: no text found (an empty file)",
        f"{corpus / 'prices.xlsx'}: unsupported file type (supported: {', '.join(SUFFIXES)})",
    ]


def test_a_text_file_with_a_utf8_byte_order_mark_is_read_without_it(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "pumps.md").write_bytes("\ufeff# Pumps\n\nThe P-40 pump moves 40 litres per minute.\n".encode())
    (corpus / "notes.txt").write_bytes(b"\xef\xbb\xbfPump notes\nThe P-40 needs oil every month.\n")
    loaded = load_folder(corpus)
    assert loaded.skipped == []
    assert [(d.title, d.text[:1]) for d in loaded.docs] == [("Pump notes", "P"), ("Pumps", "#")]


def test_links_that_leave_the_corpus_folder_are_skipped_and_named(tmp_path):
    # Domain folders come from uploads and archives: a link to /etc/passwd must not become a document.
    outside = tmp_path / "secret.txt"
    outside.write_text("Secret\nThe root password is hunter2.\n")
    (tmp_path / "private").mkdir()
    (tmp_path / "private" / "keys.md").write_text("# Keys\n\nThe vault key is 1234.\n")
    corpus = tmp_path / "domain" / "corpus"
    (corpus / "sub").mkdir(parents=True)
    (corpus / "pumps.md").write_text("# Pumps\n\nThe P-40 pump moves 40 litres per minute.\n")
    (corpus / "passwd.txt").symlink_to(outside)
    (corpus / "sub" / "up.md").symlink_to(Path("..") / ".." / ".." / "private" / "keys.md")
    (corpus / "private").symlink_to(tmp_path / "private", target_is_directory=True)
    (corpus / "alias.md").symlink_to(corpus / "pumps.md")  # inside the folder: read as any file
    loaded = load_folder(corpus)
    assert [d.id for d in loaded.docs] == ["alias.md", "pumps.md"]
    leaving = [
        (corpus / "passwd.txt", "file", outside),
        (corpus / "private", "folder", tmp_path / "private"),
        (corpus / "sub" / "up.md", "file", tmp_path / "private" / "keys.md"),
    ]
    assert loaded.skipped == [
        f"{link}: a link to a {kind} outside the corpus folder ({target}): not read"
        for link, kind, target in leaving
    ]
    assert not any("hunter2" in d.text or "vault" in d.text for d in loaded.docs)


def test_a_hard_link_is_skipped_and_named_wherever_its_other_name_is(tmp_path):
    # No path check sees a hard link: "ln ../secret.txt corpus/hard.txt" made the secret a document.
    outside = tmp_path / "secret.txt"
    outside.write_text("Secret\nThe root password is hunter2.\n")
    corpus = tmp_path / "domain" / "corpus"
    corpus.mkdir(parents=True)
    (corpus / "pumps.md").write_text("# Pumps\n\nThe P-40 pump moves 40 litres per minute.\n")
    os.link(outside, corpus / "hard.txt")
    loaded = load_folder(corpus)
    assert [d.id for d in loaded.docs] == ["pumps.md"]
    why = "a hard link (the file has 2 names, any of them maybe outside the corpus folder): not read"
    assert loaded.skipped == [
        f"{corpus / 'hard.txt'}: {why}; copy the file into the folder instead of linking it"
    ]


def test_a_file_name_that_is_not_utf8_is_skipped_by_name_and_the_rest_is_ingested(tmp_path, capsys):
    # Zips from legacy systems hold such names; one of them stopped the whole ingest ("surrogates not
    # allowed") and no file was stored.
    corpus = tmp_path / "legacy" / "corpus"
    corpus.mkdir(parents=True)
    (corpus / "good.txt").write_text("Good\n\nThe P-40 pump moves 40 litres per minute.\n")
    bad = os.fsencode(corpus) + b"/bad\xff\xfename.txt"
    Path(os.fsdecode(bad)).write_text("Bad\n\nNot read.\n")
    (corpus / "sub\udcff").mkdir()  # a folder of that kind: its files are skipped, each by name
    (corpus / "sub\udcff" / "inner.txt").write_text("Inner\n\nNot read either.\n")
    shown = f"{corpus}/bad\\xff\\xfename.txt: the file name is not valid UTF-8: not read; rename the file"
    domain = load_domain(corpus.parent)
    assert [d.id for d in domain.corpus] == ["good.txt"]
    assert domain.skipped[0] == shown and domain.skipped[1].startswith(f"{corpus}/sub\\xff/inner.txt: ")
    assert len(domain.source("kb").paths) == 1  # the fingerprint reads what the load reads
    assert main(["ingest", str(corpus.parent), "--chroma-path", str(tmp_path / "chroma")]) == 0
    out = capsys.readouterr().out
    assert "legacy__kb: 1 documents" in out and f"  {shown}" in out.splitlines()


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are POSIX")
def test_a_named_pipe_in_the_corpus_is_skipped_by_name_never_opened(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "pumps.md").write_text("# Pumps\n\nThe P-40 pump moves 40 litres per minute.\n")
    os.mkfifo(corpus / "pipe.txt")  # opened, it would block the load for ever
    loaded = load_folder(corpus)
    assert [d.id for d in loaded.docs] == ["pumps.md"]
    assert loaded.skipped == [f"{corpus / 'pipe.txt'}: not a regular file (a named pipe): not read"]


def test_a_missing_package_names_the_extra_and_stops_the_load(domain, monkeypatch):
    monkeypatch.setitem(sys.modules, "pypdf", None)  # import pypdf now raises ImportError
    with pytest.raises(
        MissingExtraError, match=r"needs the 'documents' extra \(.*pypdf.*\): pip install 'crag"
    ):
        load_domain(domain)  # not skipped: every PDF would fail the same way
    assert main(["ingest", str(domain), "--chroma-path", str(domain / "chroma")]) == 2


def _script(system: str, user: str):
    if "You judge search results" in system:
        return 0.9 if PDF_FACT in field(user, "document") else 0.05
    if "You judge short knowledge strips" in system:
        return 0.9 if PDF_FACT in field(user, "strip") else 0.05
    if "web search query" in system:
        return {"query": "night crossing Velm Island"}
    return {"answer": "23:40" if PDF_FACT in field(user, "context") else "I don't know"}


def test_a_question_only_the_pdf_answers_is_answered_from_the_pdf(domain, tmp_path):
    from crag_dspy.app import build_crag
    from crag_dspy.settings import Settings

    settings = Settings(domain_dir=domain, chroma_path=tmp_path / "chroma", web_search="none")
    lm = ScriptedLM(_script)
    crag = build_crag(settings, lm=lm, progress=False)  # ingests the folder: real embeddings and Chroma
    pred = crag(question="When does the night crossing to Velm Island leave?")

    trace = pred.trace
    assert pred.answer == "23:40" and pred.action == "CORRECT", trace.model_dump_json(indent=1)
    top = trace.documents[0]
    assert (top.doc_id, top.title) == ("handbook.pdf", "Harbour Ferry Handbook")  # retrieval found it
    assert PDF_FACT in trace.context  # the PDF's passage reached the answerer
    (context,) = [field(user, "context") for system, user in lm.calls if "Answer the question" in system]
    assert PDF_FACT in context
    # The answer is cited to the PDF's page, with the sentence that states it.
    (citation,) = pred.citations
    assert (citation.doc_id, citation.page, citation.label) == ("handbook.pdf", 1, "handbook.pdf, p. 1")
    assert PDF_FACT in citation.quote and citation.quote in trace.context
    assert top.doc_id == "handbook.pdf" and trace.internal_strips[0].page == 1
    from crag_dspy.cli import format_trace

    answer, cited = format_trace(trace).splitlines()[:2]  # `crag-dspy ask` prints the source under it
    assert answer == "answer: 23:40" and cited.startswith('  [1] handbook.pdf, p. 1: "The night crossing')


def test_a_pdf_is_read_page_by_page_and_each_chunk_keeps_its_page(tmp_path):
    from pypdf import PdfReader

    from crag_dspy.store import planned_chunks

    doc = load_document(PDF)
    pages = [(page.extract_text() or "").strip() for page in PdfReader(PDF).pages]
    assert [part.page for part in doc.parts] == [1, 2] and [part.text for part in doc.parts] == pages
    assert doc.text == "\n\n".join(pages)  # the text is the pages in order, as before
    chunks = planned_chunks([doc], chunk_words=120).values()
    by_page = {meta["page"] for _, _, meta in chunks}
    assert by_page == {1, 2}  # a chunk never spans two pages
    lost = next(meta for _, stored, meta in chunks if "Lost property" in stored)
    assert lost["page"] == 2 and "section" not in lost


def test_html_docx_and_markdown_sections_keep_their_heading_paths(tmp_path):
    import docx

    page = tmp_path / "guide.html"
    page.write_text(
        "<html><head><title>Tool guide</title></head><body><nav>Home</nav><main><h1>Tool guide</h1>"
        "<p>This guide explains the tool and how it is set up on a new machine by an administrator.</p>"
        "<h2>Options</h2><p>The --limit option caps connections at 412 unless it is set otherwise.</p>"
        "<h3>Cache</h3><p>The cache lives in /var/cache/tool and grows without bound unless pruned.</p>"
        "</main></body></html>",
        encoding="utf-8",
    )
    html = load_document(page)
    assert [p.section for p in html.parts] == [None, "Options", "Options > Cache"]  # the title is not a step
    assert "412" in html.parts[1].text and html.parts[1].page is None

    path = tmp_path / "rules.docx"
    document = docx.Document()
    document.core_properties.title = "Staff Rules"
    document.add_heading("Staff Rules", level=1)
    document.add_paragraph("These rules apply to every member of staff on every route.")
    document.add_heading("Leave", level=2)
    document.add_heading("Deckhands", level=3)  # no body of its own: it goes with the next one's
    document.add_paragraph("A deckhand has 27 days of annual leave.")
    document.save(str(path))
    rules = load_document(path)
    assert [(p.section, p.text.splitlines()[-1]) for p in rules.parts] == [
        (None, "These rules apply to every member of staff on every route."),
        ("Leave > Deckhands", "A deckhand has 27 days of annual leave."),
    ]

    note = tmp_path / "piers.md"
    note.write_text("# Piers\n\nPier four has a kiosk.\n\n## Winter\n\n```\n# not a heading\n```\n")
    assert [p.section for p in load_document(note).parts] == [None, "Winter"]
    plain = tmp_path / "plain.txt"
    plain.write_text("Plain notes\n\n# not a heading in a text file\n")
    assert load_document(plain).parts is None  # a text file is one part, chunked as before


def test_a_dependency_a_reader_imports_late_is_a_missing_extra_not_a_bad_file(domain, monkeypatch):
    def reader(path, raw, max_bytes):  # as trafilatura fails when justext cannot import lxml.html.clean
        raise ImportError("lxml.html.clean module is now a separate project lxml_html_clean")

    monkeypatch.setitem(loaders.SUFFIXES, ".html", reader)
    with pytest.raises(
        MissingExtraError,
        match=r"tickets.html: reading .html files needs the 'documents' "
        r"extra \(lxml.html.clean module is now .*\): pip install 'crag-dspy\[documents\]'",
    ):
        load_domain(domain)


def test_loading_the_embedding_model_prints_no_progress_bar_of_its_own(monkeypatch, capfd):
    # transformers' "Loading weights" bar broke into ingest's progress bar and every ask's output.
    from crag_dspy import embeddings

    monkeypatch.setattr(embeddings, "_MODELS", {})
    assert len(embeddings.Embedder().encode(["pump"])[0]) == 384
    assert "Loading weights" not in capfd.readouterr().err
    from transformers.utils import logging as hf_logging

    assert hf_logging.is_progress_bar_enabled()  # put back as it was


def write_bomb_docx(path: Path, spaces: int, declared: int | None = None) -> None:
    """A .docx whose word/document.xml is ``spaces`` spaces and one word, deflated to a few KB (a zip bomb
    in small). With ``declared`` its headers state that size instead, with the CRC of that many bytes, as
    a packer that lies about a part's size writes it: zipfile then checks nothing it would notice."""
    import struct
    import zipfile
    import zlib

    head = (
        b'<?xml version="1.0"?><w:document xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/'
        b'2006/main"><w:body><w:p><w:r><w:t>'
    )
    xml = head + b" " * spaces + b"x</w:t></w:r></w:p></w:body></w:document>"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(
            "[Content_Types].xml",
            '<?xml version="1.0"?><Types xmlns="http://schemas.openxmlformats.org/package/2006/'
            'content-types"><Default Extension="rels" ContentType="application/vnd.openxmlformats-'
            'package.relationships+xml"/><Override PartName="/word/document.xml" ContentType="application/'
            'vnd.openxmlformats-officedocument.wordprocessingml.document.main+xml"/></Types>',
        )
        archive.writestr(
            "_rels/.rels",
            '<?xml version="1.0"?><Relationships xmlns="http://schemas.openxmlformats.org/package/2006/'
            'relationships"><Relationship Id="rId1" Type="http://schemas.openxmlformats.org/officeDocument/'
            '2006/relationships/officeDocument" Target="word/document.xml"/></Relationships>',
        )
        archive.writestr("word/document.xml", xml)
    if declared is None:
        return
    raw = bytearray(path.read_bytes())
    fields = struct.pack("<L", zlib.crc32(xml[:declared]))
    with zipfile.ZipFile(path) as archive:
        part = archive.getinfo("word/document.xml")
    local = part.header_offset  # CRC at +14, sizes at +18 (compressed) and +22 (uncompressed)
    raw[local + 14 : local + 18], raw[local + 22 : local + 26] = fields, struct.pack("<L", declared)
    central = raw.rindex(b"word/document.xml") - 46  # its central directory entry: CRC +16, size +24
    raw[central + 16 : central + 20], raw[central + 24 : central + 28] = fields, struct.pack("<L", declared)
    path.write_bytes(bytes(raw))


def test_a_file_over_the_size_limit_and_a_docx_zip_bomb_are_skipped_by_name_and_the_rest_is_ingested(
    tmp_path, capsys, monkeypatch
):
    # Probe 3, H3: a 3 MB .docx unpacked to 3 GB, and a 5 GB sparse .txt was read whole; both filled
    # memory. Here the limit is 10 KB (CRAG_MAX_DOCUMENT_MB=0.01), so neither file needs to be large.
    corpus = tmp_path / "bombs" / "corpus"
    corpus.mkdir(parents=True)
    (corpus / "pumps.md").write_text("# Pumps\n\nThe P-40 pump moves 40 litres per minute.\n")
    with open(corpus / "big.txt", "wb") as big:
        os.truncate(big.fileno(), 20_000)  # sparse: no disk used
    write_bomb_docx(corpus / "bomb.docx", spaces=3 * 2**20)
    assert (corpus / "bomb.docx").stat().st_size < 5_000  # small on disk, 3 MB unpacked
    monkeypatch.setenv("CRAG_MAX_DOCUMENT_MB", "0.01")
    hashed = []
    monkeypatch.setattr("crag_dspy.domain._sha256", lambda p: hashed.append(p.name) or "hash")
    assert main(["ingest", str(corpus.parent), "--chroma-path", str(tmp_path / "chroma")]) == 0
    out = capsys.readouterr().out
    assert "bombs__kb: 1 documents" in out
    limit = "(setting CRAG_MAX_DOCUMENT_MB"
    assert out.rstrip().splitlines()[-3:] == [
        "skipped 2 unreadable file(s):",
        f"  {corpus / 'big.txt'}: corpus file is larger than 10485 bytes {limit}: 0.01 MB; not read)",
        f"  {corpus / 'bomb.docx'}: its parts would unpack to more than 0.01 MB {limit}): not read",
    ]
    assert "big.txt" not in hashed  # a file that is not read is not hashed for the store's fingerprint either


def test_the_default_size_limit_is_checked_before_a_byte_is_read_and_is_a_finite_setting(tmp_path):
    from pydantic import ValidationError

    from crag_dspy.settings import Settings

    big = tmp_path / "big.txt"
    with open(big, "wb") as file:
        os.truncate(file.fileno(), 64 * 2**20)  # sparse, over the 50 MB default
    with pytest.raises(UnreadableDocumentError, match=r"big.txt: corpus file is larger than 52428800 bytes"):
        load_document(big)
    assert Settings().max_document_bytes == 50 * 2**20
    for bad in (0, -1, float("inf"), float("nan")):
        with pytest.raises(ValidationError, match="max_document_mb"):
            Settings(max_document_mb=bad)


def test_a_docx_part_that_unpacks_to_more_than_it_declares_is_skipped(tmp_path):
    # zipfile trusts a part's declared size: it inflates the whole stream at once and cuts the output
    # there, so a part declaring 100 bytes (with the CRC of those 100) could still unpack to gigabytes.
    write_bomb_docx(tmp_path / "liar.docx", spaces=2**20, declared=100)
    with pytest.raises(
        UnreadableDocumentError, match=r"liar.docx: part 'word/document.xml' unpacks to more than "
    ):
        load_document(tmp_path / "liar.docx")
    write_bomb_docx(tmp_path / "honest.docx", spaces=1000)  # within the limit: read as any .docx
    assert load_document(tmp_path / "honest.docx").text == "x"


def test_a_text_of_one_long_line_is_chunked_with_a_short_title_in_linear_work(tmp_path):
    # Probe 4, H1: a .txt file's title is its first line, and every chunk carried it in its metadata and
    # id hash: a 3 MB one-line file grew to 5.5 GB of memory. Titles and heading names are now cut.
    from crag_dspy.store import planned_chunks

    line = "zorblax " * 40_000  # 320 KB, no line break
    (tmp_path / "line.txt").write_text(line)
    (tmp_path / "heading.md").write_text(f"# Manual\n\n## {line}\n\nThe pump moves 42 velds.\n")
    docs = load_folder(tmp_path).docs
    line_doc, heading_doc = sorted(docs, key=lambda d: d.id != "line.txt")
    cut = " ".join(["zorblax"] * 24) + "…"  # at most 200 characters, at a word boundary
    assert line_doc.title == cut
    planned = planned_chunks(docs, 120)
    assert len(planned) > 300
    for embedded, _, metadata in planned.values():
        assert len(metadata["title"]) <= 200 and len(metadata.get("section", "")) <= 200
        assert len(embedded) < 5_000  # the chunk's heading is the bounded title, not the whole line
    sections = {meta.get("section") for _, _, meta in planned.values() if meta["doc_id"] == heading_doc.id}
    assert sections == {cut}  # the long heading is cut as the title is


def test_a_text_file_holding_nul_bytes_is_skipped_as_not_text(tmp_path):
    # Probe 4, H1: a 49 MB all-NUL .txt (valid UTF-8) was one 49 MB "line" of title; no text file holds NUL.
    (tmp_path / "zeros.txt").write_bytes(b"\x00" * 100_000)
    (tmp_path / "ok.txt").write_text("Pumps\n\nThe pump moves 42 velds.\n")
    folder = load_folder(tmp_path)
    assert [d.id for d in folder.docs] == ["ok.txt"]
    assert folder.skipped == [
        f"{tmp_path / 'zeros.txt'}: not text (it holds NUL bytes: a binary or UTF-16 file?): not read"
    ]


def write_pdf(path: Path, objects: list[bytes]) -> None:
    """A PDF of ``objects`` (object 1 the catalog), numbered from 1, with their cross-reference table."""
    out, offsets = b"%PDF-1.4\n", []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    xref += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    trailer = b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, len(out))
    path.write_bytes(out + xref + trailer)


def write_shared_stream_pdf(path: Path, pages: int, padding: int) -> None:
    """A PDF of ``pages`` pages that all draw one content stream: "Hello pump" and ``padding`` bytes of
    empty text objects, deflated (probe 4's gen/mkpdf2.py)."""
    import zlib

    content = zlib.compress(b"BT /F1 12 Tf (Hello pump) Tj ET\n" + b"BT ET\n" * (padding // 6), 9)
    font = b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"
    page = b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 3 0 R "
    page += b"/Resources << /Font << /F1 4 0 R >> >> >>"
    kids = " ".join(f"{5 + i} 0 R" for i in range(pages))
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        f"<< /Type /Pages /Kids [{kids}] /Count {pages} >>".encode(),
        b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(content) + content + b"\nendstream",
        font,
        *[page] * pages,
    ]
    write_pdf(path, objects)


def test_a_pdf_whose_pages_content_is_over_the_limit_is_skipped_before_text_is_extracted(
    tmp_path, monkeypatch
):
    # Probe 4, H2: 2000 pages sharing one 1.8 MB stream of operators with no text (a 317 KB file) cost
    # about an hour of pypdf's CPU; no text came out, so the text limit never applied. Here the limit
    # is 10 KB and the stream 2 KB: one page is read, twenty (40 KB of content to parse) are not.
    write_shared_stream_pdf(tmp_path / "one.pdf", pages=1, padding=2_000)
    assert load_document(tmp_path / "one.pdf", max_bytes=10_000).text == "Hello pump"
    write_shared_stream_pdf(tmp_path / "many.pdf", pages=20, padding=2_000)
    assert (tmp_path / "many.pdf").stat().st_size < 10_000  # the file itself is under the limit
    extracted = []
    monkeypatch.setattr("pypdf.PageObject.extract_text", lambda page, *a, **k: extracted.append(page) or "")
    with pytest.raises(
        UnreadableDocumentError,
        match=r"many.pdf: its pages' content would be more than 0.01 MB \(setting CRAG_MAX_DOCUMENT_MB\)",
    ):
        load_document(tmp_path / "many.pdf", max_bytes=10_000)
    assert extracted == []  # refused before any page was parsed for its text


def write_form_pdf(path: Path, draws: int, operators: int) -> None:
    """A one-page PDF whose few bytes of page content draw one form XObject ``draws`` times; the form
    shows "Hello pump" and ``operators`` empty text operators."""
    form = b"BT /F1 12 Tf (Hello pump) Tj " + b"() Tj " * operators + b"ET"
    page = b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 5 0 R "
    page += b"/Resources << /Font << /F1 4 0 R >> /XObject << /X0 6 0 R >> >> >>"
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        page,
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
        b"<< /Length %d >>\nstream\n" % (7 * draws) + b"/X0 Do " * draws + b"\nendstream",
        b"<< /Type /XObject /Subtype /Form /BBox [0 0 612 792] /Resources << /Font << /F1 4 0 R >> >> "
        + b"/Length %d >>\nstream\n" % len(form)
        + form
        + b"\nendstream",
    ]
    write_pdf(path, objects)


def test_a_pdf_drawing_one_form_over_and_over_is_skipped_past_the_limit(tmp_path):
    # A page's content can draw one form XObject thousands of times, and pypdf parses the form's content
    # each time: an 867-byte file drawing a form of 2000 empty text operators 100 times took 1.3 s a page,
    # past every size check. Here the limit is 10 KB (1250 operators) and the form 100 operators.
    write_form_pdf(tmp_path / "few.pdf", draws=5, operators=100)
    assert load_document(tmp_path / "few.pdf", max_bytes=10_000).text.split() == ["Hello", "pump"] * 5
    write_form_pdf(tmp_path / "many.pdf", draws=50, operators=100)
    assert (tmp_path / "many.pdf").stat().st_size < 2_000  # file and page content far under the limit
    with pytest.raises(
        UnreadableDocumentError,
        match=r"many.pdf: drawing its pages would parse more content than 0.01 MB \(setting CRAG_MAX_DOC",
    ):
        load_document(tmp_path / "many.pdf", max_bytes=10_000)


def test_an_html_page_of_more_elements_than_the_limit_allows_is_skipped_before_extraction(
    tmp_path, monkeypatch
):
    # Probe 7: a 20.9 MB page of 1.9M <b> elements took 3.85 GB in trafilatura (about 2.5 KB an element)
    # and sank the ingest. Here the limit is 20 KB: 100 elements are read, 101 are not, never extracted.
    def page(bold: int) -> str:
        return "<html><body><div>" + "x <b>y</b> " * bold + "</div></body></html>"

    (tmp_path / "few.html").write_text(page(97))  # with html, body and div: 100 elements
    assert load_document(tmp_path / "few.html", max_bytes=20_000).text.startswith("x **y**")
    # Nodes beside the root (a comment before <html>, as generators write) have no parent to be dropped from.
    head = "<!-- made by a tool -->\n"
    (tmp_path / "commented.html").write_text(
        head + "<html><body><p>The pump moves 42 velds.</p></body></html>"
    )
    assert load_document(tmp_path / "commented.html", max_bytes=20_000).text == "The pump moves 42 velds."
    (tmp_path / "many.html").write_text(page(98))
    extracted = []
    monkeypatch.setattr("trafilatura.extract", lambda *a, **k: extracted.append(a) or "")
    with pytest.raises(
        UnreadableDocumentError,
        match=r"many.html: it has more than 100 elements, one per 200 bytes of 0.02 MB \(setting CRAG_MAX_DOC",
    ):
        load_document(tmp_path / "many.html", max_bytes=20_000)
    assert extracted == []


@pytest.mark.parametrize("depth", [300, 200_000])
def test_html_nested_deeper_than_its_reader_reads_is_named_not_read_in_part(tmp_path, depth):
    # Probe 5: past 255 levels libxml2 stops building the tree without an error, so the nested text and all
    # that followed it were dropped while the page counted as ingested.
    nested = "<div>" * depth + "<p>Nested: the Quibble 3 weighs 4 kg.</p>" + "</div>" * depth
    page = tmp_path / "deep.html"
    page.write_text(f"<html><body><p>Top text.</p>{nested}<p>Tail text.</p></body></html>")
    with pytest.raises(UnreadableDocumentError, match=r"deep\.html: elements nested deeper than 255 levels"):
        load_document(page)
    shallow = tmp_path / "shallow.html"
    shallow.write_text(
        page.read_text().replace("<div>" * depth, "<div>" * 100).replace("</div>" * depth, "</div>" * 100)
    )
    text = load_document(shallow).text
    assert "Top text." in text and "Quibble 3 weighs 4 kg" in text and "Tail text." in text


def test_a_document_of_more_sections_or_pages_than_the_limit_allows_is_skipped_by_name(tmp_path):
    # Probe 6, D5: a 10.7 MB Markdown file of one-line sections ("# h\nx\n") made 900k sections, each a
    # chunk, and 1.3 GB held while ingesting. A document may have one section or page per 256 bytes of the
    # limit: here 40 at 10 KB, so the first is read whole and the second, under the size limit, is not.
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "few.md").write_text("".join(f"# h{i}\nx\n" for i in range(40)))
    (corpus / "many.md").write_text("".join(f"# h{i}\nx\n" for i in range(41)))
    folder = load_folder(corpus, max_bytes=10_240)
    assert [doc.id for doc in folder.docs] == ["few.md"] and len(folder.docs[0].parts) == 40
    shown = "it has more than 40 sections, one per 256 bytes of 0.01 MB (setting CRAG_MAX_DOCUMENT_MB)"
    assert folder.skipped == [f"{corpus / 'many.md'}: {shown}: not read"]
    write_shared_stream_pdf(tmp_path / "many.pdf", pages=41, padding=0)
    with pytest.raises(
        UnreadableDocumentError, match=r"many.pdf: it has more than 40 pages, one per 256 byt"
    ):
        load_document(tmp_path / "many.pdf", max_bytes=10_240)
