"""An A2A 0.3 client (the Python a2a-sdk 0.3.x, in its own virtual environment) against warden.

Usage: python sdk03_client.py BASE_URL TOKEN TRANSPORT   (TRANSPORT: JSONRPC or HTTP+JSON)

The 0.3 SDK sends no A2A-Version header and speaks 0.3's shapes (JSON-RPC `message/send` with
`kind` discriminators; REST `/v1/...` ProtoJSON). It resolves the card (reading its 0.3 fields),
then: blocking send, get, streaming send ending `final`, cancel, resubscribe on a task waiting for
input, and push config set/get. Prints one line per check and exits non-zero on the first failure.
"""

import asyncio
import json
import sys
import uuid

import httpx
from a2a.client import ClientConfig, ClientFactory
from a2a.types import (
    GetTaskPushNotificationConfigParams,
    Message,
    MessageSendConfiguration,
    Part,
    PushNotificationConfig,
    Role,
    Task,
    TaskIdParams,
    TaskPushNotificationConfig,
    TaskQueryParams,
    TaskState,
    TaskStatusUpdateEvent,
    TextPart,
)


def msg(text: str, task_id: str | None = None, message_id: str | None = None) -> Message:
    return Message(
        message_id=message_id or f"sdk03-{uuid.uuid4()}",
        role=Role.user,
        parts=[Part(root=TextPart(text=text))],
        task_id=task_id,
    )


def check(ok: bool, what: str) -> None:
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        sys.exit(1)


async def main(base: str, token: str, transport: str) -> None:
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(headers=headers, timeout=60) as http:
        card = (await http.get(f"{base}/.well-known/agent-card.json")).json()
        check(card.get("protocolVersion") == "0.3.0" and card.get("url"), f"{transport} card has the 0.3 fields")

        def config(streaming: bool) -> ClientConfig:
            return ClientConfig(streaming=streaming, supported_transports=[transport], httpx_client=http)

        # blocking send -> a completed task with the answer
        c = await ClientFactory.connect(base, client_config=config(False))
        events = [e async for e in c.send_message(msg("tck-complete-task please", message_id=f"tck-complete-task-{uuid.uuid4()}"))]
        task, _ = events[0]
        check(isinstance(task, Task) and task.status.state == TaskState.completed, f"{transport} send completes ({task.status.state})")
        check(task.status.message is not None or task.artifacts, f"{transport} the task has the answer")

        # get
        got = await c.get_task(TaskQueryParams(id=task.id, history_length=1))
        check(got.id == task.id and got.status.state == TaskState.completed, f"{transport} get")
        check(got.history is not None and len(got.history) <= 1, f"{transport} get honours historyLength")

        # cancel a running task (sent without blocking)
        hang = json.dumps({"steps": [{"type": "message", "text": "working"}, {"type": "hang"}]})
        events = [e async for e in c.send_message(msg(hang), configuration=MessageSendConfiguration(blocking=False))]
        running, _ = events[0]
        check(running.status.state in (TaskState.submitted, TaskState.working), f"{transport} blocking=false gives a running task ({running.status.state} {running.status.message})")
        for _ in range(100):
            t = await c.get_task(TaskQueryParams(id=running.id))
            if t.status.state == TaskState.working:
                break
            await asyncio.sleep(0.05)
        canceled = await c.cancel_task(TaskIdParams(id=running.id))
        check(canceled.status.state == TaskState.canceled, f"{transport} cancel ({canceled.status.state})")

        # push config set/get on a task waiting for input (webhook host must be public: refused)
        events = [e async for e in c.send_message(msg("ask", message_id=f"tck-input-required-{uuid.uuid4()}"))]
        waiting, _ = events[0]
        check(waiting.status.state == TaskState.input_required, f"{transport} a task waiting for input ({waiting.status.state})")
        try:
            await c.set_task_callback(TaskPushNotificationConfig(
                task_id=waiting.id,
                push_notification_config=PushNotificationConfig(id="cb1", url="http://127.0.0.1:9/hook"),
            ))
            check(False, f"{transport} a loopback webhook is refused")
        except Exception as e:  # the SDK's error class differs per transport
            check("refused" in str(e) or "Invalid" in type(e).__name__ or "400" in str(e), f"{transport} a loopback webhook is refused ({type(e).__name__})")
        # (Clients share the one httpx client, which closing a client would close.)

        # stream: task first, then updates, the last one final and completed
        c = await ClientFactory.connect(base, client_config=config(True))
        finals = []
        first = None
        async for ev in c.send_message(msg("stream please", message_id=f"tck-stream-001-{uuid.uuid4()}")):
            t, update = ev
            first = first or t
            if isinstance(update, TaskStatusUpdateEvent):
                finals.append((update.status.state, update.final))
        check(first is not None, f"{transport} stream yields the task")
        check(finals and finals[-1] == (TaskState.completed, True), f"{transport} stream ends final and completed ({finals})")
        check(all(not f for _, f in finals[:-1]), f"{transport} only the last status is final")

        # resubscribe to the waiting task, answer it, follow it to the end
        async def follow():
            states = []
            async for t, update in c.resubscribe(TaskIdParams(id=waiting.id)):
                if isinstance(update, TaskStatusUpdateEvent):
                    states.append(update.status.state)
            return states
        follower = asyncio.create_task(follow())
        await asyncio.sleep(0.5)
        answer = await ClientFactory.connect(base, client_config=config(False))
        done = [e async for e in answer.send_message(msg("blue", task_id=waiting.id))]
        check(done[0][0].status.state == TaskState.completed, f"{transport} the answer completes the task")
        states = await asyncio.wait_for(follower, 30)
        check(states and states[-1] == TaskState.completed, f"{transport} resubscribe follows to completed ({states})")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))
