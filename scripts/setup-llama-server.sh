#!/usr/bin/env bash
# Build llama.cpp's llama-server (for the tests of a real external server, tests/external;
# the default stack never runs it) from the sources the llama-cpp-python sdist vendors,
# with portable CPU flags, in the build tree scripts/setup-models.sh keeps in
# $ACCELMUX_WHEEL_CACHE (scripts/llama-build.sh): the libraries it built are reused, only
# the server and its common code compile here. The binary and its libraries go to
# $ACCELMUX_WHEEL_CACHE/llama-server-<version>/ (default ~/.cache/accelmux-wheels), so a
# machine (or CI cache) builds it once. Idempotent: a second run only checks that the
# cached binary starts.
#
# Prints the path of the binary on its last line.
#
# Environment:
#   ACCELMUX_WHEEL_CACHE        where the build tree and the binary are kept
#   ACCELMUX_LLAMA_CPP_VERSION  llama-cpp-python sdist version (default in python-env.sh)
#   ACCELMUX_LLAMA_CMAKE_ARGS   CMake CPU flags (default in llama-build.sh; never
#                               -DGGML_NATIVE=ON)
#   ACCELMUX_BUILD_JOBS         parallel compile jobs (default: the number of CPUs)
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=python-env.sh
. scripts/python-env.sh

CACHE=${ACCELMUX_WHEEL_CACHE:-$HOME/.cache/accelmux-wheels}
# shellcheck source=llama-build.sh
. scripts/llama-build.sh
DEST="$CACHE/llama-server-$LLAMA_VERSION"
BIN="$DEST/llama-server"

log() { printf '== setup-llama-server: %s\n' "$*" >&2; }

if [ -x "$BIN" ] && "$BIN" --version >/dev/null 2>&1; then
  log "llama-server ($LLAMA_VERSION sources) already built at $BIN"
  echo "$BIN"
  exit 0
fi
llama_need_tools
llama_sources
if [ -f "$LLAMA_BUILD/CMakeCache.txt" ]; then
  log "building llama-server in $LLAMA_BUILD (its libraries are built already)"
else
  log "building llama.cpp's libraries and llama-server with '$LLAMA_CMAKE_ARGS'"
fi
log "on $BUILD_JOBS jobs (the server and llama.cpp's common code compile here)"
# No web UI (the tests use the API only): no npm build, no download of prebuilt assets.
llama_configure -DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
  -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF
llama_build llama-server
built="$LLAMA_BUILD/bin/llama-server"
if [ ! -x "$built" ]; then
  echo "setup-llama-server: the build left no llama-server binary at $built" >&2
  exit 1
fi
"$built" --version >&2
rm -rf "$DEST.partial"
mkdir -p "$DEST.partial"
# the binary finds its shared libraries beside it ($ORIGIN run path)
cp -L "$built" "$LLAMA_BUILD"/bin/lib*.so* "$DEST.partial/"
rm -rf "$DEST"
mv "$DEST.partial" "$DEST"
log "llama-server at $BIN"
echo "$BIN"
