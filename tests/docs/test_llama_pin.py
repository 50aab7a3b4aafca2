"""One llama-cpp-python version everywhere, and its internals reached from one module.

The version accelmux supports (``llama_adapter.SUPPORTED_VERSION``) is the one
``scripts/setup-models.sh`` builds and the one ``pyproject.toml``'s ``llama`` extra pins;
every private field of llama-cpp-python is reached through ``llama_adapter`` alone.
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

from accelmux.models import llama_adapter

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "accelmux"
ADAPTER = SRC / "models" / "llama_adapter.py"

#: Private names of llama-cpp-python objects (``Llama``, ``LlamaGrammar``, its modules).
LLAMA_PRIVATE = frozenset(
    {
        "_model",
        "_ctx",
        "_batch",
        "_sampler",
        "_n_ctx",
        "_n_vocab",
        "_candidates",
        "_logits_all",
        "_requires_eval",
        "_mirostat_mu",
        "_grammar",
        "_root",
        "_stack",
        "__dict__",
    }
)


def test_setup_models_installs_the_supported_version() -> None:
    env = (ROOT / "scripts" / "python-env.sh").read_text()
    default = re.search(r"LLAMA_VERSION=\$\{ACCELMUX_LLAMA_CPP_VERSION:-([^}]+)\}", env)
    assert default, "scripts/python-env.sh sets no default LLAMA_VERSION"
    assert default.group(1) == llama_adapter.SUPPORTED_VERSION


def test_pyproject_pins_the_supported_version() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    assert extras["llama"] == [f"llama-cpp-python=={llama_adapter.SUPPORTED_VERSION}"]
    assert not any("llama-cpp-python" in dep for dep in extras["models"]), (
        "the models extra must not build llama-cpp-python (natively) by surprise"
    )


def test_unsupported_version_names_both_versions() -> None:
    assert llama_adapter.unsupported_version(llama_adapter.SUPPORTED_VERSION) is None
    assert llama_adapter.unsupported_version("0.2.90") == (
        f"llama-cpp-python 0.2.90 is installed; accelmux supports "
        f"{llama_adapter.SUPPORTED_VERSION} (scripts/setup-models.sh installs it)"
    )


def _private_access(path: Path) -> list[str]:
    found = []
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in LLAMA_PRIVATE:
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.ImportFrom | ast.Import):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            names += [alias.name for alias in node.names]
            if any(name.startswith("llama_cpp._") for name in names):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: imports {names}")
        elif isinstance(node, ast.Constant) and node.value == "llama_cpp._internals":
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: 'llama_cpp._internals'")
    return found


def test_only_the_adapter_reaches_into_llama_cpp_python() -> None:
    found = [
        line
        for path in sorted(SRC.rglob("*.py"))
        if path != ADAPTER
        for line in _private_access(path)
    ]
    assert not found, "reach llama-cpp-python's internals through llama_adapter:\n" + "\n".join(
        found
    )
