#!/usr/bin/env bash
# Every test, the real small model included: set up, then pytest from the repository root. Arguments
# are pytest's; one that names a file or folder where you are (tests/x.py, tests/x.py::test_y) is
# passed as its full path, so it means what it means there.
source "$(dirname "$0")/setup.sh"
args=()
for arg in "$@"; do
  path=${arg%%::*}
  if [[ "$arg" != -* && -e "$path" ]]; then
    arg="$(CDPATH= cd -- "$(dirname -- "$path")" && pwd)/$(basename -- "$path")${arg:${#path}}"
  fi
  args+=("$arg")
done
cd "$OVERNIGHT_ROOT"
exec .venv/bin/python -m pytest "${args[@]}"
