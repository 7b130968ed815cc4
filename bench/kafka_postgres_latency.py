"""Latency Kafka → PostgreSQL: Real-Time Mode against micro-batches at a 1 s trigger.

The same pipeline part in both runs: :class:`lakemirror.supervisor.events.stream_runner.EventStreamRunner` with
:class:`lakemirror.sinks.postgres.event_replicas.PostgresEventReplicas`, reading a 2-partition topic of Debezium envelopes into a PostgreSQL replica under the sequence
guard. Real-Time Mode: ``trigger(realTime="1 second")`` (the default checkpoint interval) and the ``foreach`` writer committing by
``max_dwell_ms`` (50) and count; micro-batch: ``foreachBatch`` every second. A producer sends one
new row every ``1 / rate`` seconds for ``seconds``; a poller reads the replica's keys every 10 ms.
A row's latency is the time it is first seen in Postgres minus the time it was handed to the
producer (both on this machine's clock), so it includes the Kafka hop, Spark and the commit.

Runs throwaway servers with scripts/kafka.sh and scripts/postgres.sh and a local Spark.
``python -m bench.kafka_postgres_latency`` prints the figures; ``make bench ONLY=kafka_postgres_latency``
records them in docs/BENCHMARKS.md. The machine's load average is reported with them (shared).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg

from lakemirror.sinks.postgres.executor import PostgresTarget
from lakemirror.sinks.postgres.event_replicas import PostgresEventReplicas
from lakemirror.sinks.postgres.real_time import RealTimeSpec
from lakemirror.sources.event_source import event_source_for
from lakemirror.supervisor.events.stream_runner import EventStreamRunner, EventStreamSpec

ROOT = Path(__file__).resolve().parent.parent
MODES = ("real-time", "micro-batch 1 s")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def envelope(i: int, lsn: int) -> dict[str, Any]:
    """A Debezium insert of row ``i`` at log position ``lsn`` (Postgres connector, JSON converter)."""
    ts = int(time.time() * 1000)
    return {"before": None, "after": {"id": i, "amount": i * 10, "note": f"row {i}"},
            "source": {"connector": "postgresql", "name": "bench", "db": "bench", "schema": "public",
                       "table": "orders", "lsn": lsn, "txId": lsn, "ts_ms": ts, "snapshot": "false"},
            "op": "c", "ts_ms": ts}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(round(q / 100 * (len(ordered) - 1)))))]


def _one_mode(spark: Any, mode: str, brokers: str, target: PostgresTarget, workdir: Path, rate: float,
              seconds: float) -> dict[str, Any]:
    from kafka import KafkaProducer
    from kafka.admin import KafkaAdminClient, NewTopic

    topic = f"bench.public.orders_{uuid.uuid4().hex[:6]}"
    KafkaAdminClient(bootstrap_servers=brokers).create_topics([NewTopic(topic, 2, 1)])
    producer = KafkaProducer(bootstrap_servers=brokers, linger_ms=0)
    schema = target.schema
    real_time = RealTimeSpec(max_dwell_ms=50, max_rows=1000) \
        if mode == "real-time" else None
    spec = EventStreamSpec("bench", "kafka", "debezium", bootstrap_servers=brokers, topics=topic,
                           trigger_interval_seconds=1.0)
    events = event_source_for(spec)
    sink = PostgresEventReplicas(target, "bench", spec.name, events.decoder, label="events:bench", real_time=real_time)
    runner = EventStreamRunner(spec, spark, workdir / mode.replace(" ", "_"), sink, source=events)
    sent: dict[int, float] = {}
    seen: dict[int, float] = {}
    stop = threading.Event()

    def send(i: int) -> None:
        sent[i] = time.time()
        producer.send(topic, key=json.dumps({"id": i}).encode(), value=json.dumps(envelope(i, 1000 + i)).encode(),
                      partition=i % 2)
        producer.flush()

    def poll() -> None:
        with psycopg.connect(**{**target.connect_kwargs(), "options": "-c TimeZone=UTC"}) as conn:
            while not stop.is_set():
                try:
                    for (i,) in conn.execute(f'SELECT id FROM "{schema}".orders').fetchall():
                        seen.setdefault(int(i), time.time())
                except psycopg.errors.UndefinedTable:
                    pass
                time.sleep(0.01)

    poller = threading.Thread(target=poll, daemon=True)
    runner.launch()
    poller.start()
    load_start = os.getloadavg()
    try:
        # Warm-up: the query starts and the replica exists before anything is measured.
        send(0)
        deadline = time.time() + 600
        while 0 not in seen:
            assert time.time() < deadline, f"{mode}: the first row never reached Postgres"
            runner.poll()
            time.sleep(0.1)
        first = 1
        count = int(rate * seconds)
        started = time.time()
        for n in range(count):
            send(first + n)
            runner.poll()
            time.sleep(max(0.0, started + (n + 1) / rate - time.time()))
        deadline = time.time() + 120
        while not all(i in seen for i in range(first, first + count)) and time.time() < deadline:
            runner.poll()
            time.sleep(0.1)
    finally:
        stop.set()
        poller.join(5)
        runner.halt()
        producer.close()
    latencies = [(seen[i] - sent[i]) * 1000 for i in range(first, first + count) if i in seen]
    return {"mode": mode, "rows": count, "rows_seen": len(latencies), "rate_per_second": rate,
            "p50_ms": round(percentile(latencies, 50), 1), "p99_ms": round(percentile(latencies, 99), 1),
            "max_ms": round(max(latencies), 1), "load_average_start": [round(x, 1) for x in load_start],
            "load_average_end": [round(x, 1) for x in os.getloadavg()]}


def kafka_postgres_latency(rate: float = 20.0, seconds: float = 30.0) -> list[dict[str, Any]]:
    from lakemirror.daemon.settings import RuntimeSettings
    from lakemirror.daemon.settings.real_time import real_time_spark_conf
    from lakemirror.daemon.spark import local_session

    root = Path(tempfile.mkdtemp(prefix="bench-kafka-pg-"))
    root.chmod(0o755)
    pg_port, kafka_port, controller_port = _free_port(), _free_port(), _free_port()
    pg = [str(ROOT / "scripts" / "postgres.sh"), "start", str(pg_port), str(root / "pg")]
    kafka = [str(ROOT / "scripts" / "kafka.sh")]
    subprocess.run(pg, check=True, capture_output=True)
    subprocess.run([*kafka, "fetch"], check=True, capture_output=True)
    subprocess.run([*kafka, "start", str(root / "kafka"), str(kafka_port), str(controller_port)], check=True,
                   capture_output=True)
    # the session a daemon running Real-Time Mode gets (daemon.context.DaemonContext.runtime)
    spark = local_session(RuntimeSettings(master="local[2]", shuffle_partitions=2, driver_memory="2g",
                                          spark_conf=real_time_spark_conf({})), app_name="bench-kafka-postgres")
    try:
        out = []
        for mode in MODES:
            target = PostgresTarget("127.0.0.1", pg_port, "postgres", f"bench_{mode.split()[0].replace('-', '_')}",
                                    "postgres", retry_seconds=30)
            out.append(_one_mode(spark, mode, f"127.0.0.1:{kafka_port}", target, root, rate, seconds))
            print(f"  {out[-1]}", flush=True)
        return out
    finally:
        spark.stop()
        subprocess.run([*kafka, "stop", str(root / "kafka")], capture_output=True)
        subprocess.run([str(ROOT / "scripts" / "postgres.sh"), "stop", str(pg_port), str(root / "pg")],
                       capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


def render(runs: list[dict[str, Any]]) -> list[str]:
    r0 = runs[0]
    lines = ["## Latency Kafka → PostgreSQL", "",
             f"`bench/kafka_postgres_latency.py`: {r0['rows']} new rows at {r0['rate_per_second']:g} per second into "
             "a 2-partition topic of Debezium envelopes, read by lakemirror's event source into a PostgreSQL 15 "
             "replica (scripts/postgres.sh, fsync off) under the sequence guard; a row's latency is the time it is "
             "first seen in Postgres (polled every 10 ms) minus the time it was handed to the producer. Real-Time "
             "Mode: `trigger(realTime=\"1 second\")` (the default checkpoint interval), a `foreach` writer committing by `max_dwell_ms: 50`; "
             "micro-batch: `foreachBatch` every second. The machine is shared: its load average (1, 5, 15 min) "
             "is noted with each run.", "",
             "| mode | rows seen | p50 ms | p99 ms | max ms | load average at start → end |", "|---|---|---|---|---|---|"]
    for r in runs:
        lines.append(f"| {r['mode']} | {r['rows_seen']}/{r['rows']} | {r['p50_ms']} | {r['p99_ms']} | {r['max_ms']} | "
                     f"{r['load_average_start']} → {r['load_average_end']} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rate", type=float, default=20.0, help="rows per second")
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args()
    for r in kafka_postgres_latency(args.rate, args.seconds):
        print(json.dumps(r))


if __name__ == "__main__":
    main()
