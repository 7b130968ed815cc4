"""Change-feed batches into Delta replicas through Spark: the pure MERGE planner, the choice of apply
path, and the executors (Spark's MERGE, the rewrite of a small replica, the SQL-only path for Spark
Connect)."""
