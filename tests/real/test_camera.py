"""Frame reading from a video file, a folder of images and an MJPEG stream on loopback."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from accelmux.errors import BackendError
from accelmux.models import FrameReader

from .support import CV2, need

pytestmark = pytest.mark.real


@pytest.fixture(scope="module")
def video(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two seconds of 25 fps MJPEG video whose frame i has brightness 5 x i."""
    need(CV2)
    import cv2
    import numpy as np

    path = tmp_path_factory.mktemp("video") / "clip.avi"
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 25.0, (64, 48))
    for i in range(50):
        writer.write(np.full((48, 64, 3), i * 5, np.uint8))
    writer.release()
    return path


def test_video_file_is_sampled_at_the_rate(video: Path) -> None:
    frames = list(FrameReader(video, fps=5, pace=False))
    assert [f.index for f in frames] == list(range(10))
    assert [round(f.timestamp_s, 2) for f in frames] == [round(0.2 * i, 2) for i in range(10)]
    # frame k of the 25 fps video is taken every 5 frames: brightness 25 x k
    assert [round(float(f.image.mean()) / 25) for f in frames] == list(range(10))
    assert (frames[0].width, frames[0].height) == (64, 48)


def test_paced_reading_takes_real_time(video: Path) -> None:
    start = time.monotonic()
    frames = list(FrameReader(video, fps=20, pace=True, max_frames=6))
    elapsed = time.monotonic() - start
    assert len(frames) == 6
    assert 0.2 < elapsed < 2.0  # 5 periods of 50 ms, with room for a busy machine


def test_stop_from_another_thread_ends_a_looping_reader(video: Path) -> None:
    reader = FrameReader(video, fps=10, pace=True, loop=True)
    timer = threading.Timer(0.5, reader.stop)
    timer.start()
    start = time.monotonic()
    frames = list(reader)
    timer.join()
    assert time.monotonic() - start < 2.0
    assert 2 <= len(frames) <= 12
    assert reader.stopped


def test_loop_continues_the_timeline(video: Path) -> None:
    frames = list(FrameReader(video, fps=1, pace=False, loop=True, max_frames=5))
    times = [f.timestamp_s for f in frames]
    assert times == sorted(times)
    assert len(set(times)) == 5


def test_folder_of_images_in_name_order(tmp_path: Path) -> None:
    need(CV2)
    import cv2
    import numpy as np

    for i in (2, 0, 1):
        cv2.imwrite(str(tmp_path / f"frame-{i}.png"), np.full((8, 8, 3), i * 50, np.uint8))
    (tmp_path / "notes.txt").write_text("not an image")
    frames = list(FrameReader(tmp_path, fps=50))
    assert [Path(f.source).name for f in frames] == ["frame-0.png", "frame-1.png", "frame-2.png"]
    assert [int(f.image.mean()) for f in frames] == [0, 50, 100]


class _Mjpeg(BaseHTTPRequestHandler):
    frames = 200

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        import cv2
        import numpy as np

        self.send_response(200)
        self.send_header("Content-Type", "multipart/x-mixed-replace; boundary=frame")
        self.end_headers()
        try:
            for i in range(self.frames):
                _, jpg = cv2.imencode(".jpg", np.full((48, 64, 3), (i * 7) % 256, np.uint8))
                head = b"--frame\r\nContent-Type: image/jpeg\r\nContent-Length: %d\r\n\r\n"
                self.wfile.write(head % len(jpg) + jpg.tobytes() + b"\r\n")
                self.wfile.flush()
                time.sleep(0.02)
        except (BrokenPipeError, ConnectionResetError):
            pass


@pytest.fixture
def mjpeg_url() -> Iterator[str]:
    need(CV2)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Mjpeg)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/stream.mjpg"
    server.shutdown()
    server.server_close()


def test_mjpeg_stream_over_http(mjpeg_url: str) -> None:
    reader = FrameReader(mjpeg_url, fps=10, max_frames=4, open_timeout_s=5)
    assert reader.kind == "stream"
    start = time.monotonic()
    frames = list(reader)
    assert len(frames) == 4
    assert frames[0].image.shape == (48, 64, 3)
    assert time.monotonic() - start >= 0.25  # 3 periods of 100 ms
    gaps = [b.timestamp_s - a.timestamp_s for a, b in itertools.pairwise(frames)]
    assert all(g >= 0.08 for g in gaps), gaps


def test_unopenable_sources_are_backend_errors(tmp_path: Path) -> None:
    need(CV2)
    with pytest.raises(BackendError, match="not a file"):
        list(FrameReader(tmp_path / "missing.mp4"))
    (tmp_path / "fake.mp4").write_bytes(b"not a video")
    with pytest.raises(BackendError, match="cannot open"):
        list(FrameReader(tmp_path / "fake.mp4"))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(BackendError, match="no images"):
        list(FrameReader(empty))
    with pytest.raises(BackendError, match="cannot open"):
        list(FrameReader("rtsp://127.0.0.1:9/none", open_timeout_s=1))
