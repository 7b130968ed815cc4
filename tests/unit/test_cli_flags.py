"""The command line's flags: each says what it does, and each command offers only the flags that
mean something to it (run's shortcuts are run's alone)."""

from __future__ import annotations

import argparse
import errno
import subprocess
from pathlib import Path

import pytest

from lakemirror.daemon.cli import DEMO_PORT, build_parser
from lakemirror.daemon.preflight import DEMO_PORT_SETTING, bind_failure

ROOT = Path(__file__).resolve().parents[2]
RUN_ONLY = {"--trigger-interval-seconds", "--spark-remote", "--warehouse", "--http-port"}


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))  # noqa: SLF001
    return dict(sub.choices)


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {o for a in parser._actions for o in a.option_strings}  # noqa: SLF001


def test_every_flag_and_argument_of_every_command_has_help_text() -> None:
    parser = build_parser()
    missing = [f"lakemirror {a.dest}" for a in parser._actions if not a.help]  # noqa: SLF001
    for name, command in _commands(parser).items():
        missing += [f"lakemirror {name} {'/'.join(a.option_strings) or a.dest}"
                    for a in command._actions if not a.help or a.help == argparse.SUPPRESS]  # noqa: SLF001
    assert not missing, f"give these a help text: {missing}"


def test_runs_shortcuts_appear_on_run_only() -> None:
    commands = _commands(build_parser())
    assert RUN_ONLY <= _options(commands["run"])
    for name in ("validate", "status", "pause", "resume", "resync"):
        assert not RUN_ONLY & _options(commands[name]), f"{name} offers run's flags"
        assert "--set" in _options(commands[name]), f"{name} reads the file: --set may override it"
    args = build_parser().parse_args(["run", "p.yaml", "--http-port", "0", "--warehouse", "/w"])
    assert (args.http_port, args.warehouse) == (0, "/w")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["validate", "p.yaml", "--http-port", "0"])


def test_the_demo_port_is_chosen_with_port_or_make_demo_port() -> None:
    parse = build_parser().parse_args
    assert parse(["demo"]).http_port == DEMO_PORT == 9464
    assert parse(["demo", "--port", "9470"]).http_port == 9470
    assert parse(["demo", "--http-port", "0"]).http_port == 0
    make = subprocess.run(["make", "-n", "demo", "PORT=9471"], cwd=ROOT, capture_output=True, text=True)
    if make.returncode != 0:
        pytest.skip(f"make is not available: {make.stderr.strip()[:200]}")
    assert "lakemirror demo --port 9471" in make.stdout
    assert "--port" not in subprocess.run(["make", "-n", "demo"], cwd=ROOT, capture_output=True, text=True).stdout
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "make demo PORT=" in readme and "lakemirror demo --port" in readme


def test_a_demo_whose_port_is_taken_says_how_to_choose_another() -> None:
    message = str(bind_failure("127.0.0.1", 9464, OSError(errno.EADDRINUSE, "in use"), DEMO_PORT_SETTING))
    assert message.startswith("port 9464 on 127.0.0.1 is in use: set the demo's port (`make demo PORT=…`")
