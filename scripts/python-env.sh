# Sourced by the setup scripts: sets PY to the Python to install into and LLAMA_VERSION.
# Python: $PYTHON if set, else the active virtualenv's, else this repo's .venv, else python3
# (relative paths are from the repository root, where the scripts cd first).
if [ -n "${PYTHON:-}" ]; then
  PY=$PYTHON
elif [ -n "${VIRTUAL_ENV:-}" ] && [ -x "$VIRTUAL_ENV/bin/python" ]; then
  PY=$VIRTUAL_ENV/bin/python
elif [ -x .venv/bin/python ]; then
  PY=.venv/bin/python
else
  PY=python3
fi
# the default of accelmux.setup.packages.LLAMA_VERSION (tests/docs/test_llama_pin.py)
LLAMA_VERSION=${ACCELMUX_LLAMA_CPP_VERSION:-0.3.36}
