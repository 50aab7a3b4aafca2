"""Start an external server so that it dies with accelmux (run as a script, stdlib only).

``python -I child_launch.py --parent PID [--cgroup DIR] -- ARGV...`` is what accelmux
executes instead of ARGV. In the fresh process (single-threaded, unlike the daemon) it

1. asks the kernel for SIGKILL when its parent dies (``prctl(PR_SET_PDEATHSIG)``);
2. exits at once when the parent is already gone (it died between fork and prctl);
3. joins the service's cgroup v2 (``DIR/cgroup.procs``) when one is given, so the
   ``memory.max`` there holds it and everything it starts;
4. replaces itself with ARGV (``execvp``): same pid, no Python left running.

The death signal survives ``execve`` (except for set-user-ID programs). Doing this in a
separate program rather than in ``subprocess``'s ``preexec_fn`` avoids running Python
code between fork and exec in a multi-threaded daemon, which can deadlock. The signal is
tied to the thread that forked the child: accelmux forks from its event-loop thread,
which lives as long as the daemon.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def set_death_signal() -> bool:
    """Ask for SIGKILL on the parent's death; False where prctl is not available."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def join_cgroup(directory: str) -> None:
    with open(os.path.join(directory, "cgroup.procs"), "w", encoding="ascii") as fh:
        fh.write("0\n")  # 0: the writing process itself


def main(args: list[str]) -> int:
    parent: int | None = None
    cgroup: str | None = None
    while args and args[0] != "--":
        flag, value, args = args[0], args[1], args[2:]
        if flag == "--parent":
            parent = int(value)
        elif flag == "--cgroup":
            cgroup = value
        else:
            print(f"child_launch: unknown option {flag}", file=sys.stderr)
            return 2
    argv = args[1:]
    if not argv:
        print("child_launch: no command after --", file=sys.stderr)
        return 2
    if not set_death_signal():
        print("child_launch: prctl(PR_SET_PDEATHSIG) unavailable", file=sys.stderr)
    if parent is not None and os.getppid() != parent:
        return 1  # accelmux died before the death signal was armed
    if cgroup:
        try:
            join_cgroup(cgroup)
        except OSError as exc:
            print(f"child_launch: cannot join cgroup {cgroup}: {exc}", file=sys.stderr)
            return 1
    sys.stdout.flush()
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        print(f"child_launch: cannot start {argv[0]!r}: {exc}", file=sys.stderr)
        return 127
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
