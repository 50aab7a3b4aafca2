"""Configuration: the YAML schema, loading with named errors, and spec building."""

from accelmux.config.load import load_config, load_config_text, semantic_problems
from accelmux.config.schema import AccelmuxConfig
from accelmux.config.specs import to_manager_spec

__all__ = [
    "AccelmuxConfig",
    "load_config",
    "load_config_text",
    "semantic_problems",
    "to_manager_spec",
]
