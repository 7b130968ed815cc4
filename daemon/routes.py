"""Every route the daemon's HTTP server answers, as data, and matching a request to one. Pure.

The server dispatches on :data:`ROUTES` only, and the OpenAPI document
(:mod:`lakemirror.daemon.openapi`) is checked against it by a test, so neither can drift.
Path parameters are single, URL-encoded path segments (``{table}`` may hold any character).
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qs, unquote, urlsplit


@dataclass(frozen=True)
class Route:
    method: str
    template: str
    name: str
    mutating: bool = False   # needs control authorization
    api: bool = False        # under /api: authorized whenever a token is configured

    @property
    def parts(self) -> list[str]:
        return self.template.strip("/").split("/") if self.template != "/" else []


ROUTES: tuple[Route, ...] = (
    Route("GET", "/", "page"),
    Route("GET", "/metrics", "metrics"),
    Route("GET", "/healthz", "healthz"),
    Route("GET", "/readyz", "readyz"),
    Route("GET", "/status", "status"),
    Route("POST", "/tables/{table}/pause", "table_pause", mutating=True),
    Route("POST", "/tables/{table}/resume", "table_resume", mutating=True),
    Route("POST", "/tables/{table}/resync", "table_resync", mutating=True),
    Route("GET", "/api/openapi.json", "openapi"),
    Route("POST", "/api/continuous-sync", "create", mutating=True, api=True),
    Route("GET", "/api/continuous-sync", "list", api=True),
    Route("GET", "/api/continuous-sync/{job_id}", "get", api=True),
    Route("DELETE", "/api/continuous-sync/{job_id}", "delete", mutating=True, api=True),
    Route("POST", "/api/continuous-sync/{job_id}/pause", "pause", mutating=True, api=True),
    Route("POST", "/api/continuous-sync/{job_id}/resume", "resume", mutating=True, api=True),
    Route("POST", "/api/continuous-sync/{job_id}/resync/{table}", "resync", mutating=True, api=True),
    Route("GET", "/api/incremental/cdf-check", "cdf_check", api=True),
    Route("GET", "/api/events/{source}/dead-letters", "dead_letters", api=True),
    Route("POST", "/api/events/{source}/dead-letters/skip", "dead_letters_skip", mutating=True, api=True),
    Route("POST", "/api/events/{source}/dead-letters/replay", "dead_letters_replay", mutating=True, api=True),
    Route("GET", "/api/change-feed/dead-letters", "dead_letters_feed", api=True),
    Route("POST", "/api/change-feed/dead-letters/skip", "dead_letters_feed_skip", mutating=True, api=True),
    Route("POST", "/api/change-feed/dead-letters/replay", "dead_letters_feed_replay", mutating=True, api=True),
    Route("GET", "/api/recovery-point", "recovery_point", api=True),
)


@dataclass(frozen=True)
class Match:
    route: Route
    params: dict[str, str]
    query: dict[str, list[str]]

    def arg(self, name: str) -> str | None:
        """The last value of a query parameter, or None."""
        values = self.query.get(name)
        return values[-1] if values else None


def _match_path(route: Route, segments: list[str]) -> dict[str, str] | None:
    parts = route.parts
    if len(parts) != len(segments):
        return None
    params: dict[str, str] = {}
    for want, got in zip(parts, segments):
        if want.startswith("{") and want.endswith("}"):
            if not got:
                return None
            params[want[1:-1]] = unquote(got)
        elif want != got:
            return None
    return params


def match(method: str, target: str) -> Match | None | str:
    """The route for ``method`` and the request target: a :class:`Match`; ``"method"`` when the
    path exists under another method (405); None when no route has that path (404)."""
    url = urlsplit(target)
    segments = url.path.strip("/").split("/") if url.path.strip("/") else []
    if url.path != "/" + "/".join(segments):   # "//", trailing slashes: not a route
        return None
    query = parse_qs(url.query, keep_blank_values=True)
    other_method = False
    for route in ROUTES:
        params = _match_path(route, segments)
        if params is None:
            continue
        if route.method == method:
            return Match(route, params, query)
        other_method = True
    return "method" if other_method else None


def allowed_methods(target: str) -> list[str]:
    path = urlsplit(target).path.strip("/")
    segments = path.split("/") if path else []
    return sorted({r.method for r in ROUTES if _match_path(r, segments) is not None})
