"""Pure chunking of documents into indexable passages with content-hash ids."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from .records import DocPart
from .strips import split_sentences

__all__ = ["Chunk", "chunk_document", "chunk_text", "split_paragraphs"]


@dataclass(frozen=True)
class Chunk:
    id: str
    doc_id: str
    index: int
    text: str
    page: int | None = None
    section: str | None = None


def split_paragraphs(text: str) -> list[str]:
    paragraphs = [" ".join(p.split()) for p in text.replace("\r\n", "\n").split("\n\n")]
    return [p for p in paragraphs if p]


def _words(text: str) -> int:
    return len(text.split())


def chunk_text(text: str, max_words: int) -> list[str]:
    """Paragraph-aligned chunks of at most ``max_words`` words where possible.

    Paragraphs are kept whole and short neighbours are merged; a paragraph longer than ``max_words``
    is cut at sentence boundaries; a single sentence longer than ``max_words`` stays one chunk rather
    than being cut mid-sentence.
    """
    pieces: list[str] = []
    for paragraph in split_paragraphs(text):
        if _words(paragraph) <= max_words:
            pieces.append(paragraph)
            continue
        current: list[str] = []
        for sentence in split_sentences(paragraph):
            if current and _words(" ".join([*current, sentence])) > max_words:
                pieces.append(" ".join(current))
                current = []
            current.append(sentence)
        if current:
            pieces.append(" ".join(current))
    chunks: list[str] = []
    min_words = max_words // 4
    for piece in pieces:
        short = chunks and min(_words(chunks[-1]), _words(piece)) < min_words
        if short and _words(chunks[-1]) + _words(piece) <= max_words:
            chunks[-1] = f"{chunks[-1]}\n\n{piece}"  # a fragment this short cannot stand alone as a passage
        else:
            chunks.append(piece)
    return chunks


def chunk_document(
    doc_id: str, title: str, text: str, max_words: int, parts: Sequence[DocPart] | None = None
) -> list[Chunk]:
    """Chunks with ids that hash the document id, title and chunk text: unchanged chunks keep their id.

    With ``parts`` (a PDF's pages, a document's sections) each part is chunked on its own, so a chunk
    never spans two pages or sections and carries the ``page`` or ``section`` it is from; ``text`` is
    then not read. The location is part of the id, so a paragraph that moves to another page is a new
    chunk (its citation changed).
    """
    located = [(p.text, p.page, p.section) for p in parts] if parts else [(text, None, None)]
    pieces = [
        (piece, page, section) for body, page, section in located for piece in chunk_text(body, max_words)
    ]
    chunks, seen = [], {}
    for index, (piece, page, section) in enumerate(pieces):
        where = "" if page is None and section is None else f"\x00{page or ''}\x00{section or ''}"
        digest = hashlib.sha256(f"{doc_id}\x00{title}\x00{piece}{where}".encode()).hexdigest()[:32]
        seen[digest] = seen.get(digest, -1) + 1
        chunk_id = digest if seen[digest] == 0 else f"{digest}-{seen[digest]}"
        chunks.append(Chunk(chunk_id, doc_id, index, piece, page, section))
    return chunks
