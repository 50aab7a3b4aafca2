"""Hide secrets in text that leaves the daemon (HTTP answers, status, logs, dashboard).

Four shapes are masked with ``***``:

* URL credentials: ``rtsp://user:password@host/`` -> ``rtsp://***@host/``;
* query-string secrets: ``?password=x``, ``&token=x``, ``api_key=x`` (any parameter whose
  name holds a secret word);
* assignments and options whose name holds a secret word: ``HF_TOKEN=x``,
  ``"api_key": "x"``, ``--api-key x``, ``--password=x``;
* bearer tokens: ``Authorization: Bearer x``.

The secret words are ``token``, ``key``, ``secret``, ``password``/``passwd``/``pwd``,
``credential`` and ``auth``. Masking errs on the side of hiding: ``MONKEY=1`` is masked too.
"""

from __future__ import annotations

import re

MASK = "***"

_WORD = r"(?:token(?!s)|key|secret|passw(?:or)?d|pwd|credential|auth)"
_URL_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)[^/@\s?#]+@")
_BEARER = re.compile(r"(?P<head>\bbearer\s+)\S+", re.IGNORECASE)
_OPTION = re.compile(
    r"(?P<head>(?<![\w-])--?[\w-]*" + _WORD + r"[\w-]*(?:=|\s+))(?P<value>[^\s\"'&]+)",
    re.IGNORECASE,
)
_ASSIGNMENT = re.compile(
    r"(?P<head>[\w.-]*" + _WORD + r"[\w.-]*[\"']?\s*[=:]\s*[\"']?)(?P<value>[^\s\"'&,;}]+)",
    re.IGNORECASE,
)


def redact(text: str) -> str:
    """``text`` with every secret of the shapes above replaced by ``***``."""
    if not text:
        return text
    out = _URL_USERINFO.sub(lambda m: m["scheme"] + MASK + "@", text)
    out = _BEARER.sub(lambda m: m["head"] + MASK, out)
    out = _OPTION.sub(lambda m: m["head"] + MASK, out)
    return _ASSIGNMENT.sub(lambda m: m["head"] + MASK, out)
