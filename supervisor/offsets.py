"""Reading a Delta streaming source's offset: which source versions are fully applied.

A Delta source offset is ``{reservoirVersion, index, isStartingVersion, ...}``: the stream has
consumed the files of ``reservoirVersion`` up to ``index`` (``-1``: none of that version yet).
Every version strictly below ``reservoirVersion`` is therefore fully applied once the batch that
reached this offset has committed.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

BASE_INDEX = -1


def applied_through_from_offset(offset: Mapping[str, Any] | str | None) -> int | None:
    """The highest source version fully applied at ``offset``, or None if it cannot be told."""
    if offset is None:
        return None
    if isinstance(offset, str):
        offset = json.loads(offset)
    assert not isinstance(offset, str)
    if "reservoirVersion" not in offset:
        return None
    version = int(offset["reservoirVersion"])
    return version - 1
