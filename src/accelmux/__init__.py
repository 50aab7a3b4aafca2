"""accelmux: one resource manager for a home server's AI accelerator."""

__version__ = "0.1.0"
