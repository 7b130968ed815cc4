"""The JVM's standard error under Real-Time Mode (daemon.jvm_stderr): PySpark's tracebacks of Python
workers stopped mid-task are left out, everything else passes in order."""

from __future__ import annotations

import io

from lakemirror.daemon.jvm_stderr import WorkerStopFilter, pump

STOPPED_WORKER = [
    "Traceback (most recent call last):\n",
    '  File "/venv/pyspark/python/lib/pyspark.zip/pyspark/daemon.py", line 262, in manager\n',
    '  File "/venv/pyspark/python/lib/pyspark.zip/pyspark/daemon.py", line 90, in worker\n',
    '  File "/venv/pyspark/python/lib/pyspark.zip/pyspark/worker.py", line 3642, in main\n',
    "    if read_int(infile) == SpecialLengths.END_OF_STREAM:\n",
    "       ^^^^^^^^^^^^^^^^\n",
    '  File "/venv/pyspark/python/lib/pyspark.zip/pyspark/serializers.py", line 575, in read_int\n',
    "    raise EOFError\n",
    "EOFError\n",
]


def run(lines: list[str]) -> tuple[str, WorkerStopFilter]:
    out: list[str] = []
    keep = WorkerStopFilter(out.append)
    for line in lines:
        keep.feed(line)
    keep.close()
    return "".join(out), keep


def test_a_stopped_workers_eof_traceback_is_left_out_and_the_rest_passes_in_order():
    before = "2026-11-27 16:28:23,410 ERROR spark DataWritingSparkTask: Aborted commit for partition 0\n"
    after = "2026-11-27 16:28:24,001 INFO lakemirror.daemon.context: drained\n"
    text, keep = run([before, *STOPPED_WORKER, *STOPPED_WORKER, after])
    assert text == before + after and keep.left_out == 2


def test_any_other_traceback_passes_whole():
    other = ["Traceback (most recent call last):\n", '  File "/venv/lakemirror/sinks/postgres/foreach.py", line 9\n',
             "    raise EOFError\n", "EOFError\n"]
    failure = [*STOPPED_WORKER[:-1], "psycopg.OperationalError: connection refused\n"]
    text, keep = run([*other, *failure])
    assert text == "".join([*other, *failure]) and keep.left_out == 0, "not PySpark's worker protocol"
    cut, _ = run(STOPPED_WORKER[:4])
    assert cut == "".join(STOPPED_WORKER[:4]), "a traceback the stream ended inside is written out"


def test_the_pump_reads_bytes_until_they_end():
    out = io.StringIO()
    lines = [line.encode() for line in ["a\n", *STOPPED_WORKER, "b\n"]]
    keep = pump(iter(lines), out)
    import time

    deadline = time.monotonic() + 10
    while out.getvalue() != "a\nb\n":
        assert time.monotonic() < deadline, out.getvalue()
        time.sleep(0.01)
    assert keep.left_out == 1
