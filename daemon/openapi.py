"""The OpenAPI 3 document of the daemon's HTTP endpoint, served at ``GET /api/openapi.json``.

Written by hand (it is the published contract) except the request body of
``POST /api/continuous-sync``, which is generated from the settings model
(:mod:`lakemirror.daemon.settings.openapi`); a unit test checks that it names exactly the routes
of :data:`lakemirror.daemon.routes.ROUTES`, which are the ones the server answers.
"""

from __future__ import annotations

from typing import Any

from lakemirror import __version__
from lakemirror.daemon.settings.openapi import pipeline_settings_schemas

_ERR = {"$ref": "#/components/schemas/Error"}
_PROBLEMS = {"$ref": "#/components/schemas/Problems"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _auth_errors() -> dict[str, Any]:
    return {"401": _json(_ERR, "Missing or wrong bearer token (http.auth_token, or the daemon.token the daemon "
                               "wrote)."),
            "403": _json(_ERR, "The Host header does not name the daemon, the Origin or Sec-Fetch-Site is another "
                               "site's, or (http.auth none) the endpoint is not on a loopback interface."),
            "503": _json(_ERR, "Not accepted: the daemon is shutting down and takes no more commands, or a "
                               "command could not be recorded durably in the pipeline's folder (or, databricks "
                               "mode, the daemon has no workspace to submit to).")}


def _param(name: str, where: str, description: str, schema: dict[str, Any] | None = None,
           required: bool = True) -> dict[str, Any]:
    return {"name": name, "in": where, "required": required, "description": description,
            "schema": schema or {"type": "string"}}


JOB_ID = _param("job_id", "path", "The pipeline id (local and connect mode) or the Databricks job id.")
WORKSPACE = [_param("X-Databricks-Host", "header", "Databricks mode: the workspace to use for this request "
                    "(https://...); with X-Databricks-Token. Ignored in local and connect mode.", required=False),
             _param("X-Databricks-Token", "header", "Databricks mode: the token for X-Databricks-Host; never "
                    "logged nor echoed.", required=False)]
TABLE = _param("table", "path", "The table name (URL-encoded).")
_SECURE: list[dict[str, list[str]]] = [{"bearer": []}]


def _body_errors() -> dict[str, Any]:
    return {"400": _json(_ERR, "The body cannot be read: bad Content-Length or chunked framing, not UTF-8, "
                               "not valid JSON, or nested deeper than 64 levels."),
            "408": _json(_ERR, "The body did not arrive within the read timeout."),
            "413": _json(_ERR, "The body is larger than 1 MiB."),
            "415": _json(_ERR, "A body not sent with Content-Type: application/json."),
            "501": _json(_ERR, "A Transfer-Encoding other than chunked.")}


def _op(summary: str, responses: dict[str, Any], *, params: list[dict[str, Any]] | None = None,
        secured: bool = False, body: dict[str, Any] | None = None) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary, "responses": {**responses, **(_auth_errors() if secured else {})}}
    if params:
        op["parameters"] = params
    if secured:
        op["security"] = _SECURE
    if body is not None:
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": body}}}
    return op


def _table_command(verb: str) -> dict[str, Any]:
    return _op(f"{verb.capitalize()} one table of the daemon's configured pipeline (recorded durably, then applied "
               f"by its supervisor; a daemon killed before applying it applies it at its next start).",
               {"202": _json({"type": "object"}, "Accepted and recorded."), "404": _json(_ERR, "No such table.")},
               params=[TABLE], secured=True)


SOURCE = _param("source", "path", "The event source's name (source.name).")
_LETTER_IDS = {"type": "object", "properties": {
    "ids": {"type": "array", "items": {"type": "string"}, "description": "The letters' ids (from the list)."},
    "all_pending": {"type": "boolean", "description": "Every pending letter instead (of `table` if given)."},
    "table": {"type": "string", "description": "With all_pending: only this table's letters."}}}


def _letters_command(verb: str, summary: str, feed: bool = False) -> dict[str, Any]:
    missing = ({"404": _json(_ERR, "The pipeline has no change-feed tables (an event source feeds it)."),
                "409": _json(_ERR, "The replicas are PostgreSQL tables: their dead letters are rows of "
                                   "lakemirror_dead_letters there.")} if feed else
               {"404": _json(_ERR, "No such event source in this pipeline."),
                "409": _json(_ERR, "The source's replicas are PostgreSQL tables.")})
    return _op(summary, {
        "200": _json({"type": "object", "properties": {
            "verb": {"const": verb}, "unknown": {"type": "array", "items": {"type": "string"}},
            "letters": {"type": "array", "items": {"type": "object", "properties": {
                "id": {"type": "string"}, "status": {"type": "string"}, "resolution": {"type": "string"},
                "reason": {"type": "string", "description": "The new reason, when a replay was refused again."}}}}}},
            "What became of each letter, and the ids not found."),
        "202": _json({"type": "object"}, "Still working after the API timeout: list the letters to see the outcome."),
        **_body_errors(),
        **missing,
        "422": _json(_PROBLEMS, "Neither ids nor all_pending, or both.")},
        params=[] if feed else [SOURCE], secured=True, body=_LETTER_IDS)


def document() -> dict[str, Any]:
    """The whole document (a new dict each call)."""
    text = {"text/plain": {"schema": {"type": "string"}}}
    one = {"$ref": "#/components/schemas/Pipeline"}
    return {
        "openapi": "3.0.3",
        "info": {"title": "lakemirror daemon", "version": __version__,
                 "description": "Metrics, health, status and control of a lakemirror replication daemon."},
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                                           "description": "http.auth_token, else the token the daemon generates "
                                           "at each start into <checkpoint_volume>/<pipeline_id>/daemon.token "
                                           "(owner-readable); with http.auth none, none (loopback only)."}},
            "schemas": {
                "Error": {"type": "object", "properties": {"error": {"type": "string"}}, "required": ["error"]},
                "DeadLetter": {"type": "object", "properties": {k: {"type": t} for k, t in (
                    ("id", "string"), ("table", "string"), ("origin", "string"), ("partition", "integer"),
                    ("offset", "integer"), ("key", "string"), ("position", "string"), ("reason", "string"),
                    ("status", "string"), ("batch_id", "integer"), ("recorded_at", "string"),
                    ("resolved_at", "string"), ("resolution", "string"))}},
                "FeedDeadLetter": {"type": "object", "properties": {k: {"type": t} for k, t in (
                    ("id", "string"), ("table", "string"), ("source", "string"), ("key", "string"),
                    ("commit_version", "integer"), ("change_type", "string"), ("row", "string"),
                    ("reason", "string"), ("status", "string"), ("batch_id", "integer"), ("txn_app_id", "string"),
                    ("recorded_at", "string"), ("resolved_at", "string"), ("resolution", "string"))}},
                "Problems": {"type": "object", "required": ["error", "problems"], "properties": {
                    "error": {"type": "string"},
                    "problems": {"type": "array", "items": {"type": "object", "properties": {
                        "field": {"type": "string"}, "message": {"type": "string"}}}}}},
                **pipeline_settings_schemas(),
                "Submitted": {"type": "object", "required": ["job_id", "run_url"], "properties": {
                    "job_id": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
                    "run_url": {"type": "string", "description": "Empty where there is no workspace."}}},
                "TableView": {"type": "object", "properties": {
                    "table": {"type": "string"}, "state": {"type": "string"},
                    "lag_seconds": {"type": "number", "nullable": True},
                    "versions_behind": {"type": "integer", "nullable": True},
                    "applied_through": {"type": "integer", "nullable": True},
                    "rows_applied": {"type": "integer"}, "last_error": {"type": "string", "nullable": True},
                    "bootstrap": {"type": "object", "nullable": True, "description": "A running bootstrap: "
                                  "chunks_done, chunks_total, rows_copied, rows_total, rows_per_second, eta_seconds, "
                                  "captured_through, captures, note."}}},
                "Pipeline": {"type": "object", "properties": {
                    "job_id": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
                    "origin": {"type": "string", "enum": ["config", "api", "databricks"]},
                    "state": {"type": "string"}, "source": {"type": "string"}, "destination": {"type": "string"},
                    "run_url": {"type": "string"},
                    "tables": {"type": "array", "items": {"$ref": "#/components/schemas/TableView"}}}},
                "Readiness": {"type": "object", "properties": {
                    "table": {"type": "string"}, "ready": {"type": "boolean"}, "cdf_enabled": {"type": "boolean"},
                    "key": {"type": "array", "items": {"type": "string"}, "nullable": True},
                    "key_rule": {"type": "string", "nullable": True},
                    "retention_headroom_seconds": {"type": "number", "nullable": True},
                    "problems": {"type": "array", "items": {"type": "string"}},
                    "fixes": {"type": "array", "items": {"type": "string"}},
                    "warnings": {"type": "array", "items": {"type": "string"}}}},
            },
        },
        "paths": {
            "/": {"get": _op("The per-table status page (HTML, no external assets): state, lag and its recent "
                             "history, rows applied, last error, retention headroom, pause/resume buttons.",
                             {"200": {"description": "HTML.", "content": {"text/html": {"schema": {"type": "string"}}}}})},
            "/metrics": {"get": _op("Prometheus metrics.", {"200": {"description": "Text format.", "content": text}})},
            "/healthz": {"get": _op("The process is alive.", {"200": _json({"type": "object"}, "Alive.")})},
            "/readyz": {"get": _op("Every table that is not paused runs within the lag SLO.", {
                "200": _json({"type": "object"}, "Ready."), "503": _json({"type": "object"}, "Not ready, with reasons.")})},
            "/status": {"get": _op("Per-table state of the configured pipeline.",
                                   {"200": _json({"type": "object"}, "Status.")})},
            "/tables/{table}/pause": {"post": _table_command("pause")},
            "/tables/{table}/resume": {"post": _table_command("resume")},
            "/tables/{table}/resync": {"post": _table_command("resync")},
            "/api/openapi.json": {"get": _op("This document.", {"200": _json({"type": "object"}, "OpenAPI 3.")})},
            "/api/continuous-sync": {
                "post": _op("Start a Continuous Sync pipeline (in this daemon, or as a Databricks job).", {
                    "201": _json({"$ref": "#/components/schemas/Submitted"}, "Started or submitted."),
                    **_body_errors(),
                    "409": _json(_ERR, "A pipeline of that id already runs, or its checkpoint folder is, holds or "
                                       "lies inside a running pipeline's (symbolic links resolved); the message "
                                       "names both folders."),
                    "422": _json(_PROBLEMS, "Invalid settings: every problem with its field."),
                    "504": _json(_ERR, "Not started within the API timeout.")},
                    params=WORKSPACE, secured=True, body={"$ref": "#/components/schemas/PipelineSettings"}),
                "get": _op("Every pipeline, with per-table state and lag.", {"200": _json(
                    {"type": "object", "properties": {"pipelines": {"type": "array", "items": one}}}, "Pipelines.")},
                    params=WORKSPACE, secured=True)},
            "/api/continuous-sync/{job_id}": {
                "get": _op("One pipeline, with per-table state and lag.", {
                    "200": _json(one, "The pipeline."), "404": _json(_ERR, "No such pipeline.")},
                    params=[JOB_ID, *WORKSPACE], secured=True),
                "delete": _op("Stop (drain) the pipeline or cancel and delete its Databricks job.", {
                    "200": _json({"type": "object"}, "Stopped."),
                    "202": _json({"type": "object"}, "Still draining after the API timeout."),
                    "404": _json(_ERR, "No such pipeline."),
                    "409": _json(_ERR, "The configured pipeline, or checkpoints that may not be deleted."),
                    "422": _json(_PROBLEMS, "Invalid query.")},
                    params=[JOB_ID, _param("cleanup_checkpoints", "query",
                                           "Also delete <checkpoint_volume>/<pipeline_id> (default false).",
                                           {"type": "boolean", "default": False}, required=False), *WORKSPACE],
                    secured=True)},
            "/api/continuous-sync/{job_id}/pause": {"post": _op(
                "Pause every table of the pipeline (a Databricks job: pause its trigger and cancel its run).",
                {"202": _json({"type": "object"}, "Queued."), "404": _json(_ERR, "No such pipeline.")},
                params=[JOB_ID, *WORKSPACE], secured=True)},
            "/api/continuous-sync/{job_id}/resume": {"post": _op(
                "Resume every table of the pipeline (a Databricks job: unpause its trigger).",
                {"202": _json({"type": "object"}, "Queued."), "404": _json(_ERR, "No such pipeline.")},
                params=[JOB_ID, *WORKSPACE], secured=True)},
            "/api/continuous-sync/{job_id}/resync/{table}": {"post": _op(
                "Rebuild one table's replica from a new snapshot (recorded durably, then applied by the pipeline's "
                "supervisor).",
                {"202": _json({"type": "object"}, "Accepted and recorded."), "404": _json(_ERR, "No such pipeline or table."),
                 "501": _json(_ERR, "A Databricks job: resync through its own daemon.")},
                params=[JOB_ID, TABLE], secured=True)},
            "/api/incremental/cdf-check": {"get": _op(
                "Per table of a schema: ready for continuous sync? (CDF, key and rule, retention) and the fixes.", {
                    "200": _json({"type": "object", "properties": {
                        "catalog": {"type": "string"}, "schema": {"type": "string"}, "ready": {"type": "boolean"},
                        "tables": {"type": "array", "items": {"$ref": "#/components/schemas/Readiness"}}}},
                        "Verdicts."),
                    "422": _json(_PROBLEMS, "Missing or invalid catalog or schema."),
                    "504": _json(_ERR, "The tables were not described within the API timeout.")},
                params=[_param("catalog", "query", "Source catalog."), _param("schema", "query", "Schema.")],
                secured=True)},
            "/api/events/{source}/dead-letters": {"get": _op(
                "The dead letters of an event source (Delta replicas): table, decoded key, source position, "
                "reason, status (pending, skipped, replayed); the raw message stays in the table.", {
                    "200": _json({"type": "object", "properties": {
                        "source": {"type": "string"},
                        "letters": {"type": "array", "items": {"$ref": "#/components/schemas/DeadLetter"}}}},
                        "The letters, oldest first."),
                    "404": _json(_ERR, "No such event source in this pipeline."),
                    "409": _json(_ERR, "The source's replicas are PostgreSQL tables: their dead letters are in "
                                       "lakemirror_event_dead_letters."),
                    "422": _json(_PROBLEMS, "Invalid query."),
                    "504": _json(_ERR, "The dead-letter table was not read within the API timeout.")},
                params=[SOURCE, _param("status", "query", "Only letters of this status: pending, skipped or "
                                                          "replayed.", required=False),
                        _param("table", "query", "Only this table's letters.", required=False),
                        _param("limit", "query", "At most this many (the newest; default 500).",
                               {"type": "integer"}, required=False)],
                secured=True)},
            "/api/events/{source}/dead-letters/skip": {"post": _letters_command("skip", (
                "Mark dead letters skipped: nothing is written to a replica."))},
            "/api/events/{source}/dead-letters/replay": {"post": _letters_command("replay", (
                "Decode each dead letter's message again and apply it under the sequence guard (it cannot "
                "move a row backwards: a change older than the replica's row counts as stale); a letter "
                "still refused stays pending with the new reason."))},
            "/api/change-feed/dead-letters": {"get": _op(
                "The dead letters of the configured pipeline's change-feed tables (Delta replicas): the changes "
                "their replicas refused, with table (the pipeline's name; source: the source table), key, commit "
                "version, operation, row, reason and status (pending, skipped, replayed).", {
                    "200": _json({"type": "object", "properties": {
                        "letters": {"type": "array", "items": {"$ref": "#/components/schemas/FeedDeadLetter"}}}},
                        "The letters, oldest first."),
                    "404": _json(_ERR, "The pipeline has no change-feed tables (an event source feeds it)."),
                    "409": _json(_ERR, "The replicas are PostgreSQL tables: their dead letters are rows of "
                                       "lakemirror_dead_letters there."),
                    "422": _json(_PROBLEMS, "Invalid query."),
                    "504": _json(_ERR, "The dead-letter table was not read within the API timeout.")},
                params=[_param("status", "query", "Only letters of this status: pending, skipped or replayed.",
                               required=False),
                        _param("table", "query", "Only this table's letters (its name in the pipeline, or the "
                                                 "source table).", required=False),
                        _param("limit", "query", "At most this many (the newest; default 500).",
                               {"type": "integer"}, required=False)],
                secured=True)},
            "/api/change-feed/dead-letters/skip": {"post": _letters_command("skip", (
                "Mark dead letters skipped: nothing is written to a replica; the replica keeps the key as it "
                "was before the refused change."), feed=True)},
            "/api/change-feed/dead-letters/replay": {"post": _letters_command("replay", (
                "Write each letter's key again, between two of its table's batches: its row at the version the "
                "replica has applied through, read from the source (a delete when it has none there), under a "
                "transaction id of the replay's own; every pending letter of the same key is settled by that "
                "write. A key the replica refuses again stays pending with the new reason."), feed=True)},
            "/api/recovery-point": {"get": _op(
                "Per table of the configured pipeline, the replica version showing its source as of one instant, "
                "the same instant for every table (a consistent failover point).", {
                    "200": _json({"type": "object", "properties": {
                        "as_of": {"type": "string"}, "as_of_epoch_seconds": {"type": "number"},
                        "valid_until": {"type": "string", "nullable": True},
                        "tables": {"type": "array", "items": {"type": "object"}},
                        "notes": {"type": "object"}}}, "The recovery point."),
                    "409": _json({"type": "object"}, "No replica version of some table shows its source as of that "
                                                     "instant; the reasons, per table."),
                    "422": _json(_PROBLEMS, "An invalid at, anchor or tables."),
                    "504": _json(_ERR, "The replicas' histories were not read within the API timeout.")},
                params=[_param("at", "query", "The instant: ISO 8601 (UTC without an offset) or epoch seconds; "
                                              "default the newest instant every replica has reached.", required=False),
                        _param("anchor", "query", "Only instants at which this table committed.", required=False),
                        _param("tables", "query", "Comma-separated tables (default: all with applied batches).",
                               required=False)],
                secured=True)},
        },
    }
