#!/usr/bin/env python3
"""A fake OpenAI Responses API for driving the real Codex adapters offline in tests.

The script rides in the user's prompt, so the server keeps no state between requests:

    SCRIPT {"steps": [{"shell": "echo hi > x"}, {"patch": "*** Begin Patch\\n..."}], "final": "done"}

With k tool outputs in the request's input after the last SCRIPT message, the server answers with
step k as a tool call; once the steps run out it answers with the final text. A step is one of

    {"shell": "COMMAND"}          the shell tool Codex offers, in that tool's own argument shape
                                  (`shell`: argv ["bash", "-lc", COMMAND]; `shell_command`: the
                                  string; `exec_command`: {"cmd": COMMAND}); with
                                  "escalate": true it asks to run outside Codex's sandbox
    {"patch": "*** Begin Patch..."}  `apply_patch`, as a custom (freeform) tool call when Codex
                                  offers it that way, else as a function call {"input": PATCH}
    {"tool": NAME, "arguments": {...}}  any function tool, verbatim
    {"text": "..."}               a text answer in the middle of the steps (ends the model turn)

When Codex offers only its code mode (Codex 0.16x: one custom tool `exec` taking JavaScript, the
other tools nested in it, listed in an `additional_tools` input item), a step becomes an `exec`
call of the nested tool (`await tools.exec_command({...})`, `await tools.apply_patch("...")`).

"{CWD}" anywhere in a step is replaced by the working directory Codex states in its environment
context (`<cwd>...</cwd>`). Requests without tools or without a SCRIPT (titles, probes) get a
short text. Every request is appended to the log file (one JSON line: path, the offered tool
names, the answer) so a test can assert what the model was asked and what it answered. Answers
stream as Server-Sent Events the way the Responses API does (`response.created`, text deltas,
`response.output_item.done`, `response.completed`). Listens on 127.0.0.1 only; prints the port
as its first line.

The same server answers OpenAI-compatible Chat Completions (`POST .../chat/completions`, what
Qwen Code calls): with k `tool` messages after the last user message carrying a SCRIPT, step k
is answered as a tool call; a step there is {"tool": NAME, "args": {...}} (a function call of
any tool the request offers, verbatim) or {"text": "..."}. "{CWD}" is the directory the
request's messages name after "working in the directory:" (Qwen Code) or "Working directory:"
(OpenCode).
Streamed as `chat.completion.chunk` Server-Sent Events ending in `data: [DONE]`.

Usage: fake_openai.py LOGFILE
"""

import json
import re
import uuid

from fake_http import JsonHandler, last_script, serve, substitute

SHELL_TOOLS = ("shell_command", "shell", "exec_command", "local_shell")
OUTPUT_TYPES = ("function_call_output", "custom_tool_call_output", "local_shell_call_output")


def item_texts(item):
    content = item.get("content")
    if isinstance(content, str):
        return [content]
    out = []
    for part in content or []:
        if isinstance(part, dict) and isinstance(part.get("text"), str):
            out.append(part["text"])
    return out


def find_script(items):
    """(index of the last SCRIPT user message, the script) or (None, None)."""
    return last_script(
        (i, item_texts(item))
        for i, item in enumerate(items)
        if isinstance(item, dict) and item.get("role") == "user"
    )


def working_directory(body):
    blob = json.dumps(body.get("input") or []) + json.dumps(body.get("instructions") or "")
    m = re.search(r"<cwd>([^<]+)</cwd>", blob)
    return m.group(1) if m else ""


def offered_tools(body):
    """name -> type ("function", "custom", "local_shell", ...): the request's `tools`, and
    those of `additional_tools` input items (Codex 0.16x), namespaces flattened."""
    out = {}

    def add(tools):
        for t in tools or []:
            if not isinstance(t, dict):
                continue
            if t.get("type") == "namespace":
                add(t.get("tools"))
                continue
            name = t.get("name") or (t.get("function") or {}).get("name") or t.get("type")
            out[name] = t.get("type", "function")

    add(body.get("tools"))
    for item in body.get("input") or []:
        if isinstance(item, dict) and item.get("type") == "additional_tools":
            add(item.get("tools"))
    return out


def code_mode_source(step):
    """The JavaScript of Codex's code mode (`exec`, one custom tool calling the nested ones)."""
    if "shell" in step:
        args = {"cmd": step["shell"]}
        if step.get("workdir"):
            args["workdir"] = step["workdir"]
        if step.get("escalate"):
            args["sandbox_permissions"] = "require_escalated"
            args["justification"] = "the script says so"
        return "const r = await tools.exec_command(%s);\ntext(JSON.stringify(r));\n" % json.dumps(args)
    if "patch" in step:
        return "const r = await tools.apply_patch(%s);\ntext(JSON.stringify(r));\n" % json.dumps(step["patch"])
    return "const r = await tools.%s(%s);\ntext(JSON.stringify(r));\n" % (
        step.get("tool", "unknown"), json.dumps(step.get("arguments") or {}))


def call_item(step, offered, k):
    """The output item for one tool step."""
    call_id = "call_fake_%d_%s" % (k, uuid.uuid4().hex[:8])
    if offered.get("exec") == "custom" and not ({"exec_command", "shell", "shell_command"} & set(offered)):
        return {"type": "custom_tool_call", "id": "ctc_" + call_id, "call_id": call_id,
                "name": "exec", "input": code_mode_source(step)}
    if "shell" in step:
        cmd = step["shell"]
        name = next((n for n in SHELL_TOOLS if n in offered), "shell")
        if name == "local_shell":
            return {"type": "local_shell_call", "id": "lsh_" + call_id, "call_id": call_id,
                    "status": "completed",
                    "action": {"type": "exec", "command": ["bash", "-lc", cmd]}}
        if name == "shell":
            args = {"command": ["bash", "-lc", cmd]}
        elif name == "exec_command":
            args = {"cmd": cmd}
        else:
            args = {"command": cmd}
        if step.get("workdir"):
            args["workdir"] = step["workdir"]
        if step.get("escalate") and name in ("exec_command", "shell_command"):
            args["sandbox_permissions"] = "require_escalated"
            args["justification"] = "the script says so"
        return {"type": "function_call", "id": "fc_" + call_id, "call_id": call_id,
                "name": name, "arguments": json.dumps(args)}
    if "patch" in step:
        patch = step["patch"]
        if offered.get("apply_patch") == "custom":
            return {"type": "custom_tool_call", "id": "ctc_" + call_id, "call_id": call_id,
                    "name": "apply_patch", "input": patch}
        return {"type": "function_call", "id": "fc_" + call_id, "call_id": call_id,
                "name": "apply_patch", "arguments": json.dumps({"input": patch})}
    return {"type": "function_call", "id": "fc_" + call_id, "call_id": call_id,
            "name": step.get("tool", "unknown"), "arguments": json.dumps(step.get("arguments") or {})}


def text_item(text):
    return {"type": "message", "role": "assistant", "id": "msg_fake_" + uuid.uuid4().hex[:12],
            "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}


def answer_for(body):
    """The output items of the model's answer."""
    items = body.get("input") or []
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    offered = offered_tools(body)
    at, script = find_script(items)
    if at is None or not offered:
        return [text_item("ok")]
    k = sum(1 for it in items[at + 1:] if isinstance(it, dict) and it.get("type") in OUTPUT_TYPES)
    # Text steps end a model turn without a tool output: count the assistant texts too.
    k += sum(1 for it in items[at + 1:]
             if isinstance(it, dict) and it.get("type") == "message" and it.get("role") == "assistant")
    steps = script.get("steps") or []
    if k < len(steps):
        step = substitute(steps[k], working_directory(body) or script.get("cwd", ""))
        if "text" in step:
            return [text_item(step["text"])]
        return [call_item(step, offered, k)]
    return [text_item(script.get("final", "done"))]


def chat_texts(message):
    content = message.get("content")
    if isinstance(content, str):
        return [content]
    return [p["text"] for p in content or [] if isinstance(p, dict) and isinstance(p.get("text"), str)]


def chat_working_directory(messages):
    for m in messages:
        for t in chat_texts(m):
            found = re.search(r"(?:working in the directory:?|Working directory:)\s*(/[^\s`'\"<>]+)", t)
            if found:
                return found.group(1).rstrip(".,:;)")
    return ""


def chat_tools(body):
    return sorted((t.get("function") or {}).get("name") or t.get("name") or "?"
                  for t in body.get("tools") or [] if isinstance(t, dict))


def chat_answer(body):
    """The assistant message: {"content": text} or {"tool_calls": [...]}."""
    messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
    at, script = None, None
    for i, m in enumerate(messages):
        if m.get("role") != "user":
            continue
        for t in chat_texts(m):
            k = t.find("SCRIPT ")
            if k < 0:
                continue
            try:
                found, _ = json.JSONDecoder().raw_decode(t[k + len("SCRIPT "):])
            except ValueError:
                continue
            if isinstance(found, dict):
                at, script = i, found
    if at is None or not body.get("tools"):
        return {"content": "ok"}
    rest = messages[at + 1:]
    k = sum(1 for m in rest if m.get("role") == "tool")
    k += sum(1 for m in rest if m.get("role") == "assistant" and not m.get("tool_calls"))
    steps = script.get("steps") or []
    if k >= len(steps):
        return {"content": script.get("final", "done")}
    step = substitute(steps[k], chat_working_directory(messages) or script.get("cwd", ""))
    if "text" in step:
        return {"content": step["text"]}
    call_id = "call_fake_%d_%s" % (k, uuid.uuid4().hex[:8])
    return {"tool_calls": [{"id": call_id, "type": "function", "function": {
        "name": step.get("tool", "unknown"), "arguments": json.dumps(step.get("args") or {})}}]}


class Handler(JsonHandler):

    def chat_completions(self, path, body):
        answer = chat_answer(body)
        self.record({"method": "POST", "path": path, "model": body.get("model"),
                     "tools": chat_tools(body),
                     "cwd": chat_working_directory(body.get("messages") or []),
                     "messages": body.get("messages"), "answer": answer})
        chat_id = "chatcmpl-fake-" + uuid.uuid4().hex[:12]
        finish = "tool_calls" if "tool_calls" in answer else "stop"
        usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        if not body.get("stream"):
            message = {"role": "assistant", "content": answer.get("content")}
            if "tool_calls" in answer:
                message["tool_calls"] = answer["tool_calls"]
            self.send_json(200, {"id": chat_id, "object": "chat.completion", "created": 0,
                                 "model": body.get("model"), "usage": usage,
                                 "choices": [{"index": 0, "message": message,
                                              "finish_reason": finish}]})
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()

        def chunk(delta, finish_reason=None, with_usage=False):
            data = {"id": chat_id, "object": "chat.completion.chunk", "created": 0,
                    "model": body.get("model"),
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]}
            if with_usage:
                data["usage"] = usage
            self.wfile.write(("data: %s\n\n" % json.dumps(data)).encode())

        chunk({"role": "assistant", "content": ""})
        if "tool_calls" in answer:
            calls = [dict(c, index=i) for i, c in enumerate(answer["tool_calls"])]
            chunk({"tool_calls": calls})
        else:
            chunk({"content": answer["content"]})
        chunk({}, finish, with_usage=True)
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()


    def do_GET(self):
        path = self.path.split("?", 1)[0]
        self.record({"method": "GET", "path": path})
        if path.endswith("/models"):
            self.send_json(200, {"object": "list", "data": [], "models": []})
            return
        self.send_json(404, {"error": {"type": "not_found", "message": path}})

    def do_HEAD(self):
        self.send_response(404)
        self.end_headers()

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if self.headers.get("Content-Encoding") == "zstd":
            self.record({"method": "POST", "path": self.path, "error": "zstd body"})
            self.send_json(415, {"error": {"type": "invalid_request_error",
                                           "message": "compressed bodies are not supported"}})
            return
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = {}
        path = self.path.split("?", 1)[0]
        if path.endswith("/chat/completions"):
            self.chat_completions(path, body)
            return
        if not path.endswith("/responses"):
            self.record({"method": "POST", "path": path})
            self.send_json(404, {"error": {"type": "not_found", "message": path}})
            return
        output = answer_for(body)
        self.record({"method": "POST", "path": path, "model": body.get("model"),
                     "tools": sorted(offered_tools(body)), "input": body.get("input"),
                     "answer": output})
        resp_id = "resp_fake_" + uuid.uuid4().hex[:12]
        usage = {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 0},
                 "output_tokens": 5, "output_tokens_details": {"reasoning_tokens": 0},
                 "total_tokens": 15}
        if not body.get("stream"):
            self.send_json(200, {"id": resp_id, "object": "response", "status": "completed",
                                 "model": body.get("model"), "output": output, "usage": usage})
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()

        def event(data):
            self.wfile.write(("event: %s\ndata: %s\n\n" % (data["type"], json.dumps(data))).encode())

        event({"type": "response.created",
               "response": {"id": resp_id, "object": "response", "status": "in_progress"}})
        for i, item in enumerate(output):
            event({"type": "response.output_item.added", "output_index": i,
                   "item": dict(item, content=[]) if item["type"] == "message" else item})
            if item["type"] == "message":
                for part in item["content"]:
                    event({"type": "response.output_text.delta", "output_index": i,
                           "item_id": item["id"], "content_index": 0, "delta": part["text"]})
            event({"type": "response.output_item.done", "output_index": i, "item": item})
        event({"type": "response.completed",
               "response": {"id": resp_id, "object": "response", "status": "completed",
                            "output": output, "usage": usage}})
        self.wfile.flush()


def main():
    serve(Handler, "fake_openai.py")


if __name__ == "__main__":
    main()
