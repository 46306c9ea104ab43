#!/usr/bin/env python3
"""A fake Anthropic Messages API for driving a real Claude Code adapter offline in tests.

The script rides in the user's prompt, so the server keeps no state between requests:

    SCRIPT {"steps": [{"tool": ["mcp__acp__Write", "Write"], "input": {...}}, ...], "final": "done"}

With k tool results in the conversation after the (last) SCRIPT message, the server answers with step k
as a tool_use (the first of its tool names the request offers); once the steps run out it answers
with the final text. "{CWD}" in an input is replaced by the working directory Claude Code states
in its system prompt (or, Claude Agent SDK 0.3, its first user message). Requests without tools or without a SCRIPT (titles, probes) get a short
text. Every request is appended to the log file (one JSON line) so a test can see what the model
was asked. Listens on 127.0.0.1 only; prints the port as its first line.

Usage: fake_anthropic.py LOGFILE
"""

import json
import re
import uuid

from fake_http import JsonHandler, last_script, serve, substitute



def texts(content):
    if isinstance(content, str):
        return [content]
    out = []
    for block in content or []:
        if isinstance(block, dict) and block.get("type") == "text":
            out.append(block.get("text", ""))
    return out


def find_script(messages):
    """(index of the last SCRIPT message, the script) or (None, None)."""
    return last_script(
        (i, texts(m.get("content"))) for i, m in enumerate(messages) if m.get("role") == "user"
    )


def tool_results_after(messages, start):
    n = 0
    for m in messages[start + 1:]:
        content = m.get("content")
        if isinstance(content, list):
            n += sum(1 for b in content if isinstance(b, dict) and b.get("type") == "tool_result")
    return n


def working_directory(body):
    system = body.get("system")
    blob = system if isinstance(system, str) else json.dumps(system or "")
    # Claude Agent SDK 0.3 states it in the first user message instead.
    blob += json.dumps(body.get("messages") or [])
    # "Working directory: /x" (Claude Code 1.x), "Primary working directory: /x" (2.x).
    m = re.search(r"[Ww]orking directory: ([^\s\\\"]+)", blob)
    return m.group(1) if m else ""


def answer_for(body):
    """The content blocks and stop reason of the model's answer."""
    messages = body.get("messages") or []
    offered = [t.get("name") for t in body.get("tools") or [] if isinstance(t, dict)]
    at, script = find_script(messages)
    if at is None or not offered:
        return [{"type": "text", "text": "ok"}], "end_turn"
    k = tool_results_after(messages, at)
    steps = script.get("steps") or []
    if k < len(steps):
        step = steps[k]
        names = step.get("tool")
        names = [names] if isinstance(names, str) else names or []
        name = next((n for n in names if n in offered), names[0] if names else "unknown")
        cwd = working_directory(body) or script.get("cwd", "")
        block = {
            "type": "tool_use",
            "id": "toolu_fake_%d_%s" % (k, uuid.uuid4().hex[:8]),
            "name": name,
            "input": substitute(step.get("input") or {}, cwd),
        }
        return [block], "tool_use"
    return [{"type": "text", "text": script.get("final", "done")}], "end_turn"


class Handler(JsonHandler):

    def do_GET(self):
        self.record({"method": "GET", "path": self.path})
        self.send_json(404, {"type": "error", "error": {"type": "not_found_error", "message": "no"}})

    def do_HEAD(self):
        self.send_response(404)
        self.end_headers()

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = {}
        path = self.path.split("?", 1)[0]
        if path == "/v1/messages/count_tokens":
            self.record({"method": "POST", "path": path})
            self.send_json(200, {"input_tokens": 10})
            return
        if path != "/v1/messages":
            self.record({"method": "POST", "path": path})
            self.send_json(404, {"type": "error", "error": {"type": "not_found_error", "message": path}})
            return
        content, stop = answer_for(body)
        self.record({"method": "POST", "path": path, "cwd": working_directory(body),
                     "answer": content, "stop": stop})
        model = body.get("model", "claude-fake")
        msg_id = "msg_fake_" + uuid.uuid4().hex[:12]
        if not body.get("stream"):
            self.send_json(200, {
                "id": msg_id, "type": "message", "role": "assistant", "model": model,
                "content": content, "stop_reason": stop, "stop_sequence": None,
                "usage": {"input_tokens": 10, "output_tokens": 5},
            })
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()

        def event(name, data):
            self.wfile.write(("event: %s\ndata: %s\n\n" % (name, json.dumps(data))).encode())

        event("message_start", {"type": "message_start", "message": {
            "id": msg_id, "type": "message", "role": "assistant", "model": model, "content": [],
            "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": 10, "output_tokens": 1}}})
        for i, block in enumerate(content):
            if block["type"] == "text":
                event("content_block_start", {"type": "content_block_start", "index": i,
                                              "content_block": {"type": "text", "text": ""}})
                event("content_block_delta", {"type": "content_block_delta", "index": i,
                                              "delta": {"type": "text_delta", "text": block["text"]}})
            else:
                start = dict(block, input={})
                event("content_block_start", {"type": "content_block_start", "index": i,
                                              "content_block": start})
                event("content_block_delta", {"type": "content_block_delta", "index": i,
                                              "delta": {"type": "input_json_delta",
                                                        "partial_json": json.dumps(block["input"])}})
            event("content_block_stop", {"type": "content_block_stop", "index": i})
        event("message_delta", {"type": "message_delta",
                                "delta": {"stop_reason": stop, "stop_sequence": None},
                                "usage": {"output_tokens": 5}})
        event("message_stop", {"type": "message_stop"})
        self.wfile.flush()


def main():
    serve(Handler, "fake_anthropic.py")


if __name__ == "__main__":
    main()
