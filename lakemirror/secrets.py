"""Keeping secrets out of logs, metrics, status, audit rows and error messages. Pure.

Two ways a secret escapes: as a configuration value under a telling key (``auth_token``,
``spark.hadoop.fs.s3a.secret.key``, ``password``…), and inside free text, mostly exception
messages that quote a URL or a header (``jdbc:postgresql://u:pw@h/db``, ``?password=pw``,
``Authorization: Bearer …``). :func:`mask_secrets` handles the first, :func:`redact` the second;
every error that lakemirror shows or stores goes through :func:`redact`.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

MASK = "**********"

_SEP = r"[._-]?"
#: A key names a secret when one of its dot/underscore/dash-separated parts (or adjacent pairs) says so.
_SECRET_KEY = re.compile(
    r"(^|[._-])(token|secret|password|passwd|pwd|credentials?|bearer|"
    rf"private{_SEP}key|api{_SEP}key|access{_SEP}key|secret{_SEP}key|account{_SEP}key|"
    rf"client{_SEP}secret|auth{_SEP}token|sas{_SEP}token|session{_SEP}token)($|[._-])",
    re.IGNORECASE)

_TEXT_PATTERNS = (
    # password=…, token: …, "secret": "…" in query strings, JDBC properties, JSON, headers
    (re.compile(r"(?P<keep>\b(?:password|passwd|pwd|token|secret|api[_-]?key|access[_-]?key|"
                r"secret[_-]?key|client[_-]?secret|auth[_-]?token|sas[_-]?token)\b[\"']?\s*[=:]\s*[\"']?)"
                r"[^\s&;,\"'}]+", re.IGNORECASE), MASK),
    # Authorization: Bearer …
    (re.compile(r"(?P<keep>\bbearer\s+)[A-Za-z0-9._~+/=-]+", re.IGNORECASE), MASK),
    # Databricks personal access tokens wherever they appear
    (re.compile(r"(?P<keep>)\bdapi[0-9a-f]{32}(?:-\d+)?\b"), MASK),
)


def is_secret_key(key: str) -> bool:
    return bool(_SECRET_KEY.search(key))


def mask_secrets(config: Any) -> Any:
    """A copy of ``config`` (dicts, lists, scalars) with secret values replaced by :data:`MASK`.

    A value is secret when its key names a secret or when it is a pydantic ``SecretStr`` /
    ``SecretBytes`` (anything with ``get_secret_value``); strings are also :func:`redact`-ed.
    """
    if hasattr(config, "get_secret_value"):
        return MASK
    if isinstance(config, Mapping):
        return {k: (MASK if (isinstance(k, str) and is_secret_key(k) and v is not None) else mask_secrets(v))
                for k, v in config.items()}
    if isinstance(config, (list, tuple)):
        return [mask_secrets(v) for v in config]
    if isinstance(config, str):
        return redact(config)
    return config


_SCHEME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+.-")


def _url_passwords(text: str) -> str:
    """``scheme://user:password@host`` with the password masked, wherever it appears.

    A scan from each ``://`` instead of a regular expression: one anchored at the scheme
    (``[a-z][a-z0-9+.-]*://``) restarts at every letter of a long word and takes time quadratic in
    its length, so one long name in a message could hold the thread for minutes. Each ``://`` is looked at once, backwards over its
    scheme and forwards over its user and password, and each scan stops at the next ``/``: linear."""
    out, start, find = [], 0, text.find("://")
    while find != -1:
        at = find
        while at > 0 and text[at - 1] in _SCHEME_CHARS:  # the scheme: at least one letter, as in a URI
            at -= 1
        user_end = find + 3
        while user_end < len(text) and text[user_end] not in "/:@" and not text[user_end].isspace():
            user_end += 1
        secret_end = user_end + 1
        while secret_end < len(text) and text[secret_end] not in "@/" and not text[secret_end].isspace():
            secret_end += 1
        if (any(c.isalpha() for c in text[at:find]) and user_end > find + 3 and user_end < len(text)
                and text[user_end] == ":" and secret_end > user_end + 1 and secret_end < len(text)
                and text[secret_end] == "@"):
            out += [text[start:user_end + 1], MASK]
            start = secret_end
        find = text.find("://", max(find + 1, start))
    out.append(text[start:])
    return "".join(out)


def redact(text: str, known: tuple[str, ...] = ()) -> str:
    """``text`` with credentials in URLs, key=value pairs, bearer headers and every ``known``
    secret value replaced by :data:`MASK`. Linear in the length of ``text``."""
    for value in known:
        if value and len(value) >= 4:
            text = text.replace(value, MASK)
    text = _url_passwords(text)
    for pattern, mask in _TEXT_PATTERNS:
        text = pattern.sub(lambda m: m.group("keep") + mask, text)
    return text
