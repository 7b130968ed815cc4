"""Where an incremental sweep starts (pure), its transaction ids, and the config it needs."""

from __future__ import annotations

import pytest

from lakemirror.checkpoints.state import TableProgress
from lakemirror.daemon.settings.replicate import CliOverrides, load_replicate_config
from lakemirror.errors import ConfigError
from lakemirror.sinks.batch.incremental import SweepFacts, plan_sweep, sweep_app_id
from lakemirror.sinks.merge.delta_merge import txn_app_id

RUNNING = TableProgress(epoch=2, bootstrap_version=7, bootstrapped=True, source_table_id="s1")


def test_an_epoch_of_the_same_source_continues() -> None:
    plan = plan_sweep(SweepFacts(RUNNING, "s1", 20, replica_exists=True, mirrored_version=15, mirrored_source_id="s1"))
    assert (plan.action, plan.start_version) == ("stream", 7)


def test_a_cloned_replica_is_adopted_at_its_mirrored_version() -> None:
    plan = plan_sweep(SweepFacts(TableProgress(), "s1", 20, True, mirrored_version=15, mirrored_source_id="s1"))
    assert (plan.action, plan.start_version) == ("adopt", 15)


@pytest.mark.parametrize("facts, reason", [
    (SweepFacts(TableProgress(), "s1", 20, replica_exists=False), "does not exist"),
    (SweepFacts(TableProgress(), "s1", 20, True, mirrored_version=None), "no usable mirrored"),
    (SweepFacts(TableProgress(), "s1", 20, True, mirrored_version=15, mirrored_source_id="old"), "no usable"),
    (SweepFacts(TableProgress(), "s1", 20, True, mirrored_version=25, mirrored_source_id="s1"), "no usable"),
    (SweepFacts(RUNNING, "s2", 20, True), "replaced"),
    (SweepFacts(RUNNING, "s1", 20, True, schema_breaking=True), "schema"),
    (SweepFacts(RUNNING, "s1", 20, replica_exists=False), "does not exist"),
])
def test_otherwise_a_snapshot_at_the_current_version(facts: SweepFacts, reason: str) -> None:
    plan = plan_sweep(facts)
    assert (plan.action, plan.start_version) == ("bootstrap", 20) and reason in plan.reason


def test_sweep_transaction_ids_never_meet_the_streams() -> None:
    assert sweep_app_id("p1", "dst__s__t", 1, 7) == "lakemirror-incremental/p1/dst__s__t/e1-v7"
    assert not sweep_app_id("p1", "dst__s__t", 1, 7).startswith(txn_app_id("p1", "dst__s__t", 1)[:12])


def test_replicate_needs_a_checkpoint_volume_for_incremental() -> None:
    data = {"catalogs": [{"name": "prod", "target_catalog": "dr"}]}
    with pytest.raises(ConfigError) as info:
        load_replicate_config(None, CliOverrides(operations=["incremental"]), data=data)
    assert info.value.problems[0][0] == "settings: checkpoint_volume"
    assert load_replicate_config(None, CliOverrides(operations=["incremental"]),
                                 data={**data, "checkpoint_volume": "/tmp/x"}).checkpoint_volume == "/tmp/x"
    assert load_replicate_config(None, None, data=data).checkpoint_volume is None
