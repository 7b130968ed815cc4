"""The settings of lakemirror, one versioned package: the models of the daemon's pipeline YAML
(:mod:`.pipeline`, with its :mod:`.destination`, :mod:`.event_source` and :mod:`.schedule` blocks),
of ``lakemirror replicate`` (:mod:`.replicate`), and what is generated from them: the runtime's
specs (:mod:`.runtime_spec`), the control API's request schema (:mod:`.openapi`) and
docs/configuration.md (:mod:`.docs`). A field is written once, on its model, with its type,
default, bounds and help text; everything else reads it from there.
"""

from lakemirror.daemon.settings.destination import DeltaDestination, Destination, PostgresDestination
from lakemirror.daemon.settings.event_source import EventSourceSettings
from lakemirror.daemon.settings.pipeline import (
    SETTINGS_VERSION, DatabricksSettings, HttpSettings, RestartSettings, RuntimeSettings, Settings, TableOverride,
    load_settings, local_path_problem, object_storage_problem, parse_set_flags, read_yaml, warn_unknown_environment,
)
from lakemirror.daemon.settings.schedule import ScheduleSettings

__all__ = [
    "SETTINGS_VERSION", "DatabricksSettings", "DeltaDestination", "Destination", "EventSourceSettings",
    "HttpSettings", "PostgresDestination", "RestartSettings", "RuntimeSettings", "ScheduleSettings", "Settings",
    "TableOverride", "load_settings", "local_path_problem", "object_storage_problem", "parse_set_flags",
    "read_yaml", "warn_unknown_environment",
]
