"""The committed configuration reference matches the schema."""

from __future__ import annotations

from pathlib import Path

from accelmux.config.reference import render_reference

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_reference_doc_is_current() -> None:
    assert DOC.read_text(encoding="utf-8") == render_reference(), (
        "docs/configuration.md is stale: run `accelmux check --reference > docs/configuration.md`"
    )


def test_reference_names_every_section() -> None:
    text = render_reference()
    for key in (
        "services.NAME.memory.kv_ceiling",
        "devices.NAME.headroom",
        "server.admin_key",
        "policy.safety_factor",
        "services.NAME.backend.argv",
    ):
        assert f"`{key}`" in text
