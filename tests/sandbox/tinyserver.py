"""A tiny container for the node agent's tests, given through the image table: binds `--host`/`--port`, answers
`GET /health` (200, or 500 once the file named by $TINY_FAIL_FILE exists), `GET /env` (its environment as JSON)
and `GET /argv`, and answers `/v1/*` with 200 or, when $TINY_STATUS says, that status. It waits $TINY_DELAY_S
before it listens (a model's load)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, default=8000)
    args, _ = parser.parse_known_args()
    time.sleep(float(os.environ.get("TINY_DELAY_S", "0")))

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *_: object) -> None:
            pass

        def _answer(self, status: int, body: object) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            fail = os.environ.get("TINY_FAIL_FILE")
            if self.path == "/health":
                self._answer(500 if fail and Path(fail).exists() else 200, {})
            elif self.path == "/env":
                self._answer(200, dict(os.environ))
            elif self.path == "/argv":
                self._answer(200, sys.argv)
            else:
                self._answer(int(os.environ.get("TINY_STATUS", "200")), {"pod": os.environ.get("POD_NAME", "")})

        do_POST = do_GET

    ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
