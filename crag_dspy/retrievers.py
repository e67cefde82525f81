"""Adapters from other libraries' retrievers to the :class:`~crag_dspy.protocols.Retriever` protocol.

:class:`~crag_dspy.module.CRAG` wraps what it is given with :func:`as_retriever`, so any of these works
as its retriever without a line of glue:

- an object with ``retrieve(query, k) -> list[Passage]`` (the protocol itself: used as it is);
- ``dspy.retrievers.Embeddings`` (:class:`DSPyRetriever`; its own ``k`` caps how many it returns);
- any callable ``(query, k) -> list[str | dict | Passage]`` (:class:`FunctionRetriever`);
- a LangChain retriever (``langchain_core.retrievers.BaseRetriever``, :class:`LangChainRetriever`) and a
  LlamaIndex one (``llama_index.core.retrievers.BaseRetriever``, :class:`LlamaIndexRetriever`). Neither
  package is a dependency: they are recognised by their base class's module and name, never imported.

What each item becomes is :func:`to_passage`'s one rule. A source that gives no score gets similarity
0.0 (it is read only by a compiled program that fuses it into the grade; docs/architecture.md).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from .protocols import Passage, Retriever

__all__ = [
    "DSPyRetriever",
    "FunctionRetriever",
    "LangChainRetriever",
    "LlamaIndexRetriever",
    "as_retriever",
    "to_passage",
    "to_passages",
]

_TEXT_KEYS = ("text", "content", "page_content", "long_text", "passage")
_SCORE_KEYS = ("similarity", "score", "relevance_score")


def _first(mapping: dict[str, Any], keys: Sequence[str]) -> Any:
    return next((mapping[key] for key in keys if mapping.get(key) is not None), None)


def _text_id(text: str) -> str:
    """A stable id for a text without one: the same passage gets the same id in every call (the stage
    cache and the citations key on it)."""
    return "passage-" + hashlib.sha1(text.encode("utf-8")).hexdigest()[:12]


def _int_or_none(value: Any) -> int | None:
    return int(value) if value is not None else None


def to_passage(item: Any, rank: int) -> Passage:
    """One retrieved item as a :class:`~crag_dspy.protocols.Passage` at ``rank`` (0 = best).

    - a ``Passage``: kept, at this rank;
    - a string: the passage text (no title; its id is a hash of the text);
    - a dict: ``text`` (or ``content``, ``page_content``, ``long_text``, ``passage``), and optionally
      ``id``, ``doc_id``, ``title``, ``similarity`` (or ``score``), ``url``, ``source``, ``page``, ``section``;
    - a LangChain ``Document`` (``page_content`` and ``metadata``, read as the dict's keys);
    - a LlamaIndex ``NodeWithScore`` (``node.get_content()``, ``node.node_id``, ``node.metadata``, ``score``).

    Raises TypeError for anything else, naming what it got.
    """
    if isinstance(item, Passage):
        return item if item.rank == rank else replace(item, rank=rank)
    if isinstance(item, str):
        return Passage(
            id=_text_id(item), doc_id=_text_id(item), title="", text=item, rank=rank, similarity=0.0
        )
    if hasattr(item, "page_content"):  # LangChain Document
        fields = {**(getattr(item, "metadata", None) or {}), "text": item.page_content}
        if getattr(item, "id", None) and "id" not in fields:
            fields["id"] = item.id
        return _from_fields(fields, rank)
    node = getattr(item, "node", None)
    if node is not None and callable(getattr(node, "get_content", None)):  # LlamaIndex NodeWithScore
        fields = {**(getattr(node, "metadata", None) or {}), "text": node.get_content()}
        fields.setdefault("id", getattr(node, "node_id", None))
        fields.setdefault("doc_id", getattr(node, "ref_doc_id", None))
        if getattr(item, "score", None) is not None:
            fields["similarity"] = item.score
        return _from_fields(fields, rank)
    if isinstance(item, dict):
        return _from_fields(item, rank)
    raise TypeError(
        f"a retriever returned a {type(item).__name__}: expected a str, a dict with 'text', a Passage, a "
        "LangChain Document or a LlamaIndex NodeWithScore"
    )


def _from_fields(fields: dict[str, Any], rank: int) -> Passage:
    text = _first(fields, _TEXT_KEYS)
    if not isinstance(text, str):
        raise TypeError(
            f"a retrieved dict needs its text under one of {list(_TEXT_KEYS)}; got keys {sorted(fields)}"
        )
    pid = str(fields.get("id") or fields.get("doc_id") or _text_id(text))
    score = _first(fields, _SCORE_KEYS)
    return Passage(
        id=pid,
        doc_id=str(fields.get("doc_id") or pid),
        title=str(fields.get("title") or ""),
        text=text,
        rank=rank,
        similarity=float(score) if score is not None else 0.0,
        source=fields.get("source"),
        url=fields.get("url"),
        page=_int_or_none(fields.get("page")),
        section=fields.get("section"),
    )


def to_passages(items: Any, k: int) -> list[Passage]:
    """The first ``k`` of ``items`` (a list, or a ``dspy.Prediction`` with ``passages``) as passages."""
    if hasattr(items, "passages") and not isinstance(items, list | tuple):
        items = items.passages
    if not isinstance(items, list | tuple):
        raise TypeError(f"a retriever returned a {type(items).__name__}: expected a list of passages")
    return [to_passage(item, rank) for rank, item in enumerate(items[:k])]


class FunctionRetriever:
    """Any callable ``(query, k) -> list[str | dict | Passage]`` (or a ``dspy.Prediction`` with
    ``passages``) as a retriever; ``name`` names it in the trace (default: the function's name)."""

    def __init__(self, function: Callable[[str, int], Any], name: str | None = None):
        self.function = function
        self.name = name or getattr(function, "__name__", type(function).__name__)

    def retrieve(self, query: str, k: int) -> list[Passage]:
        return to_passages(self.function(query, k), k)


class DSPyRetriever:
    """``dspy.retrievers.Embeddings`` (called with the query alone; it returns its own ``k`` passages,
    as many as its ``k`` allows) as a retriever. Its cosine scores become the passages' similarity and
    a passage's corpus index its id (``corpus-<index>``)."""

    name = "dspy-embeddings"

    def __init__(self, retriever: Any):
        self.retriever = retriever

    def retrieve(self, query: str, k: int) -> list[Passage]:
        # __call__ returns passages and corpus indices only; search_fn, what __call__ runs (dspy 3.4),
        # also gives the cosine scores of the same ranking.
        search = getattr(self.retriever, "search_fn", None)
        if callable(search):
            texts, indices, scores = search(query)
        else:
            result = self.retriever(query)
            texts, indices, scores = result.passages, list(getattr(result, "indices", [])), []
        return [
            replace(
                to_passage(text, rank),
                id=f"corpus-{indices[rank]}" if rank < len(indices) else _text_id(text),
                doc_id=f"corpus-{indices[rank]}" if rank < len(indices) else _text_id(text),
                similarity=float(scores[rank]) if rank < len(scores) else 0.0,
            )
            for rank, text in enumerate(list(texts)[:k])
        ]


class LangChainRetriever:
    """A LangChain retriever (``invoke(query) -> list[Document]``) as a retriever: the first ``k`` of
    what it returns (its own ``search_kwargs`` decide how many it finds)."""

    name = "langchain"

    def __init__(self, retriever: Any):
        self.retriever = retriever

    def retrieve(self, query: str, k: int) -> list[Passage]:
        return to_passages(self.retriever.invoke(query), k)


class LlamaIndexRetriever:
    """A LlamaIndex retriever (``retrieve(query) -> list[NodeWithScore]``) as a retriever: the first
    ``k`` of what it returns (its own ``similarity_top_k`` decides how many it finds)."""

    name = "llamaindex"

    def __init__(self, retriever: Any):
        self.retriever = retriever

    def retrieve(self, query: str, k: int) -> list[Passage]:
        return to_passages(self.retriever.retrieve(query), k)


def _derives_from(obj: Any, package: str, class_name: str) -> bool:
    """Whether ``obj``'s class derives from a class ``class_name`` defined in ``package``: the optional
    libraries are recognised without importing them."""
    return any(
        base.__name__ == class_name and base.__module__.split(".")[0] == package for base in type(obj).__mro__
    )


def _is_dspy_embeddings(obj: Any) -> bool:
    from dspy.retrievers import Embeddings

    return isinstance(obj, Embeddings)


def as_retriever(obj: Any) -> Retriever:
    """``obj`` as a :class:`~crag_dspy.protocols.Retriever`: itself when it has ``retrieve(query, k)``,
    else wrapped in the adapter for what it is (the module docstring lists them). Raises TypeError,
    naming what is accepted, for anything else."""
    # LlamaIndex's retrieve takes the query alone: it must be recognised before the protocol's check.
    if _derives_from(obj, "llama_index", "BaseRetriever"):
        return LlamaIndexRetriever(obj)
    if _derives_from(obj, "langchain_core", "BaseRetriever"):
        return LangChainRetriever(obj)
    if callable(getattr(obj, "retrieve", None)):
        return obj
    if _is_dspy_embeddings(obj):
        return DSPyRetriever(obj)
    if callable(obj):
        return FunctionRetriever(obj)
    raise TypeError(
        "retriever must have a method retrieve(query, k) -> list[Passage] (crag_dspy.protocols), or be "
        "dspy.retrievers.Embeddings, a callable (query, k) -> list[str | dict], a LangChain or a "
        f"LlamaIndex retriever, or None to load or save state only; got {type(obj).__name__}"
    )
