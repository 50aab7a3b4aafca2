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
llama_configure "${LLAMA_SERVER_FLAGS[@]}"
llama_build llama-server
llama_install_server "$DEST"
log "llama-server at $BIN"
echo "$BIN"
