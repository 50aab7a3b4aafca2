"""The cluster's secret: Ray's authentication token, found where Ray looks for it.

One secret per household: the token Ray's token authentication uses
(``ray get-auth-token --generate`` on the head, then the same file copied to every
machine). Ray checks it on every connection to the cluster; accelmux derives from it the
key a node's LAN listener asks of every request (:func:`listener_key`), so a gateway that
may join the cluster may call the nodes' daemons and nobody else can. The derived key, not
the token, travels in accelmux's requests: seeing it does not give Ray's token.

Found as Ray finds it (no Ray import): ``RAY_AUTH_TOKEN``, else the file
``RAY_AUTH_TOKEN_PATH`` names, else ``~/.ray/auth_token``.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from pathlib import Path

from accelmux.errors import ClusterError

#: The header a gateway sends a node's LAN listener.
KEY_HEADER = "X-Accelmux-Cluster-Key"
NO_TOKEN = (
    "no cluster token on this machine: cluster mode uses Ray's token authentication; "
    "create it once on the head (RAY_AUTH_MODE=token ray get-auth-token --generate) and "
    "copy ~/.ray/auth_token to every machine (docs/cluster.md, step 1)"
)


def token_path() -> Path:
    named = os.environ.get("RAY_AUTH_TOKEN_PATH")
    return Path(named) if named else Path.home() / ".ray" / "auth_token"


def find_token() -> str | None:
    """The cluster's token as Ray would read it on this machine; None when there is none."""
    token = os.environ.get("RAY_AUTH_TOKEN", "").strip()
    if token:
        return token
    try:
        token = token_path().read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return token or None


def require_token() -> str:
    token = find_token()
    if token is None:
        raise ClusterError(NO_TOKEN)
    return token


def listener_key(token: str) -> str:
    """The key a node's LAN listener accepts, derived from the cluster's token."""
    return hmac.new(token.encode(), b"accelmux node listener v1", hashlib.sha256).hexdigest()


def key_matches(sent: str | None, key: str) -> bool:
    return sent is not None and hmac.compare_digest(sent.encode(), key.encode())
