#!/usr/bin/env bash
# Every test, the real small model included: set up, then pytest.
source "$(dirname "$0")/setup.sh"
exec .venv/bin/python -m pytest "$@"
