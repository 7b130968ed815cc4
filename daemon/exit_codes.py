"""The exit codes of the ``lakemirror`` commands (docs/operations.md lists them for ``run``)."""

#: Done: for ``run``, stopped by SIGTERM/SIGINT after a complete drain.
EXIT_OK = 0
#: A failure: the start failed (one line says why), or ``run`` lost its pipeline's lease and stopped.
EXIT_FAILED = 1
#: An invalid configuration (every problem named), or a pipeline another daemon runs: nothing started.
EXIT_CONFIG = 2
#: ``run`` stopped, but its drain ended at ``drain_timeout_seconds`` with work abandoned (named in the
#: log); that work is done again at the next start. 124, as ``timeout(1)`` exits when its command timed out.
EXIT_DRAIN_INCOMPLETE = 124
#: A second SIGTERM/SIGINT: the process ended at once (:mod:`lakemirror.daemon.signals`).
EXIT_FORCED = 130
