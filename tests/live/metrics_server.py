"""A tiny HTTP server on 127.0.0.1 serving fixed bodies by path (for fetch and page tests); stopped by the test."""

import http.server
import threading
import time


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.server.hits += 1
        self.server.host_headers.append(self.headers.get("Host"))
        routes = self.server.routes
        if self.path == "/slow":
            time.sleep(2)
        if self.path == "/secret-error":
            body = b"the admin password is hunter2"
            self.send_response(500, "hunter2 reason")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
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
        self.httpd.hits = 0  # GET requests answered: a refused address must leave it at 0
        self.httpd.host_headers = []  # the Host header of each request
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def hits(self) -> int:
        return self.httpd.hits

    @property
    def host_headers(self) -> list[str]:
        return self.httpd.host_headers

    def url(self, path: str = "/metrics") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
