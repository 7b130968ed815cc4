"""Upper bounds shared by the settings: durations, names and paths. A value past them is refused at
validate with the bound, instead of overflowing later (a drain timeout of 1e10 seconds passed
validation and crashed the daemon at SIGTERM: no wait takes a timeout that large) or making every
message that quotes it as long as the value (a 40,000-character schema name).
"""

from __future__ import annotations

from typing import Final

DAY: Final = 86400.0
#: Durations that bound a wait or an interval: at most a year.
YEAR: Final = 366 * DAY
#: Horizons and warnings measured against data retention: at most ten years.
DECADE: Final = 10 * YEAR
#: Catalog, schema, table and column names (Unity Catalog's limit is 255 characters).
MAX_NAME_CHARS: Final = 255
#: Local paths and URIs (Linux's PATH_MAX).
MAX_PATH_CHARS: Final = 4096
#: Values of Spark confs and Delta table properties.
MAX_VALUE_CHARS: Final = 16384
