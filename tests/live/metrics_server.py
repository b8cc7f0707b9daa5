"""A tiny HTTP server on 127.0.0.1 serving fixed bodies by path (for fetch and page tests); stopped by the test."""

import http.server
import threading
import time


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        routes = self.server.routes
        if self.path == "/slow":
            time.sleep(2)
        if self.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", "http://10.255.255.1/metrics")
            self.end_headers()
            return
        body = routes.get(self.path)
        if body is None:
            self.send_error(404, "no such path")
            return
        data = body.encode() if isinstance(body, str) else body
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


class MetricsServer:
    """`routes` maps a path to the body served there (mutable while running)."""

    def __init__(self, routes: dict[str, str | bytes]):
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.httpd.routes = routes
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str = "/metrics") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
