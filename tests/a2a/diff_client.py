"""The official A2A Python SDK (a2a-sdk 1.x, A2A 1.0) reading a task's diff artifact from warden.

Usage: python3 diff_client.py BASE_URL TOKEN BINDING TEXT   (BINDING: JSONRPC, HTTP+JSON or GRPC)

Sends TEXT (blocking), reads the task again (GetTask), and sends it once more streaming; prints
one JSON line for each ({"how": "send"|"get"|"stream", ...}) describing the `text/x-diff`
artifact it found: its id, name, the part's filename and media type, the decoded bytes, and the
files its metadata names. The Rust test judges them.
"""

import asyncio
import json
import sys
import uuid

import grpc
import httpx
from a2a.client import ClientConfig, create_client
from a2a.types import GetTaskRequest, Message, Part, Role, SendMessageRequest
from google.protobuf.json_format import MessageToDict


class BearerUnary(grpc.aio.UnaryUnaryClientInterceptor):
    def __init__(self, token: str):
        self.token = token

    async def intercept_unary_unary(self, continuation, details, request):
        md = list(details.metadata or []) + [("authorization", f"Bearer {self.token}")]
        return await continuation(details._replace(metadata=md), request)


class BearerStream(grpc.aio.UnaryStreamClientInterceptor):
    def __init__(self, token: str):
        self.token = token

    async def intercept_unary_stream(self, continuation, details, request):
        md = list(details.metadata or []) + [("authorization", f"Bearer {self.token}")]
        return await continuation(details._replace(metadata=md), request)


def msg(text: str) -> Message:
    return Message(message_id=f"diff-{uuid.uuid4()}", role=Role.ROLE_USER, parts=[Part(text=text)])


def describe(how: str, task_id: str, artifacts) -> dict:
    out = {"how": how, "taskId": task_id, "diffs": []}
    for a in artifacts:
        for p in a.parts:
            if p.media_type == "text/x-diff":
                meta = MessageToDict(a.metadata) if a.HasField("metadata") else {}
                out["diffs"].append({
                    "artifactId": a.artifact_id,
                    "name": a.name,
                    "filename": p.filename,
                    "mediaType": p.media_type,
                    "raw": p.raw.decode("utf-8"),
                    "files": meta.get("warden", {}).get("files", []),
                })
    return out


async def main(base: str, token: str, binding: str, text: str) -> None:
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(headers=headers, timeout=60) as http:
        def config(streaming: bool) -> ClientConfig:
            return ClientConfig(
                streaming=streaming,
                supported_protocol_bindings=[binding],
                httpx_client=http,
                grpc_channel_factory=lambda url: grpc.aio.insecure_channel(
                    url, interceptors=[BearerUnary(token), BearerStream(token)]
                ),
            )

        async with await create_client(base, client_config=config(False)) as c:
            events = [e async for e in c.send_message(SendMessageRequest(message=msg(text)))]
            task = events[0].task
            print(json.dumps(describe("send", task.id, task.artifacts)), flush=True)
            got = await c.get_task(GetTaskRequest(id=task.id))
            print(json.dumps(describe("get", got.id, got.artifacts)), flush=True)

        async with await create_client(base, client_config=config(True)) as c:
            arts, task_id = [], ""
            async for ev in c.send_message(SendMessageRequest(message=msg(text))):
                kind = ev.WhichOneof("payload")
                if kind == "task":
                    task_id = ev.task.id
                elif kind == "artifact_update":
                    arts.append(ev.artifact_update.artifact)
            print(json.dumps(describe("stream", task_id, arts)), flush=True)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
