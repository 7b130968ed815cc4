"""``source.real_time``: run a Kafka event source into PostgreSQL in Spark's Real-Time Mode.

::

    source:
      kind: kafka
      ...
      real_time:
        checkpoint_interval_seconds: 1   # trigger(realTime="1 second"): how often offsets are checkpointed
        max_dwell_ms: 100                # a record is committed to Postgres at most this long after it came
        max_rows: 1000                   # ... or as soon as a writer holds this many
        tasks: 3                         # Kafka partitions read at once: one task, one connection each

Open-source Spark 4.2 runs Real-Time Mode from Kafka into ``foreach`` sinks only (not
``foreachBatch``, not Delta), so it needs ``source.kind: kafka`` and ``destination.kind: postgres``;
the pipeline YAML is refused otherwise (exit 2). Without this block the source runs in micro-batches
(``trigger_interval_seconds``), the default.
"""

from __future__ import annotations

from typing import Mapping

from pydantic import BaseModel, ConfigDict, Field

#: Spark's buffer between the JVM and a Python worker, in bytes, for a daemon running Real-Time Mode.
#: Records reach the ``foreach`` writer's Python worker through a buffered stream that is written
#: out when full (64 KiB by default): at 20 records a second that held records for seconds, and
#: the writer's ``max_dwell_ms`` could not help. A buffer of a few small records passes each one on
#: promptly; a smaller buffer gains nothing more (``make bench ONLY=kafka_postgres_latency``
#: measures the latency this gives).
REAL_TIME_BUFFER_BYTES = 512
BUFFER_CONF = "spark.buffer.size"


def real_time_spark_conf(spark_conf: Mapping[str, str]) -> dict[str, str]:
    """``spark_conf`` with the settings a Real-Time Mode daemon needs added (a value the user set wins)."""
    return {BUFFER_CONF: str(REAL_TIME_BUFFER_BYTES), **spark_conf}


class RealTimeSettings(BaseModel):
    """Real-Time Mode: ``trigger(realTime=…)`` and a ``foreach`` writer that commits by time and count."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    checkpoint_interval_seconds: float = Field(
        1.0, ge=1, le=3600, description="The realTime trigger's duration: how long each real-time batch runs before "
        "its offsets are checkpointed; a restart replays at most this much. It bounds latency too: within a batch "
        "Spark hands records to the Python writer in pickled groups that double in size (1, 2, 4, ... records), so "
        "a record waits longer the later it comes in its batch, and a shorter batch bounds that wait (make bench "
        "ONLY=kafka_postgres_latency measures it at the default). Below 5 s the source lowers Spark's "
        "spark.sql.streaming.realTimeMode.minBatchDuration (5 s by default) to match.")
    max_dwell_ms: int = Field(100, ge=1, le=60000, description="Each foreach writer commits a record to Postgres at "
                              "most this long after it arrived (a timer flushes during lulls).")
    max_rows: int = Field(1000, ge=1, le=1_000_000, description="... or as soon as the writer holds this many records.")
    tasks: int | None = Field(None, ge=1, le=10_000, description="Kafka partitions of the subscribed topics: "
                              "Real-Time Mode reads each with one long-running task, whose writer holds one Postgres "
                              "connection. Set: counted in the connection budget (destination.max_connections) at "
                              "load, and a broker with more partitions stops the source with the arithmetic. Unset: "
                              "the partitions are counted at the broker when the source starts, the daemon keeps one "
                              "connection of its own (unless destination.pool_connections says otherwise), and a "
                              "budget that does not fit stops the source with the arithmetic.")
