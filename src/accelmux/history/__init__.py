"""The request history the daemon records: what the simulator needs, nothing a user would mind.

Per request: arrival, service, class, sizes (tokens, units), the times of its phases
(queue, first token, end), its outcome and reason; per load: how long it took and the
bytes measured; every decision that is not a request's own dispatch; and memory samples
with the compute other processes used. Never a prompt, an output or a file name.

- :mod:`.records`: the rows; :mod:`.run`: what a run of the daemon ran;
- :mod:`.recorder`: the observer the runtime tells every Manager round;
- :mod:`.store`: SQLite day files under ``data_dir/history``, bounded, 0600;
- :mod:`.cpu`: the compute the host's processes used between two samples.
"""
