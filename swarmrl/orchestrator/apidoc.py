"""How the orchestrator's API describes itself in its OpenAPI document (served at
/openapi.json, checked in as docs/openapi.json): the refusals a route may answer
(`ERRORS`, given to every route of orchestrator/app.py) and how each route
authenticates (`with_security`: signed routes and the operator's bearer token)."""

from __future__ import annotations

from fastapi import FastAPI

ERRORS = {
    400: {
        "description": "Body not strict JSON (NaN, Infinity, a number beyond a double, a lone surrogate)"
    },
    401: {
        "description": "Not authenticated: bad or missing signature, stale timestamp, reused nonce"
    },
    403: {"description": "Authenticated but not allowed (role, state or grant)"},
    409: {"description": "Conflicts with the recorded state"},
    413: {"description": "Body too large"},
    422: {"description": "Body does not match the schema"},
}


SIGNED_DOC = (
    "ed25519 signature (hex) by X-Swarm-Key over 'swarmrl-v1\\n' RUN_ID '\\n' METHOD '\\n' "
    "PATH?QUERY '\\n' X-Swarm-Timestamp '\\n' X-Swarm-Nonce '\\n' sha256(body) (see "
    "swarmrl/protocol/signing.py)"
)


def with_security(app: FastAPI) -> dict:
    """The generated document plus how each route authenticates."""
    if app.openapi_schema is not None:
        return app.openapi_schema
    from fastapi.openapi.utils import get_openapi

    doc = get_openapi(
        title=app.title, version=app.version, description=app.description, routes=app.routes
    )
    doc.setdefault("components", {})["securitySchemes"] = {
        "signed": {"type": "apiKey", "in": "header", "name": "X-Swarm-Signature", "description": SIGNED_DOC},
        "operator": {"type": "http", "scheme": "bearer", "description": "The operator's token"},
    }  # fmt: skip
    for path, ops in doc["paths"].items():
        for op in ops.values():
            if path.startswith("/v1/admin/"):
                op["security"] = [{"operator": []}]
            elif path.startswith(("/v1/nodes/", "/v1/uploads", "/v1/submit", "/v1/relays/",
                                  "/v1/validation/", "/v1/trainer/")):  # fmt: skip
                op["security"] = [{"signed": []}]
    app.openapi_schema = doc
    return doc
