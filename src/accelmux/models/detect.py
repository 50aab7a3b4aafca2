"""Face and person detection with OpenCV (``opencv-python-headless`` 4.x).

Faces: the Haar cascade ``haarcascade_frontalface_default.xml`` that OpenCV 4.x
ships in ``cv2/data``. People: the HOG descriptor with OpenCV's default people
detector (a linear SVM). Both run on the CPU and keep no per-request state.

Scores are the detectors' raw confidences (Haar level weight, HOG SVM margin)
passed through a logistic function, so they lie in (0, 1) and rank detections
of one label; they are not calibrated probabilities.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from accelmux.errors import BackendError, RequestError
from accelmux.models._deps import require
from accelmux.models.assets import haar_cascade_path

LABELS = ("face", "person")
#: Largest encoded image accepted.
MAX_IMAGE_BYTES = 32 * 2**20
#: Largest decoded image accepted, in pixels.
MAX_IMAGE_PIXELS = 50_000_000
#: OpenCV's resident cost once loaded (library, cascade, HOG), measured.
CV_RUNTIME_BYTES = 24 * 2**20


@dataclass(frozen=True)
class Detection:
    label: str
    score: float
    x: int
    y: int
    w: int
    h: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _squash(raw: float) -> float:
    return 1.0 / (1.0 + math.exp(-max(-50.0, min(50.0, raw))))


class OpenCvDetector:
    """Image bytes (JPEG, PNG, ...) -> boxes of faces and people. One request at a time."""

    def __init__(
        self,
        *,
        cascade_path: str | Path | None = None,
        max_side: int = 800,
        face_min_size: int = 24,
        face_min_neighbors: int = 5,
        person_min_score: float = 0.0,
    ) -> None:
        self._cascade_path = Path(cascade_path) if cascade_path else None
        self.max_side = max_side
        self.face_min_size = face_min_size
        self.face_min_neighbors = face_min_neighbors
        self.person_min_score = person_min_score
        self._cv2: Any = None
        self._cascade: Any = None
        self._hog: Any = None

    @property
    def cascade_path(self) -> Path:
        return self._cascade_path or haar_cascade_path()

    @property
    def loaded(self) -> bool:
        return self._cv2 is not None

    def memory_estimate(self) -> int:
        """24 MiB of OpenCV runtime + 4 x the cascade XML + working images.

        Working images: the decoded image is capped at ``MAX_IMAGE_PIXELS`` x 3
        bytes; detection runs on a copy scaled to ``max_side`` (BGR + gray +
        HOG's pyramid, about 8 bytes per scaled pixel).
        """
        scaled = self.max_side * self.max_side * 8
        return CV_RUNTIME_BYTES + self.cascade_path.stat().st_size * 4 + scaled

    def load(self) -> None:
        if self._cv2 is not None:
            return
        cv2 = require("cv2", "opencv-python-headless<5")
        cascade = cv2.CascadeClassifier(str(self.cascade_path))
        if cascade.empty():
            raise BackendError(f"OpenCV cannot load the Haar cascade {self.cascade_path}")
        hog = cv2.HOGDescriptor()
        hog.setSVMDetector(cv2.HOGDescriptor_getDefaultPeopleDetector())
        self._cv2, self._cascade, self._hog = cv2, cascade, hog

    def unload(self) -> None:
        self._cv2 = self._cascade = self._hog = None

    def decode(self, image: bytes) -> Any:
        """Decode image bytes to a BGR ``numpy.ndarray``; malformed input raises RequestError."""
        cv2 = self._require()
        np = require("numpy", "numpy")
        if not isinstance(image, (bytes, bytearray, memoryview)) or len(image) == 0:
            raise RequestError("image must be non-empty bytes", field="image")
        if len(image) > MAX_IMAGE_BYTES:
            raise RequestError(
                f"image is {len(image)} bytes; the limit is {MAX_IMAGE_BYTES}",
                field="image",
                status=413,
            )
        arr = np.frombuffer(bytes(image), dtype=np.uint8)
        try:
            img = cv2.imdecode(arr, cv2.IMREAD_COLOR)
        except cv2.error as exc:
            raise RequestError(f"malformed image: {exc}", field="image") from exc
        if img is None or img.size == 0:
            raise RequestError(
                "malformed image: not a JPEG, PNG or other format OpenCV decodes", field="image"
            )
        if img.shape[0] * img.shape[1] > MAX_IMAGE_PIXELS:
            raise RequestError("image has too many pixels", field="image", status=413)
        return img

    def detect(self, image: bytes, labels: Iterable[str] = LABELS) -> list[Detection]:
        """Detect ``labels`` (``"face"``, ``"person"``) in encoded image bytes."""
        return self.detect_array(self.decode(image), labels)

    def detect_array(self, image: Any, labels: Iterable[str] = LABELS) -> list[Detection]:
        """Detect in a decoded BGR (or gray) ``numpy.ndarray``; boxes are in its pixels."""
        cv2 = self._require()
        wanted = list(labels)
        unknown = [label for label in wanted if label not in LABELS]
        if unknown:
            raise RequestError(f"unknown labels {unknown}; known: {list(LABELS)}", field="labels")
        if image.ndim == 2:
            image = cv2.cvtColor(image, cv2.COLOR_GRAY2BGR)
        h, w = image.shape[:2]
        scale = min(1.0, self.max_side / max(h, w))
        small = image
        if scale < 1.0:
            small = cv2.resize(
                image, (round(w * scale), round(h * scale)), interpolation=cv2.INTER_AREA
            )
        out: list[Detection] = []
        if "face" in wanted:
            out += self._faces(cv2, small, scale)
        if "person" in wanted:
            out += self._people(small, scale)
        out.sort(key=lambda d: d.score, reverse=True)
        return out

    def _faces(self, cv2: Any, img: Any, scale: float) -> list[Detection]:
        gray = cv2.equalizeHist(cv2.cvtColor(img, cv2.COLOR_BGR2GRAY))
        boxes, _, weights = self._cascade.detectMultiScale3(
            gray,
            scaleFactor=1.1,
            minNeighbors=self.face_min_neighbors,
            minSize=(self.face_min_size, self.face_min_size),
            outputRejectLevels=True,
        )
        return [
            _box("face", float(wt), box, scale) for box, wt in zip(boxes, weights, strict=False)
        ]

    def _people(self, img: Any, scale: float) -> list[Detection]:
        boxes, weights = self._hog.detectMultiScale(
            img, winStride=(8, 8), padding=(8, 8), scale=1.05
        )
        return [
            _box("person", float(wt), box, scale)
            for box, wt in zip(boxes, weights, strict=False)
            if float(wt) >= self.person_min_score
        ]

    def _require(self) -> Any:
        if self._cv2 is None:
            raise BackendError("the detector is not loaded")
        return self._cv2


def _box(label: str, raw: float, box: Any, scale: float) -> Detection:
    x, y, w, h = (round(float(v) / scale) for v in box)
    return Detection(label=label, score=round(_squash(raw), 4), x=x, y=y, w=w, h=h)
