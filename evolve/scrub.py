"""Secret scrubbing: the one rule set for what is a secret, wherever PrisMem writes text out.

Owns :func:`is_secret_name` (which names hold secrets), :func:`mask_secrets` (secrets in a text
masked) and :func:`scrub_secrets` (a JSON-like value made safe to write: dict keys that name
secrets are dropped, secrets in strings masked by :data:`REDACTED`). The run store scrubs
everything it writes to disk with it; the LLM client masks its error texts and leaves
secret-named parameters out of its request hash with it. Pure functions of their input and
the environment; nothing here touches a file.
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
_SECRET_STEMS = ("secret", "password", "passwd", "credential")
_SECRET_VALUE = re.compile(
    r"(?<![A-Za-z0-9])(?:"
    r"(?:sk|rk|gsk|hf|ghp|gho|ghu|ghs|ghr|github_pat|glpat|xox[abeprs])[-_][A-Za-z0-9_\-]{20,}"
    r"|AIza[A-Za-z0-9_\-]{30,}"
    r"|(?:AKIA|ASIA)[0-9A-Z]{16}(?![0-9A-Za-z])"
    r"|[Bb]earer\s+[A-Za-z0-9._~+/\-]{16,}=*"
    r")"
)


def is_secret_name(name: str) -> bool:
    """Whether a dict key, parameter or environment variable named ``name`` holds a secret:
    ``api_key``, ``OPENAI_API_KEY``, ``hf_token``, ``DBPASSWORD``, ``client_secret``,
    ``authorization``, ``credentials``, ... but not ``max_tokens``, ``prompt_tokens``, ``keys``."""
    words = [w.lower() for w in re.findall(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+", name)]
    pairs = zip(words, words[1:], strict=False)
    lowered = name.lower()
    return (
        any(w in _SECRET_WORDS for w in words)
        or bool(words and words[-1] in _SECRET_LAST_WORDS)
        or ("api", "key") in pairs
        or "apikey" in words
        or any(w in lowered for w in _SECRET_STEMS)  # glued names: "DBPASSWORD"
        or lowered.endswith("token")
    )


def mask_secrets(text: str, values: list[str], mark: str = REDACTED) -> str:
    """``text`` with each of ``values`` (see :func:`secret_values`) and whatever looks like a
    key (``sk-``/``hf_``/``ghp_``/... followed by 20+ random-looking characters, AWS ``AKIA...``
    ids, ``Bearer ...`` tokens) replaced by ``mark``."""
    for value in values:
        text = text.replace(value, mark)

    def key(match: re.Match[str]) -> str:
        found, body = match[0], match[0][4:]  # past the prefix: keys have digits or mixed case
        if found[:6].lower() == "bearer" or any(c.isdigit() for c in body):
            return mark
        return mark if body.lower() != body and body.upper() != body else found

    return _SECRET_VALUE.sub(key, text)


def secret_values(extra: list[str] | None = None) -> list[str]:
    """The values to mask: those of secret-named environment variables and ``extra``, longest
    first; values under 8 characters are placeholders like ``"x"``, and masking them would
    garble the text."""
    found = [v for k, v in os.environ.items() if is_secret_name(k)] + (extra or [])
    return sorted({v for v in found if len(v) >= 8}, key=len, reverse=True)


def scrub_secrets(obj: Any) -> Any:
    """A copy of ``obj`` (dicts, lists, tuples, scalars) that is safe to write to disk.

    Drops every dict key whose name looks secret (``api_key``, ``OPENAI_API_KEY``, ``hf_token``,
    ``secret``, ``password``, ``authorization``, ``credentials``, ...; ``max_tokens``,
    ``prompt_tokens`` and the like stay) and, in strings, replaces with ``"[redacted]"``
    whatever looks like a key: ``sk-``/``sk_``/``hf_``/``ghp_``/``xoxb-``/... followed by 20+
    random-looking characters, AWS ``AKIA...`` ids, ``Bearer ...`` tokens, and the value (8+
    characters) of any secret-named environment variable.
    """
    return _scrub(obj, secret_values())


def _scrub(obj: Any, env: list[str]) -> Any:
    if isinstance(obj, dict):
        return {k: _scrub(v, env) for k, v in obj.items() if not is_secret_name(str(k))}
    if isinstance(obj, list | tuple):
        return [_scrub(v, env) for v in obj]
    if isinstance(obj, str):
        return mask_secrets(obj, env)
    return obj
