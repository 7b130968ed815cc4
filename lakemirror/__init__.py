"""lakemirror: live, exact replicas of Delta tables from their Change Data Feed."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("lakemirror")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0+source"
