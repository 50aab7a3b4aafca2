"""Built-in configurations: the default real-model stack (:mod:`accelmux.defaults.stack`)."""
