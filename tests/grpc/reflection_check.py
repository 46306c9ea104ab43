#!/usr/bin/env python3
"""Server reflection on a warden admin socket, as a generic client (grpcurl's way) uses it:
no .proto files, only what the daemon describes. Prints one JSON object:

  {"services": [...], "methods": {"warden.v1.AdminService": [...]}, "status": {...},
   "without_authority": "<status code name of a call without grpc.default_authority>"}

Usage: reflection_check.py SOCKET
"""

import json
import sys

import grpc
from google.protobuf import json_format
from google.protobuf.descriptor_pool import DescriptorPool
from google.protobuf.message_factory import GetMessageClass
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)


def main():
    socket = sys.argv[1]
    target = f"unix:{socket}"
    options = [("grpc.default_authority", "localhost")]
    out = {}
    with grpc.insecure_channel(target, options=options) as ch:
        db = ProtoReflectionDescriptorDatabase(ch)
        out["services"] = sorted(db.get_services())
        pool = DescriptorPool(db)
        svc = pool.FindServiceByName("warden.v1.AdminService")
        out["methods"] = {svc.full_name: [m.name for m in svc.methods]}
        status = svc.methods_by_name["Status"]
        req_cls = GetMessageClass(status.input_type)
        resp_cls = GetMessageClass(status.output_type)
        call = ch.unary_unary(
            f"/{svc.full_name}/Status",
            request_serializer=req_cls.SerializeToString,
            response_deserializer=resp_cls.FromString,
        )
        out["status"] = json_format.MessageToDict(call(req_cls(), timeout=5))
    # gRPC C-core's default :authority for a unix: target (the %-encoded path).
    with grpc.insecure_channel(target) as ch:
        call = ch.unary_unary("/grpc.health.v1.Health/Check")
        try:
            call(b"", timeout=5)
            out["without_authority"] = "OK"
        except grpc.RpcError as e:
            out["without_authority"] = e.code().name
    print(json.dumps(out))


if __name__ == "__main__":
    main()
