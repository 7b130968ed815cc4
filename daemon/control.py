"""Control commands over HTTP: pause, resume and resync one table. Pure: routing and authorization.

``POST /tables/{table}/pause|resume|resync`` (the table name URL-encoded). The HTTP thread only
journals and queues the command with the supervisor, which applies it on its next tick: it never
calls Spark.

Authorization: with a token (``http.auth_token``, or the one the daemon generates), a request needs
``Authorization: Bearer <token>`` (compared in constant time). Without one (``http.auth: none``),
control is allowed only when the endpoint listens on a loopback interface.

Where a request comes from (:func:`foreign_request`): a browser sends whatever a web page asks to
any address, including a daemon on loopback, and a DNS name the page controls can be pointed at
127.0.0.1 (DNS rebinding). So a control or API request must name the daemon in its ``Host``
header (its address, ``localhost`` on a loopback or all-interfaces bind, or one of
``http.allowed_hosts``), and one that a browser marks as coming from another site (``Origin``,
``Sec-Fetch-Site``) is refused.
"""

from __future__ import annotations

import hmac
import ipaddress
from dataclasses import dataclass
from typing import Collection, Protocol
from urllib.parse import unquote, urlsplit

VERBS = ("pause", "resume", "resync")


@dataclass(frozen=True)
class ControlRequest:
    verb: str
    table: str


def route(path: str) -> ControlRequest | None:
    """``/tables/<table>/<verb>`` as a request, or None when the path is not a control route."""
    parts = path.split("?", 1)[0].split("/")
    if len(parts) != 4 or parts[0] != "" or parts[1] != "tables" or parts[3] not in VERBS or not parts[2]:
        return None
    return ControlRequest(parts[3], unquote(parts[2]))


def is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def authorize(header: str | None, token: str | None, bound_host: str) -> tuple[int, str] | None:
    """None when allowed; else (HTTP status, reason) with the fix in the reason."""
    if token:
        scheme, _, given = (header or "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token.encode()):
            return 401, ("missing or wrong bearer token: send Authorization: Bearer <token>, the token being "
                         "http.auth_token or the one in the daemon.token file of the pipeline's checkpoint folder")
        return None
    if is_loopback(bound_host):
        return None
    return 403, (f"control is disabled on a non-loopback interface ({bound_host}) without a token: "
                 f"set http.auth to token (a token is generated) or http.auth_token (LAKEMIRROR_HTTP__AUTH_TOKEN)")


class Headers(Protocol):
    """What :func:`foreign_request` reads of a request's headers (``email.message.Message``-like)."""

    def get(self, name: str) -> str | None: ...


def _split_host(value: str) -> tuple[str, str] | None:
    """``(host, port)`` of a Host header (``name``, ``name:port``, ``[v6]:port``), lower-cased; None
    when it is not one."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        if end < 0 or (value[end + 1:] and not value[end + 1:].startswith(":")):
            return None
        return value[1:end], value[end + 2:]
    host, _, port = value.partition(":")
    if not host or ":" in port or (port and not port.isdigit()):
        return None
    return host, port


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def host_allowed(host: str, bound_host: str, allowed_hosts: Collection[str] = ()) -> bool:
    """Whether a request naming ``host`` (no port) is meant for a daemon bound to ``bound_host``."""
    if host in allowed_hosts:
        return True
    bound = _ip(bound_host)
    wildcard = bound is not None and bound.is_unspecified
    if host == "localhost":
        return wildcard or is_loopback(bound_host)
    ip = _ip(host)
    if ip is None:
        return False  # a name: only the configured ones (a name the caller controls can point anywhere)
    if wildcard:
        return True   # an address of one of the daemon's interfaces, or a route to one
    return ip == bound or (ip.is_loopback and bound is not None and bound.is_loopback)


def foreign_request(headers: Headers, bound_host: str, allowed_hosts: Collection[str] = ()) -> str | None:
    """Why a control or API request is refused for where it comes from (403), or None.

    Refused: a ``Host`` that does not name this daemon (:func:`host_allowed`), an ``Origin`` that is
    not the daemon's own (``scheme://`` + the request's ``Host``; ``null`` included) and a
    ``Sec-Fetch-Site`` of ``cross-site`` or ``same-site``. Clients that are not browsers (curl, the
    ``lakemirror`` command) send no Origin and pass on their Host alone."""
    raw_host = headers.get("Host")
    if raw_host is not None:
        parsed = _split_host(raw_host)
        if parsed is None or not host_allowed(parsed[0], bound_host, allowed_hosts):
            shown = raw_host.strip()[:100]
            return (f"Host {shown!r} does not name this daemon: a request must be addressed to its own address "
                    f"(or localhost on loopback); add a DNS name in front of it to http.allowed_hosts")
    origin = headers.get("Origin")
    if origin is not None:
        url = urlsplit(origin.strip().lower())
        if url.scheme not in ("http", "https") or raw_host is None or url.netloc != raw_host.strip().lower():
            return (f"cross-origin request from {origin.strip()[:100]!r} refused: control requests are accepted "
                    f"from this daemon's own page and from clients that are not browsers")
    if (headers.get("Sec-Fetch-Site") or "").strip().lower() in ("cross-site", "same-site"):
        return "cross-site request refused: control requests are accepted from this daemon's own page only"
    return None
