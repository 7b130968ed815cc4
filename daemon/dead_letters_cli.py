"""``lakemirror dead-letters``: list the pipeline's dead letters, skip them or replay them.

One command for both kinds of pipeline: an event source's letters, or those of the change-feed
tables (the changes their Delta replicas refused). The running daemon does the work (it is the
replicas' one writer): the command finds it as ``status`` does (the endpoint it recorded, or
``--url``) and calls the dead-letter routes of its HTTP endpoint
(:mod:`lakemirror.daemon.dead_letter_api`): ``/api/events/{source}/dead-letters`` for a pipeline
with an event source, ``/api/change-feed/dead-letters`` for the others::

    lakemirror dead-letters pipeline.yaml                       # the pending letters
    lakemirror dead-letters pipeline.yaml list --status skipped
    lakemirror dead-letters pipeline.yaml replay 3f2a9c0d1e2b4a5c 9d8e…
    lakemirror dead-letters pipeline.yaml skip --all-pending --table orders
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.request
from typing import Any, Callable
from urllib.error import HTTPError
from urllib.parse import quote, urlencode

ACTIONS = ("list", "skip", "replay")


def add_parser(sub: Any) -> None:
    p = sub.add_parser("dead-letters", help="the changes a replica could not take: list, skip or replay them "
                                            "(in the running daemon)")
    p.add_argument("config", help="pipeline YAML file")
    p.add_argument("action", nargs="?", choices=ACTIONS, default="list",
                   help="list (default), skip (mark them skipped; nothing is written) or replay (an event "
                        "source's: the message applied again under the sequence guard; a change-feed table's: "
                        "the key's row written again from the source, as of the version the replica holds)")
    p.add_argument("ids", nargs="*", help="the letters' ids, as listed")
    p.add_argument("--all-pending", action="store_true", help="skip or replay every pending letter (of --table)")
    p.add_argument("--table", help="only this table's letters")
    p.add_argument("--status", choices=("pending", "skipped", "replayed", "all"), default="pending",
                   help="list: letters of this status (default pending)")
    p.add_argument("--url", help="the daemon's HTTP endpoint (default: the one it recorded)")
    p.add_argument("--json", action="store_true", help="print the daemon's JSON answer")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a setting of the file")
    p.set_defaults(func=cmd_dead_letters)


def _request(url: str, token: str | None, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method="POST" if body is not None else "GET",
                                     headers={"Content-Type": "application/json"} if data else {})
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=120) as resp:
            return resp.status, json.load(resp)
    except HTTPError as exc:
        payload = json.loads(exc.read() or b"{}")
        return exc.code, payload


def render_letters(letters: list[dict[str, Any]]) -> str:
    if not letters:
        return "no dead letters"
    header = ("ID", "TABLE", "KEY", "POSITION", "STATUS", "REASON")
    lines = [header] + [(str(x.get("id")), str(x.get("table") or "?"), str(x.get("key") or "-"), _position(x),
                         str(x.get("status")), _why(x)[:160]) for x in letters]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header) - 1)]
    return "\n".join("  ".join([*(c.ljust(widths[i]) for i, c in enumerate(line[:-1])), line[-1]]).rstrip()
                     for line in lines)


def _position(x: dict[str, Any]) -> str:
    """Where the letter's change came from: an event's source position (or message), a change-feed
    change's commit version and operation."""
    if x.get("position"):
        return str(x["position"])
    if "commit_version" in x:
        return f"version {x.get('commit_version')} {x.get('change_type') or ''}".rstrip()
    return f"{x.get('origin')}[{x.get('partition')}]@{x.get('offset')}"


def _why(x: dict[str, Any]) -> str:
    """A resolved letter's resolution; a pending one's reason (and what its last replay said)."""
    if x.get("status") != "pending":
        return str(x.get("resolution") or x.get("reason") or "")
    said = x.get("resolution")
    return str(x.get("reason") or "") + (f" [{said}]" if said else "")


def cmd_dead_letters(args: argparse.Namespace) -> int:
    from lakemirror.daemon.cli import EXIT_CONFIG, EXIT_FAILED, EXIT_OK, _control_token, _daemon_url, _load
    from lakemirror.daemon.http_token import TokenUnreadable

    settings = _load(args)
    events = settings.source
    elsewhere = settings.destination.letters_elsewhere()
    if events is None and elsewhere is not None:
        print(f"{args.config}: the pipeline writes {elsewhere}", file=sys.stderr)
        return EXIT_CONFIG
    if args.action != "list" and bool(args.ids) == bool(args.all_pending):
        print(f"lakemirror dead-letters {args.action}: give the letters' ids, or --all-pending (not both)",
              file=sys.stderr)
        return EXIT_CONFIG
    url = args.url or _daemon_url(settings)
    if not url:
        table = f"_lakemirror_dead_letters_{events.name}" if events is not None else "_lakemirror_dead_letters"
        print(f"no running daemon for pipeline {settings.effective_pipeline_id}: start it with `lakemirror run` "
              f"(it is the replicas' one writer), or pass --url. The letters are rows of {table} in the "
              f"destination schema.", file=sys.stderr)
        return EXIT_FAILED
    try:
        token = _control_token(settings)
    except TokenUnreadable as exc:
        print(f"lakemirror dead-letters: no token for the daemon's control API: {exc}", file=sys.stderr)
        return EXIT_FAILED
    base = (f"{url.rstrip('/')}/api/events/{quote(events.name, safe='')}/dead-letters" if events is not None
            else f"{url.rstrip('/')}/api/change-feed/dead-letters")
    show: Callable[[Any], str]
    try:
        if args.action == "list":
            query = {k: v for k, v in (("status", None if args.status == "all" else args.status),
                                       ("table", args.table)) if v is not None}
            code, payload = _request(base + (f"?{urlencode(query)}" if query else ""), token)
            show = lambda p: render_letters(p.get("letters", []))  # noqa: E731
        else:
            body: dict[str, Any] = {"all_pending": True} if args.all_pending else {"ids": list(args.ids)}
            if args.table:
                body["table"] = args.table
            code, payload = _request(f"{base}/{args.action}", token, body)
            show = _render_report
    except OSError as exc:
        print(f"lakemirror dead-letters: the daemon at {url} did not answer ({exc})", file=sys.stderr)
        return EXIT_FAILED
    if code >= 400:
        print(f"lakemirror dead-letters {args.action}: refused ({code}): {payload.get('error', payload)}",
              file=sys.stderr)
        return EXIT_FAILED
    print(json.dumps(payload, indent=2) if args.json else show(payload))
    return EXIT_OK


def _render_report(payload: dict[str, Any]) -> str:
    if "letters" not in payload:  # 202: still working
        return str(payload.get("message", payload))
    lines = [f"{x['id']}  {x['status']}  {x['resolution']}" + (f": {x['reason']}" if x.get("reason") else "")
             for x in payload["letters"]] or ["no pending letter matched"]
    if payload.get("unknown"):
        lines.append("not found: " + ", ".join(payload["unknown"]))
    return "\n".join(lines)
