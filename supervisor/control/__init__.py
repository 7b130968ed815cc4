"""The control plane: one loop over a pipeline's tables and what it decides with.

- :mod:`.loop`: the supervisor's loop over a pipeline's tables: launches, polls, commands, drain;
- :mod:`.table_state`: each table's state machine, a pure function of state, event, time and policy;
- :mod:`.failure_policy`: what a failure leads to: retry with backoff, restart, resync, or stay failed;
- :mod:`.classify_errors`: Spark's and Delta's errors translated into lakemirror's taxonomy;
- :mod:`.lag`: honest replication lag, as a pure function;
- :mod:`.destination_waits`: a replica's waits on its destination, as the state machine's events;
- :mod:`.pipeline_spec`: what the supervisor is asked to replicate: plain frozen data;
- :mod:`.observer`: how the supervisor reports what happens, without knowing about Prometheus;
- :mod:`.halts`: a drain's halts: every table's runner halted at once, under one deadline;
- :mod:`.command_plan`: which accepted control commands still need applying (pure);
- :mod:`.command_inbox`: control commands between their acceptance and their effect.
"""
