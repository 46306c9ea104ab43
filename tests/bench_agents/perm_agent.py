#!/usr/bin/env python3
"""A stdlib-only ACP v1 agent for the `vs_acpx` bench (tests/benches/vs_acpx.rs).

It behaves like a coding agent that edits one file many times, and measures what its client
costs it: on every `session/prompt` it announces a `tool_call` (kind `edit`, the file inside its
working directory), asks `session/request_permission` with Claude's 0.101 options, waits for the
answer, marks the call completed, and repeats `--n` times, one request at a time. Each round trip
(request written -> answer read) is timed with the monotonic clock; the report (`--report`,
relative to the working directory) is one JSON object: the round trips in microseconds, the
answers by option id, and CLOCK_MONOTONIC nanoseconds of the process start and of the first
answer (so the bench, on the same clock, can time spawn -> first permission answered), and of
the start and end of the loop with the agent's own CPU time then (so the bench counts each
client's CPU over exactly that window).

`--chunks M` makes each prompt stream M `agent_message_chunk` updates instead (A2A events/s).
`--hostile` ignores SIGTERM and the end of its input, and forks a child that does too (a kill
ladder must escalate to SIGKILL).

Nothing here is a real model: it is the same peer for every client, so the clients are compared.
"""

import json
import os
import signal
import sys
import time

START_NS = time.monotonic_ns()


def parse_args(argv):
    opts = {"n": 100, "report": "perm-report.json", "chunks": 0, "hostile": False}
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--n":
            opts["n"] = int(argv[i + 1])
            i += 2
        elif a == "--report":
            opts["report"] = argv[i + 1]
            i += 2
        elif a == "--chunks":
            opts["chunks"] = int(argv[i + 1])
            i += 2
        elif a == "--hostile":
            opts["hostile"] = True
            i += 1
        else:
            sys.stderr.write("perm_agent: unknown argument %r\n" % a)
            sys.exit(2)
    return opts


class Peer:
    """NDJSON JSON-RPC over stdin/stdout, one thread: while waiting for an answer, requests and
    notifications that arrive are kept for the main loop."""

    def __init__(self):
        self.inp = sys.stdin.buffer
        self.out = sys.stdout.buffer
        self.next_id = 0
        self.pending = []
        self.cancelled = False

    def send(self, msg):
        self.out.write(json.dumps(msg, separators=(",", ":")).encode() + b"\n")
        self.out.flush()

    def read(self):
        line = self.inp.readline()
        if not line:
            return None
        try:
            return json.loads(line)
        except ValueError:
            return {}

    def call(self, method, params):
        self.next_id += 1
        rid = self.next_id
        self.send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
        while True:
            msg = self.read()
            if msg is None:
                return None
            if "method" not in msg and msg.get("id") == rid:
                return msg
            if msg.get("method") == "session/cancel":
                self.cancelled = True
            else:
                self.pending.append(msg)

    def next_message(self):
        if self.pending:
            return self.pending.pop(0)
        return self.read()


def update(peer, sid, u):
    peer.send({"jsonrpc": "2.0", "method": "session/update",
               "params": {"sessionId": sid, "update": u}})


OPTIONS = [
    {"optionId": "allow-once", "name": "Yes", "kind": "allow_once"},
    {"optionId": "allow-with-updates", "name": "Yes, allow all edits during this session",
     "kind": "allow_always"},
    {"optionId": "reject", "name": "No", "kind": "reject_once"},
]


def run_edits(peer, opts, sid, cwd, report):
    path = os.path.join(cwd, "bench.txt")
    t = os.times()
    report["loop_start_ns"] = time.monotonic_ns()
    report["agent_cpu_start_us"] = int((t.user + t.system) * 1e6)
    try:
        return edit_loop(peer, opts, sid, path, report)
    finally:
        t = os.times()
        report["loop_end_ns"] = time.monotonic_ns()
        report["agent_cpu_end_us"] = int((t.user + t.system) * 1e6)


def edit_loop(peer, opts, sid, path, report):
    for i in range(opts["n"]):
        if peer.cancelled:
            return "cancelled"
        tcid = "toolu_bench_%d" % i
        tc = {"toolCallId": tcid, "title": "Edit `%s`" % path, "kind": "edit",
              "status": "pending", "locations": [{"path": path}],
              "content": [{"type": "diff", "path": path, "oldText": None, "newText": "x"}],
              "rawInput": {"file_path": path, "content": "x"}}
        u = dict(tc)
        u["sessionUpdate"] = "tool_call"
        update(peer, sid, u)
        t0 = time.perf_counter_ns()
        answer = peer.call("session/request_permission",
                           {"sessionId": sid, "toolCall": tc, "options": OPTIONS})
        rtt = (time.perf_counter_ns() - t0) // 1000
        if report["first_answer_ns"] is None:
            report["first_answer_ns"] = time.monotonic_ns()
        if answer is None:
            return "refusal"
        outcome = (answer.get("result") or {}).get("outcome") or {}
        chosen = outcome.get("optionId") or outcome.get("outcome") or "error"
        report["answers"][chosen] = report["answers"].get(chosen, 0) + 1
        report["rtt_us"].append(rtt)
        status = "completed" if chosen.startswith("allow") else "failed"
        update(peer, sid, {"sessionUpdate": "tool_call_update", "toolCallId": tcid,
                           "status": status})
    return "end_turn"


def stream(peer, opts, sid):
    for i in range(opts["chunks"]):
        update(peer, sid, {"sessionUpdate": "agent_message_chunk",
                           "content": {"type": "text", "text": "%06d;" % i}})
    return "end_turn"


def write_report(cwd, opts, report):
    path = os.path.join(cwd, opts["report"])
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(report, f)
    os.replace(tmp, path)
    r = sorted(report["rtt_us"])
    if r:
        sys.stderr.write("perm_agent: %d permissions, p50 %d us, max %d us\n"
                         % (len(r), r[len(r) // 2], r[-1]))


def main():
    opts = parse_args(sys.argv[1:])
    if opts["hostile"]:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if os.fork() == 0:
            # A child that also ignores TERM and outlives a parent that would exit.
            sys.stdin.close()
            while True:
                time.sleep(3600)
    peer = Peer()
    cwd = os.getcwd()
    sessions = 0
    report = {"rtt_us": [], "answers": {}, "start_ns": START_NS, "first_answer_ns": None,
              "pid": os.getpid()}
    while True:
        msg = peer.next_message()
        if msg is None:
            if opts["hostile"]:
                # Not even the end of its input stops it: only SIGKILL does.
                while True:
                    time.sleep(3600)
            return
        method = msg.get("method")
        rid = msg.get("id")
        params = msg.get("params") or {}
        if method is None:
            continue
        if method == "session/cancel":
            peer.cancelled = True
            continue
        if rid is None:
            continue
        result = None
        if method == "initialize":
            result = {"protocolVersion": 1,
                      "agentCapabilities": {"loadSession": False,
                                            "promptCapabilities": {"image": False,
                                                                   "audio": False,
                                                                   "embeddedContext": False}},
                      "authMethods": [],
                      "agentInfo": {"name": "warden-bench-perm-agent", "version": "1"}}
        elif method == "session/new":
            sessions += 1
            cwd = params.get("cwd") or cwd
            result = {"sessionId": "bench-%d-%d" % (os.getpid(), sessions),
                      "modes": {"currentModeId": "default",
                                "availableModes": [{"id": "default", "name": "Manual"}]}}
        elif method == "session/set_mode":
            result = {}
        elif method == "session/prompt":
            peer.cancelled = False
            sid = params.get("sessionId", "")
            if opts["chunks"]:
                reason = stream(peer, opts, sid)
            else:
                reason = run_edits(peer, opts, sid, cwd, report)
                write_report(cwd, opts, report)
            if reason == "refusal":
                return
            result = {"stopReason": "cancelled" if peer.cancelled else reason}
        if result is None:
            peer.send({"jsonrpc": "2.0", "id": rid,
                       "error": {"code": -32601, "message": "method not found: %s" % method}})
        else:
            peer.send({"jsonrpc": "2.0", "id": rid, "result": result})


if __name__ == "__main__":
    main()
