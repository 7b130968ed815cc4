"""delta-rs commits on S3 are conditional puts: two writers cannot both commit one version.

delta-rs 1.x writes a commit file with ``If-None-Match: *`` (lakemirror sets
``AWS_CONDITIONAL_PUT=etag`` explicitly, :func:`lakemirror.object_store.delta_rs_storage_options`).
These tests prove it on the session's S3 server (moto's): the server refuses a second put of a key
with the header; two delta-rs writers that both read version ``n`` and commit at once end with both
commits in the log, at ``n + 1`` and ``n + 2``, or the loser refused; and through a proxy that drops
the header (a store without conditional writes) the same two commits leave only one in the log: the
other is silently lost, which is why such a store is safe for one writer per table only
(docs/deployment.md, "Object storage").
"""

from __future__ import annotations

import http.client
import re
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator
from urllib.parse import urlparse

import pytest

from lakemirror.object_store import delta_rs_storage_options, delta_rs_uri

pytestmark = pytest.mark.integration


def _options(s3_bucket: Any, endpoint: str | None = None) -> dict[str, str]:
    conf = dict(s3_bucket.hadoop_conf)
    if endpoint is not None:
        conf["fs.s3a.endpoint"] = endpoint
    return delta_rs_storage_options(conf)


#: A commit file's key: ``<table>/_delta_log/<20-digit version>.json``.
COMMIT_FILE = re.compile(r"/_delta_log/\d{20}\.json$")


class _CommitRendezvous(ThreadingHTTPServer):
    """A proxy to ``upstream`` that holds each PUT of a commit file until a second PUT of the same key
    arrives (or ``wait`` seconds pass), then forwards them one after the other: two writers that both
    read version ``n`` reach the store with their commits of ``n + 1`` together, whatever their timing.
    ``drop_conditional``: forward without the ``If-None-Match`` header (a store that ignores it)."""

    daemon_threads = True

    def __init__(self, upstream: str, drop_conditional: bool, wait: float = 5.0) -> None:
        self.upstream = urlparse(upstream)
        self.drop_conditional = drop_conditional
        self.wait = wait
        self.meetings: dict[str, threading.Barrier] = {}
        self.lock = threading.Lock()        # meetings
        self.forwarding = threading.Lock()  # one request at the store at a time, after a meeting
        #: (key, status) of every commit-file PUT, in the order the store answered them.
        self.commit_puts: list[tuple[str, int]] = []
        rendezvous = self

        class Handler(BaseHTTPRequestHandler):
            def _forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {k: v for k, v in self.headers.items()
                           if not (rendezvous.drop_conditional and k.lower() == "if-none-match")}
                commit = self.command == "PUT" and COMMIT_FILE.search(self.path.split("?")[0]) is not None
                if commit:
                    with rendezvous.lock:
                        meeting = rendezvous.meetings.setdefault(self.path, threading.Barrier(2))
                    try:
                        meeting.wait(rendezvous.wait)
                    except threading.BrokenBarrierError:
                        pass  # no second writer for this version: forward alone
                with rendezvous.forwarding:
                    status, answer_headers, data = rendezvous.send(self.command, self.path, body, headers)
                    if commit:
                        rendezvous.commit_puts.append((self.path.split("/_delta_log/")[1], status))
                self.send_response(status)
                for k, v in answer_headers:
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

            def log_message(self, *args: Any) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def send(self, method: str, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, list[Any], bytes]:
        conn = http.client.HTTPConnection(self.upstream.hostname, self.upstream.port, timeout=30)
        try:
            conn.request(method, path, body=body, headers=headers)
            answer = conn.getresponse()
            return answer.status, answer.getheaders(), answer.read()
        finally:
            conn.close()


@contextmanager
def _rendezvous(s3_bucket: Any, drop_conditional: bool) -> Iterator[_CommitRendezvous]:
    proxy = _CommitRendezvous(s3_bucket.endpoint, drop_conditional)
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    try:
        yield proxy
    finally:
        proxy.shutdown()
        proxy.server_close()


def test_the_s3_server_refuses_a_second_put_of_a_key_with_if_none_match(s3_bucket: Any) -> None:
    import boto3
    from botocore.exceptions import ClientError

    client = boto3.client("s3", endpoint_url=s3_bucket.endpoint, region_name="us-east-1",
                          aws_access_key_id="test", aws_secret_access_key="test")
    key = s3_bucket.fresh("conditional").split("/", 3)[3] + "/_delta_log/00000000000000000001.json"
    client.put_object(Bucket=s3_bucket.bucket, Key=key, Body=b"first", IfNoneMatch="*")
    with pytest.raises(ClientError) as refused:
        client.put_object(Bucket=s3_bucket.bucket, Key=key, Body=b"second", IfNoneMatch="*")
    assert refused.value.response["Error"]["Code"] == "PreconditionFailed"
    assert client.get_object(Bucket=s3_bucket.bucket, Key=key)["Body"].read() == b"first"


def _two_writers_commit_one_version(uri: str, direct: dict[str, str], options: dict[str, str]) -> dict[str, Any]:
    """Two delta-rs handles (``options``) read version 0 (written with ``direct``), then each appends
    one row under its own transaction id, at once. Returns what each writer was told and what the log
    holds afterwards."""
    import pyarrow as pa
    from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

    write_deltalake(uri, pa.table({"id": pa.array([0], pa.int64())}), storage_options=direct)
    writers = {name: DeltaTable(uri, storage_options=options) for name in ("a", "b")}
    assert {w.version() for w in writers.values()} == {0}
    told: dict[str, str] = {}

    def commit(name: str, row: int) -> None:
        txn = CommitProperties(app_transactions=[Transaction(f"writer-{name}", 1)])
        try:
            write_deltalake(writers[name], pa.table({"id": pa.array([row], pa.int64())}), mode="append",
                            commit_properties=txn)
            told[name] = "committed"
        except Exception as exc:  # noqa: BLE001 (a refused commit is a valid outcome; a lost one is not)
            told[name] = f"refused: {type(exc).__name__}"

    threads = [threading.Thread(target=commit, args=(n, r)) for n, r in (("a", 1), ("b", 2))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    final = DeltaTable(uri, storage_options=direct)
    return {"told": told, "version": final.version(),
            "recorded": {n: final.transaction_version(f"writer-{n}") for n in ("a", "b")},
            "rows": sorted(final.to_pyarrow_table()["id"].to_pylist())}


def test_two_commits_of_one_version_cannot_both_land_on_the_s3_server(s3_bucket: Any) -> None:
    """Both writers' commits of version 1 reach the server together: it takes one and refuses the
    other (412), whose writer then commits version 2 or fails; nothing a writer was told it committed
    is missing from the log."""
    uri = delta_rs_uri(s3_bucket.fresh("two-writers"))
    with _rendezvous(s3_bucket, drop_conditional=False) as proxy:
        seen = _two_writers_commit_one_version(uri, _options(s3_bucket), _options(s3_bucket, proxy.endpoint))
    first = [status for key, status in proxy.commit_puts if key.startswith("00000000000000000001")]
    assert sorted(first) == [200, 412], proxy.commit_puts
    committed = [n for n, told in seen["told"].items() if told == "committed"]
    assert committed and seen["version"] == len(committed), seen
    for name, row in (("a", 1), ("b", 2)):
        assert (seen["recorded"][name] == 1) == (name in committed), seen
        assert (row in seen["rows"]) == (name in committed), seen


def test_without_conditional_puts_two_commits_of_one_version_lose_one(s3_bucket: Any) -> None:
    """The same two commits through a store that ignores If-None-Match: both writers are told they
    committed version 1, and the log holds only one of them: the other is silently lost."""
    uri = delta_rs_uri(s3_bucket.fresh("no-conditional"))
    with _rendezvous(s3_bucket, drop_conditional=True) as proxy:
        seen = _two_writers_commit_one_version(uri, _options(s3_bucket), _options(s3_bucket, proxy.endpoint))
    assert [status for _, status in proxy.commit_puts] == [200, 200], proxy.commit_puts  # version 1, twice
    assert seen["told"] == {"a": "committed", "b": "committed"}, seen
    assert seen["version"] == 1 and len(seen["rows"]) == 2, seen
    assert sorted(v for v in seen["recorded"].values() if v is not None) == [1], seen
