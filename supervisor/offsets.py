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


def applied_through_from_offset(offset: Mapping[str, Any] | str | None,
                                files_in_version: int | None = None) -> int | None:
    """The highest source version fully applied at ``offset``, or None if it cannot be told.

    ``files_in_version``: how many file indexes the offset's version has, where known. Delta's
    ``DeltaSource`` ends a batch that read a whole version at that version's last file index (not at
    the next version's ``-1``): that version is then fully applied too."""
    if offset is None:
        return None
    if isinstance(offset, str):
        offset = json.loads(offset)
    assert not isinstance(offset, str)
    if "reservoirVersion" not in offset:
        return None
    version = int(offset["reservoirVersion"])
    index = int(offset.get("index", BASE_INDEX))
    if files_in_version is not None and index >= 0 and index == files_in_version - 1:
        return version
    return version - 1
