"""Bearer tokens: the operator's token file, and the scope a request may use.

Owns the token file's format, :class:`TokenFile` (read, checked, re-read when it changes),
:class:`Grant` (a token's name and scopes), :func:`add_token` (``evolve token add``) and
:func:`parse_bearer`. The file is JSON::

    {"tokens": [{"name": "agent-1", "sha256": "<hex>", "scopes": ["ana", "bob"],
                 "expires": "2027-01-01T00:00:00Z"}]}        # expires: null for never

Invariants:

- **Tokens are never stored in clear**: the file holds each token's sha256; a presented token
  is hashed and compared with every entry by :func:`hmac.compare_digest`.
- **The tenant comes from the credential.** :meth:`TokenFile.resolve` turns a token into a
  :class:`Grant` or raises :class:`~evolve.server.records.Unauthorized` (missing, unknown or
  expired; the caller learns no more than that); :meth:`Grant.scope` turns the scope a request
  names into one the grant holds or raises :class:`~evolve.server.records.Forbidden`. A request
  names a scope only to choose among its grants.
- **The operator's file only**: a token file writable by group or others, or not a regular
  file, is refused; so is a malformed one (one line naming what is wrong). A file that
  becomes unreadable while serving refuses every token until it is fixed (fail closed).
- :func:`add_token` writes atomically with mode 0600 and returns the token, which is shown once
  and stored nowhere.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
import stat
import threading
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from evolve.files import write_atomic
from evolve.server.records import SCOPE_PATTERN, Forbidden, ServiceError, Unauthorized

TOKEN_PREFIX = "pmt_"
_SCOPE = re.compile(SCOPE_PATTERN)
_HEX = re.compile(r"^[0-9a-f]{64}$")
REFUSED = "missing, unknown or expired bearer token"  # all a refused caller is told


TOKEN_ENV = "PRISMEM_TOKEN"  # the bearer token of a server on stdio (``evolve serve --stdio``)


class TokenFileError(Exception):
    """A token file that cannot be used; one line."""


@dataclass(frozen=True)
class Grant:
    """A resolved token: its name (for logs) and the scopes it may use."""

    name: str
    scopes: tuple[str, ...]

    def scope(self, requested: str | None) -> str:
        """The scope a request uses: ``requested`` if granted (else Forbidden); with none
        requested, the only scope granted (several: a 400 naming the field)."""
        if requested is None:
            if len(self.scopes) == 1:
                return self.scopes[0]
            raise ServiceError("scope: this token grants several scopes; name one of them")
        if requested not in self.scopes:
            raise Forbidden(f"scope: {requested[:140]!r} is not granted to this token")
        return requested


@dataclass(frozen=True)
class _Entry:
    name: str
    digest: bytes
    scopes: tuple[str, ...]
    expires: datetime | None


def digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def parse_bearer(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header; None when absent or another
    scheme."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def _expiry(value: Any, where: str) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise TokenFileError(f"{where}: expires is an ISO time string or null")
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise TokenFileError(f"{where}: expires {value!r} is not an ISO time") from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def _entries(path: Path) -> list[_Entry]:
    try:
        st = path.stat()
    except OSError as exc:
        raise TokenFileError(f"cannot read token file {path}: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise TokenFileError(f"token file {path} is not a regular file")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise TokenFileError(f"token file {path} is writable by group or others "
                             f"(mode {stat.S_IMODE(st.st_mode):o}): chmod 600 it")  # fmt: skip
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TokenFileError(f"token file {path} is not readable JSON: {exc}") from None
    tokens = data.get("tokens") if isinstance(data, dict) else None
    if not isinstance(tokens, list):
        raise TokenFileError(f'token file {path}: expected {{"tokens": [...]}}')
    out = []
    for k, item in enumerate(tokens):
        where = f"token file {path}, token {k}"
        if not isinstance(item, dict):
            raise TokenFileError(f"{where}: not an object")
        name, sha, scopes = item.get("name"), item.get("sha256"), item.get("scopes")
        if not isinstance(name, str) or not name:
            raise TokenFileError(f"{where}: name is a non-empty string")
        if not isinstance(sha, str) or not _HEX.match(sha):
            raise TokenFileError(f"{where} ({name}): sha256 is 64 lowercase hex digits")
        if not isinstance(scopes, list) or not scopes:
            raise TokenFileError(f"{where} ({name}): scopes is a non-empty list")
        for s in scopes:
            if not isinstance(s, str) or not _SCOPE.match(s):
                raise TokenFileError(f"{where} ({name}): scope {s!r} does not match "
                                     f"{SCOPE_PATTERN}")  # fmt: skip
        out.append(_Entry(name, bytes.fromhex(sha), tuple(scopes),
                          _expiry(item.get("expires"), where)))  # fmt: skip
    return out


class TokenFile:
    """The operator's token file, checked on open and re-read when it changes on disk."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._seen: tuple[int, int, int] | None = None
        self._entries: list[_Entry] = []
        self._broken: str | None = None
        self._load()
        if self._broken:
            raise TokenFileError(self._broken)

    def _signature(self) -> tuple[int, int, int] | None:
        try:
            st = self.path.stat()
        except OSError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def _load(self) -> None:
        with self._lock:
            seen = self._signature()
            if seen is not None and seen == self._seen:
                return
            try:
                self._entries, self._broken = _entries(self.path), None
            except TokenFileError as exc:
                self._entries, self._broken = [], str(exc)
            self._seen = seen

    @property
    def problem(self) -> str | None:
        """Why the file refuses every token now (None: it is in use)."""
        return self._broken

    def resolve(self, token: str | None, *, now: datetime | None = None) -> Grant:
        """The grant of ``token``; Unauthorized when it is missing, unknown or expired."""
        self._load()
        if not token:
            raise Unauthorized(REFUSED)
        presented = bytes.fromhex(digest(token))
        found = None
        for entry in self._entries:  # every entry compared: the time does not say which
            if hmac.compare_digest(entry.digest, presented):
                found = entry
        if found is None:
            raise Unauthorized(REFUSED)
        if found.expires is not None and found.expires <= (now or datetime.now(UTC)):
            raise Unauthorized(REFUSED)
        return Grant(found.name, found.scopes)


def add_token(
    path: Path, name: str, scopes: list[str], *, expires_days: float | None = None
) -> str:
    """Append a new token for ``scopes`` to the file at ``path`` (made if absent) and return it
    (shown once; only its sha256 is written). TokenFileError on a bad name, scope or file."""
    if not name:
        raise TokenFileError("--name is a non-empty string")
    if not scopes:
        raise TokenFileError("at least one --scope")
    for s in scopes:
        if not _SCOPE.match(s):
            raise TokenFileError(f"scope {s!r} does not match {SCOPE_PATTERN}")
    if expires_days is not None and not expires_days > 0:
        raise TokenFileError("--expires is a positive number of days")
    path = Path(path)
    if path.exists():
        _entries(path)  # refuse to extend a file that is not sound
        data = json.loads(path.read_text(encoding="utf-8"))
    else:
        data = {"tokens": []}
    if any(t.get("name") == name for t in data["tokens"]):
        raise TokenFileError(f"token file {path} already has a token named {name!r}")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    expires = None
    if expires_days is not None:
        when = datetime.now(UTC) + timedelta(days=expires_days)
        expires = when.isoformat(timespec="seconds").replace("+00:00", "Z")
    data["tokens"].append({"name": name, "sha256": digest(token), "scopes": list(scopes),
                           "expires": expires})  # fmt: skip
    try:
        write_atomic(path, (json.dumps(data, indent=2) + "\n").encode(), mode=0o600)
    except OSError as exc:
        raise TokenFileError(f"cannot write token file {path}: {exc.strerror}") from None
    os.chmod(path, 0o600)
    return token
