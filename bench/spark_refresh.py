"""The full refresh as a scheduled Spark job does it: ``python -m bench.spark_refresh SOURCE TARGET``.

One local Spark session with the daemon's settings (started once, as a long-lived job cluster
would be); for every line read on stdin, the target is overwritten with the whole source, and one
JSON line answers with the cycle's wall seconds and the CPU seconds this process and its JVM used.
"""

from __future__ import annotations

import json
import os
import sys
import time


def main(argv: list[str]) -> int:
    source, target = argv[0], argv[1]
    from bench.big import process_tree_cpu
    from lakemirror.daemon.settings import RuntimeSettings
    from lakemirror.daemon.spark import local_session

    spark = local_session(RuntimeSettings(shuffle_partitions=2), app_name="bench-full-refresh")
    print(json.dumps({"ready": True}), flush=True)
    for _ in sys.stdin:
        cpu0, t0 = process_tree_cpu(os.getpid()), time.time()
        spark.read.format("delta").load(source).write.format("delta").mode("overwrite").save(target)
        print(json.dumps({"wall": time.time() - t0, "cpu": process_tree_cpu(os.getpid()) - cpu0}), flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
