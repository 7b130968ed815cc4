"""Debezium events from Kafka into Delta: lakemirror's event source against the Streaming CDC recipe.

    .venv/bin/python -m bench.debezium_events --events 200000 [--out docs/bench/debezium_events.json]
    make bench ONLY=debezium_events      # a section of docs/BENCHMARKS.md: 1,000,000 events (20,000 with QUICK=1)

One KRaft broker (scripts/kafka.sh) on loopback; four Debezium topics (``bench.public.t0`` … ``t3``)
of two partitions each: eight partitions, four tables. The events are Debezium's Postgres envelopes
as the JSON converter writes them without schemas (``before``, ``after``, ``source`` with ``lsn``,
``txId`` and ``ts_ms``, ``op``), keyed by the primary key, with the tombstone after each delete:
inserts, updates, deletes and re-inserts of 5,000 keys per table, several changes of one key in one
millisecond (one transaction), and, as a Connect task restarted without its last offsets flushed
does, every 20,000 events the last 2,000 of a partition delivered again after newer ones.

Both consumers read the same topics from the beginning with Spark's Kafka source and
``foreachBatch``, at most ``--max-offsets`` messages a batch:

- lakemirror: :class:`lakemirror.supervisor.events.stream_runner.EventStreamRunner` (decode, per-key fold by
  log position, one guarded MERGE per replica under a transaction id, tombstones);
- the Streaming CDC recipe (Delta Lake's "Streaming CDC Pipeline" code recipe): parse the JSON, per table keep each key's latest event
  by timestamp (``row_number`` over ``ts_ms`` descending), one ``DeltaTable`` MERGE (delete, update
  all, insert), no guard.

Before the measured runs, each system drains a small backlog of its own (``warm.public.*``) in the same
JVM. Reported per system: events per second to drain the whole backlog (wall time from the query's start
until every message is applied and committed), and whether each replica equals the fold of the distinct events by
log position (the state PostgreSQL would hold). Then each system, in turn, reads topics of its own
while a producer thread sends the same kind of workload at a steady rate (``STEADY_RATE`` events a
second; no ranges delivered again), each envelope stamped with the time it is sent: its event-time
lag is the commit time of its table's MERGE minus that stamp, p50 and p99 over every event, and its
replicas are checked against the fold too. The machine's load average is recorded before and
after, as the machine is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

ROOT = Path(__file__).resolve().parents[1]
TABLES = ("t0", "t1", "t2", "t3")
KEYS = 5000
PARTITIONS = 2
#: Events each system drains from topics of their own before the measured run, in the same JVM: Spark's
#: and Delta's first queries (class loading, JIT) are then paid by neither measured run.
WARM_UP_EVENTS = 2_000
#: The baseline's name in the report: Delta Lake's Streaming CDC Pipeline code recipe, as written there.
RECIPE = "Streaming CDC recipe"


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def envelope(table: str, op: str, key: int, row: dict[str, Any] | None, lsn: int, tx: int, ts_ms: int) -> dict[str, Any]:
    source = {"version": "3.7.0.Final", "connector": "postgresql", "name": "bench", "ts_ms": ts_ms,
              "snapshot": "false", "db": "bench", "schema": "public", "table": table, "txId": tx, "lsn": lsn}
    return {"before": {"id": key} if op == "d" else None, "after": row, "source": source, "op": op,
            "ts_ms": ts_ms + 3}


def workload(events: int, seed: int, prefix: str = "bench") -> Iterator[tuple[str, int, dict[str, Any], dict[str, Any] | None]]:
    """(topic, partition, key, value) in log order; ``value`` None is a tombstone."""
    rng = random.Random(seed)
    live: dict[tuple[str, int], bool] = {}
    lsn, tx, ts = 10_000, 500, 1_764_000_000_000
    made = 0
    while made < events:
        tx += 1
        ts += rng.choice((0, 0, 1, 2))          # several transactions can share one millisecond
        table = rng.choice(TABLES)
        key = rng.randint(1, KEYS)
        for _ in range(rng.choice((1, 1, 1, 2, 3))):  # changes of one key in one transaction: one ts_ms
            if made >= events:
                break
            lsn += rng.randint(8, 200)
            exists = live.get((table, key), False)
            roll = rng.random()
            if not exists:
                op = "c"
            elif roll < 0.8:
                op = "u"
            else:
                op = "d"
            row = None if op == "d" else {"id": key, "v": made, "name": f"n{rng.randint(0, 999)}",
                                          "amount": round(rng.uniform(-1e4, 1e4), 2)}
            live[(table, key)] = op != "d"
            topic = f"{prefix}.public.{table}"
            partition = key % PARTITIONS
            yield topic, partition, {"id": key}, envelope(table, op, key, row, lsn, tx, ts)
            made += 1
            if op == "d":
                yield topic, partition, {"id": key}, None


def produce(servers: str, events: int, seed: int,
            prefix: str = "bench") -> list[tuple[str, int, dict[str, Any], dict[str, Any] | None]]:
    """Create the topics and produce the workload with its redelivered ranges; every message sent."""
    from kafka import KafkaProducer
    from kafka.admin import KafkaAdminClient, NewTopic

    KafkaAdminClient(bootstrap_servers=servers).create_topics(
        [NewTopic(f"{prefix}.public.{t}", PARTITIONS, 1) for t in TABLES])
    producer = KafkaProducer(bootstrap_servers=servers, linger_ms=20, batch_size=256 * 1024)
    sent: list[tuple[str, int, dict[str, Any], dict[str, Any] | None]] = []
    per_partition: dict[tuple[str, int], list[int]] = {}
    for n, message in enumerate(workload(events, seed, prefix), start=1):
        topic, partition, key, value = message
        sent.append(message)
        per_partition.setdefault((topic, partition), []).append(len(sent) - 1)
        if n % 20_000 == 0:  # a Connect task restarted without its last offsets: a range again
            tp = (topic, partition)
            for i in per_partition[tp][-2000:]:
                sent.append(sent[i])
    for topic, partition, key, value in sent:
        producer.send(topic, key=json.dumps(key).encode(), value=None if value is None else json.dumps(value).encode(),
                      partition=partition)
    producer.flush()
    producer.close()
    return sent


def steady_producer(servers: str, events: int, rate: float, seed: int, prefix: str
                    ) -> tuple[list[tuple[str, int, dict[str, Any], dict[str, Any] | None]], threading.Thread]:
    """The workload's messages (no ranges delivered again) and a thread that sends them at ``rate``
    events a second, each envelope's ``ts_ms`` set to the moment it is sent: an event's lag is then
    its replica commit time minus the time its change happened."""
    from kafka import KafkaProducer
    from kafka.admin import KafkaAdminClient, NewTopic

    KafkaAdminClient(bootstrap_servers=servers).create_topics(
        [NewTopic(f"{prefix}.public.{t}", PARTITIONS, 1) for t in TABLES])
    messages = list(workload(events, seed, prefix))

    def send() -> None:
        producer = KafkaProducer(bootstrap_servers=servers, linger_ms=5)
        started, n = time.time(), 0
        for topic, partition, key, value in messages:
            if value is not None:
                n += 1
                ahead = started + n / rate - time.time()
                if ahead > 0:
                    time.sleep(ahead)
                now_ms = int(time.time() * 1000)
                value["source"]["ts_ms"], value["ts_ms"] = now_ms, now_ms + 3
            producer.send(topic, key=json.dumps(key).encode(),
                          value=None if value is None else json.dumps(value).encode(), partition=partition)
        producer.flush()
        producer.close()

    return messages, threading.Thread(target=send, name="steady-producer", daemon=True)


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)


def expected(sent: list[tuple[str, int, dict[str, Any], dict[str, Any] | None]]) -> dict[str, dict[int, dict[str, Any]]]:
    """Each table's rows after every distinct event applied in log order (what PostgreSQL holds)."""
    unique = {}
    for topic, _, key, value in sent:
        if value is not None:
            unique[(value["source"]["lsn"], key["id"], value["op"])] = value
    out: dict[str, dict[int, dict[str, Any]]] = {t: {} for t in TABLES}
    for (lsn, key, op), value in sorted(unique.items()):
        rows = out[value["source"]["table"]]
        if op == "d":
            rows.pop(key, None)
        else:
            rows[key] = value["after"]
    return out


def replica_state(spark: Any, path: str) -> dict[int, dict[str, Any]]:
    from delta.tables import DeltaTable

    if not DeltaTable.isDeltaTable(spark, path):
        return {}
    df = spark.read.format("delta").load(path)
    return {r["id"]: {c: r[c] for c in ("id", "v", "name", "amount")} for r in df.collect()}


def wrong_keys(spark: Any, root: str, want: dict[str, dict[int, dict[str, Any]]]) -> int:
    bad = 0
    for table in TABLES:
        got = replica_state(spark, f"{root}/{table}")
        bad += sum(1 for k in set(got) | set(want[table]) if got.get(k) != want[table].get(k))
    return bad


def run_lakemirror(spark: Any, servers: str, root: Path, total: int, max_offsets: int,
                   prefix: str = "bench", on_start: Callable[[], Any] | None = None, *, tables_at: str,
                   driver_apply: bool = True) -> dict[str, Any]:
    from lakemirror.identifiers import TableName
    from lakemirror.supervisor.control import table_state as sm
    from lakemirror.supervisor.events.stream_runner import EventBatchReport, EventStreamRunner, EventStreamSpec
    from lakemirror.tables import TableLocation

    spec = EventStreamSpec("bench", "kafka", "debezium", bootstrap_servers=servers, topic_pattern=prefix + "\\.public\\..*",
                           trigger_interval_seconds=0.1, max_per_trigger=max_offsets, driver_apply=driver_apply)

    def locate(table: str) -> TableLocation:
        return TableLocation(TableName("b", "s", table), f"{tables_at}/{table}")

    from lakemirror.sources.event_source import event_source_for
    from lakemirror.sinks.events.delta_sink import delta_event_sink

    sink = delta_event_sink(spec, event_source_for(spec).decoder, "bench", spark, locate, locate("_dead_letters"))
    runner = EventStreamRunner(spec, spark, root / "_events", sink)
    read = batches = 0
    lags: list[float] = []
    started = time.time()
    runner.launch()
    if on_start is not None:
        on_start()
    try:
        while read < total:
            for item in runner.poll():
                if isinstance(item, EventBatchReport):
                    read += item.outcome.stats.rows_read
                    batches += 1
                    lags += [lag for r in item.replicas.values() for lag in r.event_lags_seconds]
                if isinstance(item, sm.Failed):
                    raise RuntimeError(item.error)
            time.sleep(0.05)
        elapsed = time.time() - started
    finally:
        runner.halt()
    stale = sum(r.stale for r in runner.replicas.values())
    return {"seconds": elapsed, "batches": batches, "messages": read, "stale_dropped": stale,
            "dead_letters": runner.dead_letter_count, "lags": lags}


RECIPE_SCHEMA = ("before STRUCT<id: BIGINT>, after STRUCT<id: BIGINT, v: BIGINT, name: STRING, amount: DOUBLE>, "
                 "source STRUCT<`table`: STRING, lsn: BIGINT, txId: BIGINT, ts_ms: BIGINT>, op STRING, ts_ms BIGINT")


def run_recipe(spark: Any, servers: str, root: Path, total: int, max_offsets: int,
               prefix: str = "bench", on_start: Callable[[], Any] | None = None, *, tables_at: str) -> dict[str, Any]:
    """The Streaming CDC recipe's approach: foreachBatch, latest per key by timestamp, one DeltaTable MERGE, no guard."""
    from delta.tables import DeltaTable
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    counted = {"messages": 0, "batches": 0}
    lags: list[float] = []

    def batch(df: Any, batch_id: int) -> None:
        df = df.persist()
        messages = df.count()
        events = (df.where(F.col("value").isNotNull())
                  .select(F.from_json(F.col("value").cast("string"), RECIPE_SCHEMA).alias("e")).select("e.*")
                  .select(F.col("source.table").alias("tbl"), F.coalesce(F.col("after.id"), F.col("before.id")).alias("id"),
                          "op", F.col("source.ts_ms").alias("ts"), F.col("after.v").alias("v"),
                          F.col("after.name").alias("name"), F.col("after.amount").alias("amount")))
        latest = (events.withColumn("rn", F.row_number().over(Window.partitionBy("tbl", "id").orderBy(F.col("ts").desc())))
                  .where("rn = 1").drop("rn").persist())
        committed: dict[str, float] = {}
        for table in TABLES:
            rows = latest.where(F.col("tbl") == table)
            path = f"{tables_at}/{table}"
            if not DeltaTable.isDeltaTable(df.sparkSession, path):
                (rows.where("op != 'd'").select("id", "v", "name", "amount").write.format("delta").save(path))
            else:
                cols = {c: f"s.{c}" for c in ("id", "v", "name", "amount")}
                (DeltaTable.forPath(df.sparkSession, path).alias("t").merge(rows.alias("s"), "t.id = s.id")
                 .whenMatchedDelete("s.op = 'd'").whenMatchedUpdate(set=cols)
                 .whenNotMatchedInsert(condition="s.op != 'd'", values=cols).execute())
            committed[table] = time.time()
        if on_start is not None:  # the steady run: each event's commit time minus its source ts_ms, as lakemirror's
            lags.extend(committed[r["tbl"]] - r["ts"] / 1000.0 for r in events.select("tbl", "ts").collect())
        latest.unpersist()
        df.unpersist()
        counted["messages"] += messages  # counted once the batch's MERGEs are committed, as lakemirror's reports are
        counted["batches"] += 1

    stream = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", servers)
              .option("subscribePattern", prefix + "\\.public\\..*").option("startingOffsets", "earliest")
              .option("maxOffsetsPerTrigger", str(max_offsets)).load())
    started = time.time()
    query = (stream.writeStream.foreachBatch(batch).option("checkpointLocation", str(root / "_checkpoint"))
             .trigger(processingTime="0.1 seconds").start())
    if on_start is not None:
        on_start()
    try:
        while counted["messages"] < total:
            if not query.isActive:
                raise RuntimeError(f"the recipe's query stopped: {query.exception()}")
            time.sleep(0.05)
        elapsed = time.time() - started
    finally:
        query.stop()
    return {"seconds": elapsed, "batches": counted["batches"], "messages": counted["messages"], "lags": lags}


#: The steady run after the drain: events a second and for how long (``steady_seconds``).
STEADY_RATE = 2_000


def debezium_events(events: int, max_offsets: int, seed: int, steady_seconds: float = 60.0,
                    steady_rate: float = STEADY_RATE, store: str = "local") -> list[dict[str, Any]]:
    """The consumers over the same topics (one broker, one Spark for all); one result per system:
    events per second to drain the backlog, then (``steady_seconds`` > 0) event-time lag p50/p99 of a
    steady stream of ``steady_rate`` events a second for ``steady_seconds`` into topics of its own,
    and for both runs the keys whose replica row differs from the fold.

    ``store``: ``local`` puts the replicas on the driver's disk; ``s3`` in a bucket of moto's S3 server
    on loopback (scripts/s3-server.sh; ``s3a://`` for Spark, ``s3://`` for delta-rs), where lakemirror
    also runs with ``driver_apply: false`` (Spark's MERGE, as over Spark Connect or for catalog tables)."""
    from functools import partial

    from lakemirror.daemon.settings import RuntimeSettings
    from lakemirror.daemon.spark import local_session

    work = Path(tempfile.mkdtemp(prefix="lakemirror-bench-debezium-"))
    kafka_dir, port = work / "kafka", free_port()
    subprocess.run([str(ROOT / "scripts" / "kafka.sh"), "start", str(kafka_dir), str(port), str(free_port())], check=True)
    servers = f"127.0.0.1:{port}"
    runs: list[dict[str, Any]] = []
    s3 = None
    try:
        spark_conf: dict[str, str] = {}
        tables_root = str(work)
        if store == "s3":
            from bench.production import BUCKET, S3Server

            s3 = S3Server(free_port())
            s3.start()
            spark_conf, tables_root = s3.spark_conf, f"s3a://{BUCKET}/debezium"
        sent = produce(servers, events, seed)
        want = expected(sent)
        warm = produce(servers, WARM_UP_EVENTS, seed, prefix="warm")
        spark = local_session(RuntimeSettings(master="local[2]", shuffle_partitions=2, driver_memory="3g",
                                              spark_conf=spark_conf),
                              app_name="lakemirror-bench-debezium", s3a=store == "s3")
        systems: list[tuple[str, Callable[..., dict[str, Any]]]] = [("lakemirror", run_lakemirror)]
        if store == "s3":
            systems.append(("lakemirror, Spark MERGE", partial(run_lakemirror, driver_apply=False)))
        systems.append((RECIPE, run_recipe))

        def at(kind: str, name: str) -> tuple[Path, str]:
            slug = kind + name.replace(" ", "_").replace(",", "")
            return work / slug, f"{tables_root}/{slug}"

        for name, run in systems:  # every path once through the JVM, so no run pays another's warm-up
            state, tables_at = at("warm_", name)
            run(spark, servers, state, len(warm), max_offsets, prefix="warm", tables_at=tables_at)
        for name, run in systems:
            state, tables_at = at("", name)
            load_before = os.getloadavg()
            out = run(spark, servers, state, len(sent), max_offsets, tables_at=tables_at)
            out.update(system=name, store=store, events=events, messages=len(sent), partitions=PARTITIONS * len(TABLES),
                       tables=len(TABLES), max_offsets_per_trigger=max_offsets,
                       events_per_second=round(len(sent) / out["seconds"], 1), seconds=round(out["seconds"], 1),
                       wrong_keys=wrong_keys(spark, tables_at, want), keys=sum(len(rows) for rows in want.values()),
                       load_average_start=[round(x, 1) for x in load_before],
                       load_average_end=[round(x, 1) for x in os.getloadavg()])
            out.pop("lags", None)
            runs.append(out)
            print(f"  {name}: {json.dumps(out)}", flush=True)
        for out, (name, run) in zip(runs, systems if steady_seconds > 0 else []):
            state, tables_at = at("steady_", name)
            prefix = "steady_" + state.name
            messages, producer = steady_producer(servers, int(steady_rate * steady_seconds), steady_rate, seed + 1,
                                                 prefix=prefix)
            steady = run(spark, servers, state, len(messages), max_offsets, prefix=prefix, on_start=producer.start,
                         tables_at=tables_at)
            producer.join()
            lags = steady.pop("lags")
            out.update(steady_rate=steady_rate, steady_seconds=steady_seconds, steady_events=len(lags),
                       lag_p50_seconds=percentile(lags, 0.50), lag_p99_seconds=percentile(lags, 0.99),
                       lag_max_seconds=percentile(lags, 1.0), steady_batches=steady["batches"],
                       steady_wrong_keys=wrong_keys(spark, tables_at, expected(messages)))
            print(f"  {name} steady: p50 {out['lag_p50_seconds']} s, p99 {out['lag_p99_seconds']} s over "
                  f"{len(lags):,} events, {out['steady_wrong_keys']} wrong keys", flush=True)
        spark.stop()
    finally:
        subprocess.run([str(ROOT / "scripts" / "kafka.sh"), "stop", str(kafka_dir)], check=False)
        if s3 is not None:
            s3.stop()
        shutil.rmtree(work, ignore_errors=True)
    return runs


def _intro(r0: dict[str, Any]) -> tuple[str, str]:
    """The section's heading and its description of the run."""
    if r0.get("store") == "s3":
        return ("## Debezium events from Kafka into Delta on S3",
                f"`bench/debezium_events.py --store s3`: the same workload, {r0['events']:,} events ({r0['messages']:,} "
                f"messages), {r0['max_offsets_per_trigger']:,} offsets a batch, with the replicas in a bucket of moto's "
                "S3 server on loopback (scripts/s3-server.sh): `s3a://` for Spark, `s3://` for delta-rs with storage "
                "options from the session's `fs.s3a.*` settings. lakemirror with its defaults (the driver's delta-rs "
                "MERGE under the sequence guard) and with `driver_apply: false` (Spark's MERGE with the tombstone "
                "anti-joins: the path of catalog tables and Spark Connect); the Streaming CDC recipe with `DeltaTable` MERGEs. "
                "The machine's two cores also run the S3 server.")
    return ("## Debezium events from Kafka into Delta",
            f"`bench/debezium_events.py`: {r0['events']:,} Debezium change events ({r0['messages']:,} messages with "
            f"the tombstones after deletes and the ranges delivered again) over {r0['partitions']} partitions into "
            f"{r0['tables']} tables, produced before either consumer starts; both read the topics from the beginning "
            f"with Spark's Kafka source and `foreachBatch`, at most {r0['max_offsets_per_trigger']:,} offsets a batch. "
            "lakemirror: the event source (fold by log position, one guarded MERGE per replica, tombstones); the "
            "Streaming CDC recipe (Delta Lake's Streaming CDC Pipeline code recipe): latest event per key by `ts_ms`, one `DeltaTable` MERGE per table, no guard. *Wrong keys* "
            "counts the keys whose replica row differs from the fold of the distinct events by log position (what "
            "the source database holds). Event-time lag: after the drain, each system reads topics of its own "
            f"while a producer sends {r0.get('steady_rate', 0):,.0f} events a second for "
            f"{r0.get('steady_seconds', 0):.0f} s, each stamped with the time it is sent (`source.ts_ms`); an "
            "event's lag is the commit time of its table's MERGE minus that stamp, over every event. The machine "
            "is shared: its load average (1, 5, 15 min) is noted per run.")


def render(runs: list[dict[str, Any]]) -> list[str]:
    """The section of docs/BENCHMARKS.md; the steady run's columns only when it ran."""
    heading, intro = _intro(runs[0])
    steady = any(r.get("steady_events") for r in runs)
    columns = ["system", "messages", "seconds", "messages/s", "wrong keys (of keys)", "batches",
               *(["event-time lag p50 / p99 / max (steady)", "wrong keys (steady)"] if steady else []),
               "load average start → end"]
    lines = [heading, "", intro, "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in runs:
        cells = [r["system"], f"{r['messages']:,}", str(r["seconds"]), f"{r['events_per_second']:,}",
                 f"{r['wrong_keys']} ({r['keys']:,})", str(r["batches"])]
        if steady:
            cells += [(f"{r['lag_p50_seconds']} / {r['lag_p99_seconds']} / {r['lag_max_seconds']} s "
                       f"({r['steady_events']:,} events)") if r.get("steady_events") else "-",
                      str(r.get("steady_wrong_keys", "-"))]
        cells.append(f"{r['load_average_start']} → {r['load_average_end']}")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--max-offsets", type=int, default=50_000, help="maxOffsetsPerTrigger for both")
    parser.add_argument("--seed", type=int, default=25)
    parser.add_argument("--steady-seconds", type=float, default=60.0, help="length of the steady run (lag); 0: none")
    parser.add_argument("--store", choices=("local", "s3"), default="local",
                        help="where the replicas live: the driver's disk, or moto's S3 server on loopback")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "bench" / "debezium_events.json")
    args = parser.parse_args(argv)
    runs = debezium_events(args.events, args.max_offsets, args.seed, args.steady_seconds, store=args.store)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(runs, indent=2) + "\n")
    print("\n".join(render(runs)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
