#!/usr/bin/env bash
# Build llama.cpp's llama-server from the sources that the llama-cpp-python sdist carries,
# with portable CPU flags, and keep the binary in $ACCELMUX_WHEEL_CACHE/llama-server-<version>/
# (default ~/.cache/accelmux-wheels), so a machine (or CI cache) builds it once.
# Idempotent: a second run only checks that the cached binary starts.
#
# Prints the path of the binary on its last line.
#
# Environment:
#   ACCELMUX_WHEEL_CACHE        where the built binary is kept
#   ACCELMUX_LLAMA_CPP_VERSION  llama-cpp-python sdist version (default below)
#   ACCELMUX_LLAMA_CMAKE_ARGS   CMake flags (default below; never -DGGML_NATIVE=ON, see
#                               setup-models.sh)
#   ACCELMUX_BUILD_JOBS         parallel compile jobs (default: the number of CPUs)
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=python-env.sh
. scripts/python-env.sh

CACHE=${ACCELMUX_WHEEL_CACHE:-$HOME/.cache/accelmux-wheels}
CMAKE_FLAGS=${ACCELMUX_LLAMA_CMAKE_ARGS:-"-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"}
JOBS=${ACCELMUX_BUILD_JOBS:-$(nproc)}
DEST="$CACHE/llama-server-$LLAMA_VERSION"
BIN="$DEST/llama-server"

log() { printf '== setup-llama-server: %s\n' "$*" >&2; }

if [ -x "$BIN" ] && "$BIN" --version >/dev/null 2>&1; then
  log "llama-server ($LLAMA_VERSION sources) already built at $BIN"
  echo "$BIN"
  exit 0
fi
for tool in cmake cc c++; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "setup-llama-server: building llama-server needs $tool" \
      "(Debian: apt-get install build-essential cmake)" >&2
    exit 1
  fi
done

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
log "downloading the llama-cpp-python $LLAMA_VERSION sdist"
# Only the package itself as an sdist: its build requirements (scikit-build-core) as wheels.
"$PY" -m pip download -q --no-binary llama-cpp-python --no-deps -d "$tmp" "llama-cpp-python==$LLAMA_VERSION"
sdist=$(find "$tmp" -maxdepth 1 -name 'llama_cpp_python-*.tar.gz' | head -n 1)
if [ -z "$sdist" ]; then
  echo "setup-llama-server: pip left no llama-cpp-python sdist in $tmp" >&2
  exit 1
fi
tar -xzf "$sdist" -C "$tmp"
src=$(find "$tmp" -maxdepth 3 -type d -path '*/vendor/llama.cpp' | head -n 1)
if [ -z "$src" ]; then
  echo "setup-llama-server: the sdist carries no vendor/llama.cpp" >&2
  exit 1
fi
generator=()
if command -v ninja >/dev/null 2>&1; then
  generator=(-G Ninja)
fi
log "building llama-server with '$CMAKE_FLAGS' on $JOBS jobs (15+ minutes on 2 cores)"
# shellcheck disable=SC2086  # the flags are a word list on purpose
cmake -S "$src" -B "$tmp/build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF $CMAKE_FLAGS >&2
cmake --build "$tmp/build" --target llama-server -j "$JOBS" >&2
built=$(find "$tmp/build" -type f -name llama-server -perm -u+x | head -n 1)
if [ -z "$built" ]; then
  echo "setup-llama-server: the build left no llama-server binary" >&2
  exit 1
fi
"$built" --version >&2
mkdir -p "$DEST"
cp "$built" "$BIN.partial"
mv "$BIN.partial" "$BIN"
log "llama-server at $BIN"
echo "$BIN"
