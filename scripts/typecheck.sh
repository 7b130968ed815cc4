#!/usr/bin/env bash
# mypy --strict over the packages that pass it (make typecheck; part of make test).
# The layers are top-level folders that install as lakemirror.<layer> (pyproject.toml's package-dir);
# mypy does not follow setuptools' editable import hook, so it reads them through a tree of symbolic
# links laid out as the installed namespace (build/typecheck/lakemirror/...).
set -euo pipefail
cd "$(dirname "$0")/.."
PACKAGES=${TYPECHECK_PACKAGES:-"lakemirror.delta_log lakemirror.daemon lakemirror.supervisor lakemirror.sinks lakemirror.sources lakemirror.checkpoints lakemirror.tools"}
tree=build/typecheck
rm -rf "$tree" && mkdir -p "$tree/lakemirror"
for entry in lakemirror/*.py; do ln -s "$PWD/$entry" "$tree/lakemirror/"; done
for entry in lakemirror/*/__init__.py; do ln -s "$PWD/$(dirname "$entry")" "$tree/lakemirror/"; done
for layer in daemon supervisor sources sinks checkpoints tools; do ln -s "$PWD/$layer" "$tree/lakemirror/$layer"; done
args=()
for p in $PACKAGES; do args+=(-p "$p"); done
MYPYPATH="$tree" exec .venv/bin/python -m mypy --strict "${args[@]}"
