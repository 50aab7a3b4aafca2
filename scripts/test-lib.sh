# Sourced by scripts/test: running pytest and combining the exit statuses of its phases.
# tests/install/test_scripts.py runs these functions on their own.

pytest_rc() {
  # Runs pytest; prints its exit status (pytest's own output goes to stderr here).
  set +e
  "$@" >&2
  echo $?
  set -e
}

combined_rc() {
  # One exit status for several pytest runs: the first failure, else 0; collecting nothing
  # in every run is a failure (exit status 5 alone never passes).
  local rc nothing=1
  for rc in "$@"; do
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ]; then
      echo "$rc"
      return
    fi
    [ "$rc" -eq 0 ] && nothing=0
  done
  if [ "$nothing" -eq 1 ]; then
    echo "pytest collected no tests: that is a failure" >&2
    echo 1
    return
  fi
  echo 0
}
