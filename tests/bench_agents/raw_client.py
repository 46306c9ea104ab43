#!/usr/bin/env python3
"""The floor of the `vs_acpx` bench: the least an ACP client can do for a permission.

A stdlib-only ACP v1 client that starts the agent command given after `--` in the working
directory `--cwd`, initializes, opens a session, sends one prompt and answers every
`session/request_permission` at once with its first `allow_once` option: no policy, no record,
no event relay. It exits with the prompt's stop reason on stdout.
"""

import json
import subprocess
import sys


def main():
    argv = sys.argv[1:]
    cwd = "."
    if argv[:1] == ["--cwd"]:
        cwd = argv[1]
        argv = argv[2:]
    if argv[:1] == ["--"]:
        argv = argv[1:]
    agent = subprocess.Popen(argv, cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    out, inp = agent.stdin, agent.stdout
    next_id = [0]

    def send(msg):
        out.write(json.dumps(msg, separators=(",", ":")).encode() + b"\n")
        out.flush()

    def call(method, params):
        next_id[0] += 1
        rid = next_id[0]
        send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
        while True:
            line = inp.readline()
            if not line:
                sys.exit("raw_client: the agent closed its output")
            msg = json.loads(line)
            m = msg.get("method")
            if m is None:
                if msg.get("id") == rid:
                    if "error" in msg:
                        sys.exit("raw_client: %s failed: %s" % (method, msg["error"]))
                    return msg["result"]
                continue
            if m == "session/request_permission" and "id" in msg:
                options = msg.get("params", {}).get("options", [])
                pick = next((o["optionId"] for o in options if o.get("kind") == "allow_once"),
                            None)
                outcome = ({"outcome": "selected", "optionId": pick} if pick
                           else {"outcome": "cancelled"})
                send({"jsonrpc": "2.0", "id": msg["id"], "result": {"outcome": outcome}})
            elif "id" in msg:
                send({"jsonrpc": "2.0", "id": msg["id"],
                      "error": {"code": -32601, "message": "not supported"}})

    call("initialize", {"protocolVersion": 1,
                        "clientCapabilities": {"fs": {"readTextFile": False,
                                                      "writeTextFile": False},
                                               "terminal": False}})
    sid = call("session/new", {"cwd": cwd, "mcpServers": []})["sessionId"]
    res = call("session/prompt", {"sessionId": sid,
                                  "prompt": [{"type": "text", "text": "edit bench.txt"}]})
    print(res.get("stopReason", ""))
    out.close()
    agent.wait()


if __name__ == "__main__":
    main()
