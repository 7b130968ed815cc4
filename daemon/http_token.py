"""The control API's bearer token when ``http.auth_token`` is not set: generated at each start and
kept in a file only the daemon's user can read, as Jupyter's and Spark Connect's tokens are.

The file is ``<checkpoint_volume>/<pipeline_id>/daemon.token`` (mode 0600), beside ``daemon.json``
(the endpoint's address), where ``lakemirror pause|resume|resync`` look for both; it is rewritten at
each start and removed at shutdown. Nothing else shows the token: not the log, not ``daemon.json``,
not ``/status``. A local user other than the daemon's, or a web page the operator opens, cannot read
it, so neither can drive the daemon.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from lakemirror.checkpoints import layout

TOKEN_FILE = layout.TOKEN_FILE


class TokenUnreadable(Exception):
    """The token file exists but cannot be read (the message names the file and the fix)."""


def generate() -> str:
    """A new token: 32 random bytes, URL-safe base64 (43 characters)."""
    return secrets.token_urlsafe(32)


def write(folder: Path, token: str) -> Path:
    """Write ``token`` to ``folder/daemon.token`` with mode 0600, atomically; return its path."""
    folder.mkdir(parents=True, exist_ok=True)
    path, tmp = layout.token_file(folder), layout.token_file_tmp(folder, os.getpid())
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        with os.fdopen(fd, "w", encoding="ascii") as out:
            out.write(token + "\n")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def read(folder: Path) -> str | None:
    """The token in ``folder/daemon.token`` (line break dropped), None when there is no such file;
    :class:`TokenUnreadable` when it cannot be read. Never quotes the content."""
    path = layout.token_file(folder)
    try:
        text = path.read_text(encoding="ascii")
    except FileNotFoundError:
        return None
    except PermissionError:
        raise TokenUnreadable(f"{path} can be read only by the user the daemon runs as: run this command as "
                              f"that user, or give both the same http.auth_token") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TokenUnreadable(f"{path} cannot be read ({type(exc).__name__}); restart the daemon to write "
                              f"it again") from None
    token = text.strip()
    if not token or not all("\x21" <= c <= "\x7e" for c in token):
        raise TokenUnreadable(f"{path} does not hold a token; restart the daemon to write it again")
    return token


def remove(folder: Path) -> None:
    layout.token_file(folder).unlink(missing_ok=True)
