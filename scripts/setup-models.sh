#!/usr/bin/env bash
# Install the real model runtimes and the models into the current Python environment:
# `accelmux setup` (src/accelmux/setup, docs/models.md), run from this checkout.
# Idempotent: a second run only checks. Arguments go to it (--check: report only).
#
# Python: $PYTHON if set, else the active virtualenv's, else this repo's .venv, else python3.
# Environment: ACCELMUX_WHEEL_CACHE, ACCELMUX_LLAMA_CPP_VERSION, ACCELMUX_LLAMA_CMAKE_ARGS,
# ACCELMUX_BUILD_JOBS (see `accelmux setup --help` and docs/models.md).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=python-env.sh
. scripts/python-env.sh
PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" exec "$PY" -m accelmux.setup "$@"
