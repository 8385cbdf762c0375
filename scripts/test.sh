#!/usr/bin/env bash
# Every test, the real small model included: set up, then pytest. Arguments are pytest's; paths in
# them are taken from where you are (without any, the whole suite runs from the repository root).
source "$(dirname "$0")/setup.sh"
named_a_path=
for arg in "$@"; do
  case "$arg" in
    -*) ;;
    *) if [ -e "${arg%%::*}" ]; then named_a_path=1; fi ;;
  esac
done
if [ -z "$named_a_path" ]; then
  cd "$OVERNIGHT_ROOT"
fi
exec "$OVERNIGHT_ROOT/.venv/bin/python" -m pytest --rootdir "$OVERNIGHT_ROOT" -c "$OVERNIGHT_ROOT/pyproject.toml" "$@"
