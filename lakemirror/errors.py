"""The error taxonomy: vendor errors are translated once, at the boundary, into these types.

``TransientError``: may succeed if retried as is (a concurrent commit, a network blip).
``TerminalError``: will fail again until a person changes something; the message says what.
Both carry the table they concern and a short machine-readable ``code``.
"""

from __future__ import annotations


class LakemirrorError(Exception):
    """Base of every error lakemirror raises on purpose."""

    code = "error"

    def __init__(self, message: str, *, table: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.table = table
        if code is not None:
            self.code = code

    @property
    def message(self) -> str:
        return str(self)


class TransientError(LakemirrorError):
    """Retrying the same operation may succeed."""

    code = "transient"


class TerminalError(LakemirrorError):
    """Retrying will not help until the cause named in the message is fixed."""

    code = "terminal"


def excerpt(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, with an ellipsis and the length left out when cut."""
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text) - limit} more characters)"


class ConfigError(TerminalError):
    """The configuration is invalid; ``problems`` lists each (location, message).

    Shown as given, but each location and message is cut to :attr:`MAX_LOCATION` and
    :attr:`MAX_MESSAGE` characters and at most :attr:`MAX_PROBLEMS` are kept (with one more saying
    how many were left out): a problem can quote a value of any length, and a file that is not a
    configuration can have thousands of keys."""

    code = "config"
    MAX_LOCATION, MAX_MESSAGE, MAX_PROBLEMS = 200, 500, 30

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        from lakemirror.secrets import redact

        # A location or message may quote a value (an identifier, a URL) holding a credential: every
        # problem is redacted here, once, so no output of a ConfigError (CLI, log, API) can show it.
        kept = [(excerpt(redact(str(loc)), self.MAX_LOCATION), excerpt(redact(str(msg)), self.MAX_MESSAGE))
                for loc, msg in problems[:self.MAX_PROBLEMS]]
        if len(problems) > self.MAX_PROBLEMS:
            kept.append(("…", f"and {len(problems) - self.MAX_PROBLEMS} more problems"))
        self.problems = kept
        super().__init__("; ".join(f"{loc}: {msg}" for loc, msg in self.problems))


class SchemaChangeRestart(TransientError):
    """The source gained columns; the stream must restart to read them (no backoff needed)."""

    code = "schema_additive"


class SchemaIncompatible(TerminalError):
    """The source schema changed in a way the replica cannot follow by adding columns."""

    code = "schema_breaking"


class NoUsableKey(TerminalError):
    code = "no_key"


class ChangeFeedDisabled(TerminalError):
    """The source's Change Data Feed is off, and the replica reads it: turn it on (or let lakemirror)."""

    code = "cdf_disabled"


class UnsupportedColumnType(TerminalError):
    """A source column of a type the replica cannot hold: exclude it, or cast it on the source."""

    code = "unsupported_type"


class ChangeWindowExpired(TerminalError):
    """A source version the replica still needs is no longer in the change feed."""

    code = "window_expired"


class PinnedVersionAged(Exception):
    """A bootstrap could not read its pinned version before writing anything: the source committed
    after the pin, and the pinned commit is older than the source's deleted-file retention, so
    Delta refuses the read. The bootstrap pins the source's latest version again (a new epoch);
    the Delta error is the cause."""

    def __init__(self, table: str, version: int) -> None:
        super().__init__(f"{table}: the pinned source version {version} is no longer the latest and is older "
                         f"than the source's delta.deletedFileRetentionDuration, so Delta refuses to read it")
        self.version = version


class BootstrapPlanOutdated(PinnedVersionAged):
    """A bootstrap's saved plan was made under rules this lakemirror no longer resumes (catch-up
    rounds that wrote to the replica between chunks): the bootstrap starts again at a new pin,
    which replaces the replica's partial copy; the plan's error is the cause."""

    def __init__(self, table: str, version: int, reason: str) -> None:
        Exception.__init__(self, f"{table}: {reason}; this lakemirror copies chunks at their own versions and "
                                 f"captures the change feed instead, so the bootstrap starts again")
        self.version = version


class BootstrapCannotConverge(TerminalError):
    """A bootstrap could not capture the source's change feed before the source's retention let it
    go: the change window is too short for this bootstrap. The message says which retention it
    needs; resyncing without raising it would lose the window again."""

    code = "window_too_short"


class SourceReplaced(TerminalError):
    """The source table was dropped and recreated (new table id) since the replica was built."""

    code = "source_replaced"


class DestinationConflict(TerminalError):
    """The destination exists but was not created by this pipeline."""

    code = "destination_conflict"
