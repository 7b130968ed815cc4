"""The control plane and the runners it supervises, one sub-package by concern:

- :mod:`.control`: the loop over a pipeline's tables, the per-table state machine, failure policy,
  error classes, lag, the pipeline's spec and the observer;
- :mod:`.change_feed`: one Delta table replicated from its change feed (prepare, bootstrap, stream,
  batch apply, lag probe);
- :mod:`.apply_workers`: tables taking turns on a few apply workers;
- :mod:`.events`: event sources (Kafka, JSON-lines files) into their replicas;
- :mod:`.offline`: what the pipeline and its replicas recorded, read without Spark;
- :mod:`.recovery`: a recovery point consistent across tables;
- :mod:`.subtasks`: the scheduled batch sub-tasks (clone, reconcile, metadata sync, cycles).
"""
