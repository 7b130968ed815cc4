"""One Delta table replicated from its change feed: launched, streamed, each batch applied once.

- :mod:`.table_runner`: the per-table runner: prepares the table and runs its streaming query;
- :mod:`.table_factories`: where a table's changes come from and where they go (the default factories);
- :mod:`.prepare`: the preparation before the stream starts: key, merge plan, checks, bootstrap, schema;
- :mod:`.source_description`: the source's description for one launch, kept between launches while it holds;
- :mod:`.bootstrap`: the bootstrap: a source version pinned, the source copied as of it;
- :mod:`.launch_slots`: how many tables launch at once;
- :mod:`.launch_timing`: where a launch spends its time, for the line the runner logs;
- :mod:`.stream_wiring`: the streaming query wired: change stream, checkpoint, batch function, trigger;
- :mod:`.batch_apply`: one micro-batch applied exactly once and recorded after it is durable;
- :mod:`.commit_file_batches`: batches planned from the source's commit files and applied on the driver;
- :mod:`.server_batches`: batches a Spark Connect server applied, reported by the daemon;
- :mod:`.dead_letters`: the tables' dead letters, for the operator: counted, listed, skipped, replayed;
- :mod:`.turn_taker`: the table's side of the apply workers' pool: ready, has work, takes a turn;
- :mod:`.lag_probe`: the table's lag probe;
- :mod:`.shared_state`: what the runner's threads share while the table runs.
"""
