#!/usr/bin/env bash
# A real night on the embedded small model, from a fresh machine: set up, then `overnight demo`.
source "$(dirname "$0")/setup.sh"
exec "$OVERNIGHT_ROOT/.venv/bin/overnight" demo "$@"
