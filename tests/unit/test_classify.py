"""lakemirror.supervisor.control.classify_errors: vendor errors into the Transient / Terminal taxonomy."""

from __future__ import annotations

import pytest

from lakemirror.errors import (
    ChangeWindowExpired, ConfigError, LakemirrorError, NoUsableKey, SchemaChangeRestart, SchemaIncompatible,
    TerminalError, TransientError,
)
from lakemirror.supervisor.control.classify_errors import classify, first_line


class Py4JJavaError(Exception):
    pass


class StreamingQueryException(Exception):
    pass


WINDOW = Py4JJavaError(
    "An error occurred while calling o88.awaitTermination.\n"
    ": org.apache.spark.sql.delta.DeltaFileNotFoundException: [DELTA_MISSING_FILES_UNEXPECTED_VERSION] "
    "The stream from your Delta table was expecting process data from version 3,\n"
    "\tat org.apache.spark.sql.delta.DeltaErrors$.missingFiles(DeltaErrors.scala:10)")
ADDITIVE = StreamingQueryException("[DELTA_SCHEMA_CHANGED_WITH_VERSION] Detected schema change in version 5:\n"
                                   "streaming source schema: struct<id:int>")
BREAKING = StreamingQueryException("[DELTA_STREAMING_INCOMPATIBLE_SCHEMA_CHANGE_USE_SCHEMA_LOG] Streaming read "
                                   "is not supported on tables with read-incompatible schema changes")
CONCURRENT = Py4JJavaError("An error occurred while calling o1.merge.\n: io.delta.exceptions."
                           "ConcurrentAppendException: Files were added to the root of the table by a "
                           "concurrent update.")


#: The same, from Delta's Kernel-based streaming source (no error class in the text).
KERNEL_WINDOW = StreamingQueryException("Cannot time travel Delta table to version 2. Available versions: [6, 7].")
KERNEL_START_GONE = Py4JJavaError(
    "io.delta.kernel.exceptions.StartVersionNotFoundException: /w/src: Requested table changes beginning with "
    "startVersion=3 but no log file found for version 3. Earliest available version is 6")


@pytest.mark.parametrize("exc, kind, code", [
    (WINDOW, ChangeWindowExpired, "window_expired"),
    (KERNEL_WINDOW, ChangeWindowExpired, "window_expired"),
    (KERNEL_START_GONE, ChangeWindowExpired, "window_expired"),
    (ADDITIVE, SchemaChangeRestart, "schema_additive"),
    (BREAKING, SchemaIncompatible, "schema_breaking"),
    (CONCURRENT, TransientError, "transient"),
    (RuntimeError("Connection reset by peer"), TransientError, "transient"),
    (ValueError("something odd"), TerminalError, "failed"),
])
def test_category(exc: BaseException, kind: type, code: str) -> None:
    err = classify(exc, table="c.s.t")
    assert type(err) is kind
    assert err.code == code
    assert err.table == "c.s.t"


def test_schema_restart_is_transient_and_breaking_change_is_terminal() -> None:
    assert isinstance(classify(ADDITIVE, table="t"), TransientError)
    assert isinstance(classify(BREAKING, table="t"), TerminalError)
    assert isinstance(classify(WINDOW, table="t"), TerminalError)


def test_messages_say_what_happened_and_what_to_do() -> None:
    assert str(classify(WINDOW, table="c.s.t")) == (
        "c.s.t: a source version the replica still needs is no longer available (DeltaFileNotFoundException: "
        "[DELTA_MISSING_FILES_UNEXPECTED_VERSION] The stream from your Delta table was expecting process data "
        "from version 3,). The change window expired (VACUUM or log retention); resync the table.")
    assert str(classify(BREAKING, table="c.s.t")).endswith(
        "Resync the table (a new bootstrap), or revert the change on the source.")
    assert str(classify(CONCURRENT, table="c.s.t")) == (
        "c.s.t: ConcurrentAppendException: Files were added to the root of the table by a concurrent update.")
    assert str(classify(ValueError("something odd"), table="c.s.t")) == "c.s.t: ValueError: something odd"


@pytest.mark.parametrize("err", [
    TransientError("x", table="a"), NoUsableKey("no key", table="b"), ConfigError([("f", "bad")]),
    LakemirrorError("cdf off", table="c", code="cdf_disabled"),
])
def test_lakemirror_errors_pass_through_unchanged(err: LakemirrorError) -> None:
    assert classify(err, table="other") is err


def test_first_line_prefers_the_error_class_line_over_the_py4j_call() -> None:
    assert first_line(str(WINDOW)) == ("DeltaFileNotFoundException: [DELTA_MISSING_FILES_UNEXPECTED_VERSION] "
                                       "The stream from your Delta table was expecting process data from version 3,")


def test_first_line_uses_a_java_exception_line_when_no_error_class() -> None:
    text = "An error occurred while calling o5.start.\n: java.io.IOException: disk full\n\tat x.y(Z.java:1)"
    assert first_line(text) == "IOException: disk full"


def test_first_line_truncates() -> None:
    assert first_line("x" * 600, limit=10) == "xxxxxxxxx…"
    assert first_line("\n\n  plain message \n more") == "plain message"


def test_message_without_a_table_does_not_say_none() -> None:
    assert not str(classify(ValueError("odd"))).startswith("None")


#: A MERGE whose batch read a vacuumed change file: the top exception only says a wait failed.
VACUUMED_IN_MERGE = Py4JJavaError(
    "An error occurred while calling o412.execute.\n"
    ": org.apache.spark.SparkException: Exception thrown in awaitResult: \n"
    "\tat org.apache.spark.util.SparkThreadUtils$.awaitResult(SparkThreadUtils.scala:56)\n"
    "\tat org.apache.spark.sql.delta.commands.MergeIntoCommand.run(MergeIntoCommand.scala:88)\n"
    "Caused by: org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 12.0 failed 1 "
    "times, most recent failure: Lost task 0.0 in stage 12.0 (TID 20) (localhost executor driver): "
    "java.io.FileNotFoundException: File file:/w/src/_change_data/cdc-00000-1a.c000.snappy.parquet does not exist\n"
    "\tat org.apache.spark.scheduler.DAGScheduler.failJobAndIndependentStages(DAGScheduler.scala:2856)\n"
    "\t... 40 more\n"
    "Caused by: java.io.FileNotFoundException: File file:/w/src/_change_data/cdc-00000-1a.c000.snappy.parquet "
    "does not exist\n"
    "\tat org.apache.hadoop.fs.RawLocalFileSystem.deprecatedGetFileStatus(RawLocalFileSystem.java:915)\n")


def test_the_message_names_the_root_cause_not_the_wrapper() -> None:
    err = classify(VACUUMED_IN_MERGE, table="c.s.t")
    assert type(err) is ChangeWindowExpired
    assert "awaitResult" not in str(err)
    assert ("(FileNotFoundException: File file:/w/src/_change_data/cdc-00000-1a.c000.snappy.parquet does not "
            "exist)") in str(err)


class _JavaThrowable:
    def __init__(self, text: str, cause: "_JavaThrowable | None" = None) -> None:
        self.text, self.cause = text, cause

    def toString(self) -> str:
        return self.text

    def getCause(self) -> "_JavaThrowable | None":
        return self.cause


def test_the_java_cause_chain_of_a_py4j_error_is_followed() -> None:
    """Py4J's text can end at the wrapper; the Java exception still holds its causes."""
    exc = Py4JJavaError("An error occurred while calling o9.execute.\n"
                        ": org.apache.spark.SparkException: Exception thrown in awaitResult: ")
    exc.java_exception = _JavaThrowable(  # type: ignore[attr-defined]
        "org.apache.spark.SparkException: Exception thrown in awaitResult: ",
        _JavaThrowable("org.apache.spark.SparkFileNotFoundException: [FAILED_READ_FILE.FILE_NOT_EXIST] File "
                       "file:/w/src/_change_data/cdc-1.parquet does not exist. SQLSTATE: 42K03"))
    err = classify(exc, table="c.s.t")
    assert type(err) is ChangeWindowExpired
    assert "(SparkFileNotFoundException: [FAILED_READ_FILE.FILE_NOT_EXIST] File file:/w/src/_change_data/cdc-1" \
        in str(err)


def test_a_python_cause_chain_is_followed() -> None:
    try:
        try:
            raise OSError("disk full on /w/dst")
        except OSError as inner:
            raise RuntimeError("Exception thrown in awaitResult") from inner
    except RuntimeError as outer:
        err = classify(outer, table="c.s.t")
    assert str(err) == "c.s.t: OSError: disk full on /w/dst"


WORKER_FAILURE = (
    "[STREAM_FAILED] Query [id = 7, runId = 8] terminated with exception: Job aborted due to stage failure: Task 0 "
    "in stage 3.0 failed 1 times, most recent failure: Lost task 0.0 in stage 3.0 (TID 3) (10.0.0.1 executor "
    "driver): org.apache.spark.api.python.PythonException: [PYTHON_EXCEPTION] An exception was thrown from the "
    "Python worker. Please see the stack trace below.\n"
    "Traceback (most recent call last):\n"
    '  File "/venv/pyspark/worker.py", line 2049, in main\n'
    "    process()\n"
    '  File "/venv/lakemirror/sinks/postgres/foreach.py", line 101, in process\n'
    "    self._raise_pending()\n"
    "    ^^^^^^^^^^^^^^^^^^^^^\n"
    "lakemirror.errors.TerminalError: shop: postgres://lm@db:5432/app (schema r): the server refused the login "
    '(password authentication failed for user "lm"); check destination.user and the password it is given '
    "(destination.password, password_env or password_file).\n"
    "\n"
    "\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException(PythonRunner.scala:641)\n"
    "\tat org.apache.spark.sql.execution.python.PythonForeachWriter.process(PythonForeachWriter.scala:80)\n")


def test_a_python_workers_error_is_told_by_the_line_its_traceback_ends_with():
    from lakemirror.supervisor.control.classify_errors import python_worker_error, stream_error

    assert python_worker_error(WORKER_FAILURE) == (
        'shop: postgres://lm@db:5432/app (schema r): the server refused the login (password authentication failed '
        'for user "lm"); check destination.user and the password it is given (destination.password, password_env '
        'or password_file).')
    chained = ("PythonException: Traceback (most recent call last):\n  File \"a.py\", line 1, in f\n    g()\n"
               "KeyError: 'x'\n\nThe above exception was the direct cause of the following exception:\n\n"
               "Traceback (most recent call last):\n  File \"b.py\", line 2, in h\n    f()\n"
               "psycopg.OperationalError: connection failed: Connection refused\n\tat org.apache.Foo.bar(Foo.java:1)")
    assert python_worker_error(chained) == "OperationalError: connection failed: Connection refused"
    assert python_worker_error("org.apache.spark.SparkException: [DELTA_X] no traceback here") is None

    class StreamingQueryException(Exception):
        pass

    line = stream_error("events:shop", StreamingQueryException(WORKER_FAILURE))
    assert line.startswith("shop: postgres://lm@db:5432/app") and "destination.password" in line
    assert "Traceback" not in line and "PYTHON_EXCEPTION" not in line and "\n" not in line
    assert stream_error("events:shop", StreamingQueryException(chained)) == \
        "events:shop: OperationalError: connection failed: Connection refused"
    assert stream_error("events:shop", None) == "events:shop: the stream stopped"
    assert classify(StreamingQueryException(WORKER_FAILURE), table="t").message.startswith(
        "t: shop: postgres://lm@db:5432/app (schema r): the server refused the login")
