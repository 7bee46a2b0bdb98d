"""A tiny stand-in for a model server's HTTP side, shared by the vLLM and SGLang stand-ins.

Only what slurmfm relies on: ``GET /health`` (200 once "loaded", or 503 for ever with
``fail_health``) and ``GET /v1/models`` (the OpenAI-compatible model list both servers offer),
and a request through a router: ``POST /generate`` (SGLang's native API) and
``/v1/completions`` answer with the server's role and the request they got, which
``GET /standin/requests`` lists (the keys a prefill/decode router adds, ``bootstrap_host``,
``bootstrap_port``, ``bootstrap_room``, show that it sent the request to both servers).
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
    requests: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
            except ValueError:
                self._send(400, {"error": "not JSON"})
                return
            if self.path not in ("/generate", "/v1/completions"):
                self._send(404, {"error": self.path})
                return
            requests.append({"path": self.path, "body": body})
            role = info.get("disaggregation_mode", "null")
            text = f"standin {role} {info.get('node')}"
            if self.path == "/generate":
                meta = {"id": str(body.get("bootstrap_room", "")), "finish_reason": "stop"}
                self._send(200, {"text": text, "meta_info": meta})
            else:
                choice = {"index": 0, "text": text, "finish_reason": "stop"}
                self._send(200, {"object": "text_completion", "model": model, "choices": [choice]})

        def do_GET(self) -> None:
            if self.path == "/health":
                ok = not fail_health and time.monotonic() - started >= delay
                self._send(200 if ok else 503, {"ok": ok})
            elif self.path == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": model, "object": "model"}]})
            elif self.path == "/standin/info":
                self._send(200, info)
            elif self.path == "/standin/requests":
                self._send(200, {"requests": requests})
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
