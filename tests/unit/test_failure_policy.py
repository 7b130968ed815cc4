"""supervisor.control.failure_policy: a configuration error is terminal at once, a transient one is retried."""

from __future__ import annotations

import pytest

from lakemirror.errors import (
    BootstrapCannotConverge, ChangeWindowExpired, ConfigError, DestinationConflict, LakemirrorError,
    SchemaChangeRestart, TerminalError, TransientError,
)
from lakemirror.schema import Column
from lakemirror.sources.catalog import TableMissing
from lakemirror.sources.keys import choose_key
from lakemirror.supervisor.control import table_state as sm
from lakemirror.supervisor.control.failure_policy import failed_event

POLICY = sm.RestartPolicy(base_delay_seconds=10.0, max_delay_seconds=100.0, jitter=0.0)


def _key_not_in_table() -> LakemirrorError:
    try:
        choose_key("c.s.t", [Column("id", "bigint", False)], configured=("order_id",))
    except LakemirrorError as exc:
        return exc
    raise AssertionError("a configured key column the table lacks must be refused")


def _no_usable_key() -> LakemirrorError:
    try:
        choose_key("c.s.t", [Column("a", "string", True)])
    except LakemirrorError as exc:
        return exc
    raise AssertionError("a table without a usable key must be refused")


def event(error: LakemirrorError, policy: str = "fail") -> sm.Failed:
    return failed_event(error, table="t", allow_schema_evolution=True, change_window_policy=policy, rand=0.0)


@pytest.mark.parametrize("error", [
    _key_not_in_table(), _no_usable_key(),
    TableMissing("table c.s.t does not exist (no Delta table at /w/c/s/t)", table="c.s.t"),
    ConfigError([("tables.t.keys", "bad")]),
    DestinationConflict("d.s.t already exists and was not created by pipeline 'p'", table="c.s.t"),
])
def test_configuration_errors_fail_the_table_at_once_with_the_fix(error: LakemirrorError) -> None:
    failed = event(error)
    status, actions = sm.step(sm.TableStatus(state=sm.TableState.RUNNING), failed, 100.0, POLICY)
    assert (status.state, status.next_retry_at, status.retries, actions) == (sm.TableState.FAILED, None, 0,
                                                                             (sm.Action.HALT,))
    assert status.last_error and status.last_error.startswith(str(error))
    assert "tables:" in status.last_error or "restart the daemon" in status.last_error
    # Nothing brings it back by itself, however much time passes.
    assert sm.step(status, sm.Tick(), 1e9, POLICY)[0].state == sm.TableState.FAILED


def test_a_missing_table_is_coded_for_the_discovery_loop() -> None:
    assert event(TableMissing("table c.s.t does not exist", table="c.s.t")).code == "table_missing"


@pytest.mark.parametrize("error", [
    TransientError("c.s.t: ConcurrentAppendException", table="c.s.t"),
    TerminalError("c.s.t: ValueError: something odd", table="c.s.t", code="failed"),  # unknown: may pass
    LakemirrorError("c.s.t: Change Data Feed is not enabled", table="c.s.t", code="cdf_disabled"),
])
def test_other_failures_still_back_off(error: LakemirrorError) -> None:
    status, _ = sm.step(sm.TableStatus(state=sm.TableState.RUNNING), event(error), 100.0, POLICY)
    assert (status.state, status.next_retry_at) == (sm.TableState.DEGRADED, 110.0)


def test_window_and_schema_policies_are_unchanged() -> None:
    window = ChangeWindowExpired("c.s.t: gone", table="c.s.t")
    assert event(window).fatal and not event(window).resync
    assert event(window, "resync").resync and not event(window, "resync").fatal
    assert event(SchemaChangeRestart("c.s.t: new column", table="c.s.t")).restart_now


@pytest.mark.parametrize("policy", ["fail", "resync"])
def test_a_window_too_short_for_a_bootstrap_fails_once_and_is_never_resynced_into_the_same_loss(policy: str) -> None:
    error = BootstrapCannotConverge("t: the bootstrap cannot keep up with the source's change window: … needs a "
                                    "change window of at least 180s: ALTER TABLE …", table="t")
    e = event(error, policy)
    assert e.fatal and not e.resync and e.code == "window_too_short"
    assert "needs a change window of at least 180s" in e.error and "lakemirror resync CONFIG t" in e.error
    status, actions = sm.step(sm.TableStatus(state=sm.TableState.BOOTSTRAPPING), e, 0.0, POLICY)
    assert status.state == sm.TableState.FAILED and sm.Action.RESYNC not in actions
