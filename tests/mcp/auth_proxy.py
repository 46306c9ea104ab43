"""A loopback HTTP proxy that adds `Authorization: Bearer TOKEN` to every request, for MCP test
tools that cannot send a header (the conformance suite). warden never turns authentication off;
this stands where a host's own configuration would put the token.

    auth_proxy.py UPSTREAM_HOST:PORT TOKEN      # prints the port it listens on, then serves

Each request is sent upstream on its own connection with `Connection: close`, and the bytes are
copied both ways until either side closes, so SSE streams pass through as they come.
"""

import asyncio
import sys

UPSTREAM_HOST, UPSTREAM_PORT = sys.argv[1].rsplit(":", 1)
TOKEN = sys.argv[2]


async def pipe(reader, writer):
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        try:
            writer.close()
        except Exception:
            pass


async def handle(creader, cwriter):
    try:
        head = await creader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
        cwriter.close()
        return
    lines = head.decode("latin-1").split("\r\n")
    out = [lines[0]]
    has_auth = False
    for line in lines[1:]:
        if not line:
            continue
        name = line.split(":", 1)[0].strip().lower()
        if name in ("connection", "keep-alive", "proxy-connection"):
            continue
        has_auth |= name == "authorization"
        out.append(line)
    if not has_auth:
        out.append(f"Authorization: Bearer {TOKEN}")
    out.append("Connection: close")
    try:
        ureader, uwriter = await asyncio.open_connection(UPSTREAM_HOST, int(UPSTREAM_PORT))
    except OSError:
        cwriter.close()
        return
    uwriter.write(("\r\n".join(out) + "\r\n\r\n").encode("latin-1"))
    await uwriter.drain()
    up = asyncio.create_task(pipe(creader, uwriter))
    await pipe(ureader, cwriter)
    up.cancel()


async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


asyncio.run(main())
