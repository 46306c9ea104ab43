"""What the fake model servers share: a loopback JSON-over-HTTP server that logs each request as
a JSON line, and the "{CWD}" substitution in scripted tool inputs.

Imported by fake_anthropic.py and fake_openai.py (run as scripts, so this directory is on
sys.path). Listens on 127.0.0.1 only.
"""

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOG_LOCK = threading.Lock()


def substitute(value, cwd):
    """`value` with every "{CWD}" in its strings replaced by `cwd`."""
    if isinstance(value, str):
        return value.replace("{CWD}", cwd)
    if isinstance(value, dict):
        return {k: substitute(v, cwd) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute(v, cwd) for v in value]
    return value


def last_script(user_texts):
    """(index, script) of the last `SCRIPT {json}` among `user_texts`, pairs of (index of a user
    entry, its texts) in order; (None, None) when there is none. Each turn of a conversation may
    bring its own script; every fake reads it the same way, only the API's shape differs."""
    found = (None, None)
    for i, texts in user_texts:
        for t in texts:
            at = t.find("SCRIPT ")
            if at < 0:
                continue
            try:
                script, _ = json.JSONDecoder().raw_decode(t[at + len("SCRIPT "):])
            except ValueError:
                continue
            if isinstance(script, dict):
                found = (i, script)
    return found


class JsonHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"

    def log_message(self, *args):
        pass

    def record(self, entry):
        with LOG_LOCK, open(self.server.log_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")

    def send_json(self, status, obj):
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def serve(handler, name):
    """Serves `handler` on a free loopback port (printed as the first line), logging to argv[1]."""
    if len(sys.argv) != 2:
        sys.exit("usage: %s LOGFILE" % name)
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.log_path = sys.argv[1]
    server.daemon_threads = True
    print(server.server_address[1], flush=True)
    server.serve_forever()
