"""A stand-in external server for the argv test: writes the argv it received (as JSON) to
the file named by its first argument, then answers /health on the port of its second, for
at most 60 seconds."""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer


class Health(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, format: str, *args: object) -> None:
        return


def main() -> None:
    out, port = sys.argv[1], int(sys.argv[2])
    with open(out, "w") as fh:
        json.dump(sys.argv[3:], fh)
    server = HTTPServer(("127.0.0.1", port), Health)
    threading.Timer(60, server.shutdown).start()  # bounded: ends by itself
    server.serve_forever()


if __name__ == "__main__":
    main()
