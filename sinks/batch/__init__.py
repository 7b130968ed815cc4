"""Batch work on replicas: the snapshot copy (bootstrap and clone), clone, incremental sweeps,
reconciliation and metadata sync, and the operations the batch runner calls to run them."""
