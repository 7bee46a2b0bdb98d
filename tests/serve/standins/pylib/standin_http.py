"""A tiny stand-in for a model server's HTTP side, shared by the vLLM and SGLang stand-ins.

Only what slurmfm relies on: ``GET /health`` (200 once "loaded", or 503 for ever with
``fail_health``) and ``GET /v1/models`` (the OpenAI-compatible model list both servers offer).
The stand-ins exist because there are no GPUs here; they are started by the job exactly as the
real servers are, so the launch line, node ranks, rendezvous and readiness logic run for real.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def serve(host: str, port: int, model: str, *, fail_health: bool, delay: float, info: dict) -> None:
    """Serve until SIGTERM; /health turns 200 after ``delay`` seconds unless ``fail_health``."""
    started = time.monotonic()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/health":
                ok = not fail_health and time.monotonic() - started >= delay
                self._send(200 if ok else 503, {"ok": ok})
            elif self.path == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": model, "object": "model"}]})
            elif self.path == "/standin/info":
                self._send(200, info)
            else:
                self._send(404, {"error": self.path})

        def _send(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, fmt: str, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer((host, port), Handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(f"standin: serving {model} on {host}:{port} (pid {os.getpid()})", flush=True)
    try:
        httpd.serve_forever(poll_interval=0.2)
    finally:
        httpd.server_close()
