"""Pure splitting of a document into located parts: sections under their heading path.

HTML (as trafilatura's Markdown), Markdown and DOCX (by paragraph style) all become a sequence of
blocks, each a heading with its level or a run of body text; :func:`sectioned` turns that into
:class:`~crag_dspy.records.DocPart` objects whose ``section`` is the heading path ("Options > Limits").
A citation names that path, and the chunker never lets a chunk cross two sections.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

from .records import DocPart, short_title

__all__ = ["TooManyPartsError", "markdown_blocks", "markdown_parts", "sectioned"]

_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_FENCE = re.compile(r"^\s*(```|~~~)")
_SEPARATOR = " > "

Block = tuple[int | None, str]
"""(heading level, text): level None for body text; a heading's text is the line as written."""


class TooManyPartsError(ValueError):
    """A document would have more sections than the caller allows (each is at least one chunk)."""


def _heading_text(line: str) -> str:
    match = _HEADING.match(line)
    text = match.group(2) if match else line
    # Markup and the permalink sign documentation generators put after a heading ("Options¶").
    # Bounded as titles are: every chunk of the section carries its heading path.
    return short_title(" ".join(text.replace("*", "").replace("`", "").replace("\u00b6", "").split()))


def markdown_blocks(text: str) -> Iterator[Block]:
    """The headings (``#`` to ``######`` at the start of a line, outside code fences) and the body
    text between them, in order; body text keeps its lines and blank lines.

    Lazily, and a body is a slice of ``text``, not a list of its lines: a file of millions of short lines
    costs no list of millions of strings, and a caller that stops early (too many parts) stops here too.
    """
    text = text.replace("\r\n", "\n")
    fenced = False
    body_start = start = 0
    while start <= len(text):
        end = text.find("\n", start)
        end = len(text) if end < 0 else end
        line = text[start:end]
        if _FENCE.match(line):
            fenced = not fenced  # a "# comment" inside a code block is not a heading
        match = None if fenced else _HEADING.match(line)
        if match and match.group(2).strip():
            body = text[body_start : max(body_start, start - 1)].strip()
            if body:
                yield None, body
            yield len(match.group(1)), line.strip()
            body_start = end + 1
        start = end + 1
    body = text[body_start:].strip()
    if body:
        yield None, body


def sectioned(
    blocks: Iterable[Block], title: str | None = None, *, most: int | None = None
) -> list[DocPart] | None:
    """Parts of body text under their heading path, or None when the document has no heading (then
    it is one part, chunked as before).

    A heading with no body of its own (a chapter heading straight above a section heading) is kept
    with the next body text, so no part is a bare heading. A top-level heading equal to the
    document's ``title`` is not part of the path: the citation names the document already. Heading
    lines stay in the part's text, so a chunk that starts a section says what it is about.

    More than ``most`` parts raise :class:`TooManyPartsError` as the part past it is made: each part is
    at least one chunk, and a file of one-line sections made a million of them.
    """
    headed = False
    plain_title = short_title(" ".join((title or "").split())).casefold()  # as the headings are cut
    path: list[tuple[int, str]] = []
    parts: list[DocPart] = []
    pending: list[str] = []  # heading lines waiting for their body

    def section() -> str | None:
        names = [name for _, name in path]
        if names and names[0].casefold() == plain_title:
            names = names[1:]
        return _SEPARATOR.join(names) or None

    for level, text in blocks:
        if level is None:
            if most is not None and len(parts) >= most:
                raise TooManyPartsError(f"more than {most} sections")
            parts.append(DocPart(text="\n\n".join([*pending, text]), section=section()))
            pending = []
            continue
        headed = True
        while path and path[-1][0] >= level:
            path.pop()
        path.append((level, _heading_text(text)))
        pending.append(text)
    if not headed:
        return None
    if pending:  # trailing headings with no body: they belong to the last part, or are the document
        if parts:
            last = parts[-1]
            parts[-1] = DocPart(text="\n\n".join([last.text, *pending]), section=last.section)
        else:
            parts.append(DocPart(text="\n\n".join(pending), section=section()))
    return parts


def markdown_parts(text: str, title: str | None = None, *, most: int | None = None) -> list[DocPart] | None:
    """:func:`sectioned` of Markdown text (also trafilatura's Markdown of an HTML page)."""
    return sectioned(markdown_blocks(text), title, most=most)
