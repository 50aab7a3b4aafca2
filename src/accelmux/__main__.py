"""``python -m accelmux``: the ``accelmux`` command (what a systemd unit runs)."""

from __future__ import annotations

import sys

from accelmux.cli import main

if __name__ == "__main__":
    sys.exit(main())
