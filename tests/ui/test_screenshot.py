"""The screenshot script keeps working (a short run; the real one renders docs/dashboard.png)."""

from __future__ import annotations

import struct
from pathlib import Path

from tests.ui.support import need_browser


def test_make_screenshot_renders_the_whole_page(tmp_path: Path) -> None:
    need_browser()
    from tests.ui.make_screenshot import make

    out = make(tmp_path / "shot.png", seconds=4)
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert width == 1500 and height > 1200
