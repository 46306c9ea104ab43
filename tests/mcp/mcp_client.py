"""The official Python MCP client (`mcp` 2.3.0) against warden's MCP front.

    mcp_client.py http  URL TOKEN MODE WORKSPACE   # MODE: legacy (2025-11-25 session) | 2026-07-28
    mcp_client.py stdio WARDEN STATE MODE DEPTH|- [WORKSPACE]  # `warden mcp` as a stdio server

Prints one `ok ...` line per check and exits non-zero (with the reason) on the first failure.
Driven by tests/tests/mcp_python.rs, which starts the real daemons.
"""

import asyncio
import json
import os
import sys

import httpx2
from mcp import Client, types
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

VERBS = {"advise", "review", "implement"}
TOOLS = VERBS | {"implement_background", "job_status", "job_result", "job_cancel", "bind_workspace", "status"}


def scenario(steps):
    return "Please.\n```json\n" + json.dumps({"steps": steps}) + "\n```\n"


def decision(status, verdict):
    return {"type": "message", "text": "Done. " + json.dumps(
        {"status": status, "verdict": verdict, "findings": ["f"], "files_touched": [], "remaining": [], "blockers": []})}


def check(cond, what, detail=""):
    if not cond:
        raise SystemExit(f"FAIL {what}: {detail}")
    print(f"ok   {what}", flush=True)


class Human:
    """The elicitation callback: what the person at the host answers."""

    def __init__(self):
        self.bind_answer = "accept"
        self.asked = []

    async def __call__(self, context, params):
        message = params.message
        self.asked.append(message)
        if message.startswith("The supervised agent asks"):
            return types.ElicitResult(action="accept", content={"answer": "notes.txt"})
        if self.bind_answer == "accept":
            props = params.requested_schema.get("properties", {})
            content = {"confirm": True}
            if "path" in props:
                content["path"] = props["path"]["enum"][0]
            return types.ElicitResult(action="accept", content=content)
        return types.ElicitResult(action="decline")


def structured(result):
    sc = result.structured_content
    if sc is None:
        raise SystemExit(f"FAIL no structuredContent: {result}")
    return sc


async def common(c, label, human, stateless):
    tools = {t.name: t for t in (await c.list_tools()).tools}
    check(set(tools) == TOOLS, f"{label} tools/list has the inventory", sorted(tools))
    for v in VERBS:
        t = tools[v]
        check(t.output_schema is not None and t.input_schema.get("additionalProperties") is False,
              f"{label} {v} publishes input and output schemas")
    progress = []

    async def on_progress(p, total, message):
        progress.append(message)

    r = await c.call_tool("advise", {"task": scenario([decision("complete", "fine")])}, progress_callback=on_progress)
    e = structured(r)
    check(e["status"] == "complete" and e["verdict"] == "fine" and not r.is_error, f"{label} advise", e)
    check(len(progress) >= 1, f"{label} progress notifications from the turn's events", progress)
    r = await c.call_tool("implement", {"task": "x", "workspace": "/etc"})
    e = structured(r)
    check(r.is_error and e["status"] == "refused" and e["blockers"][0]["rule"] == "mcp.argument.forbidden",
          f"{label} a model-supplied workspace is refused", e)
    # The agent's question goes to the caller as elicitation: a server request on a session,
    # an input-required result statelessly (the client retries with the answer).
    before = len(human.asked)
    r = await c.call_tool("advise", {"task": scenario([
        {"type": "question", "message": "Which file?", "schema": {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}},
        {"type": "message", "text": "Thanks"}])})
    e = structured(r)
    check(len(human.asked) == before + 1 and "Which file?" in human.asked[-1], f"{label} the agent's question reached the caller", human.asked)
    check("notes.txt" in e["verdict"] and not e["blockers"], f"{label} the answer reached the agent", e)


async def binding(c, label, human, workspace):
    human.bind_answer = "accept"
    r = await c.call_tool("bind_workspace", {"proposed_path": workspace})
    s = structured(r)
    check(s["bound"] is True and s["binding"]["path"] == os.path.realpath(workspace), f"{label} bind accepted", s)
    check("PROPOSED" in human.asked[-1] and os.path.realpath(workspace) in human.asked[-1],
          f"{label} the form shows the exact canonical path and says it was proposed", human.asked[-1])
    st = structured(await c.call_tool("status", {}))
    check(st["workspace"] == os.path.realpath(workspace) and st["workspace_fingerprint"], f"{label} status shows the binding", st)
    r = await c.call_tool("advise", {"task": scenario([decision("complete", "in the workspace")])})
    check(structured(r)["status"] == "complete", f"{label} a verb runs in the bound workspace", structured(r))
    # Another directory now stands at the bound path: the binding is void, nothing runs there.
    moved = workspace.rstrip("/") + ".moved"
    os.rename(workspace, moved)
    os.mkdir(workspace)
    try:
        r = await c.call_tool("advise", {"task": "hi"})
        e = structured(r)
        check(r.is_error and e["status"] == "refused" and e["blockers"][0]["rule"] == "mcp.binding.void",
              f"{label} a binding is void once the path names another directory", e)
        st = structured(await c.call_tool("status", {}))
        check(st["binding"] is None, f"{label} the void binding is cleared", st)
    finally:
        os.rmdir(workspace)
        os.rename(moved, workspace)
    human.bind_answer = "decline"
    r = await c.call_tool("bind_workspace", {"proposed_path": workspace})
    s = structured(r)
    check(s["bound"] is False and r.is_error, f"{label} bind declined", s)
    st = structured(await c.call_tool("status", {}))
    check(st["binding"] is None and st["workspace"] is None, f"{label} rebinding cleared the previous binding", st)
    asked = len(human.asked)
    r = await c.call_tool("bind_workspace", {"proposed_path": "/"})
    s = structured(r)
    check(s["bound"] is False and "root" in s["message"] and len(human.asked) == asked,
          f"{label} a proposed / is refused without asking", s)
    r = await c.call_tool("bind_workspace", {"proposed_path": os.path.expanduser("~")})
    check(structured(r)["bound"] is False, f"{label} a home directory is refused", structured(r))
    r = await c.call_tool("bind_workspace", {"proposed_path": os.path.expanduser("~/.claude")})
    check(structured(r)["bound"] is False, f"{label} an agent configuration home is refused", structured(r))
    r = await c.call_tool("bind_workspace", {"proposed_path": "/etc/../" + workspace.lstrip("/") + "x"})
    check(structured(r)["bound"] is False and "not a workspace the operator allowed" in structured(r)["message"],
          f"{label} a path the operator did not allow is refused", structured(r))
    # No proposal: the human chooses among the operator's workspaces, then confirms.
    human.bind_answer = "accept"
    r = await c.call_tool("bind_workspace", {})
    s = structured(r)
    check(s["bound"] is True and s["binding"]["path"] == os.path.realpath(workspace) and "PROPOSED" not in human.asked[-1],
          f"{label} bind by choosing among the allowed workspaces", s)
    r = await c.call_tool("bind_workspace", {"proposed_path": workspace, "workspace": "/"})
    check(structured(r)["bound"] is False and structured(await c.call_tool("status", {}))["binding"] is None,
          f"{label} a bind with a forbidden argument is refused and clears the binding", structured(r))


async def http(url, token, mode, workspace):
    human = Human()
    hc = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(60, read=120))
    async with Client(streamable_http_client(url, http_client=hc), mode=mode, elicitation_callback=human) as c:
        label = f"http {mode}"
        check(c.protocol_version == ("2025-11-25" if mode == "legacy" else mode), f"{label} negotiated", c.protocol_version)
        await common(c, label, human, stateless=mode != "legacy")
        await binding(c, label, human, workspace)


async def stdio(warden, state, mode, depth, workspace):
    env = {"WARDEN_STATE_DIR": state, "PATH": os.environ.get("PATH", "")}
    if depth is not None:
        env["WARDEN_DEPTH"] = depth
    human = Human()
    params = StdioServerParameters(command=warden, args=["mcp"], env=env)
    async with Client(params, mode=mode, elicitation_callback=human) as c:
        label = f"stdio {mode}" + (f" depth={depth}" if depth is not None else "")
        if depth is not None:
            r = await c.call_tool("advise", {"task": "hi"})
            e = structured(r)
            check(r.is_error and e["status"] == "refused" and e["blockers"][0]["rule"] == "mcp.recursion" and e["depth"] >= 1,
                  f"{label} a call from inside a warden agent is refused", e)
            return
        await common(c, label, human, stateless=mode != "legacy")
        if workspace:
            await binding(c, label, human, workspace)


def main():
    kind = sys.argv[1]
    if kind == "http":
        asyncio.run(http(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]))
    elif kind == "stdio":
        depth = sys.argv[5] if len(sys.argv) > 5 and sys.argv[5] != "-" else None
        workspace = sys.argv[6] if len(sys.argv) > 6 else None
        asyncio.run(stdio(sys.argv[2], sys.argv[3], sys.argv[4], depth, workspace))
    else:
        raise SystemExit(f"unknown kind {kind}")


if __name__ == "__main__":
    main()
