"""Frames from a camera source at a set rate: a video file, a folder of images, or a stream URL.

:class:`FrameReader` wraps ``cv2.VideoCapture`` (files and ``rtsp://``,
``http(s)://`` MJPEG streams) and ``cv2.imread`` (folders). It only reads:
what to do with a frame is the caller's business.

Rate: frames come at most ``fps`` per second. For a video file, frames are
picked by the file's own timestamps (one every ``1/fps`` seconds of video;
the ones between are skipped without decoding), and with ``pace=True`` they are
also delivered in real time. A folder yields its images in name order, one
every ``1/fps`` seconds when pacing. A live stream is read continuously (so
its buffer never goes stale) and the newest frame is delivered every
``1/fps`` seconds.

:meth:`FrameReader.stop` may be called from any thread: iteration ends within
one frame read.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from accelmux.errors import BackendError
from accelmux.models._deps import require
from accelmux.redact import redact

IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".ppm"})
STREAM_SCHEMES = ("rtsp://", "rtsps://", "http://", "https://", "rtmp://", "udp://", "tcp://")


@dataclass(frozen=True)
class Frame:
    """One frame: a BGR ``numpy.ndarray`` (``image``), its number and when it was taken."""

    index: int
    timestamp_s: float  # seconds from the source's start (video time, or wall time for streams)
    image: Any
    source: str

    @property
    def width(self) -> int:
        return int(self.image.shape[1])

    @property
    def height(self) -> int:
        return int(self.image.shape[0])


def source_kind(source: str | Path) -> str:
    """``"stream"``, ``"folder"`` or ``"file"`` for a source string or path."""
    text = str(source)
    if text.lower().startswith(STREAM_SCHEMES):
        return "stream"
    if Path(text).is_dir():
        return "folder"
    return "file"


class FrameReader:
    """Iterate :class:`Frame` objects from one source, at most ``fps`` per second."""

    def __init__(
        self,
        source: str | Path,
        *,
        fps: float = 1.0,
        pace: bool = True,
        loop: bool = False,
        max_frames: int | None = None,
        open_timeout_s: float = 10.0,
    ) -> None:
        if fps <= 0:
            raise ValueError("fps must be positive")
        self.source = str(source)
        self.kind = source_kind(source)
        self.fps = fps
        self.pace = pace
        self.loop = loop
        self.max_frames = max_frames
        self.open_timeout_s = open_timeout_s
        self._stop = threading.Event()
        self._cap: Any = None
        self._lock = threading.Lock()

    # -- control ------------------------------------------------------------------------------

    def stop(self) -> None:
        """End the iteration (thread-safe) and release the capture; a stopped reader stays so."""
        self._stop.set()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            cap, self._cap = self._cap, None
        if cap is not None:
            cap.release()

    def __enter__(self) -> FrameReader:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __iter__(self) -> Iterator[Frame]:
        return self.frames()

    # -- reading ------------------------------------------------------------------------------

    def frames(self) -> Iterator[Frame]:
        """Yield frames until the source ends, ``max_frames`` is reached, or :meth:`stop`."""
        cv2 = require("cv2", "opencv-python-headless<5")
        if self.kind == "folder":
            inner = self._folder(cv2)
        elif self.kind == "stream":
            inner = self._stream(cv2)
        else:
            inner = self._file(cv2)
        count = 0
        try:
            for frame in inner:
                yield frame
                count += 1
                if self._stop.is_set() or (
                    self.max_frames is not None and count >= self.max_frames
                ):
                    return
        finally:
            inner.close()
            self.close()

    def _sleep_until(self, deadline: float) -> bool:
        """Wait until ``deadline`` (monotonic); False if stopped meanwhile."""
        delay = deadline - time.monotonic()
        if delay > 0:
            return not self._stop.wait(delay)
        return not self._stop.is_set()

    def _open_capture(self, cv2: Any) -> Any:
        params = [
            cv2.CAP_PROP_OPEN_TIMEOUT_MSEC,
            int(self.open_timeout_s * 1000),
            cv2.CAP_PROP_READ_TIMEOUT_MSEC,
            int(self.open_timeout_s * 1000),
        ]
        try:
            cap = cv2.VideoCapture(self.source, cv2.CAP_ANY, params)
        except cv2.error as exc:
            shown = redact(self.source)
            raise BackendError(f"cannot open camera source {shown!r}: {redact(str(exc))}") from exc
        if not cap.isOpened():
            cap.release()
            raise BackendError(f"cannot open camera source {redact(self.source)!r}")
        with self._lock:
            self._cap = cap
        return cap

    def _folder(self, cv2: Any) -> Generator[Frame, None, None]:
        paths = sorted(p for p in Path(self.source).iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        if not paths:
            raise BackendError(f"no images in folder {self.source!r}")
        period = 1.0 / self.fps
        index = 0
        start = time.monotonic()
        while not self._stop.is_set():
            for path in paths:
                if self.pace and not self._sleep_until(start + index * period):
                    return
                image = cv2.imread(str(path), cv2.IMREAD_COLOR)
                if image is None:
                    continue  # not an image after all: skip it
                yield Frame(index, index * period, image, str(path))
                index += 1
                if self._stop.is_set():
                    return
            if not self.loop:
                return

    def _file(self, cv2: Any) -> Generator[Frame, None, None]:
        if not Path(self.source).is_file():
            raise BackendError(f"camera source {self.source!r} is not a file, folder or URL")
        cap = self._open_capture(cv2)
        native = float(cap.get(cv2.CAP_PROP_FPS) or 0.0)
        if not math.isfinite(native) or native <= 0 or native > 1000:  # unknown
            native = self.fps
        period = 1.0 / self.fps
        index = 0
        start = time.monotonic()
        base = 0.0  # video time of earlier loops
        while not self._stop.is_set():
            position = 0  # frames of this pass read so far
            next_t = 0.0
            last_t = 0.0
            while not self._stop.is_set():
                t = position / native
                if t + 1e-9 < next_t:
                    if not cap.grab():
                        break
                    position += 1
                    continue
                ok, image = cap.read()
                if not ok or image is None:
                    break
                position += 1
                if self.pace and not self._sleep_until(start + index * period):
                    return
                yield Frame(index, base + t, image, self.source)
                index += 1
                last_t = t
                next_t += period
            if not self.loop or self._stop.is_set() or index == 0:
                return
            base += last_t + period
            cap.set(cv2.CAP_PROP_POS_FRAMES, 0)

    def _stream(self, cv2: Any) -> Generator[Frame, None, None]:
        cap = self._open_capture(cv2)
        period = 1.0 / self.fps
        start = time.monotonic()
        index = 0
        deadline = start
        while not self._stop.is_set():
            if not cap.grab():
                if self._stop.is_set():
                    return
                raise BackendError(f"camera stream {self.source!r} stopped delivering frames")
            now = time.monotonic()
            if now < deadline:
                continue  # drop: keep the stream's buffer fresh
            ok, image = cap.retrieve()
            if not ok or image is None:
                continue
            yield Frame(index, now - start, image, self.source)
            index += 1
            deadline = max(deadline + period, time.monotonic() - period)
