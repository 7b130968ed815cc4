"""Two-stage shutdown: the first SIGTERM/SIGINT asks for a drain, the second forces an exit.

Handlers only set a flag (or exit on the second signal); no logging, no locks inside them.
"""

from __future__ import annotations

import os
import signal
import threading
from types import FrameType

from lakemirror.daemon.exit_codes import EXIT_FORCED

FORCED_EXIT_CODE = EXIT_FORCED


class ShutdownSignals:
    def __init__(self) -> None:
        self.stop = threading.Event()
        self._count = 0

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self._count += 1
        if self._count > 1:
            os._exit(FORCED_EXIT_CODE)
        self.stop.set()

    @property
    def forced_next(self) -> bool:
        return self._count >= 1
