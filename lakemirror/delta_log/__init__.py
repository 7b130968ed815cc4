"""The Delta format code lakemirror owns: what it reads and writes of a Delta table's files itself,
beside Spark and delta-rs, which read and write everything else.

Every Delta release may change what is here, so it is kept in one place. It lives in the core
package, below every layer, because the layers that need it sit side by side: the change-feed source
(commit times, the stream's offsets, commit files), the sinks' driver paths (the local log, deletion
vectors, protocol features), the checkpoint store (whether a local table has a log), the
supervisor's reading of what a replica recorded, and the daemon's check that the checkpoint folder
lies outside every table. It imports no layer: only the core's :mod:`lakemirror.tables` (where a
table lives). ``tests/unit/test_layering.py`` lists the modules that import it, and fails when any
other module of the product spells the log's folder.

Modules:

- :mod:`.layout`: the log folder's names (``_delta_log``, ``<version>.json``, ``_last_checkpoint``).
- :mod:`.commit_files`: commit files read one version at a time, from local disk or S3.
- :mod:`.commit_times`: whether a version is committed, and when (its commit file's time).
- :mod:`.stream_offsets`: Delta's streaming source offsets, and the versions a batch holds whole.
- :mod:`.local_log`: a local table's snapshot replayed from its log; commits written atomically.
- :mod:`.data_files`: data and deletion-vector files written into a local replica.
- :mod:`.deletion_vectors`: deletion vectors' descriptors, files and bitmaps.
- :mod:`.protocol`: the protocol features each path that bypasses Spark handles as Spark does.
- :mod:`.commit_hooks`: how often a delta-rs commit lakemirror makes deletes the expired commit files.

What it reads:

- commit files (``<version>.json``, one action a line): ``add``, ``remove``, ``cdc``, ``metaData``,
  ``protocol``, ``txn`` and ``commitInfo`` actions, and each file's modification time as its
  commit's time;
- ``_last_checkpoint`` and the classic checkpoints it names, single-file or in numbered parts;
- deletion vectors: descriptors of storage type ``u`` (a file beside the data, named by a Z85 UUID),
  ``p`` (an absolute path) and ``i`` (inline), files of format version 1 with each bitmap's CRC-32,
  and bitmaps in Delta's portable 64-bit Roaring format;
- the offsets of Delta's streaming source (``reservoirId``, ``reservoirVersion``, ``index``,
  ``isStartingVersion``) that Spark logs in a query's checkpoint;
- a protocol's reader and writer versions and table features, legacy versions read as the features
  they imply.

What it writes: commits to a local replica, each created only if its version is free (a hard link
of a finished temporary file), with data files, deletion-vector files (portable format) and the
``txn`` action of the batch; and streaming source offsets in ``DeltaSourceOffset`` format 1, for
the batches the daemon plans itself. Checkpoints of such a replica are written by delta-rs.

What it refuses, and how it shows: nothing here ever refuses a table. Where a log holds what this
code does not read exactly as Delta does, the work goes to Spark (Delta's own reader and writer),
so an unknown feature can make a table slower, never wrong and never stuck:

- a V2 checkpoint, a deletion vector in Delta's older native format, or a replica with a feature or
  property the driver's deletion-vector apply does not honour (features beyond
  :data:`.protocol.DV_WRITER_FEATURES`; column mapping, CHECK constraints, invariants, generated or
  identity columns, append-only, a change data feed of its own, partitions): the replica is applied
  by Spark's MERGE instead, and its apply path with the reason shows in ``lakemirror status`` and
  ``/status`` (and a warning in the log when a batch was refused);
- a replica whose writer features go beyond :data:`.protocol.DELTA_RS_WRITER_FEATURES` (writer
  version 4 to 6 for a legacy protocol): delta-rs does not write it, Spark does (same report);
- a source with column mapping or reader features beyond :data:`.protocol.READABLE_FEATURES`: its
  batches are read by Spark, not delta-rs (logged once);
- a batch whose offsets do not fall on version boundaries, or a commit with a ``metaData`` or
  ``protocol`` action, a file action without ``dataChange``, deletion vectors without change files,
  or a MERGE that changed no row: that batch is planned and read by Spark (logged at debug);
- a commit with a ``metaData`` or ``protocol`` action since a source's kept description: the source
  is described afresh by Spark at its launch.
"""
