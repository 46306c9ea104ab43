"""The official A2A Python SDK (a2a-sdk 1.x, A2A 1.0) against a running warden gateway.

Usage: python3 sdk_client.py BASE_URL TOKEN BINDING   (BINDING: JSONRPC, HTTP+JSON or GRPC)

For GRPC the client finds the gRPC interface on the card and sends the token as the
`authorization` metadata of every call (an interceptor on an insecure loopback channel).

Resolves the agent card, then: send (blocking), stream, get, list, cancel. Prints one line per
check and exits non-zero on the first failure. The gateway sits in front of warden's scripted
agent, whose behaviour the prompt text selects.
"""

import asyncio
import json
import sys
import uuid

import grpc
import httpx
from a2a.client import ClientConfig, create_client
from a2a.types import (
    CancelTaskRequest,
    GetTaskRequest,
    ListTasksRequest,
    Message,
    Part,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
    TaskState,
)


def with_bearer(details, token: str):
    md = list(details.metadata or []) + [("authorization", f"Bearer {token}")]
    return details._replace(metadata=md)


# grpc.aio files an interceptor under its first matching kind only, so one class per kind.
class BearerUnary(grpc.aio.UnaryUnaryClientInterceptor):
    def __init__(self, token: str):
        self.token = token

    async def intercept_unary_unary(self, continuation, details, request):
        return await continuation(with_bearer(details, self.token), request)


class BearerStream(grpc.aio.UnaryStreamClientInterceptor):
    def __init__(self, token: str):
        self.token = token

    async def intercept_unary_stream(self, continuation, details, request):
        return await continuation(with_bearer(details, self.token), request)


def msg(text: str) -> Message:
    return Message(message_id=f"sdk-{uuid.uuid4()}", role=Role.ROLE_USER, parts=[Part(text=text)])


def check(ok: bool, what: str) -> None:
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        sys.exit(1)


async def main(base: str, token: str, binding: str) -> None:
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

        # send (blocking): the task comes back COMPLETED with the answer artifact.
        async with await create_client(base, client_config=config(False)) as c:
            events = [e async for e in c.send_message(SendMessageRequest(message=msg("write sdk.txt")))]
            check(len(events) == 1 and events[0].HasField("task"), f"{binding} send returns a task")
            task = events[0].task
            check(task.status.state == TaskState.TASK_STATE_COMPLETED, f"{binding} send completes ({TaskState.Name(task.status.state)})")
            answer = "".join(p.text for a in task.artifacts for p in a.parts)
            check("sdk.txt" in answer, f"{binding} answer artifact: {answer!r}")
            done_id = task.id

            # get
            got = await c.get_task(GetTaskRequest(id=done_id, history_length=1))
            check(got.id == done_id and got.status.state == TaskState.TASK_STATE_COMPLETED, f"{binding} get")
            check(len(got.history) == 1, f"{binding} get honours historyLength ({len(got.history)})")

            # list
            listed = await c.list_tasks(ListTasksRequest(context_id=task.context_id))
            check(any(t.id == done_id for t in listed.tasks), f"{binding} list finds the task")

            # cancel: a task that would run forever, sent without waiting.
            hang = json.dumps({"steps": [{"type": "message", "text": "working"}, {"type": "hang"}]})
            req = SendMessageRequest(message=msg(hang), configuration=SendMessageConfiguration(return_immediately=True))
            events = [e async for e in c.send_message(req)]
            running = events[0].task
            check(not running.status.state in (TaskState.TASK_STATE_COMPLETED, TaskState.TASK_STATE_FAILED), f"{binding} returnImmediately gives a running task")
            for _ in range(100):
                t = await c.get_task(GetTaskRequest(id=running.id))
                if t.status.state == TaskState.TASK_STATE_WORKING:
                    break
                await asyncio.sleep(0.05)
            canceled = await c.cancel_task(CancelTaskRequest(id=running.id))
            check(canceled.status.state == TaskState.TASK_STATE_CANCELED, f"{binding} cancel ({TaskState.Name(canceled.status.state)})")

        # stream: Task first, then updates, ending COMPLETED; the stream closes by itself.
        async with await create_client(base, client_config=config(True)) as c:
            kinds = []
            final = None
            async for ev in c.send_message(SendMessageRequest(message=msg("write streamed.txt"))):
                kind = ev.WhichOneof("payload")
                kinds.append(kind)
                if kind == "status_update":
                    final = ev.status_update.status.state
            check(kinds[0] == "task", f"{binding} stream starts with the task ({kinds[0]})")
            check("artifact_update" in kinds, f"{binding} stream carries artifact updates")
            check(final == TaskState.TASK_STATE_COMPLETED, f"{binding} stream ends COMPLETED ({kinds})")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))
