"""Face (Haar) and person (HOG) detection on real photographs from scikit-image."""

from __future__ import annotations

from typing import Any

import pytest

from accelmux.errors import RequestError
from accelmux.models import OpenCvDetector

from .support import SKIMAGE, need

pytestmark = pytest.mark.real


def _jpeg(rgb: Any) -> bytes:
    import cv2

    ok, data = cv2.imencode(".jpg", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
    assert ok
    return bytes(data.tobytes())


def test_face_in_the_astronaut_photograph(detector: OpenCvDetector) -> None:
    need(SKIMAGE)
    import skimage.data

    faces = detector.detect(_jpeg(skimage.data.astronaut()), labels=["face"])
    assert len(faces) == 1
    face = faces[0]
    # Eileen Collins' face spans about x 175-270, y 65-160 in the 512 x 512 picture
    assert 190 < face.x + face.w / 2 < 260
    assert 80 < face.y + face.h / 2 < 150
    assert 70 < face.w < 130
    assert 0.5 < face.score < 1.0
    assert face.to_dict() == {
        "label": "face",
        "score": face.score,
        "x": face.x,
        "y": face.y,
        "w": face.w,
        "h": face.h,
    }


def test_person_in_the_cameraman_photograph(detector: OpenCvDetector) -> None:
    need(SKIMAGE)
    import cv2
    import skimage.data

    # HOG's window is 64 x 128 with a margin: shrink the picture and give it a border
    gray = cv2.resize(skimage.data.camera(), None, fx=0.4, fy=0.4, interpolation=cv2.INTER_AREA)
    framed = cv2.copyMakeBorder(gray, 64, 64, 64, 64, cv2.BORDER_REPLICATE)
    ok, png = cv2.imencode(".png", framed)
    assert ok
    people = detector.detect(bytes(png.tobytes()), labels=["person"])
    assert people, "no person found"
    best = people[0]
    # the cameraman stands in the left half, head near the top, legs to the bottom
    assert 40 < best.x + best.w / 2 < 160
    assert 150 < best.y + best.h / 2 < 260
    assert best.h > 150


def test_no_face_in_a_cup_of_coffee(detector: OpenCvDetector) -> None:
    need(SKIMAGE)
    import skimage.data

    assert detector.detect(_jpeg(skimage.data.coffee()), labels=["face"]) == []


def test_large_images_are_scaled_and_boxes_mapped_back(detector: OpenCvDetector) -> None:
    need(SKIMAGE)
    import cv2
    import skimage.data

    big = cv2.resize(skimage.data.astronaut(), (1536, 1536), interpolation=cv2.INTER_CUBIC)
    best = detector.detect(_jpeg(big), labels=["face"])[0]  # sorted by score
    assert 570 < best.x + best.w / 2 < 780  # 3 x the position in the 512-pixel picture
    assert 240 < best.y + best.h / 2 < 450
    assert 210 < best.w < 390


@pytest.mark.parametrize(
    "bad", [b"", b"garbage", b"\xff\xd8\xff\xe0" + b"\0" * 100, b"\x89PNG\r\n\x1a\n" + b"x" * 50]
)
def test_malformed_image_is_a_request_error(detector: OpenCvDetector, bad: bytes) -> None:
    with pytest.raises(RequestError, match="image") as err:
        detector.detect(bad)
    assert err.value.field == "image"


def test_unknown_label_is_a_request_error(detector: OpenCvDetector) -> None:
    need(SKIMAGE)
    import skimage.data

    with pytest.raises(RequestError, match="unknown labels"):
        detector.detect(_jpeg(skimage.data.coffee()), labels=["cat"])
