"""A caller signing in to warden with a client certificate: the official A2A Python SDK (a2a-sdk
1.x) over httpx (JSON-RPC, HTTP+JSON) or grpcio (gRPC), each presenting the certificate in the
TLS handshake and trusting the gateway's CA. No bearer token unless one is given.

Usage:
  python3 caller.py send BASE_URL CA_FILE CERT KEY BINDING [AGENT] [TOKEN]
      CERT/KEY "" = no client certificate; AGENT "" = the default.
      prints "<STATE> <contextId> <answer>", or "refused <error>" (a refusal in the handshake
      or an error the gateway answered)
  python3 caller.py card BASE_URL CA_FILE      prints the public agent card (JSON)
  python3 caller.py mcp BASE_URL CA_FILE CERT KEY TOOL
      a stateless MCP tools/call (no arguments) with the certificate; prints the HTTP status
      and the body
"""

import asyncio
import json
import ssl
import sys
import uuid

import grpc
import httpx


def context(ca: str, cert: str, key: str) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=ca)
    if cert:
        ctx.load_cert_chain(cert, key)
    return ctx


def channel(url: str, ca: str, cert: str, key: str, token: str):
    creds = grpc.ssl_channel_credentials(
        root_certificates=open(ca, "rb").read(),
        private_key=open(key, "rb").read() if cert else None,
        certificate_chain=open(cert, "rb").read() if cert else None,
    )
    if token:
        creds = grpc.composite_channel_credentials(
            creds, grpc.access_token_call_credentials(token)
        )
    return grpc.aio.secure_channel(url, creds)


async def send(base, ca, cert, key, binding, agent, token) -> None:
    from a2a.client import ClientConfig, create_client
    from a2a.types import Message, Part, Role, SendMessageRequest, TaskState

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx.AsyncClient(verify=context(ca, cert, key), headers=headers, timeout=60) as http:
        config = ClientConfig(
            streaming=False,
            supported_protocol_bindings=[binding],
            httpx_client=http,
            grpc_channel_factory=lambda url: channel(url, ca, cert, key, token),
        )
        m = Message(message_id=f"mtls-{uuid.uuid4()}", role=Role.ROLE_USER, parts=[Part(text="write mtls.txt")])
        if agent:
            m.metadata.update({"agent": agent})
        try:
            async with await create_client(base, client_config=config) as c:
                events = [e async for e in c.send_message(SendMessageRequest(message=m))]
        except Exception as e:  # a refused handshake, or the error the gateway answered
            print(f"refused {type(e).__name__}: {e!r} {e.__cause__!r}", flush=True)
            return
        task = events[0].task
        answer = "".join(p.text for a in task.artifacts for p in a.parts)
        print(f"{TaskState.Name(task.status.state)} {task.context_id} {answer}", flush=True)


async def main(argv: list[str]) -> None:
    if argv[0] == "send":
        base, ca, cert, key, binding = argv[1:6]
        agent = argv[6] if len(argv) > 6 else ""
        token = argv[7] if len(argv) > 7 else ""
        await send(base, ca, cert, key, binding, agent, token)
    elif argv[0] == "mcp":
        base, ca, cert, key, tool = argv[1:6]
        era = "2026-07-28"
        body = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
            "name": tool, "arguments": {},
            "_meta": {"io.modelcontextprotocol/protocolVersion": era,
                      "io.modelcontextprotocol/clientInfo": {"name": "e2e", "version": "0"},
                      "io.modelcontextprotocol/clientCapabilities": {}}}}
        headers = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": era,
                   "Mcp-Method": "tools/call", "Mcp-Name": tool}
        async with httpx.AsyncClient(verify=context(ca, cert, key), timeout=60) as http:
            r = await http.post(f"{base}/mcp", json=body, headers=headers)
            print(r.status_code, r.text)
    elif argv[0] == "card":
        base, ca = argv[1:3]
        async with httpx.AsyncClient(verify=context(ca, "", "")) as http:
            print(json.dumps((await http.get(f"{base}/.well-known/agent-card.json")).json()))
    else:
        sys.exit(f"unknown command {argv[0]}")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
