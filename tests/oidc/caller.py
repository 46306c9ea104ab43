"""A caller signing in to warden with OpenID Connect: it finds the token endpoint by discovery,
gets an access token with the client_credentials grant (Authlib's OAuth 2.0 client), then sends
a task with the official A2A Python SDK (a2a-sdk 1.x) carrying that token.

Usage:
  python3 caller.py send BASE_URL ISSUER CA_FILE CLIENT_ID SECRET BINDING [AGENT]
      prints "token <jwt>", then "completed <answer>" or "refused <error>"
  python3 caller.py token ISSUER CA_FILE CLIENT_ID SECRET      prints the access token
  python3 caller.py mint ISSUER CA_FILE JSON                   prints a test token (/test/mint)
  python3 caller.py jwks ISSUER CA_FILE MODE                   /test/jwks (serve or garbage)
"""

import asyncio
import json
import ssl
import sys
import uuid

import httpx
from authlib.integrations.httpx_client import AsyncOAuth2Client


def tls(ca: str) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=ca)


async def fetch_token(issuer: str, ca: str, client_id: str, secret: str) -> str:
    async with httpx.AsyncClient(verify=tls(ca)) as http:
        meta = (await http.get(f"{issuer}/.well-known/openid-configuration")).json()
    async with AsyncOAuth2Client(client_id, secret, verify=tls(ca)) as oauth:
        token = await oauth.fetch_token(meta["token_endpoint"], grant_type="client_credentials")
    return token["access_token"]


async def send(base: str, token: str, binding: str, agent: str | None) -> None:
    from a2a.client import ClientConfig, create_client
    from a2a.types import Message, Part, Role, SendMessageRequest, TaskState

    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(headers=headers, timeout=60) as http:
        config = ClientConfig(streaming=False, supported_protocol_bindings=[binding], httpx_client=http)
        m = Message(message_id=f"oidc-{uuid.uuid4()}", role=Role.ROLE_USER, parts=[Part(text="write oidc.txt")])
        if agent:
            m.metadata.update({"agent": agent})
        try:
            async with await create_client(base, client_config=config) as c:
                events = [e async for e in c.send_message(SendMessageRequest(message=m))]
        except Exception as e:  # the SDK raises the server's JSON-RPC / HTTP error
            print(f"refused {type(e).__name__}: {e}", flush=True)
            return
        task = events[0].task
        answer = "".join(p.text for a in task.artifacts for p in a.parts)
        print(f"{TaskState.Name(task.status.state)} {task.context_id} {answer}", flush=True)


async def main(argv: list[str]) -> None:
    cmd = argv[0]
    if cmd == "send":
        base, issuer, ca, cid, secret, binding = argv[1:7]
        agent = argv[7] if len(argv) > 7 else None
        token = await fetch_token(issuer, ca, cid, secret)
        print(f"token {token}", flush=True)
        await send(base, token, binding, agent)
    elif cmd == "token":
        print(await fetch_token(*argv[1:5]))
    elif cmd == "mint":
        issuer, ca, body = argv[1:4]
        async with httpx.AsyncClient(verify=tls(ca)) as http:
            print((await http.post(f"{issuer}/test/mint", json=json.loads(body))).json()["token"])
    elif cmd == "jwks":
        issuer, ca, mode = argv[1:4]
        async with httpx.AsyncClient(verify=tls(ca)) as http:
            (await http.post(f"{issuer}/test/jwks", json={"mode": mode})).raise_for_status()
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
