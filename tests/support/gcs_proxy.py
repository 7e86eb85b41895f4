"""The suite's way into the GCS emulator for TensorFlow's own GCS file system, run as a process of its own.

TensorFlow's file system has no endpoint setting: it speaks HTTPS to www.googleapis.com (JSON API, uploads) and
storage.googleapis.com (downloads). Through libcurl it honours HTTPS_PROXY and CURL_CA_BUNDLE, so the suite points
it at this proxy: each CONNECT to one of those two hosts is answered, its TLS terminated with a certificate of the
suite's test CA, and every request inside it forwarded to the emulator's plain-HTTP port on 127.0.0.1, whose answer
goes back framed by Content-Length. Any other host is refused (403): nothing leaves the machine.

    python gcs_proxy.py EMULATOR_PORT CERT_PEM KEY_PEM PORT_FILE

writes the port it listens on to PORT_FILE once it accepts connections (GCS_PROXY_DEBUG=1 prints each request and
answer to its standard error). It is a process of its own because
TensorFlow holds the GIL in some of its file calls: a proxy thread in the caller's process could wait on it forever.
"""

import http.client
import http.server
import os
import socketserver
import ssl
import sys

GOOGLE_HOSTS = ("www.googleapis.com", "storage.googleapis.com")
HOP_HEADERS = {"connection", "keep-alive", "proxy-connection", "proxy-authorization", "transfer-encoding", "te",
               "upgrade", "trailer"}


class Forwarder(http.server.BaseHTTPRequestHandler):
    """One TLS connection from TensorFlow: its requests, forwarded one by one to the emulator."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # else each answer's second write waits ~40 ms for the client's delayed ACK

    def log_message(self, format, *args):  # the suite's output stays the suite's
        pass

    def _body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            parts = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _forward(self):
        body = self._body()
        if os.environ.get("GCS_PROXY_DEBUG"):
            print(self.command, self.path, dict(self.headers), len(body), file=sys.stderr, flush=True)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_HEADERS}
        if body or self.command in ("POST", "PUT", "PATCH"):
            headers["Content-Length"] = str(len(body))
        upstream = http.client.HTTPConnection("127.0.0.1", self.server.emulator_port, timeout=60)
        try:
            upstream.request(self.command, self.path, body=body, headers=headers)
            answer = upstream.getresponse()
            payload = answer.read()
            if os.environ.get("GCS_PROXY_DEBUG"):
                print(" ->", answer.status, answer.getheaders(), payload[:300], file=sys.stderr, flush=True)
        finally:
            upstream.close()
        self.send_response_only(answer.status, answer.reason)
        for key, value in answer.getheaders():
            if key.lower() in HOP_HEADERS or key.lower() == "content-length":
                continue
            if key.lower() == "location":  # an upload session's address: back through this proxy
                for plain in (f"http://127.0.0.1:{self.server.emulator_port}/",) + tuple(
                        f"http://{host}/" for host in GOOGLE_HOSTS):
                    if value.startswith(plain):
                        value = "https://www.googleapis.com/" + value[len(plain):]
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)
        self.wfile.flush()

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _forward


class Proxy(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def log_message(self, format, *args):
        pass

    def do_CONNECT(self):
        host = self.path.rsplit(":", 1)[0]
        if host not in GOOGLE_HOSTS:
            self.send_error(403, f"the suite's proxy reaches only {', '.join(GOOGLE_HOSTS)}")
            return
        self.send_response(200, "Connection established")
        self.end_headers()
        self.wfile.flush()
        try:
            tls = self.server.tls.wrap_socket(self.connection, server_side=True)
        except (ssl.SSLError, OSError):
            self.close_connection = True
            return
        Forwarder(tls, self.client_address, self.server)
        self.close_connection = True


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True


def main(argv):
    emulator_port, cert, key, port_file = argv[1:5]
    server = Server(("127.0.0.1", 0), Proxy)
    server.emulator_port = int(emulator_port)
    server.tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.tls.load_cert_chain(cert, key)
    tmp = port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(server.server_address[1]))
    os.replace(tmp, port_file)
    server.serve_forever()


if __name__ == "__main__":
    main(sys.argv)
