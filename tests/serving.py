"""Helpers for the service tests: a tiny on-disk domain, a question-driven scripted LM, a loopback server."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import uvicorn
from fakes import ScriptedLM, field
from fastapi.testclient import TestClient

# A fictional harbour authority: two questions the KB answers, one it needs the web for.
CORPUS = [
    {
        "id": "kb-leave",
        "title": "Annual Leave Policy",
        "text": "Harbour staff receive 27 days of annual leave per year. Leave is booked in the Tideline "
        "portal at least two weeks ahead. Unused leave of up to five days carries over to the next year.",
    },
    {
        "id": "kb-canteen",
        "title": "Canteen Opening Hours",
        "text": "The harbour canteen opens at 07:30 on weekdays. It serves fish soup on Fridays.",
    },
    {
        "id": "kb-festival",
        "title": "Harbour Festival Volunteering",
        "text": "Staff who volunteer at the Harbour Festival get one extra day off. The festival committee "
        "publishes the date each spring. Volunteers sign up with the events office.",
    },
]
WEB = [
    {
        "id": "web-festival",
        "title": "Harbour Festival 2025",
        "url": "https://harbourtown.example/festival",
        "text": "The Harbour Festival 2025 takes place on 14 June on the north quay. Entry is free.",
    },
    {
        "id": "web-ferry",
        "title": "Ferry Timetable",
        "url": "https://harbourtown.example/ferry",
        "text": "Ferries to Gull Island leave every 40 minutes from pier 3.",
    },
]

LEAVE_Q = "How many days of annual leave do harbour staff get?"
FESTIVAL_Q = "On what date is the Harbour Festival 2025?"


def write_domain(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "domain.toml").write_text('name = "harbour"\nk = 3\nsentences_per_strip = 1\n', encoding="utf-8")
    for name, rows in (("corpus.jsonl", CORPUS), ("web.jsonl", WEB)):
        (root / name).write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return root


def harbour_lm() -> ScriptedLM:
    """Grades by keyword the way a sound grader would, so the two questions take CORRECT and AMBIGUOUS."""

    def script(system: str, user: str):
        question = field(user, "question")
        if "You judge search results" in system:
            document = field(user, "document")
            if "leave" in question:
                return 0.93 if "27 days" in document else 0.06
            return 0.55 if "Festival" in document else 0.1
        if "You judge short knowledge strips" in system:
            strip = field(user, "strip")
            return 0.91 if ("27 days" in strip or "14 June" in strip) else 0.12
        if "web search query" in system:
            return {"query": "Harbour Festival 2025 date"}
        if "Rewrite the follow-up question" in system:  # a page's next question carries its history
            return {"standalone_question": question}
        if "Answer the question using only the context" in system:
            context = field(user, "context")
            if "27 days" in context:
                return {"answer": "27 days of annual leave per year"}
            if "14 June" in context:
                return {"answer": "14 June 2025"}
            return {"answer": "I don't know"}
        raise AssertionError(f"unexpected prompt: {system[:80]}")

    return ScriptedLM(script)


def local_client(app, **kwargs) -> TestClient:
    """A TestClient that calls ``app`` as a browser on this machine does: Host 127.0.0.1 (the service
    answers only its allowed hosts; TestClient's own "testserver" is not one)."""
    return TestClient(app, base_url="http://127.0.0.1", **kwargs)


@contextmanager
def serving(app, timeout_s: float = 30.0, config: uvicorn.Config | None = None) -> Iterator[str]:
    """Run ``app`` with uvicorn on a free loopback port in a thread; yields its base URL. ``config``
    replaces uvicorn's default one (e.g. ``serve``'s own, :func:`crag_dspy.serve.connections.serve_config`)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(config or uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout_s)
        sock.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
