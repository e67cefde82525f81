"""Text streamed in pieces that must not show a string before it is known whether the string is there.

A streamed completion holds back what may begin a stop string (the next token may complete it, and the
stop string is cut off: :mod:`crag_dspy.lm.ik_engine`), and a streamed draft what may begin a secret
(the next token may complete it, and it is redacted: :class:`crag_dspy.redaction.StreamRedactor`).
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["prefix_at_end"]


def prefix_at_end(text: str, strings: Iterable[str]) -> int:
    """How many characters at the end of ``text`` begin one of ``strings`` (a proper prefix of it):
    the text to hold back until the next piece shows whether the string follows."""
    longest = 0
    for s in strings:
        for n in range(min(len(s) - 1, len(text)), longest, -1):
            if text.endswith(s[:n]):
                longest = n
                break
    return longest
