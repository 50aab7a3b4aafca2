"""Device samplers: host/shared memory (psutil), NVIDIA GPUs (NVML) and virtual devices.

Each sampler turns one measurement into a core ``MemorySampled`` event. Definitions
(the same for every device kind):

* ``per_service``: what each managed service measurably holds on the device: the bytes
  its in-process backend reports plus, for external servers, its process tree (PSS,
  falling back to RSS, on the host; NVML per-process memory on a GPU).
* ``baseline``: what the device spends that is neither a service nor foreign: accelmux's
  own process (minus what its in-process backends report) plus the slack the operator
  left outside the budget (``capacity - budget``).
* ``foreign = used - per_service - baseline`` (never below 0). For a host device this
  is memory used by everything else on the machine (OS, page-cache-pinned apps, other
  daemons) beyond ``capacity - budget``: the budget is what accelmux may use while the
  rest of the machine stays within its share; anything beyond shrinks the budget live.
"""
