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


_CHARS_PER_WORD = 12  # generous: ordinary prose averages 5-8 characters a word, spaces included


def _bounded(sentence: str, max_words: int) -> list[str]:
    """``sentence`` as is, unless it is past the hard bound (twice ``max_words`` words, or 12 characters
    a word of that): a run without sentence breaks, a table flattened into one line, a data blob. Then it
    is cut into runs of at most ``max_words`` words within the character bound, and a "word" longer than
    that is cut by characters into pieces of exactly the bound (the last one shorter), which no other text
    fits next to, so no space is put inside a word; nothing is dropped or reordered.

    Twice the budget, not the budget itself: a long sentence of ordinary text (a bulleted list joined
    into one paragraph) stays one chunk as before, so its chunk id, and a corpus's, does not change.
    """
    max_chars = 2 * max_words * _CHARS_PER_WORD
    words = sentence.split()
    if len(words) <= 2 * max_words and len(sentence) <= max_chars:
        return [sentence]
    tokens = [word[i : i + max_chars] for word in words for i in range(0, len(word), max_chars)]
    runs: list[list[str]] = [[]]
    length = 0
    for token in tokens:
        if runs[-1] and (len(runs[-1]) >= max_words or length + 1 + len(token) > max_chars):
            runs.append([])
            length = -1
        runs[-1].append(token)
        length += 1 + len(token)
    return [" ".join(run) for run in runs]


def chunk_text(text: str, max_words: int) -> list[str]:
    """Paragraph-aligned chunks of at most ``max_words`` words where possible, and never past a hard bound.

    Paragraphs are kept whole and short neighbours are merged; a paragraph longer than ``max_words``
    is cut at sentence boundaries; a single sentence longer than ``max_words`` stays one chunk rather
    than being cut mid-sentence, up to twice ``max_words`` words (and 24 characters a budget word):
    past that it is cut at the word budget, since a chunk far past the embedder's input and the LM's
    context would be indexed by its start only and could not be read whole.
    """
    max_chars = 2 * max_words * _CHARS_PER_WORD
    pieces: list[str] = []
    for paragraph in split_paragraphs(text):
        if _words(paragraph) <= max_words and len(paragraph) <= max_chars:
            pieces.append(paragraph)
            continue
        current: list[str] = []
        for sentence in (part for whole in split_sentences(paragraph) for part in _bounded(whole, max_words)):
            joined = " ".join([*current, sentence])
            if current and (_words(joined) > max_words or len(joined) > max_chars):
                pieces.append(" ".join(current))
                current = []
            current.append(sentence)
        if current:
            pieces.append(" ".join(current))
    chunks: list[str] = []
    min_words = max_words // 4
    for piece in pieces:
        short = chunks and min(_words(chunks[-1]), _words(piece)) < min_words
        if (
            short
            and _words(chunks[-1]) + _words(piece) <= max_words
            and len(chunks[-1]) + 2 + len(piece) <= max_chars
        ):
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
