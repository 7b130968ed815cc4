"""The daemon's scheduled batch sub-tasks: clone, reconcile, metadata sync, maintenance, and the
cycles of triggered and snapshot PostgreSQL replicas.

- :mod:`.scheduler`: when the sub-tasks run: a pure scheduler with an injected clock;
- :mod:`.service`: due runs started on worker threads of their own, never blocking the supervisor;
- :mod:`.batch_runner`: a batch run (also behind `lakemirror replicate`): retries, timeouts, an audit row per attempt;
- :mod:`.cycle_tables`: triggered and snapshot replicas, which have no stream, as tables of ``/status``.
"""
