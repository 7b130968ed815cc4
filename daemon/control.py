"""Control commands over HTTP: pause, resume and resync one table. Pure: routing and authorization.

``POST /tables/{table}/pause|resume|resync`` (the table name URL-encoded). The HTTP thread only
queues the command with the supervisor, which applies it on its next tick: it never calls Spark.

Authorization: with ``http.auth_token`` set, a request needs ``Authorization: Bearer <token>``
(compared in constant time). Without a token, control is allowed only when the endpoint listens
on a loopback interface, where only this machine's users can reach it.
"""

from __future__ import annotations

import hmac
import ipaddress
from dataclasses import dataclass
from urllib.parse import unquote

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
            return 401, "missing or wrong bearer token (send Authorization: Bearer <http.auth_token>)"
        return None
    if is_loopback(bound_host):
        return None
    return 403, (f"control is disabled on a non-loopback interface ({bound_host}) without a token: "
                 f"set http.auth_token (LAKEMIRROR_HTTP__AUTH_TOKEN)")
