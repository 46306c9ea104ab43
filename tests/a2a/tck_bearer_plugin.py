"""A pytest plugin for running the A2A TCK (a2aproject/a2a-tck, branch 1.0-dev) against warden by
hand: the TCK cannot send a bearer token, and warden never turns authentication off, so this adds
`Authorization: Bearer $WARDEN_TOKEN` to every HTTP request (httpx) and the `authorization`
metadata to every gRPC call the TCK makes. Nothing else is changed.

    WARDEN_TOKEN=$(cat <state>/gateway/token) ./run_tck.py --sut-host http://127.0.0.1:7420 \
        -- -p tck_bearer_plugin          # with this directory on PYTHONPATH
"""

import collections
import os

import grpc
import httpx

TOKEN = os.environ.get("WARDEN_TOKEN", "")

_client_init = httpx.Client.__init__


def _init(self, *args, **kwargs):
    headers = dict(kwargs.pop("headers", None) or {})
    headers.setdefault("Authorization", f"Bearer {TOKEN}")
    _client_init(self, *args, headers=headers, **kwargs)


httpx.Client.__init__ = _init


class _Details(
    collections.namedtuple(
        "_Details", ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression")
    ),
    grpc.ClientCallDetails,
):
    pass


class _Bearer(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    def _with(self, d):
        md = list(d.metadata or []) + [("authorization", f"Bearer {TOKEN}")]
        return _Details(d.method, d.timeout, md, d.credentials, getattr(d, "wait_for_ready", None), getattr(d, "compression", None))

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._with(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._with(details), request)


_insecure = grpc.insecure_channel


def _channel(target, *args, **kwargs):
    return grpc.intercept_channel(_insecure(target, *args, **kwargs), _Bearer())


grpc.insecure_channel = _channel
