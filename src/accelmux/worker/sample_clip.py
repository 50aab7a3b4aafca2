"""A short synthetic camera clip for the default stack, written at first use.

The clip (``camera-sample.avi`` under the data directory, MJPEG, 640 x 480, 10 s at
5 frames per second) shows an empty scene for 4 s, then the face of scikit-image's
``astronaut`` photograph (public domain, NASA) sliding across it for 4 s, then the
empty scene again: a camera job on it records face events only in the middle part.
"""

from __future__ import annotations

import os
from pathlib import Path

from accelmux.models._deps import require

SAMPLE_NAME = "camera-sample.avi"
WIDTH, HEIGHT, FPS, SECONDS = 640, 480, 5, 10
#: Seconds of the clip during which the face is in view.
FACE_FROM_S, FACE_UNTIL_S = 4.0, 8.0


def sample_clip(data_dir: Path) -> Path:
    """The sample clip's path, writing it first when missing."""
    path = Path(data_dir) / SAMPLE_NAME
    if path.is_file() and path.stat().st_size > 0:
        return path
    cv2 = require("cv2", "opencv-python-headless<5")
    np = require("numpy", "numpy")
    data = require("skimage.data", "scikit-image")
    path.parent.mkdir(parents=True, exist_ok=True)
    face = cv2.cvtColor(data.astronaut()[20:240, 120:330], cv2.COLOR_RGB2BGR)  # head and helmet
    fh, fw = face.shape[:2]
    yy, xx = np.mgrid[0:HEIGHT, 0:WIDTH]
    background = np.dstack(
        [(60 + xx * 80 // WIDTH), (70 + yy * 60 // HEIGHT), np.full_like(xx, 90)]
    ).astype(np.uint8)
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial.avi")
    writer = cv2.VideoWriter(str(partial), cv2.VideoWriter_fourcc(*"MJPG"), FPS, (WIDTH, HEIGHT))
    if not writer.isOpened():
        raise OSError(f"OpenCV cannot write {partial}")
    try:
        n = FPS * SECONDS
        for i in range(n):
            frame = background.copy()
            t = i / FPS
            if FACE_FROM_S <= t < FACE_UNTIL_S:
                share = (t - FACE_FROM_S) / (FACE_UNTIL_S - FACE_FROM_S)
                x = int(40 + share * (WIDTH - fw - 80))
                y = (HEIGHT - fh) // 2
                frame[y : y + fh, x : x + fw] = face
            cv2.putText(
                frame, f"{t:4.1f}s", (10, 30), cv2.FONT_HERSHEY_SIMPLEX, 0.8, (255, 255, 255), 2
            )
            writer.write(frame)
    finally:
        writer.release()
    os.chmod(partial, 0o600)
    os.replace(partial, path)
    return path
