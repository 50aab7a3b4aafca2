#!/usr/bin/env bash
# Build llama.cpp's llama-server (for the tests of a real external server, tests/external)
# with portable CPU flags, in the build tree `accelmux setup` keeps in $ACCELMUX_WHEEL_CACHE:
# `accelmux setup --llama-server`, run from this checkout (src/accelmux/setup). Prints the
# path of the binary on its last line. Idempotent: a second run only checks that it starts.
#
# Python: $PYTHON if set, else the active virtualenv's, else this repo's .venv, else python3
# (only the standard library is needed).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=python-env.sh
. scripts/python-env.sh
PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" exec "$PY" -m accelmux.setup --llama-server "$@"
