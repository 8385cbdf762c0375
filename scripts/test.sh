#!/usr/bin/env bash
# Every test, the real small model included: set up, then pytest from the repository root (paths in
# the arguments are the repository's: tests/test_night.py, as README's commands run from there).
source "$(dirname "$0")/setup.sh"
cd "$OVERNIGHT_ROOT"
exec .venv/bin/python -m pytest "$@"
