#!/usr/bin/env python3
"""A minimal operator's client for warden-policy's admin socket (AdminService), to copy and adapt.

    python3 admin_client.py status
    python3 admin_client.py audit [-n 20] [--context CONTEXT_ID]

Run it as a member of warden-operators (the socket and the daemon's peer allowlist admit that
group). Needs the Python packages grpcio and grpcio-tools. The stubs are generated at start from
warden's .proto files (installed by the Debian package in /usr/share/warden/proto) into a
temporary directory, so nothing generated has to be kept next to this file.

gRPC's C-core (Python, C++, Ruby) sends the %-encoded socket path as the HTTP/2 :authority of a
unix: target, which the daemons' HTTP/2 layer refuses as malformed before warden sees the call
(deploy/README.md, "Your own gRPC clients"): every channel to a warden socket sets
grpc.default_authority, as below.
"""

import argparse
import importlib
import os
import sys
import tempfile

SOCKET = "/run/warden/policy/policy-admin.sock"
PROTO_DIR = "/usr/share/warden/proto"


def load_stubs(proto_dir):
    """Compiles admin.proto (and what it imports) into a temporary directory and imports it."""
    from grpc_tools import protoc

    out = tempfile.mkdtemp(prefix="warden-stubs-")
    args = [
        "protoc",
        f"-I{proto_dir}",
        # grpc_tools' own well-known types (google/protobuf/*.proto).
        f"-I{os.path.join(os.path.dirname(protoc.__file__), '_proto')}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        "warden/v1/policy.proto",
        "warden/v1/admin.proto",
    ]
    if protoc.main(args) != 0:
        sys.exit(f"cannot compile the protos in {proto_dir}")
    sys.path.insert(0, out)
    pb = importlib.import_module("warden.v1.admin_pb2")
    rpc = importlib.import_module("warden.v1.admin_pb2_grpc")
    return pb, rpc


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--socket", default=SOCKET, help=f"the admin socket (default {SOCKET})")
    ap.add_argument("--proto-dir", default=PROTO_DIR, help=f"warden's protos (default {PROTO_DIR})")
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("status", help="the daemon's status")
    audit = sub.add_parser("audit", help="the newest audit records, newest first")
    audit.add_argument("-n", "--limit", type=int, default=20)
    audit.add_argument("--context", default="", help="only this context's records")
    args = ap.parse_args()

    import grpc

    pb, rpc = load_stubs(args.proto_dir)
    # Without this option every call fails with RST_STREAM PROTOCOL_ERROR (see above).
    options = [("grpc.default_authority", "localhost")]
    with grpc.insecure_channel(f"unix:{args.socket}", options=options) as channel:
        admin = rpc.AdminServiceStub(channel)
        try:
            if args.command == "status":
                s = admin.Status(pb.StatusRequest(), timeout=5)
                print(f"{s.daemon} {s.version} pid {s.pid} up {s.uptime_seconds}s")
                for k in sorted(s.details):
                    print(f"  {k} = {s.details[k]}")
            else:
                r = admin.AuditQuery(
                    pb.AuditQueryRequest(limit=args.limit, context_id=args.context), timeout=5
                )
                verdict = pb.AuditRecord.DESCRIPTOR.fields_by_name["verdict"].enum_type
                for rec in r.records:
                    print(
                        f"{rec.decided_at_unix_ms}  {verdict.values_by_number[rec.verdict].name:<16} "
                        f"{rec.tool_kind:<8} {rec.tool_title}  rule={rec.rule} "
                        f"decision={rec.decision_id}"
                    )
        except grpc.RpcError as e:
            sys.exit(f"{args.socket}: {e.code().name}: {e.details()}")


if __name__ == "__main__":
    main()
