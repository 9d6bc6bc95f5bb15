"""Secret scrubbing for everything a run writes to disk (the run store's "no secrets" rule).

Owns :func:`scrub_secrets`: dict keys that name secrets are dropped and key-like values in
strings are replaced by :data:`REDACTED`. Pure functions of their input and the environment;
nothing here touches a file.
"""

from __future__ import annotations

import os
import re
from typing import Any

REDACTED = "[redacted]"

_SECRET_WORDS = frozenset(
    ("secret", "secrets", "password", "passwd", "credential", "credentials", "authorization")
)
_SECRET_LAST_WORDS = frozenset({"key", "token", "auth"})  # "hf_token", but not "max_tokens"
_SECRET_VALUE = re.compile(
    r"(?<![A-Za-z0-9])(?:"
    r"(?:sk|rk|gsk|hf|ghp|gho|ghu|ghs|ghr|github_pat|glpat|xox[abeprs])[-_][A-Za-z0-9_\-]{20,}"
    r"|AIza[A-Za-z0-9_\-]{30,}"
    r"|(?:AKIA|ASIA)[0-9A-Z]{16}(?![0-9A-Za-z])"
    r"|[Bb]earer\s+[A-Za-z0-9._~+/\-]{16,}=*"
    r")"
)


def _is_secret_name(name: str) -> bool:
    words = [w.lower() for w in re.findall(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+", name)]
    pairs = zip(words, words[1:], strict=False)
    return (
        any(w in _SECRET_WORDS for w in words)
        or bool(words and words[-1] in _SECRET_LAST_WORDS)
        or ("api", "key") in pairs
        or "apikey" in words
    )


def _redact_key(match: re.Match[str]) -> str:
    text, body = match[0], match[0][4:]  # past the prefix: random keys have digits or mixed case
    if text[:6].lower() == "bearer" or any(c.isdigit() for c in body):
        return REDACTED
    return REDACTED if body.lower() != body and body.upper() != body else text


def scrub_secrets(obj: Any) -> Any:
    """A copy of ``obj`` (dicts, lists, tuples, scalars) that is safe to write to disk.

    Drops every dict key whose name looks secret (``api_key``, ``OPENAI_API_KEY``, ``hf_token``,
    ``secret``, ``password``, ``authorization``, ``credentials``, ...; ``max_tokens``,
    ``prompt_tokens`` and the like stay) and, in strings, replaces with ``"[redacted]"``
    whatever looks like a key: ``sk-``/``sk_``/``hf_``/``ghp_``/``xoxb-``/... followed by 20+
    random-looking characters, AWS ``AKIA...`` ids, ``Bearer ...`` tokens, and the value (8+
    characters) of any secret-named environment variable.
    """
    env = [v for k, v in os.environ.items() if _is_secret_name(k) and len(v) >= 8]
    return _scrub(obj, sorted(env, key=len, reverse=True))


def _scrub(obj: Any, env: list[str]) -> Any:
    if isinstance(obj, dict):
        return {k: _scrub(v, env) for k, v in obj.items() if not _is_secret_name(str(k))}
    if isinstance(obj, list | tuple):
        return [_scrub(v, env) for v in obj]
    if isinstance(obj, str):
        for value in env:
            obj = obj.replace(value, REDACTED)
        return _SECRET_VALUE.sub(_redact_key, obj)
    return obj
