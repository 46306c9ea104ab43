"""An independently written ACP agent on the official Python SDK
(`pip install agent-client-protocol`), used to check warden-acp's framing
against someone else's.

On each prompt it: streams a message, announces an edit tool call, asks
permission (allow_once / allow_always / reject_once options), and if allowed
writes `peer.txt` through the client's fs/write_text_file, reads it back with
fs/read_text_file, runs `echo from-terminal` through terminal/create,
wait_for_exit, output, release, and reports what it saw. The prompt text
"deny-check" makes it report the refusal instead.
"""

import asyncio
import os
import sys
from typing import Any
from uuid import uuid4

try:
    from acp import (
        Agent,
        InitializeResponse,
        NewSessionResponse,
        PromptResponse,
        run_agent,
        start_edit_tool_call,
        text_block,
        update_agent_message,
        update_tool_call,
    )
    from acp.interfaces import Client
    from acp.schema import PermissionOption, ToolCallUpdate
except ImportError as e:  # the Rust test turns this exit code into a clear failure
    print(f"PY_ACP_SDK_MISSING: {e}", file=sys.stderr)
    sys.exit(42)


class PeerAgent(Agent):
    _conn: Client

    def on_connect(self, conn: Client) -> None:
        self._conn = conn
        self._cwd: dict[str, str] = {}

    async def initialize(self, protocol_version: int, client_capabilities=None, client_info=None, **kwargs: Any):
        return InitializeResponse(protocol_version=protocol_version)

    async def new_session(self, cwd: str, additional_directories=None, mcp_servers=None, **kwargs: Any):
        sid = uuid4().hex
        self._cwd[sid] = cwd
        return NewSessionResponse(session_id=sid)

    async def say(self, session_id: str, text: str) -> None:
        await self._conn.session_update(session_id=session_id, update=update_agent_message(text_block(text)))

    async def prompt(self, session_id: str, prompt: list, **kwargs: Any) -> PromptResponse:
        cwd = self._cwd[session_id]
        path = os.path.join(cwd, "peer.txt")
        await self.say(session_id, "python peer starting")
        await self._conn.session_update(
            session_id=session_id,
            update=start_edit_tool_call("py_tool_1", "Write peer.txt", path, "from python peer\n"),
        )
        resp = await self._conn.request_permission(
            session_id=session_id,
            tool_call=ToolCallUpdate(tool_call_id="py_tool_1", title="Write peer.txt", kind="edit", status="pending"),
            options=[
                PermissionOption(option_id="py-once", name="Allow once", kind="allow_once"),
                PermissionOption(option_id="py-always", name="Always", kind="allow_always"),
                PermissionOption(option_id="py-no", name="No", kind="reject_once"),
            ],
        )
        outcome = resp.outcome
        chosen = getattr(outcome, "option_id", None)
        if outcome.outcome != "selected" or chosen != "py-once":
            await self._conn.session_update(
                session_id=session_id, update=update_tool_call("py_tool_1", status="failed")
            )
            await self.say(session_id, f"peer refused: {outcome.outcome} {chosen}")
            return PromptResponse(stop_reason="end_turn")
        await self._conn.write_text_file(session_id=session_id, path=path, content="from python peer\n")
        read = await self._conn.read_text_file(session_id=session_id, path=path)
        term = await self._conn.create_terminal(
            session_id=session_id, command="sh", args=["-c", "echo from-terminal"], cwd=cwd
        )
        status = await self._conn.wait_for_terminal_exit(session_id=session_id, terminal_id=term.terminal_id)
        out = await self._conn.terminal_output(session_id=session_id, terminal_id=term.terminal_id)
        await self._conn.release_terminal(session_id=session_id, terminal_id=term.terminal_id)
        await self._conn.session_update(
            session_id=session_id, update=update_tool_call("py_tool_1", status="completed")
        )
        await self.say(
            session_id,
            f"read back: {read.content.strip()} | terminal exit {status.exit_code}: {out.output.strip()}",
        )
        return PromptResponse(stop_reason="end_turn")


async def main() -> None:
    await run_agent(PeerAgent())


if __name__ == "__main__":
    asyncio.run(main())
