"""Documents -> :class:`~crag_dspy.records.CorpusDoc`: PDF, HTML, DOCX, Markdown and plain text.

One reader per format behind :func:`load_document`, chosen by the file's suffix. PDF, HTML and DOCX need
the ``documents`` extra (pypdf, trafilatura, python-docx; docs/ingestion.md says why these and not
markitdown, by measurement). Each reader also says where each part of the text is
(:class:`~crag_dspy.records.DocPart`): a PDF's pages, and the sections of HTML, DOCX and Markdown under
their heading paths, which chunks keep and citations name. Plain text is one part.

A file a reader cannot parse is a :class:`UnreadableDocumentError` naming it: a corpus folder skips it
and goes on (:func:`load_folder`); a missing package is a :class:`MissingExtraError` naming the extra,
which stops the load (every file of that format would fail the same way).

Corpus files come from users' folders, uploads and archives, so what is read is bounded: a file over
``max_bytes`` (setting ``CRAG_MAX_DOCUMENT_MB``) is refused by its size before a byte is read, a .docx
(a zip) whose parts would unpack to more than that is refused before it is unpacked, and a PDF's text
stops being extracted there, as does a PDF whose pages' content streams add up to more or whose extraction
parses more operators than the limit allows (forms drawn again and again): a 3 MB zip bomb once unpacked to
3 GB here.
"""

from __future__ import annotations

import io
import logging
import os
import re
import struct
import zipfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .files import link_outside, not_regular, read_regular_file
from .records import CorpusDoc, DocPart, DomainDataError
from .sections import TooManyPartsError, markdown_parts, sectioned

if TYPE_CHECKING:
    import docx.document
    import pypdf
    from docx.oxml.table import CT_Tbl
    from docx.oxml.xmlchemy import BaseOxmlElement

__all__ = [
    "DEFAULT_MAX_DOCUMENT_MB",
    "SUFFIXES",
    "EmptyDocumentError",
    "LoadedFolder",
    "MissingExtraError",
    "UnreadableDocumentError",
    "load_document",
    "load_folder",
    "shown_path",
    "utf8_name",
]

log = logging.getLogger(__name__)

EXTRA_HINT = "pip install 'crag-dspy[documents]'"

DEFAULT_MAX_DOCUMENT_MB = 50
"""The default of setting ``max_document_mb`` (``CRAG_MAX_DOCUMENT_MB``): the largest corpus file read, and
the most its text or a .docx's parts may unpack to. Generous: a 50 MB PDF is thousands of pages."""

_MB = 2**20
_LIMIT_SETTING = "CRAG_MAX_DOCUMENT_MB"
_INFLATE_STEP = 1 << 20  # bytes a zip part is inflated by at a time when its real size is checked
# A document may have one part (page or section) per this many bytes of the limit: 204800 at 50 MB. Each
# part is at least one chunk (~1.5 KB held while ingesting), and a 10 MB file of one-line sections made
# 900k parts and 1.3 GB. Real documents are far from it: the owndocs benchmark has ~1 KB of file a part.
_BYTES_PER_PART = 256


class MissingExtraError(DomainDataError):
    """A reader's package is not installed; the message names the extra that installs it."""


class UnreadableDocumentError(DomainDataError):
    """A document is corrupt, encrypted, empty or has no extractable text; the message names the file."""


class EmptyDocumentError(UnreadableDocumentError):
    """A document that parsed but holds no text."""


Read = tuple[str | None, str, list[DocPart] | None]
"""A reader's result: the title (None: none found), the text, and its located parts (None: one part)."""


def _megabytes(size: int) -> str:
    """``size`` bytes in MB as the setting was written: 10485 bytes (0.01 MB) is "0.01", not "0.00999928"."""
    return f"{round(size / _MB, 2):g}"


def _over_limit(path: Path, what: str, max_bytes: int) -> UnreadableDocumentError:
    """The skip of a document whose ``what`` ("its text would be longer than") is over ``max_bytes``."""
    return UnreadableDocumentError(
        f"{path}: {what} {_megabytes(max_bytes)} MB (setting {_LIMIT_SETTING}): not read"
    )


def _most_parts(max_bytes: int) -> int:
    """The most pages or sections a document may have under the limit ``max_bytes``."""
    return max(1, max_bytes // _BYTES_PER_PART)


def _too_many_parts(path: Path, what: str, max_bytes: int) -> UnreadableDocumentError:
    """The skip of a document of more ``what`` ("sections") than :func:`_most_parts` allows."""
    most = _most_parts(max_bytes)
    return _over_limit(path, f"it has more than {most} {what}, one per {_BYTES_PER_PART} bytes of", max_bytes)


def _sections(
    path: Path, parts: Callable[[int], list[DocPart] | None], max_bytes: int
) -> list[DocPart] | None:
    """``parts(most)`` (a sectioning bounded to ``most`` parts), or the file's skip when it has more."""
    try:
        return parts(_most_parts(max_bytes))
    except TooManyPartsError:
        raise _too_many_parts(path, "sections", max_bytes) from None


def _text_file(path: Path, raw: bytes, max_bytes: int) -> Read:
    # The first line is the title, as the corpus folder has always read .md/.txt (CorpusDoc bounds its
    # length). utf-8-sig: editors on Windows start UTF-8 files with a byte-order mark, which is no part
    # of the text. A NUL byte is in no text file (it is valid UTF-8, so decoding lets it through): a
    # binary file, a disk image or UTF-16 text without its byte-order mark, none of them readable here.
    if b"\x00" in raw:
        raise UnreadableDocumentError(
            f"{path}: not text (it holds NUL bytes: a binary or UTF-16 file?): not read"
        )
    try:
        text = raw.decode("utf-8-sig").strip()
    except UnicodeDecodeError as exc:
        raise UnreadableDocumentError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    title = text.splitlines()[0].lstrip("# ").strip() if text else None
    return title, text, None


def _markdown(path: Path, raw: bytes, max_bytes: int) -> Read:
    title, text, _ = _text_file(path, raw, max_bytes)
    return title, text, _sections(path, lambda most: markdown_parts(text, title, most=most), max_bytes)


def _pdf(path: Path, raw: bytes, max_bytes: int) -> Read:
    import pypdf

    # pypdf bounds each stream it inflates (75 MB); the text of all pages together is bounded here, page
    # by page, so a small PDF of many inflating pages stops at max_bytes of text.
    reader = pypdf.PdfReader(io.BytesIO(raw))
    if reader.is_encrypted:
        reader.decrypt("")  # many PDFs are "encrypted" with an empty user password; others raise below
    title = reader.metadata.title if reader.metadata else None
    if len(reader.pages) > _most_parts(max_bytes):  # before any page is read: each is a part
        raise _too_many_parts(path, "pages", max_bytes)
    _check_content_size(path, reader, max_bytes)
    # One part per page, so every chunk has its page to cite (LlamaIndex's PDF reader makes a document
    # of each page for the same reason). Inside a page pypdf breaks lines with single newlines, which
    # the chunker joins, so a sentence wrapped across lines stays one sentence.
    parts, size = [], 0
    drawn = _OperatorBudget(max_bytes // _BYTES_PER_OPERATOR)
    for number, page in enumerate(reader.pages, 1):
        try:
            text = (page.extract_text(visitor_operand_before=drawn.count) or "").strip()
        except _BudgetExceeded:
            pass  # drawn.exceeded is set
        if drawn.exceeded:
            raise _over_limit(path, "drawing its pages would parse more content than", max_bytes)
        size += len(text)
        if size > max_bytes:
            raise _over_limit(path, "its text would be longer than", max_bytes)
        if text:
            parts.append(DocPart(text=text, page=number))
    return title, "\n\n".join(part.text for part in parts), parts


def _check_content_size(path: Path, reader: pypdf.PdfReader, max_bytes: int) -> None:
    """Refuse a PDF whose pages' content streams, decoded, are more than ``max_bytes`` together, before
    any text is extracted: extraction parses every page's stream, and pages may share one, so a 317 KB
    file of 2000 pages sharing 1.8 MB of operators with no text cost an hour of CPU while the text limit
    never applied. A shared stream counts once per page that uses it, as it is parsed once per page."""
    size = 0
    for page in reader.pages:
        contents = page.get_contents()
        size += len(contents.get_data()) if contents is not None else 0
        if size > max_bytes:
            raise _over_limit(path, "its pages' content would be more than", max_bytes)


# Real PDFs spend 15-30 bytes of content per operator (the owndocs PDFs, Debian's manuals); a budget of one
# operator per 8 bytes of the document limit refuses none of them and stops a hostile file within about 45 s.
_BYTES_PER_OPERATOR = 8


class _BudgetExceeded(Exception):
    """Raised inside pypdf's text extraction to stop it once the operator budget is spent."""


class _OperatorBudget:
    """Counts the content operators pypdf interprets while extracting text, form XObjects included each
    time they are drawn, and stops extraction past ``most``. The page-content check cannot see this cost:
    a page of a few bytes may draw one form 5000 times (pypdf's own cap per page), so an 867-byte file
    drawing a form of 2000 empty text operators took 1.3 s a page, and hours for a few thousand pages."""

    def __init__(self, most: int) -> None:
        self.most, self.seen, self.exceeded = most, 0, False

    def count(self, *_: object) -> None:
        self.seen += 1
        if self.seen > self.most:
            # pypdf logs and skips an error raised inside a form, but the page's next operator raises
            # again, outside any form; `exceeded` also covers a page whose last operator drew the form.
            self.exceeded = True
            raise _BudgetExceeded


# libxml2, which parses HTML for trafilatura, stops building the tree at this depth without an error: the
# text nested deeper and all that follows it were dropped while the file counted as read (probe 5).
_MAX_HTML_DEPTH = 255


# trafilatura, which extracts an HTML page's main content, takes about 2.5 KB of memory per element (Node's
# 8.4 MB all.html, 182k elements: 580 MB; a 20.9 MB page of 1.9M <b> elements reached 3.85 GB, probe 7).
# Real pages spend 36-127 bytes an element (the owndocs pages, Debian's HTML manuals), so a budget of one
# element per 200 bytes of the document limit (262k at 50 MB, about 700 MB) reads all of them.
_BYTES_PER_HTML_ELEMENT = 200


def _html_shape(raw: bytes, most: int) -> tuple[int, int]:
    """How deep the elements of the HTML page ``raw`` nest and how many there are, counting stopped once
    they are more than ``most``. Parsed as a stream without libxml2's depth limit, each element dropped
    once ended, so neither a hostile nesting nor millions of elements cost more than linear time and
    little memory (building the tree took 970 MB for 1.9M elements)."""
    import lxml.etree

    depth = deepest = elements = 0
    stream = lxml.etree.iterparse(io.BytesIO(raw), events=("start", "end"), html=True, huge_tree=True)
    for event, element in stream:
        if event == "start":
            depth, elements = depth + 1, elements + 1
            deepest = max(deepest, depth)
            if elements > most:
                break
        else:
            depth -= 1
            element.clear()
            parent = element.getparent()  # None at the top (a comment before <html>)
            while parent is not None and element.getprevious() is not None:  # ended elder siblings
                del parent[0]
    return deepest, elements


def _html(path: Path, raw: bytes, max_bytes: int) -> Read:
    import lxml.etree
    import trafilatura

    most = max_bytes // _BYTES_PER_HTML_ELEMENT
    try:
        depth, elements = _html_shape(raw, most)
    except (lxml.etree.ParserError, lxml.etree.XMLSyntaxError, ValueError):
        # Nothing to parse: trafilatura finds no text either, and the file is named as empty.
        depth = elements = 0
    if depth > _MAX_HTML_DEPTH:
        raise UnreadableDocumentError(
            f"{path}: elements nested deeper than {_MAX_HTML_DEPTH} levels: the HTML reader would "
            "drop the text below them: not read"
        )
    if elements > most:
        what = f"it has more than {most} elements, one per {_BYTES_PER_HTML_ELEMENT} bytes of"
        raise _over_limit(path, what, max_bytes)
    # bytes: trafilatura detects the page's encoding itself (and bounds what it decompresses)
    metadata = trafilatura.extract_metadata(raw)
    # Markdown keeps paragraphs apart with blank lines (the chunker's paragraph boundary); the main-content
    # extraction drops navigation, cookie banners, sidebars and footers. favor_recall: the default
    # precision mode dropped whole bulleted lists of real documentation (SQLite's wal.html: "Advantages
    # include:" followed by nothing; 3,876 words kept of 4,360), and boilerplate stays out either way.
    text = trafilatura.extract(
        raw, output_format="markdown", include_tables=True, include_comments=False, favor_recall=True
    )
    title = metadata.title if metadata else None
    return (
        title,
        text or "",
        _sections(path, lambda most: markdown_parts(text or "", title, most=most), max_bytes),
    )


def _heading_level(style_name: str | None) -> int | None:
    """The outline level of a DOCX paragraph style ("Title" 1, "Heading 2" 2), None for body text."""
    if style_name == "Title":
        return 1
    match = re.fullmatch(r"Heading (\d)", style_name or "")
    return int(match.group(1)) if match else None


def _inflated_size(raw: bytes, part: zipfile.ZipInfo, most: int) -> int:
    """How many bytes ``part`` of the zip ``raw`` really inflates to, counted in steps and given up past
    ``most``: the size a zip declares is the packer's word, and zipfile inflates a part whole at once."""
    offset = part.header_offset
    if raw[offset : offset + 4] != b"PK\x03\x04":
        raise zipfile.BadZipFile(f"no local header for part {part.filename!r}")
    name_length, extra_length = struct.unpack_from("<HH", raw, offset + 26)
    start = offset + 30 + name_length + extra_length
    data = raw[start : start + part.compress_size]
    if part.compress_type == zipfile.ZIP_STORED:
        return len(data)
    inflater, size = zlib.decompressobj(-zlib.MAX_WBITS), 0
    while not inflater.eof and size <= most:
        out = inflater.decompress(data, _INFLATE_STEP)
        data = inflater.unconsumed_tail
        size += len(out)
        if not out and not data:
            break
    return size


def _check_unpacked_size(path: Path, raw: bytes, max_bytes: int) -> None:
    """Refuse the zip ``raw`` (a .docx) before it is unpacked when its parts, by their declared sizes or
    by what they really inflate to, would be larger than ``max_bytes`` together: python-docx reads every
    part into memory, and 3 MB of deflated spaces are 3 GB unpacked. A .docx part is stored or deflated
    (ECMA-376 part 2), never encrypted; anything else is refused too, since its size cannot be checked."""
    with zipfile.ZipFile(io.BytesIO(raw)) as archive:
        parts = archive.infolist()
    if sum(part.file_size for part in parts) > max_bytes:
        raise _over_limit(path, "its parts would unpack to more than", max_bytes)
    for part in parts:
        if part.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED) or part.flag_bits & 1:
            raise UnreadableDocumentError(
                f"{path}: part {part.filename!r} is encrypted or not deflated, as no .docx part is: not read"
            )
        if _inflated_size(raw, part, part.file_size) > part.file_size:
            raise UnreadableDocumentError(
                f"{path}: part {part.filename!r} unpacks to more than the {part.file_size} bytes it "
                "declares (a zip bomb?): not read"
            )


def _core_title(document: Any) -> str | None:
    """The title in the .docx's document properties, or None when it has none: python-docx makes up
    properties titled "Word Document" for a file without them (probe 8), which is no document's title."""
    from docx.opc.constants import RELATIONSHIP_TYPE

    rels = document.part.package.rels.values()
    if not any(rel.reltype == RELATIONSHIP_TYPE.CORE_PROPERTIES for rel in rels):
        return None
    return document.core_properties.title or None


def _docx(path: Path, raw: bytes, max_bytes: int) -> Read:
    import docx

    _check_unpacked_size(path, raw, max_bytes)
    document = docx.Document(io.BytesIO(raw))
    budget = _TextBudget(path, max_bytes)
    styled = list(_docx_blocks(document.element.body, document, budget))
    title = _core_title(document) or next(
        (text for style, text in styled if style in ("Title", "Heading 1")), None
    )
    blocks = [(_heading_level(style), text) for style, text in styled]
    text = "\n\n".join(b for _, b in blocks)
    # Body paragraphs of one section are one block, paragraphs apart, as the chunker reads them.
    merged: list[tuple[int | None, str]] = []
    for level, b in blocks:
        if level is None and merged and merged[-1][0] is None:
            merged[-1] = (None, f"{merged[-1][1]}\n\n{b}")
        else:
            merged.append((level, b))
    return title, text, _sections(path, lambda most: sectioned(merged, title, most=most), max_bytes)


_W = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"
_PARAGRAPH, _TABLE, _RUN, _TEXT_BOX = _W + "p", _W + "tbl", _W + "r", _W + "txbxContent"
# Elements whose children are paragraphs and tables as if they stood in the body, cell or text box holding
# them: block content controls (how form-like templates hold their text) and custom XML.
_BLOCK_WRAPPERS = frozenset({_W + "sdt", _W + "sdtContent", _W + "customXml"})
# What in a paragraph is not its current text: deleted and moved-away runs (tracked changes), the
# paragraph's properties, and markup-compatibility fallbacks (Word writes a text box twice, as DrawingML and
# as a VML fallback, and the second copy would read it twice).
_NOT_TEXT = frozenset(
    {
        _W + "del",
        _W + "moveFrom",
        _W + "pPr",
        "{http://schemas.openxmlformats.org/markup-compatibility/2006}Fallback",
    }
)


def _descendants(element: BaseOxmlElement, tag: str, skipped: frozenset[str]) -> Iterator[BaseOxmlElement]:
    """The descendants of ``element`` tagged ``tag``, in document order, looking inside neither them nor the
    elements tagged one of ``skipped``. A loop, not recursion: lxml already caps the depth, but cheaply."""
    stack = list(reversed(element))
    while stack:
        child = stack.pop()
        if child.tag == tag:
            yield child
        elif child.tag not in skipped:
            stack.extend(reversed(child))


def _block_items(container: BaseOxmlElement) -> Iterator[BaseOxmlElement]:
    """The paragraphs and tables of a body, cell or text box in document order, those wrapped in content
    controls or custom XML included (python-docx's ``iter_inner_content`` sees only the direct ones)."""
    stack = list(reversed(container))
    while stack:
        child = stack.pop()
        if child.tag in (_PARAGRAPH, _TABLE):
            yield child
        elif child.tag in _BLOCK_WRAPPERS:
            stack.extend(reversed(child))


def _paragraph_text(p: BaseOxmlElement) -> str:
    """The current text of paragraph ``p``: every run's text (python-docx's ``CT_R.text``, which writes tabs
    and breaks as ``\\t`` and ``\\n``), whether the run stands in the paragraph or in a tracked insertion,
    hyperlink, field, smart tag, inline content control or custom XML (python-docx's ``Paragraph.text``
    reads only direct runs and hyperlinks); not deleted text, and not the text boxes a run anchors."""
    return "".join(run.text for run in _descendants(p, _RUN, _NOT_TEXT))


def _docx_blocks(
    container: BaseOxmlElement, document: docx.document.Document, budget: _TextBudget
) -> Iterator[tuple[str | None, str]]:
    """(paragraph style name, text) of each paragraph of ``container`` with text, and (None, row) of each
    table row with text, in document order. A text box's paragraphs are blocks of their own right
    after the paragraph anchoring it: a box is a flow of its own (a sidebar, a callout), and spliced into
    the anchoring paragraph its text would cut that paragraph's sentence in two."""
    from docx.text.paragraph import Paragraph

    for item in _block_items(container):
        if item.tag == _TABLE:
            yield from ((None, row) for row in _table_rows(item, budget) if row.strip(" |"))
            continue
        text = budget.spend(_paragraph_text(item).strip())
        if text:
            # A paragraph's style is None where the file defines no default paragraph style (some
            # converters write such files); its text is as readable as any other.
            yield getattr(Paragraph(item, document).style, "name", None), text
        for box in _descendants(item, _TEXT_BOX, _NOT_TEXT):
            yield from _docx_blocks(box, document, budget)


def _cell_lines(container: BaseOxmlElement) -> Iterator[str]:
    """The text of each paragraph in a table cell (or a text box in one), those in content controls and
    text boxes included; tables nested in the cell are not read, as python-docx's ``_Cell.text`` reads none."""
    for item in _block_items(container):
        if item.tag == _PARAGRAPH:
            yield _paragraph_text(item)
            for box in _descendants(item, _TEXT_BOX, _NOT_TEXT):
                yield from _cell_lines(box)


@dataclass
class _TextBudget:
    """The characters a document's text may still take (``left``); past them the file is not read."""

    path: Path
    max_bytes: int
    left: int = field(init=False)

    def __post_init__(self) -> None:
        self.left = self.max_bytes

    def spend(self, text: str) -> str:
        self.left -= len(text)
        if self.left < 0:
            raise _over_limit(self.path, "its text would be longer than", self.max_bytes)
        return text


def _table_rows(table: CT_Tbl, budget: _TextBudget) -> Iterator[str]:
    """Each row of the .docx ``table`` as its cells' text joined by " | ", read in one pass. A cell that
    continues a vertical merge shows the text of the cell that starts it, and a cell spanning columns is
    shown once. (python-docx's ``row.cells`` finds a merge's top cell by recursing up one row at a time:
    a 2 KB file of 900-row merged columns took 100 s, and 3000 rows raised RecursionError; and it repeats
    a spanning cell per column: a 987-byte file spanning 10 million columns made 210 MB of text.) A merge
    repeats its text down its rows, so the text is counted against ``budget`` cell by cell."""
    started: dict[int, str] = {}  # grid column -> text of the vertical merge that starts there
    for tr in table.tr_lst:
        column, cells = tr.grid_before, []
        for tc in tr.tc_lst:
            if tc.vMerge == "continue":
                text = started.get(column, "")
            else:
                text = "\n".join(_cell_lines(tc)).strip()  # its paragraphs a line apart, as _Cell.text
                if tc.vMerge == "restart":
                    started[column] = text
            cells.append(budget.spend(text))
            column += tc.grid_span
        yield " | ".join(cells)


Reader = Callable[[Path, bytes, int], Read]
"""A reader: the file's path (for messages), its bytes, and the most its text or parts may unpack to."""
SUFFIXES: dict[str, Reader] = {
    ".pdf": _pdf,
    ".html": _html,
    ".htm": _html,
    ".docx": _docx,
    ".md": _markdown,
    ".markdown": _markdown,
    ".txt": _text_file,
}
"""The suffixes a corpus folder reads, and the reader of each."""


def load_document(
    path: Path | str, doc_id: str | None = None, *, max_bytes: int = DEFAULT_MAX_DOCUMENT_MB * _MB
) -> CorpusDoc:
    """``path`` as one corpus document: its text, its title (the document's metadata or first heading,
    else the file name) and its path as ``source``. ``doc_id`` defaults to the file name.

    Raises :class:`UnreadableDocumentError` for a file that cannot be parsed or holds no text, and for one
    larger than ``max_bytes`` or whose text (a .docx: its parts) would unpack to more;
    :class:`MissingExtraError` when the format's package is not installed.
    """
    path = Path(path)
    reader = SUFFIXES.get(path.suffix.lower())
    if reader is None:
        raise UnreadableDocumentError(f"{path}: unsupported file type (supported: {', '.join(SUFFIXES)})")
    # Read once, bounded, and parsed from these bytes: a file that grows after its size is checked is
    # still read no further.
    raw = read_regular_file(
        path,
        max_bytes,
        "corpus file",
        UnreadableDocumentError,
        form="a document",
        limit=f"setting {_LIMIT_SETTING}: {_megabytes(max_bytes)} MB; not read",
    )
    try:
        title, text, parts = reader(path, raw, max_bytes)
    except (MissingExtraError, UnreadableDocumentError):
        raise
    except ImportError as exc:  # the reader's package, or one of its own (justext needs lxml_html_clean)
        raise MissingExtraError(
            f"{path}: reading {path.suffix} files needs the 'documents' extra ({exc}): {EXTRA_HINT}"
        ) from None
    except Exception as exc:  # parsers raise many types; whichever it is, the file is what is wrong
        raise UnreadableDocumentError(
            f"{path}: cannot read {path.suffix} ({type(exc).__name__}: {exc})"[:400]
        ) from exc
    if not text.strip():
        why = (
            " (a scanned PDF needs OCR first)"
            if path.suffix.lower() == ".pdf"
            else " (an empty file)"
            if reader in (_text_file, _markdown)
            else ""
        )
        raise EmptyDocumentError(f"{path}: no text found{why}")
    title = " ".join((title or "").split()) or path.stem
    return CorpusDoc(id=doc_id or path.name, title=title, text=text.strip(), source=str(path), parts=parts)


@dataclass
class LoadedFolder:
    """A corpus folder's documents, and the files skipped (each message names its file and why)."""

    docs: list[CorpusDoc]
    skipped: list[str]


def load_folder(folder: Path, *, max_bytes: int = DEFAULT_MAX_DOCUMENT_MB * _MB) -> LoadedFolder:
    """Every supported file under ``folder`` (recursively, in path order), ids = paths relative to it.

    An unreadable file, an empty one, or one of a type no reader reads (a slide deck, a spreadsheet) is
    logged, skipped and listed in :attr:`LoadedFolder.skipped`, so that a document the user put there is
    never missing without a word. So is a file larger than ``max_bytes``, or whose text or parts would
    unpack to more (:func:`load_document`), a file whose name is not valid UTF-8 (named with its bytes escaped),
    a named pipe, device node or socket (never opened: a read could block or never end), a symbolic
    link that leads out of ``folder`` (or nowhere), and a hard link (a file of several names): domain
    folders come from uploads and archives, and a link to ``/etc/passwd`` must not become a quotable
    document. Symbolic links inside the folder are read as the files they point to. Hidden files and folders
    (``.DS_Store``, ``.git/``) are not documents and are passed over silently.
    """
    root = folder.resolve()
    docs, skipped = [], []

    def skip(message: str) -> None:
        log.warning("skipped %s", message)
        skipped.append(message)

    for path in sorted(folder.rglob("*")):  # rglob does not descend into linked folders
        if any(part.startswith(".") for part in path.relative_to(folder).parts):
            continue
        if not utf8_name(path):
            # A name from a legacy archive: as a document id or source it cannot be stored (Chroma and
            # JSON take UTF-8 only), so it is skipped here instead of stopping the whole ingest later.
            if not path.is_dir():
                skip(f"{shown_path(path)}: the file name is not valid UTF-8: not read; rename the file")
            continue
        outside = link_outside(path, root, "corpus folder")
        if outside is not None:
            skip(outside)
            continue
        if path.is_dir():
            continue
        irregular = not_regular(path)  # a FIFO would block the read, a device node has no end: never opened
        if irregular is not None:
            skip(irregular)
            continue
        hard_link = _hard_link(path)
        if hard_link is not None:
            skip(hard_link)
            continue
        try:
            docs.append(load_document(path, doc_id=str(path.relative_to(folder)), max_bytes=max_bytes))
        except UnreadableDocumentError as exc:
            skip(str(exc))
    return LoadedFolder(docs, skipped)


def utf8_name(path: Path) -> bool:
    """Whether ``path`` is valid UTF-8 (Python decodes other bytes of a file name to lone surrogates)."""
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def shown_path(path: Path) -> str:
    """``path`` printable whatever its bytes: a byte that is not UTF-8 is shown as ``\\xff``."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def _hard_link(path: Path) -> str | None:
    """Why ``path`` is not read when its file has other names (hard links): one of them may be outside the
    folder, as ``ln /etc/shadow corpus/a.txt`` makes, and no check of the path can tell; None for a file of
    one name."""
    try:
        names = path.stat().st_nlink
    except OSError:
        return None
    if names <= 1:
        return None
    return (
        f"{path}: a hard link (the file has {names} names, any of them maybe outside the corpus folder): "
        "not read; copy the file into the folder instead of linking it"
    )
