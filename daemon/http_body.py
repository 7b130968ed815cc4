"""Reading a request body safely: framing (``Content-Length`` or chunked) and JSON. Pure.

Every function here either returns a value or raises :class:`BadRequest`, which carries the HTTP
status to answer (400, 413, 501) and one line that names the problem and the fix. Nothing a
client sends can make them raise anything else (a body nested past the decoder's recursion limit is a 400,
and so is one nested past :data:`MAX_JSON_DEPTH`; sizes are capped before anything is read, a
``Content-Length`` of any number of digits included; an object that names a key twice is a 400,
as YAML's unique keys are for the configuration file).
"""

from __future__ import annotations

import json
from typing import Any, Protocol

#: The largest body accepted (a pipeline's settings are a few kilobytes).
MAX_BODY_BYTES = 1 << 20
#: The deepest nesting of arrays and objects accepted (pipeline settings nest 3 levels).
MAX_JSON_DEPTH = 64


class BadRequest(Exception):
    """A request the server cannot read: ``status`` to answer and a one-line ``message``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def framing(content_lengths: list[str], transfer_encoding: str | None,
            max_bytes: int = MAX_BODY_BYTES) -> int | str | None:
    """How the body is framed: its length, ``"chunked"``, or None when the request has no body.

    ``content_lengths`` are every ``Content-Length`` value sent (a repeated header with different
    values is refused, as RFC 9112 §6.3 asks, and so is one beside ``Transfer-Encoding``).
    """
    if transfer_encoding is not None:
        if content_lengths:
            raise BadRequest(400, "send Content-Length or Transfer-Encoding, not both")
        codings = [c.strip().lower() for c in transfer_encoding.split(",") if c.strip()]
        if codings != ["chunked"]:
            raise BadRequest(501, f"Transfer-Encoding {transfer_encoding!r} is not supported; send the body "
                                  f"with Content-Length or Transfer-Encoding: chunked")
        return "chunked"
    if not content_lengths:
        return None
    values = {v.strip() for v in content_lengths}
    if len(values) != 1:
        raise BadRequest(400, "Content-Length is sent more than once with different values")
    raw = values.pop()
    if not raw.isascii() or not raw.isdigit():
        raise BadRequest(400, f"Content-Length must be a whole number of bytes, got {raw[:40]!r}")
    digits = raw.lstrip("0") or "0"
    # compared as text first: int() refuses more than 4300 digits (CPython's limit on converting them)
    if len(digits) > len(str(max_bytes)) or int(digits) > max_bytes:
        raise BadRequest(413, f"the body is larger than {max_bytes} bytes")
    return int(digits)


def json_media_type(content_type: str | None) -> None:
    """Refuse (415) a body not sent as ``application/json``: an HTML form or a page's script can
    send ``text/plain`` or a form's types to any address without asking, but not JSON."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media != "application/json":
        raise BadRequest(415, f"the body is sent as {media[:60] or 'no type'!r}; send JSON with Content-Type: "
                              f"application/json")


class Readable(Protocol):
    """A byte stream read by lines and by sizes (a request's ``rfile``)."""

    def readline(self, limit: int = -1, /) -> bytes: ...
    def read(self, size: int = -1, /) -> bytes: ...


def read_chunked(stream: Readable, max_bytes: int = MAX_BODY_BYTES) -> bytes:
    """The body of a ``Transfer-Encoding: chunked`` request (RFC 9112 §7.1), capped at ``max_bytes``."""
    out = bytearray()
    while True:
        line = stream.readline(1026)
        if not line.endswith(b"\n"):
            raise BadRequest(400, "the chunked body ended early or has a chunk-size line over 1 KiB")
        size_text = line.split(b";", 1)[0].strip()
        if not size_text or len(size_text) > 16 or not all(c in b"0123456789abcdefABCDEF" for c in size_text):
            raise BadRequest(400, f"bad chunk size {size_text[:20]!r} in the chunked body")
        size = int(size_text, 16)
        if size == 0:
            break
        if len(out) + size > max_bytes:
            raise BadRequest(413, f"the body is larger than {max_bytes} bytes")
        chunk = stream.read(size)
        if len(chunk) != size or stream.read(2) not in (b"\r\n", b"\n"):
            raise BadRequest(400, "the chunked body ended early or a chunk is longer than its size")
        out += chunk
    for _ in range(100):  # trailer fields, up to the empty line
        line = stream.readline(8194)
        if line in (b"\r\n", b"\n"):
            return bytes(out)
        if not line.endswith(b"\n"):
            raise BadRequest(400, "the chunked body's trailer ended early")
    raise BadRequest(400, "the chunked body has more than 100 trailer lines")


def nesting_depth(value: Any) -> int:
    """The deepest nesting of arrays and objects in a parsed JSON value (iterative: no recursion)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (list, dict)):
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object's members as a dict, refusing a name given twice (RFC 8259 leaves the meaning of a
    repeated name open; most parsers keep the last, so a body could say one thing to a proxy or a
    log reader and another to the daemon)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(f"the key {key[:80]!r} appears twice in one JSON object; keep one")
        out[key] = value
    return out


def parse_json(raw: bytes, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """The JSON value of a body (None when it is empty or blank), or :class:`BadRequest` (400)."""
    if not raw.strip():
        return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequest(400, f"the body is not UTF-8 (byte {exc.start}); send JSON encoded as UTF-8") from None
    too_deep = BadRequest(400, f"the JSON body nests deeper than {max_depth} levels")
    try:
        value = json.loads(text, parse_constant=_no_constant, object_pairs_hook=_unique_keys)
    except RecursionError:  # CPython's decoder checks its depth against the recursion limit
        raise too_deep from None
    except _DuplicateKey as exc:
        raise BadRequest(400, str(exc)) from None
    except ValueError as exc:
        raise BadRequest(400, f"the body is not valid JSON: {str(exc)[:200]}") from None
    if nesting_depth(value) > max_depth:
        raise too_deep
    return value
