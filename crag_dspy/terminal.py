"""Untrusted text made safe to print on a terminal.

Document text, titles, file names, web results and LM answers are printed by the CLIs. Raw, an escape
sequence in any of them is a command to the terminal: ``ESC [1A ESC [2K`` moves up a line and erases
it, so a planted document could hide the grounding warning printed above its citation, retitle the
window or fake output. :func:`terminal_safe` shows every such character as an escape (``\\x1b``), so
the text is still all there to read, and nothing in it acts. It is applied where the CLIs print, never
to what is stored (traces, JSON reports and the HTTP API keep the text as it was).
"""

from __future__ import annotations

import json
import re

__all__ = ["json_for_terminal", "one_line", "terminal_safe"]

# C0 controls but tab and newline (ESC starts every sequence; CR returns to the line's start and
# overwrites it; BS moves back), DEL, C1 controls (U+009B is a one-character CSI in some terminals), the
# bidi embeddings, overrides and isolates (they reorder what is shown: "Trojan source"), and lone
# surrogates (bytes that were not UTF-8: printing one raises UnicodeEncodeError). The line and paragraph
# separators U+2028/U+2029 too: viewers and str.splitlines break lines there, as at CR, VT, FF and U+0085.
_UNSAFE = r"\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff"
_UNSAFE_KEEP_NEWLINES = re.compile(f"[{_UNSAFE}]")
_UNSAFE_ONE_LINE = re.compile(f"[{_UNSAFE}\n]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group(0))
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def terminal_safe(text: str, *, newlines: bool = True) -> str:
    """``text`` with every character that could act on a terminal shown as its escape (``\\x1b``).

    Tabs are kept, and newlines too unless ``newlines`` is False (for text printed inside one line)."""
    return (_UNSAFE_KEEP_NEWLINES if newlines else _UNSAFE_ONE_LINE).sub(_escape, text)


def one_line(text: str) -> str:
    """``text`` safe on a terminal and on one line, its newlines escaped too: how a file name, title,
    citation or error is printed inside a line, so that a name holding "\\nanswer: ..." cannot start a
    line of its own that reads as the program's output."""
    return terminal_safe(text, newlines=False)


def json_for_terminal(value: object) -> str:
    """``value`` as indented JSON that is safe on a terminal and parses to the same value.

    ``json.dumps`` escapes C0 controls but writes DEL, C1 controls, bidi controls and lone surrogates raw
    when ``ensure_ascii`` is off; those can only be inside strings, where ``\\uXXXX`` means the same."""
    text = json.dumps(value, indent=2, ensure_ascii=False)
    return _UNSAFE_KEEP_NEWLINES.sub(lambda m: f"\\u{ord(m.group(0)):04x}", text)
