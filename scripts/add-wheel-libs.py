"""Add llama.cpp's shared libraries to a llama-cpp-python wheel built without them.

Usage: add-wheel-libs.py WHEEL DEST_IN_WHEEL LIB_DIR

Every ``libllama.so*`` / ``libggml*.so*`` of LIB_DIR (a link is stored as a copy of its
target, as llama-cpp-python's own wheels hold them) goes to DEST_IN_WHEEL, and the
wheel's RECORD lists them with their hashes, so pip installs and uninstalls them with
the package.
"""

from __future__ import annotations

import base64
import hashlib
import re
import sys
import zipfile
from pathlib import Path

LIBRARY = re.compile(r"^lib(llama|ggml[\w-]*)\.so(\.\d+)*$")


def record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def main(wheel: Path, dest: str, lib_dir: Path) -> None:
    libraries = sorted(p for p in lib_dir.iterdir() if LIBRARY.match(p.name))
    if not any(p.name == "libllama.so" for p in libraries):
        sys.exit(f"add-wheel-libs: no libllama.so in {lib_dir}")
    packed = wheel.with_suffix(".partial")
    with zipfile.ZipFile(wheel) as old, zipfile.ZipFile(packed, "w", zipfile.ZIP_DEFLATED) as new:
        record_name = next(n for n in old.namelist() if n.endswith(".dist-info/RECORD"))
        records = [line for line in old.read(record_name).decode().splitlines() if line]
        for item in old.infolist():
            if item.filename != record_name:
                new.writestr(item, old.read(item.filename))
        for library in libraries:
            name = f"{dest}/{library.name}"
            data = library.read_bytes()
            info = zipfile.ZipInfo(name)
            info.external_attr = 0o755 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            new.writestr(info, data)
            records.insert(-1, record_line(name, data))
        new.writestr(record_name, "\n".join(records) + "\n")
    packed.replace(wheel)
    print(f"add-wheel-libs: {len(libraries)} libraries added to {wheel.name}")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2].strip("/"), Path(sys.argv[3]))
