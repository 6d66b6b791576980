"""Names on their way out: safe for a terminal, a spreadsheet and an HTML page.

Team, namespace, job, pod, node and GPU names come from outside (pod labels, kubectl JSON,
nvidia-smi files) and reach every output. Kubernetes names never legitimately hold a control
or format character, so every such character is shown as a visible escape:

- `terminal_safe` for text printed to a terminal or a plain-text file: C0 controls (tab and
  newline included), DEL, C1 controls, bidi embeddings, overrides, isolates and marks, the
  other invisible format characters (zero-width space and joiners, the BOM, soft hyphen...),
  line and paragraph separators, and lone surrogates become `\\x1b`, `\\u202e`, `\\ud800`, in
  the notation of a Python string literal. A backslash is left alone, so the escape is for
  reading, not for parsing back; JSON output is the lossless form.
- `neutralise` and `csv_cell` for CSV text cells: a cell a spreadsheet would read as a
  formula gets a leading apostrophe (OWASP, CSV injection). Numbers never pass through them,
  so a negative number stays a number.
- `html_text` for HTML text and attribute values: the escapes above, then `html.escape`.

Pure and standard-library only: the CLI imports this module for its error line.
"""

from __future__ import annotations

import html
import unicodedata
from functools import lru_cache

ESCAPED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
"""Unicode general categories shown as escapes: controls (C0, DEL, C1), format characters
(bidi controls, zero-width characters, BOM, soft hyphen, tags), surrogates, and the line and
paragraph separators some terminals break lines at."""

_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}

FORMULA_START = frozenset("=+-@")
"""First characters that make a spreadsheet evaluate a cell, after NFKC folding (so the
full-width `＝` and the small `﹢` count) and after any leading whitespace (some importers
trim it); a tab or carriage return in first place also counts (OWASP)."""


@lru_cache(maxsize=1024)
def _escape(ch: str) -> str:
    if unicodedata.category(ch) not in ESCAPED_CATEGORIES:
        return ch
    if ch in _NAMED:
        return _NAMED[ch]
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def terminal_safe(text: str) -> str:
    """`text` with every control and invisible format character shown as a visible escape
    (module docstring); the identity on text without them."""
    if text.isprintable():  # no C*, Z* but the ASCII space: nothing to escape
        return text
    return "".join(_escape(ch) for ch in text)


def safe_lines(text: str) -> str:
    """A multi-line text made `terminal_safe` line by line, its newlines kept."""
    return "\n".join(terminal_safe(line) for line in text.split("\n"))


def _is_formula_start(ch: str) -> bool:
    return unicodedata.normalize("NFKC", ch)[:1] in FORMULA_START


def neutralise(text: str) -> str:
    """Prefix a cell a spreadsheet would read as a formula with an apostrophe (OWASP)."""
    if not text:
        return text
    lead = text.lstrip()[:1]
    if text[0] in "\t\r" or (lead and _is_formula_start(lead)):
        return "'" + text
    return text


def csv_cell(text: str) -> str:
    """A CSV text cell: controls escaped (`terminal_safe`), then formulas `neutralise`d."""
    return neutralise(terminal_safe(text))


def html_text(text: str) -> str:
    """Text for HTML content or a quoted attribute value: escapes, then `html.escape`."""
    return html.escape(terminal_safe(text), quote=True)
