"""Batch work on replicas: the snapshot copy (bootstrap and clone), clone, reconciliation and
metadata sync."""
