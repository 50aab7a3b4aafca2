# Sourced by scripts that order the llama.cpp build's steps their own way (scripts/gpu-check
# compiles the bindings' libraries and llama-server in one CUDA build; bench/bench_llama_build.py
# times each step). Each function is one step of `accelmux setup`'s build
# (src/accelmux/setup/llama.py, `python -m accelmux.setup.steps`), in the same tree:
# $CACHE/llama.cpp-$LLAMA_VERSION, from the sources the llama-cpp-python sdist vendors.
# The steps' output goes to stderr; llama_pack_wheel prints the wheel's path.
#
# Needs PY (a Python with pip: python-env.sh), LLAMA_VERSION and CACHE. Sets LLAMA_TREE,
# LLAMA_SRC, LLAMA_BUILD and LLAMA_SERVER_FLAGS.
#
# Environment: ACCELMUX_LLAMA_CMAKE_ARGS (CPU flags; never -DGGML_NATIVE=ON) and
# ACCELMUX_BUILD_JOBS (default: the number of CPUs), as `accelmux setup` reads them.

LLAMA_TREE="$CACHE/llama.cpp-$LLAMA_VERSION"
LLAMA_SRC="$LLAMA_TREE/llama-cpp-python"
LLAMA_BUILD="$LLAMA_TREE/build"

llama_step() {
  PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" ACCELMUX_WHEEL_CACHE="$CACHE" \
    ACCELMUX_LLAMA_CPP_VERSION="$LLAMA_VERSION" "$PY" -m accelmux.setup.steps "$@"
}

llama_need_tools() { llama_step need-tools || exit 1; }
llama_sources() { llama_step sources >&2 || exit 1; }
llama_configure() { llama_step configure "$@" >&2 || exit 1; }
llama_build() { llama_step compile "$@" >&2 || exit 1; }
llama_install_server() { llama_step install-server "$1" >&2 || exit 1; }
llama_pack_wheel() { llama_step pack-wheel "$1" || exit 1; }

mapfile -t LLAMA_SERVER_FLAGS < <(llama_step server-flags)
