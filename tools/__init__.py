"""Development tools beside the product: the live demos and the local PostgreSQL → Debezium → Kafka
stack they and the end-to-end tests start.

Installed as ``lakemirror.tools`` with the rest of the distribution, but not part of the daemon:
tools import the product, the product never imports tools (``tests/unit/test_layering.py``), except
the ``lakemirror demo`` command, which imports its demo only when it runs.
"""
