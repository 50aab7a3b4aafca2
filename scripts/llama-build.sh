# Sourced by setup-models.sh, setup-llama-server.sh and gpu-check: one llama.cpp build
# tree, from the sources the llama-cpp-python sdist vendors (so libllama matches its
# Python bindings exactly), kept in $LLAMA_TREE across runs. setup-models.sh builds only
# the shared libraries the Python bindings load (libllama, libggml*); setup-llama-server.sh
# builds llama-server in the same tree later; gpu-check builds both in one go (one CUDA
# compile of libggml-cuda). Either way the libraries are compiled once, not twice: the
# bindings' wheel is packed around them (llama_pack_wheel) and llama-server is copied
# with them (llama_install_server).
#
# Needs PY and LLAMA_VERSION (python-env.sh) and CACHE. Sets LLAMA_TREE, LLAMA_SRC, LLAMA_BUILD.
#
# Environment:
#   ACCELMUX_LLAMA_CMAKE_ARGS  CPU flags (default: portable AVX2; never -DGGML_NATIVE=ON:
#                              a native build can die with "Illegal instruction" on another
#                              CPU of the same kind)
#   ACCELMUX_BUILD_JOBS        parallel compile jobs (default: the number of CPUs)

LLAMA_CMAKE_ARGS=${ACCELMUX_LLAMA_CMAKE_ARGS:-"-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"}
BUILD_JOBS=${ACCELMUX_BUILD_JOBS:-$(nproc)}
LLAMA_TREE="$CACHE/llama.cpp-$LLAMA_VERSION"
LLAMA_SRC="$LLAMA_TREE/llama-cpp-python"
LLAMA_BUILD="$LLAMA_TREE/build"

llama_need_tools() {
  local tool
  for tool in cmake cc c++; do
    if ! command -v "$tool" >/dev/null 2>&1; then
      echo "building llama.cpp needs $tool (Debian: apt-get install build-essential cmake)" >&2
      exit 1
    fi
  done
}

llama_sources() {
  # The llama-cpp-python sdist, unpacked into $LLAMA_SRC (its vendor/llama.cpp is built).
  if [ -f "$LLAMA_SRC/vendor/llama.cpp/CMakeLists.txt" ]; then
    return
  fi
  local tmp sdist
  tmp=$(mktemp -d)
  "$PY" -m pip download -q --no-binary llama-cpp-python --no-deps -d "$tmp" \
    "llama-cpp-python==$LLAMA_VERSION"
  sdist=$(find "$tmp" -maxdepth 1 -name 'llama_cpp_python-*.tar.gz' | head -n 1)
  if [ -z "$sdist" ]; then
    echo "pip left no llama-cpp-python sdist in $tmp" >&2
    exit 1
  fi
  mkdir -p "$LLAMA_TREE"
  rm -rf "$LLAMA_SRC.partial"
  mkdir "$LLAMA_SRC.partial"
  tar -xzf "$sdist" -C "$LLAMA_SRC.partial" --strip-components=1
  rm -rf "$tmp" "$LLAMA_SRC"
  mv "$LLAMA_SRC.partial" "$LLAMA_SRC"
}

llama_configure() {
  # Configure the tree; extra -D flags (the server's) are added to what is there.
  local generator=() launcher=()
  if command -v ninja >/dev/null 2>&1; then
    generator=(-G Ninja)
  fi
  if command -v ccache >/dev/null 2>&1; then
    launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  fi
  local first=()
  if [ -f "$LLAMA_BUILD/CMakeCache.txt" ]; then
    generator=()  # fixed by the first configure
  else
    first=(-DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF)
  fi
  # Shared libraries with $ORIGIN run paths: libllama finds libggml beside it, in the
  # Python package and beside llama-server alike. No tests, examples, tools, curl or TLS.
  # shellcheck disable=SC2086  # the flags are a word list on purpose
  cmake -S "$LLAMA_SRC/vendor/llama.cpp" -B "$LLAMA_BUILD" "${generator[@]}" "${launcher[@]}" \
    -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
    -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON '-DCMAKE_INSTALL_RPATH=$ORIGIN' \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF "${first[@]}" $LLAMA_CMAKE_ARGS "$@" >&2
}

llama_build() {
  # Build the given targets in the tree (incremental: what is built stays built).
  cmake --build "$LLAMA_BUILD" --config Release -j "$BUILD_JOBS" --target "$@" >&2
}

llama_pack_wheel() {
  # Pack the llama-cpp-python wheel around the libraries built in the tree (no second
  # compile: -DLLAMA_BUILD=OFF) into directory $1; prints the wheel's path.
  local tmp wheel
  tmp=$(mktemp -d)
  # --no-cache-dir: pip's wheel cache is keyed by the source, not by CMAKE_ARGS.
  CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF" "$PY" -m pip wheel -q --no-cache-dir \
    --no-deps -w "$tmp" "$LLAMA_SRC" >&2
  wheel=$(find "$tmp" -maxdepth 1 -name 'llama_cpp_python-*.whl' | head -n 1)
  if [ -z "$wheel" ]; then
    echo "the llama-cpp-python build left no wheel in $tmp" >&2
    exit 1
  fi
  "$PY" scripts/add-wheel-libs.py "$wheel" llama_cpp/lib "$LLAMA_BUILD/bin" >&2
  mkdir -p "$1"
  mv "$wheel" "$1/"
  rm -rf "$tmp"
  echo "$1/$(basename "$wheel")"
}

llama_install_server() {
  # Copy the built llama-server and the shared libraries it loads (found beside it: an
  # $ORIGIN run path) to directory $1, whole or not at all.
  local built="$LLAMA_BUILD/bin/llama-server"
  if [ ! -x "$built" ]; then
    echo "the build left no llama-server binary at $built" >&2
    exit 1
  fi
  "$built" --version >&2
  rm -rf "$1.partial"
  mkdir -p "$1.partial"
  cp -L "$built" "$LLAMA_BUILD"/bin/lib*.so* "$1.partial/"
  rm -rf "$1"
  mv "$1.partial" "$1"
}

#: The CMake flags that build llama-server with its common code (no web UI: the API only,
#: no npm build, no download of prebuilt assets).
LLAMA_SERVER_FLAGS=(-DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON
  -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF)
