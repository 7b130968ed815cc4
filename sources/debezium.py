"""Debezium envelopes and simple CDC events, decoded into the change contract.

Pure: no pyspark import. One message in, one :data:`~lakemirror.sources.change_event.Decoded` out;
nothing here raises on bad input (a bad message is a :class:`DeadLetter` with the reason).

Debezium (JSON converter, with or without an embedded ``schema``/``payload``), as Debezium 3.7
emits it from Postgres through Kafka Connect's JSON converter:

- ``op``: ``c`` create, ``u`` update, ``r`` snapshot read (upserts), ``d`` delete, ``t`` truncate
  (NULL key: the whole table); ``m`` (a logical-decoding message) is skipped;
- the key comes from the message key (the primary key as JSON); without a message key (a file of
  bare envelopes) from the configured key columns, read in ``after`` (``before`` for a delete);
- a null value is the tombstone Kafka needs for compaction after a delete: skipped, not applied;
- a primary-key UPDATE arrives as ``d`` under the old key then ``c`` under the new key, with one
  lsn: two keys, each with its own change, so no rank between them is needed;
- the position, which orders a key's changes as the database committed them: Postgres ``source.lsn`` (an integer), then ``txId``, then the
  in-transaction order (``transaction.total_order`` when transaction metadata is on); MySQL binlog
  file index, ``pos``, ``row``; ``ts_ms`` only when the source gives neither (the basis says so);
  snapshot reads (``op: r``) are in phase :data:`SNAPSHOT`, older than any streamed change.

The simple form (the CDC event of Delta Lake's Streaming CDC Pipeline recipe): ``table_name``, ``operation``
(INSERT/UPDATE/DELETE, also READ and TRUNCATE), ``before``/``after``/``primary_key`` as JSON strings
(objects are accepted too), ``timestamp`` (ISO 8601, or epoch milliseconds), ``transaction_id``.
It has no log position: it is ordered by timestamp, then by the digits of ``transaction_id``.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any, Final, Mapping, Sequence

from lakemirror.sources.connect_types import BadValue, NeedsExactNumbers, column_codecs, decode_row, envelope_field
from lakemirror.sources.change_event import (
    BASIS_MYSQL_BINLOG, BASIS_POSTGRES_LSN, BASIS_SIMPLE_TIMESTAMP, BASIS_TS_MS, DELETE, SNAPSHOT, STREAM,
    TRUNCATE, UPSERT, ChangeEvent, DeadLetter, Decoded, Position, Skipped,
)

FORMAT_DEBEZIUM: Final = "debezium"
FORMAT_SIMPLE = "simple"
FORMATS = (FORMAT_DEBEZIUM, FORMAT_SIMPLE)

KeyColumns = Mapping[str, Sequence[str]]

_DEBEZIUM_OPS = {"c": UPSERT, "u": UPSERT, "r": UPSERT, "d": DELETE, "t": TRUNCATE}
_SIMPLE_OPS = {"insert": UPSERT, "create": UPSERT, "c": UPSERT, "update": UPSERT, "u": UPSERT,
               "read": UPSERT, "snapshot": UPSERT, "r": UPSERT, "delete": DELETE, "d": DELETE,
               "truncate": TRUNCATE, "t": TRUNCATE}
_SIMPLE_SNAPSHOT = {"read", "snapshot", "r"}


def _last_digits(text: str) -> str | None:
    r"""The last run of decimal digits in ``text`` (``mysql-bin.000042`` -> ``000042``), or None.

    A scan from the end, not ``re.search(r"(\d+)\D*$")``: that expression restarts at every digit
    of a long run followed by a non-digit and a digit, quadratic in the run's length, so one long
    value could hold the stream's thread for seconds."""
    end = len(text)
    while end and not text[end - 1].isdecimal():
        end -= 1
    start = end
    while start and text[start - 1].isdecimal():
        start -= 1
    return text[start:end] or None


_INT64_MAX = 2**63 - 1


class _Bad(Exception):
    """Internal: the reason a message is a dead letter (and its table, once known)."""

    def __init__(self, reason: str, table: str | None = None) -> None:
        super().__init__(reason)
        self.table = table


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or value is None:
        raise _Bad(f"{what} is {value!r}, not an integer")
    try:
        out = int(value)
    except (TypeError, ValueError):
        raise _Bad(f"{what} is {value!r}, not an integer") from None
    if not 0 <= out <= _INT64_MAX:
        raise _Bad(f"{what} {out} is outside 0..2^63-1")
    return out


def _json(text: str, what: str, exact: bool = False) -> Any:
    """``text`` parsed; with ``exact``, its numbers with a fraction or exponent as :class:`Decimal`."""
    try:
        return json.loads(text, parse_float=Decimal) if exact else json.loads(text)
    except (TypeError, ValueError) as exc:
        raise _Bad(f"{what} is not JSON ({exc})") from None


def _split(doc: Any) -> tuple[Any, Any]:
    """(payload, schema) of a JSON-converter message with an embedded schema, else (message, None)."""
    if isinstance(doc, dict) and "payload" in doc and set(doc) <= {"schema", "payload"}:
        return doc["payload"], doc.get("schema")
    return doc, None


def _unwrap(doc: Any) -> Any:
    return _split(doc)[0]


def _typed(row: Mapping[str, Any], schema: Any, only: tuple[str, ...] | None = None,
           ) -> tuple[dict[str, Any], dict[str, str]]:
    """A row image decoded through its Connect schema (decimals, dates, timestamps …), with its types;
    with ``only``, just those columns."""
    try:
        return decode_row(row, column_codecs(schema), only)
    except BadValue as exc:
        raise _Bad(f"a value does not match its schema or the replica's types: {exc}") from None


def _key_from_message(key: str | None, exact: bool = False) -> tuple[tuple[tuple[str, Any], ...], dict[str, str]] | None:
    if key is None:
        return None
    doc, schema = _split(_json(key, "the message key", exact))
    if doc is None:
        return None
    if not isinstance(doc, dict) or not doc:
        raise _Bad(f"the message key {key!r} is not a JSON object of key columns")
    values, types = _typed(doc, schema)
    return tuple(values.items()), types


def _key_from_row(table: str, row: Mapping[str, Any] | None, key_columns: KeyColumns) -> tuple[tuple[str, Any], ...]:
    names = key_columns.get(table)
    if not names:
        raise _Bad(f"no key: the message has no key and no key columns are configured for table {table!r}")
    if row is None:
        raise _Bad(f"no key: the message has no key and no row image to read {list(names)} from")
    missing = [n for n in names if n not in row]
    if missing:
        raise _Bad(f"no key: key column(s) {missing} are not in the row image")
    return tuple((n, row[n]) for n in names)


def _debezium_position(payload: Mapping[str, Any], source: Mapping[str, Any], snapshot: bool) -> tuple[Position, str]:
    phase = SNAPSHOT if snapshot else STREAM
    if source.get("lsn") is not None:
        txn = payload.get("transaction")
        order = txn.get("total_order") if isinstance(txn, dict) else None
        return (Position(phase, _int(source["lsn"], "source.lsn"),
                         _int(source.get("txId") or 0, "source.txId"),
                         _int(order or 0, "transaction.total_order")), BASIS_POSTGRES_LSN)
    if source.get("file") is not None and source.get("pos") is not None:
        found = _last_digits(str(source["file"]))
        if found is None:
            raise _Bad(f"source.file {source['file']!r} has no binlog index")
        return (Position(phase, _int(found, "source.file index"), _int(source["pos"], "source.pos"),
                         _int(source.get("row") or 0, "source.row")), BASIS_MYSQL_BINLOG)
    ts = source.get("ts_ms", payload.get("ts_ms"))
    if ts is None:
        raise _Bad("no position: source has no lsn, no binlog file/pos and no ts_ms")
    return Position(phase, _int(ts, "source.ts_ms")), BASIS_TS_MS


def _table_of(source: Mapping[str, Any], topic: str | None) -> str:
    table = source.get("table")
    if isinstance(table, str) and table:
        return table
    if topic:
        return topic.rsplit(".", 1)[-1]
    raise _Bad("no table: source.table is missing and no topic names one")


def _decode_envelope(value: str, key: str | None, key_columns: KeyColumns, topic: str | None,
                     exact: bool = False) -> Decoded:
    payload, schema = _split(_json(value, "the message value", exact))
    source = payload.get("source") if isinstance(payload, dict) else None
    named = source.get("table") if isinstance(source, dict) else None
    try:
        return _decode_payload(payload, schema, key, key_columns, topic, exact)
    except _Bad as bad:
        bad.table = bad.table or (named if isinstance(named, str) and named else None)
        raise


def _decode_payload(payload: Any, schema: Any, key: str | None, key_columns: KeyColumns, topic: str | None,
                    exact: bool) -> Decoded:
    if payload is None:
        return Skipped("tombstone (a null value after a delete)")
    if not isinstance(payload, dict):
        raise _Bad("the message value is not a JSON object")
    if "status" in payload and "op" not in payload:
        return Skipped(f"transaction {payload.get('status')} marker")
    op = payload.get("op")
    if op == "m":
        return Skipped("logical decoding message (op m), not a row change")
    if op not in _DEBEZIUM_OPS:
        raise _Bad(f"unknown op {op!r}; expected one of c, u, d, r, t")
    source = payload.get("source")
    if not isinstance(source, dict):
        raise _Bad("the envelope has no source block")
    table = _table_of(source, topic)
    try:
        return _decode_change(payload, schema, table, op, source, key, key_columns, exact)
    except _Bad as bad:
        bad.table = table
        raise


def _decode_change(payload: Mapping[str, Any], schema: Any, table: str, op: str, source: Mapping[str, Any],
                   key: str | None, key_columns: KeyColumns, exact: bool) -> Decoded:
    position, basis = _debezium_position(payload, source, snapshot=op == "r")
    ts = source.get("ts_ms", payload.get("ts_ms"))
    ts_ms = ts if isinstance(ts, int) and not isinstance(ts, bool) else None
    kind = _DEBEZIUM_OPS[op]
    if kind == TRUNCATE:
        return ChangeEvent(table, TRUNCATE, (), position, basis=basis, ts_ms=ts_ms)
    before, after = payload.get("before"), payload.get("after")
    types: dict[str, str] = {}
    columns: dict[str, Any] = {}  # an upsert's decoded 'after' image; a delete carries no columns
    from_key = _key_from_message(key, exact)
    if kind == UPSERT:
        if not isinstance(after, dict):
            raise _Bad(f"op {op!r} without an 'after' row image")
        columns, types = _typed(after, envelope_field(schema, "after"))
    if from_key is None:
        # No message key: the key columns' values are read in the decoded image (a delete's
        # 'before': only its key columns are decoded, so a value elsewhere in it that the
        # replica could not hold never stops the delete).
        image: Mapping[str, Any] | None = columns if kind == UPSERT else None
        if kind == DELETE and before is not None:
            if not isinstance(before, dict):
                raise _Bad("the row image is not a JSON object")
            image, _ = _typed(before, envelope_field(schema, "before"), tuple(key_columns.get(table) or ()))
        keys = _key_from_row(table, image, key_columns)
    else:
        keys, key_types = from_key
        types = {**key_types, **types}
    if kind == UPSERT:
        columns = {**dict(keys), **columns}
    return ChangeEvent(table, kind, keys, position, columns, basis=basis, ts_ms=ts_ms, types=types)


def decode_debezium(value: str | None, key: str | None = None, *, key_columns: KeyColumns | None = None,
                    topic: str | None = None) -> Decoded:
    """Decode one Debezium message (its value and, from Kafka, its key) into the change contract."""
    if value is None:
        return Skipped("tombstone (a null value after a delete)")
    try:
        try:
            return _decode_envelope(value, key, key_columns or {}, topic)
        except NeedsExactNumbers:  # decimals as JSON numbers: parsed again, every number exact
            return _decode_envelope(value, key, key_columns or {}, topic, exact=True)
    except _Bad as bad:
        return DeadLetter(str(bad), raw=value, key=key, table=bad.table or _topic_table(topic))


def _topic_table(topic: str | None) -> str | None:
    """The table a Debezium topic names (``<prefix>.<schema>.<table>``), for a message that names none."""
    return topic.rsplit(".", 1)[-1] if topic else None


def _timestamp_micros(value: Any) -> int:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return _int(int(value * 1000), "timestamp (epoch ms)")
    if not isinstance(value, str) or not value:
        raise _Bad(f"timestamp {value!r} is not an ISO 8601 time or epoch milliseconds")
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise _Bad(f"timestamp {value!r} is not an ISO 8601 time") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    delta = when - datetime(1970, 1, 1, tzinfo=timezone.utc)
    return _int((delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds, "timestamp")


def _image(doc: Mapping[str, Any], name: str) -> dict[str, Any] | None:
    value = doc.get(name)
    if isinstance(value, str):
        value = _json(value, name)
    if value is not None and not isinstance(value, dict):
        raise _Bad(f"{name} is not a JSON object")
    return value


def _decode_simple(line: str, key_columns: KeyColumns) -> Decoded:
    doc = _json(line, "the event")
    if not isinstance(doc, dict):
        raise _Bad("the event is not a JSON object")
    table = doc.get("table_name")
    if not isinstance(table, str) or not table:
        raise _Bad("no table_name")
    try:
        return _decode_simple_change(doc, table, key_columns)
    except _Bad as bad:
        bad.table = table
        raise


def _decode_simple_change(doc: Mapping[str, Any], table: str, key_columns: KeyColumns) -> Decoded:
    operation = str(doc.get("operation") or "").lower()
    if operation not in _SIMPLE_OPS:
        raise _Bad(f"unknown operation {doc.get('operation')!r}; expected INSERT, UPDATE, DELETE, READ or TRUNCATE")
    kind = _SIMPLE_OPS[operation]
    txn = _last_digits(str(doc.get("transaction_id") or ""))
    position = Position(SNAPSHOT if operation in _SIMPLE_SNAPSHOT else STREAM, _timestamp_micros(doc.get("timestamp")),
                        _int(txn, "transaction_id digits") if txn else 0)
    if kind == TRUNCATE:
        return ChangeEvent(table, TRUNCATE, (), position, basis=BASIS_SIMPLE_TIMESTAMP)
    before, after = _image(doc, "before"), _image(doc, "after")
    if kind == UPSERT and after is None:
        raise _Bad(f"operation {doc.get('operation')!r} without an 'after' row")
    declared = _image(doc, "primary_key")
    keys = tuple(declared.items()) if declared else _key_from_row(
        table, after if kind == UPSERT else (before or after), key_columns)
    columns = {**dict(keys), **after} if kind == UPSERT and after is not None else {}
    return ChangeEvent(table, kind, keys, position, columns, basis=BASIS_SIMPLE_TIMESTAMP)


def decode_simple(line: str, *, key_columns: KeyColumns | None = None) -> Decoded:
    """Decode one event of the simple form."""
    try:
        return _decode_simple(line, key_columns or {})
    except _Bad as bad:
        return DeadLetter(str(bad), raw=line, table=bad.table)


def decode_line(line: str, fmt: str, *, key_columns: KeyColumns | None = None) -> Decoded:
    """Decode one line of a JSON-lines file of events.

    ``debezium`` lines are either a bare envelope (the message value) or a Kafka record dump
    ``{"key": …, "value": …, "topic": …}`` whose ``key``/``value`` are JSON (text or objects).
    """
    if fmt == FORMAT_SIMPLE:
        return decode_simple(line, key_columns=key_columns)
    if fmt != FORMAT_DEBEZIUM:
        raise ValueError(f"unknown event format {fmt!r}; expected one of {FORMATS}")
    try:
        doc = _json(line, "the line")
    except _Bad as bad:
        return DeadLetter(str(bad), raw=line, table=bad.table)
    if isinstance(doc, dict) and "value" in doc and not ({"op", "payload", "schema"} & set(doc)):
        def text(part: Any) -> str | None:
            return part if part is None or isinstance(part, str) else json.dumps(part)
        topic = doc.get("topic")
        return decode_debezium(text(doc["value"]), text(doc.get("key")), key_columns=key_columns,
                               topic=topic if isinstance(topic, str) else None)
    return decode_debezium(line, None, key_columns=key_columns)
