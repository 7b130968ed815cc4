"""The bootstrap's copy floor: ``python -m bench.copy_floor SOURCE TARGET VERSION``.

A plain Spark read of the source at ``VERSION`` written as a new Delta table, on a local session
with the daemon's own Spark settings, in a process of its own. Prints one JSON line: the seconds
the session took to start and the seconds the copy took.
"""

from __future__ import annotations

import json
import sys
import time


def main(argv: list[str]) -> int:
    source, target, version = argv[0], argv[1], int(argv[2])
    from lakemirror.daemon.settings import RuntimeSettings
    from lakemirror.daemon.spark import local_session

    t0 = time.time()
    spark = local_session(RuntimeSettings(shuffle_partitions=2), app_name="bench-copy-floor")  # as the benchmark runs the daemon
    t1 = time.time()
    spark.read.format("delta").option("versionAsOf", version).load(source).write.format("delta").save(target)
    t2 = time.time()
    spark.stop()
    print(json.dumps({"session_seconds": round(t1 - t0, 2), "copy_seconds": round(t2 - t1, 2)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
