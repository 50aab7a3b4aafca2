"""``python -m accelmux.setup``: ``accelmux setup`` without the rest of the CLI (its
dependencies need not be installed)."""

from __future__ import annotations

import sys

from accelmux.setup.command import main

if __name__ == "__main__":
    sys.exit(main())
