"""Secrets out of text: the one redactor every message, log line and echoed URL goes through.

`redact` replaces with `***`:

- the password of URL userinfo, parsable or not: everything between `scheme://` (also the
  malformed `scheme//`, or the start of a token with no scheme) and the LAST `@` of the token,
  so a password with unescaped `@ : / # ?` leaks nothing; a user name alone is kept;
- `password=`, `sslpassword=`, `token=`... values, in query strings and libpq keyword strings;
- `Authorization:` header values and `Bearer ...` tokens;
- every secret handed to `remember` (a password read from a file, a bearer token), wherever
  it appears, raw or percent-encoded.

It errs on the side of redacting too much: a path with `:` and `@` loses its middle.
`RedactingFilter` applies it to every record a logging handler emits. Standard library only.
"""

from __future__ import annotations

import logging
import re
import threading
import urllib.parse

MASK = "***"

_SCHEME = re.compile(r"(?<![A-Za-z0-9+.\-])[A-Za-z][A-Za-z0-9+.\-]*:?//")
_TOKEN_SPLIT = re.compile(r"(\s+)")
_OPENERS = "'\"([{<`="
_QUOTED = re.compile(
    r"""(?P<q>['"])(?P<body>(?:(?!(?P=q)).)*?//(?:(?!(?P=q)).)*?@(?:(?!(?P=q)).)*)(?P=q)"""
)
_KEYS = (
    r"(?:ssl)?password|passwd|pwd|pass|secret|client_secret|(?:access_|bearer_|auth_|api_)?token"
    r"|api_?key"
)
_KEY_VALUE = re.compile(
    rf"""(?ix)(?<![A-Za-z0-9_])(?P<key>{_KEYS})(?P<eq>\s*=\s*)
    (?P<value>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"|[^\s'"]+)"""
)
_HEADER = re.compile(
    r"(?i)(?P<key>authorization['\"]?\s*[:=]\s*['\"]?)(?:(?:bearer|basic)\s+)?[^\s'\",}]+"
)
_SCHEME_WORDS = re.compile(r"\b(?P<kind>Bearer|Basic)\s+[A-Za-z0-9._~+/=\-]{8,}")

_remembered: set[str] = set()
_lock = threading.Lock()


def remember(secret: str | None) -> None:
    """Redact `secret` (and its percent-encoded forms) from every later text. Values under
    six characters are not remembered: they would mask ordinary words (the structural rules
    still mask them in URLs and `password=`)."""
    if not secret or len(secret) < 6:
        return
    forms = {secret, urllib.parse.quote(secret, safe=""), urllib.parse.quote_plus(secret)}
    with _lock:
        _remembered.update(forms)


def forget_all() -> None:
    """Drop every remembered secret (tests)."""
    with _lock:
        _remembered.clear()


def redact(text: str) -> str:
    """`text` with every password, token and remembered secret replaced by `***`."""
    if not text:
        return text
    with _lock:
        known = sorted(_remembered, key=len, reverse=True)
    for secret in known:
        text = text.replace(secret, MASK)
    text = _QUOTED.sub(lambda m: m["q"] + _userinfo(m["body"]) + m["q"], text)
    text = "".join(_userinfo(part) for part in _TOKEN_SPLIT.split(text))
    text = _KEY_VALUE.sub(_key_value, text)
    text = _HEADER.sub(lambda m: m["key"] + MASK, text)
    return _SCHEME_WORDS.sub(lambda m: f"{m['kind']} {MASK}", text)


def _key_value(m: re.Match[str]) -> str:
    value = m["value"]
    if value == MASK or value.startswith(MASK):
        return m[0]
    return f"{m['key']}{m['eq']}{MASK}"


def _userinfo(token: str) -> str:
    """One whitespace-free token with the userinfo before its last `@` masked: from the end of
    its first `scheme://` (or `scheme//`), else from the token's start."""
    at = token.rfind("@")
    if at < 0:
        return token
    lead = len(token) - len(token.lstrip(_OPENERS))
    m = _SCHEME.search(token, lead, at)
    colon = token.find(":", lead, at)
    if m is not None and (colon < 0 or m.start() <= colon):
        return token[: m.end()] + _mask(token[m.end() : at], scheme=True) + token[at:]
    return token[:lead] + _mask(token[lead:at], scheme=False) + token[at:]


def _mask(info: str, *, scheme: bool) -> str:
    """`user:password` -> `user:***`; a user name alone is kept (nothing secret in it)."""
    if ":" in info:
        user = info.split(":", 1)[0]
        if not user or (not scheme and "/" in user):
            return MASK
        return f"{user}:{MASK}"
    if "@" in info:  # several `@` and no `:`: no telling where a user name would end
        return MASK
    return info


class RedactingFilter(logging.Filter):
    """Redacts a record's message, arguments, traceback text and string `extra=` fields."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed record: keep what it has, redacted
            message = f"{record.msg} {record.args}"
        record.msg, record.args = redact(message), None
        if record.exc_info:
            text = logging.Formatter().formatException(record.exc_info)
            record.exc_text = redact(text)
            record.exc_info = None
        elif record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        for key, value in list(vars(record).items()):
            if key not in _STANDARD and isinstance(value, str):
                setattr(record, key, redact(value))
        return True


_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}
