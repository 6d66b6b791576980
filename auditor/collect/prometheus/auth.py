"""The credentials sent to Prometheus: HTTP basic (also from the URL's userinfo) or a
bearer token, from options, files or the environment.

They go in a header that is never logged (`Auth`'s `repr` shows no secret, and every
secret is handed to `auditor.redact`); the URL requested and printed has no userinfo.
"""

from __future__ import annotations

import base64
import os
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from auditor.errors import InputError
from auditor.redact import remember
from auditor.settings import PROMETHEUS_PASSWORD_ENV, PROMETHEUS_TOKEN_ENV

TOKEN_ENV = PROMETHEUS_TOKEN_ENV
PASSWORD_ENV = PROMETHEUS_PASSWORD_ENV


@dataclass(frozen=True)
class Auth:
    """How to authenticate to Prometheus: HTTP basic, or a bearer token. `repr` shows no
    secret; the header it makes is sent, never logged."""

    user: str | None = field(default=None)
    password: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)

    def header(self) -> str | None:
        if self.token:
            return f"Bearer {self.token}"
        if self.user is not None:
            pair = f"{self.user}:{self.password or ''}".encode()
            return f"Basic {base64.b64encode(pair).decode()}"
        return None


def split_userinfo(url: str) -> tuple[str, str | None, str | None]:
    """(`url` without userinfo, user, password), percent-decoded. The last `@` ends the
    userinfo, so an unescaped `@` or `:` in a password stays in it."""
    scheme, sep, rest = url.partition("://")
    at = rest.rfind("@")
    if not sep or at < 0:
        return url, None, None
    info, host = rest[:at], rest[at + 1 :]
    user, colon, password = info.partition(":")
    return (
        f"{scheme}://{host}",
        urllib.parse.unquote(user),
        urllib.parse.unquote(password) if colon else None,
    )


def _read_secret(path: Path, *, option: str) -> str:
    try:
        text = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as e:
        why = getattr(e, "strerror", None) or "not UTF-8 text"
        raise InputError(f"cannot read: {why}", file=str(path), field=option) from e
    if not text:
        raise InputError("the file is empty", file=str(path), field=option)
    return text


def credentials(
    url: str,
    *,
    user: str | None = None,
    password_file: Path | None = None,
    token_file: Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> tuple[str, Auth | None]:
    """The URL to request (no userinfo) and the credentials to send: a bearer token from
    `token_file` or AUDITOR_PROMETHEUS_TOKEN, else basic auth as `user` (else the URL's user)
    with the password from `password_file`, AUDITOR_PROMETHEUS_PASSWORD or the URL."""
    env = os.environ if environ is None else environ
    clean, url_user, url_password = split_userinfo(url)
    remember(url_password)
    token = _read_secret(token_file, option="--bearer-token-file") if token_file else None
    token = token or env.get(TOKEN_ENV) or None
    password = (
        _read_secret(password_file, option="--basic-auth-password-file")
        if password_file
        else env.get(PASSWORD_ENV) or None
    )
    remember(token)
    remember(password)
    name = user or url_user or None
    if token and (user or password_file):
        raise InputError("give a bearer token or basic auth, not both", field="--basic-auth-user")
    if token:
        return clean, Auth(token=token)
    if (password or url_password) and not name:
        raise InputError("a basic auth password needs a user name", field="--basic-auth-user")
    if name:
        return clean, Auth(user=name, password=password or url_password)
    return clean, None
