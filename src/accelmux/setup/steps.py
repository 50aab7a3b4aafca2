"""The llama.cpp build's steps one at a time, for a script that orders them its own way.

    python -m accelmux.setup.steps need-tools
    python -m accelmux.setup.steps sources
    python -m accelmux.setup.steps configure [CMAKE FLAG...]
    python -m accelmux.setup.steps compile TARGET...
    python -m accelmux.setup.steps install-server DEST
    python -m accelmux.setup.steps pack-wheel DEST        (prints the wheel's path)
    python -m accelmux.setup.steps server-flags           (one flag a line)

The same :class:`~.llama.Build` as ``accelmux setup`` (its cache, version, CPU flags and
jobs from the environment); ``scripts/llama-build.sh`` wraps each step as a shell
function: ``scripts/gpu-check`` compiles the bindings' libraries and llama-server in one
CUDA build with them, and ``bench/bench_llama_build.py`` times them one by one. A failed
step prints why on stderr and exits 1.
"""

from __future__ import annotations

import sys
from pathlib import Path

from accelmux.setup.llama import SERVER_FLAGS, Build, SetupError

USAGE = (
    "usage: python -m accelmux.setup.steps need-tools | sources | configure [FLAG...] | "
    "compile TARGET... | install-server DEST | pack-wheel DEST | server-flags"
)


def run_step(build: Build, step: str, args: list[str]) -> str | None:
    """Run one step; what it prints (None: nothing). Raises ``ValueError`` for a step or
    arguments it does not know."""
    if step == "need-tools" and not args:
        build.need_tools()
    elif step == "sources" and not args:
        build.fetch_sources()
    elif step == "configure":
        build.configure(*args)
    elif step == "compile" and args:
        build.compile(*args)
    elif step == "install-server" and len(args) == 1:
        build.install_server(Path(args[0]))
    elif step == "pack-wheel" and len(args) == 1:
        return str(build.pack_wheel(Path(args[0])))
    elif step == "server-flags" and not args:
        return "\n".join(SERVER_FLAGS)
    else:
        raise ValueError(step)
    return None


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print(USAGE, file=sys.stderr)
        return 2
    try:
        out = run_step(Build.from_environment(), args[0], args[1:])
    except ValueError:
        print(USAGE, file=sys.stderr)
        return 2
    except SetupError as exc:
        print(f"accelmux setup ({args[0]}): {exc}", file=sys.stderr)
        return 1
    if out is not None:
        print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
