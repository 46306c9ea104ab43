"""An OpenID provider for warden's tests, built on Authlib's OAuth 2.0 authorization server (the
client_credentials grant issuing RFC 9068 JWT access tokens) in Flask, served over HTTPS with
the certificate the test made.

Usage: python3 provider.py PORT CERT KEY

Serves /.well-known/openid-configuration, /jwks and /token (client_secret_basic or _post). Each
client's token carries `groups`; `aud` is "warden". For the refusal cases the test also needs
tokens no honest provider would issue, so /test/mint signs any claims with the provider's key or
with a key it never publishes (the "rogue" key), and /test/jwks switches the JWKS endpoint to
garbage. Prints "ready ISSUER" once listening.
"""

import base64
import json
import ssl
import sys
import time

from authlib.integrations.flask_oauth2 import AuthorizationServer
from authlib.oauth2.rfc6749 import ClientMixin, grants
from authlib.oauth2.rfc9068 import JWTBearerTokenGenerator
from flask import Flask, jsonify, request
from joserfc import jwt
from joserfc.jwk import KeySet, RSAKey
from werkzeug.serving import make_server

AUDIENCE = "warden"
CLIENTS = {
    "ci-bot": {"secret": "ci-bot-secret", "groups": ["builders"]},
    "intern": {"secret": "intern-secret", "groups": ["interns"]},
}


class Client(ClientMixin):
    def __init__(self, client_id):
        self.client_id = client_id
        self.info = CLIENTS[client_id]

    def get_client_id(self):
        return self.client_id

    def get_default_redirect_uri(self):
        return None

    def get_allowed_scope(self, scope):
        return scope or ""

    def check_redirect_uri(self, redirect_uri):
        return False

    def check_client_secret(self, client_secret):
        return client_secret == self.info["secret"]

    def check_endpoint_auth_method(self, method, endpoint):
        return method in ("client_secret_basic", "client_secret_post")

    def check_response_type(self, response_type):
        return False

    def check_grant_type(self, grant_type):
        return grant_type == "client_credentials"


def main(port: int, cert: str, key: str) -> None:
    issuer = f"https://127.0.0.1:{port}"
    signing = RSAKey.generate_key(2048, parameters={"kid": "main", "alg": "RS256", "use": "sig"}, private=True)
    rogue = RSAKey.generate_key(2048, parameters={"kid": "rogue", "alg": "RS256", "use": "sig"}, private=True)
    state = {"jwks": "serve"}

    class Tokens(JWTBearerTokenGenerator):
        def get_jwks(self):
            return KeySet([signing]).as_dict(private=True)

        def get_audiences(self, client, user, scope):
            return AUDIENCE

        def get_extra_claims(self, client, grant_type, user, scope):
            return {"groups": client.info["groups"]}

    app = Flask(__name__)
    server = AuthorizationServer(
        app,
        query_client=lambda cid: Client(cid) if cid in CLIENTS else None,
        save_token=lambda token, req: None,
    )
    server.register_grant(grants.ClientCredentialsGrant)
    server.register_token_generator("default", Tokens(issuer=issuer))

    @app.get("/.well-known/openid-configuration")
    def discovery():
        return jsonify(
            issuer=issuer,
            jwks_uri=f"{issuer}/jwks",
            token_endpoint=f"{issuer}/token",
            grant_types_supported=["client_credentials"],
            token_endpoint_auth_methods_supported=["client_secret_basic", "client_secret_post"],
            id_token_signing_alg_values_supported=["RS256"],
            subject_types_supported=["public"],
            response_types_supported=["token"],
        )

    @app.get("/jwks")
    def jwks():
        if state["jwks"] == "garbage":
            return "<html>upstream error</html>", 200, {"Content-Type": "application/json"}
        return jsonify(KeySet([signing]).as_dict(private=False))

    @app.post("/token")
    def token():
        return server.create_token_response()

    @app.post("/test/jwks")
    def jwks_mode():
        state["jwks"] = request.get_json()["mode"]
        return jsonify(ok=True)

    @app.post("/test/mint")
    def mint():
        body = request.get_json()
        now = int(time.time())
        claims = {"iss": issuer, "aud": AUDIENCE, "sub": "minted", "iat": now, "exp": now + 300}
        claims.update(body.get("claims", {}))
        alg = body.get("alg", "RS256")
        if alg == "none":
            enc = lambda v: base64.urlsafe_b64encode(json.dumps(v).encode()).rstrip(b"=").decode()
            return jsonify(token=f"{enc({'alg': 'none', 'kid': 'main'})}.{enc(claims)}.")
        if alg == "HS256":
            # The classic confusion: the provider's *public* key as an HMAC secret.
            from joserfc.jwk import OctKey

            secret = OctKey.import_key(json.dumps(signing.as_dict(private=False)).encode())
            return jsonify(token=jwt.encode({"alg": "HS256", "kid": "main"}, claims, secret, algorithms=["HS256"]))
        k = rogue if body.get("key") == "rogue" else signing
        return jsonify(token=jwt.encode({"alg": "RS256", "kid": k.kid}, claims, k))

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    httpd = make_server("127.0.0.1", port, app, threaded=True, ssl_context=ctx)
    print(f"ready {issuer}", flush=True)
    httpd.serve_forever()


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], sys.argv[3])
