"""Reading a configuration file: what the path names, how large it is, its encoding and its YAML.

Every way a path or its content can be wrong is a :class:`~lakemirror.errors.ConfigError` naming
the file and the fix, never a traceback: a missing file, a directory, a FIFO or a device (read
without blocking and never more than :data:`MAX_CONFIG_BYTES`), a file that cannot be read, bytes
that are not UTF-8, YAML that does not parse or nests too deeply, a top level that is not a
mapping, and a file that is not a lakemirror configuration at all (a path mistyped into some other
file, which may hold secrets: at most the first characters of its first key are quoted).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Any, Collection

import yaml

from lakemirror.daemon import yaml_loader
from lakemirror.errors import ConfigError

#: The largest configuration file read (a pipeline's is a few kilobytes).
MAX_CONFIG_BYTES = 1 << 20
#: How many characters of a foreign file's first key are quoted.
EXCERPT_CHARS = 12

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _kind(mode: int) -> str | None:
    """What a non-regular file is, or None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def read_bytes(path: str | Path) -> bytes:
    """The bytes of the configuration file at ``path``; :class:`ConfigError` when it cannot be one."""
    where = str(path)
    try:
        before = os.stat(path)
    except FileNotFoundError:
        raise ConfigError([(where, "file not found")]) from None
    except OSError as exc:
        raise ConfigError([(where, _unreadable(exc))]) from None
    kind = _kind(before.st_mode)
    if kind is not None:
        raise ConfigError([(where, f"is {kind}, not a file: give the path of the YAML configuration file")])
    if before.st_size > MAX_CONFIG_BYTES:
        raise ConfigError([(where, _too_large(before.st_size))])
    try:
        # O_NONBLOCK: a regular file swapped for a FIFO after the check above cannot block the open
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise ConfigError([(where, _unreadable(exc))]) from None
    try:
        kind = _kind(os.fstat(fd).st_mode)
        if kind is not None:
            raise ConfigError([(where, f"is {kind}, not a file: give the path of the YAML configuration file")])
        chunks, size = [], 0
        while size <= MAX_CONFIG_BYTES:
            chunk = os.read(fd, MAX_CONFIG_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise ConfigError([(where, _unreadable(exc))]) from None
    finally:
        os.close(fd)
    if size > MAX_CONFIG_BYTES:
        raise ConfigError([(where, _too_large(size))])
    return b"".join(chunks)


def _unreadable(exc: OSError) -> str:
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "cannot be read by this user (permission denied)"
    return f"cannot be read: {exc.strerror or type(exc).__name__}"


def _too_large(size: int) -> str:
    return (f"is larger than {MAX_CONFIG_BYTES // (1 << 20)} MiB ({size} bytes or more); a configuration file "
            f"is a few kilobytes: check the path")


def decode(raw: bytes, where: str) -> str:
    """``raw`` as UTF-8 text, or :class:`ConfigError` naming the line of the first bad byte."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise ConfigError([(f"{where}:{line}", f"is not UTF-8 text (byte {exc.start}); save the file as "
                                               f"UTF-8")]) from None


def parse(text: str, where: str) -> dict[str, Any]:
    """The top-level mapping of a YAML configuration, or :class:`ConfigError` with the line."""
    try:
        data = yaml_loader.load(text)
    except yaml_loader.DuplicateKeyError as exc:
        raise ConfigError([(f"{where}:{exc.line}:{exc.column}", str(exc))]) from None
    except yaml_loader.TooDeepError as exc:
        raise ConfigError([(f"{where}:{exc.line}" if exc.line else where, str(exc))]) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f"{where}:{mark.line + 1}:{mark.column + 1}" if mark else where
        problem = getattr(exc, "problem", None) or type(exc).__name__  # never str(exc): it quotes the lines
        raise ConfigError([(at, f"not valid YAML: {str(problem)[:200]}")]) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError([(where, "the top level must be a mapping of settings")])
    return data


def foreign_problem(data: dict[str, Any], known: Collection[str], what: str) -> str | None:
    """Why ``data`` is not a configuration of this kind (none of its top-level keys is one of
    ``known``), quoting at most :data:`EXCERPT_CHARS` characters of its first key; else None."""
    if not data or any(isinstance(k, str) and k in known for k in data):
        return None
    first = str(next(iter(data)))
    excerpt = first[:EXCERPT_CHARS] + ("…" if len(first) > EXCERPT_CHARS else "")
    return (f"not a {what}: none of its {len(data)} top-level key{'s' if len(data) != 1 else ''} is a setting "
            f"(the first begins {excerpt!r}); check the path, and docs/configuration.md for the settings")


def read_config(path: str | Path, known: Collection[str] | None = None, what: str = "lakemirror configuration"
                ) -> dict[str, Any]:
    """Read, decode and parse the configuration file at ``path``; with ``known`` (the top-level
    setting names), a file none of whose keys is one is refused without quoting it."""
    where = str(path)
    data = parse(decode(read_bytes(path), where), where)
    problem = foreign_problem(data, known, what) if known is not None else None
    if problem:
        raise ConfigError([(where, problem)])
    return data
