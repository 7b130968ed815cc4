"""Batch work on replicas: the snapshot copy (bootstrap and clone), the chunked bootstrap, clone,
incremental sweeps, reconciliation and metadata sync, and the operations the batch runner calls to
run them."""
