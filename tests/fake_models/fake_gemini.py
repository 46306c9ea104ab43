#!/usr/bin/env python3
"""A fake Gemini API (`generateContent`, `streamGenerateContent`) for driving the real Gemini CLI
offline in tests.

The script rides in the user's prompt, so the server keeps no state between requests:

    SCRIPT {"steps": [{"tool": "write_file", "args": {"file_path": "{CWD}/x", "content": "hi"}}],
            "final": "done"}

With k function responses in the request's contents after the last SCRIPT message, the server
answers with step k as a function call; once the steps run out it answers with the final text.
A step is one of

    {"tool": NAME, "args": {...}}   a function call of any tool the request offers, verbatim
    {"text": "..."}                 a text answer in the middle of the steps (ends the model turn)

"{CWD}" anywhere in a step is replaced by the first workspace directory Gemini CLI states in its
session context ("- **Workspace Directories:**" then "  - /path"). Requests without a SCRIPT
(titles, probes, next-speaker checks) get a short text, or, when they ask for JSON, an object
that fills every required property of their schema (`"next_speaker": "user"` for Gemini CLI's
own check). Every request is appended to the log file (one JSON line: path, the offered function
names, the working directory found, the answer) so a test can assert what the model was asked
and what it answered. `streamGenerateContent?alt=sse` answers as Server-Sent Events, one
`data:` line per chunk, the way the Gemini API does. Listens on 127.0.0.1 only; prints the port
as its first line.

Usage: fake_gemini.py LOGFILE
"""

import json
import re

from fake_http import JsonHandler, last_script, serve, substitute


def part_texts(content):
    return [p["text"] for p in content.get("parts") or []
            if isinstance(p, dict) and isinstance(p.get("text"), str)]


def find_script(contents):
    """(index of the last user content carrying a SCRIPT, the script) or (None, None)."""
    return last_script(
        (i, part_texts(c))
        for i, c in enumerate(contents)
        if isinstance(c, dict) and c.get("role", "user") == "user"
    )


def working_directory(body):
    blob = json.dumps(body.get("contents") or []) + json.dumps(body.get("systemInstruction") or {})
    m = re.search(r"Workspace Directories:\*\*\\n\s*- ([^\\]+)\\n", blob)
    return m.group(1).strip() if m else ""


def offered_tools(body):
    out = []
    for t in body.get("tools") or []:
        for f in (t or {}).get("functionDeclarations") or []:
            if isinstance(f, dict) and f.get("name"):
                out.append(f["name"])
    return sorted(out)


def json_for(schema):
    """A value for a JSON schema: every required property filled."""
    if not isinstance(schema, dict):
        return "ok"
    t = schema.get("type")
    if isinstance(t, str):
        t = t.lower()
    if t == "object" or "properties" in schema:
        props = schema.get("properties") or {}
        out = {}
        for name in schema.get("required") or list(props):
            if name == "next_speaker":
                out[name] = "user"
            else:
                out[name] = json_for(props.get(name) or {})
        return out
    if t == "array":
        return []
    if t in ("number", "integer"):
        return 0
    if t == "boolean":
        return False
    enum = schema.get("enum")
    if enum:
        return enum[0]
    return "ok"


def answer_for(body):
    """The parts of the model's answer."""
    contents = body.get("contents") or []
    gen = body.get("generationConfig") or {}
    if gen.get("responseMimeType") == "application/json":
        schema = gen.get("responseJsonSchema") or gen.get("responseSchema") or {}
        return [{"text": json.dumps(json_for(schema))}]
    at, script = find_script(contents)
    if at is None or not offered_tools(body):
        return [{"text": "ok"}]
    k = 0
    for c in contents[at + 1:]:
        if not isinstance(c, dict):
            continue
        parts = c.get("parts") or []
        if any(isinstance(p, dict) and "functionResponse" in p for p in parts):
            k += 1
        elif c.get("role") == "model" and parts and all(
                isinstance(p, dict) and "text" in p for p in parts):
            # A text step ended a model turn without a function response.
            k += 1
    steps = script.get("steps") or []
    if k < len(steps):
        step = substitute(steps[k], working_directory(body) or script.get("cwd", ""))
        if "text" in step:
            return [{"text": step["text"]}]
        return [{"functionCall": {"name": step.get("tool", "unknown"),
                                  "args": step.get("args") or {}}}]
    return [{"text": script.get("final", "done")}]


def response(parts, model):
    return {
        "candidates": [{"content": {"role": "model", "parts": parts},
                        "finishReason": "STOP", "index": 0}],
        "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 5,
                          "totalTokenCount": 15},
        "modelVersion": model,
    }


class Handler(JsonHandler):

    def do_GET(self):
        path = self.path.split("?", 1)[0]
        self.record({"method": "GET", "path": path})
        if path.rstrip("/").endswith("/models"):
            self.send_json(200, {"models": []})
            return
        self.send_json(404, {"error": {"code": 404, "message": path, "status": "NOT_FOUND"}})

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = {}
        path = self.path.split("?", 1)[0]
        m = re.search(r"/models/([^/:]+):(\w+)$", path)
        if not m or m.group(2) not in ("generateContent", "streamGenerateContent", "countTokens"):
            self.record({"method": "POST", "path": path})
            self.send_json(404, {"error": {"code": 404, "message": path, "status": "NOT_FOUND"}})
            return
        model, verb = m.group(1), m.group(2)
        if verb == "countTokens":
            self.record({"method": "POST", "path": path})
            self.send_json(200, {"totalTokens": 10})
            return
        parts = answer_for(body)
        self.record({"method": "POST", "path": path, "model": model,
                     "tools": offered_tools(body), "cwd": working_directory(body),
                     "contents": body.get("contents"), "answer": parts})
        if verb == "generateContent":
            self.send_json(200, response(parts, model))
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        self.wfile.write(("data: %s\r\n\r\n" % json.dumps(response(parts, model))).encode())
        self.wfile.flush()


def main():
    serve(Handler, "fake_gemini.py")


if __name__ == "__main__":
    main()
