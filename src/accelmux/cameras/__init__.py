"""Camera analysis: a background job per camera service, and the events it records.

A service of kind ``camera`` with a ``worker`` backend names its source in the
backend options (``source``: a video file, a folder of images, an ``rtsp://`` or
``http(s)://`` MJPEG URL, or ``sample`` for the clip the default stack writes into the
data directory; ``fps``: frames analysed per second). The daemon runs one loop per such
service (:class:`~accelmux.cameras.runner.CameraRunner`): each frame is one request of
the service's class (``background`` by default) through the Manager, so camera analysis
waits while voice runs and is refused or queued like any other work. Detections are
stored in SQLite under the data directory (:class:`~accelmux.cameras.store.EventStore`)
and served at ``GET /v1/cameras`` and ``GET /v1/cameras/{name}/events``.
"""

from accelmux.cameras.runner import CameraRunner
from accelmux.cameras.store import EventStore

__all__ = ["CameraRunner", "EventStore"]
