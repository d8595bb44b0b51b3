"""How every orchestrator route reads a request: the caller first, then strict JSON.

`CheckedRoute` is the app's route class (orchestrator/app.py sets it before any
route is added). It runs a route's caller check (a signed route's
`authenticate`, an operator route's token) before FastAPI reads the body, and
then refuses a body that is not strict JSON with 400 (`strict_json`), so that
neither an unauthenticated caller nor a value the server cannot store or write
back gets further. `add_refusals` installs how the app answers what it refuses
(an ApiError, a bad body, a client that hung up).
"""

from __future__ import annotations

import math

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.requests import ClientDisconnect

from swarmrl.orchestrator.service import ApiError


class CheckedRoute(APIRoute):
    """A route that authenticates before it reads the body, and reads JSON strictly.

    FastAPI decodes a JSON body before it runs any dependency, so an unsigned
    request with a broken body would learn 422 (and the schema) before it was
    refused. Here the caller is checked first (a signed route: the signature and
    role, 401/403; an operator route: the token, 401) and kept on
    `request.state.caller`; then a JSON body must be strict JSON (`strict_json`:
    no NaN, no infinity, no lone surrogate, 400) before FastAPI validates it."""

    def get_route_handler(self):
        handler = super().get_route_handler()
        check = next(
            (d.call for d in self.dependant.dependencies if hasattr(d.call, "authenticate")),
            None,
        )
        has_body = self.body_field is not None

        async def checked(request: Request) -> Response:
            if check is not None:
                request.state.caller = await check.authenticate(request)
            if has_body:
                strict_json(await request.body())
            return await handler(request)

        return checked


def strict_json(body: bytes) -> None:
    """ApiError 400 unless `body` is JSON that any JSON reader reads the same way:
    UTF-8, no NaN or Infinity (Python's reader takes them, the standard does not),
    no number too large for a double, no unpaired surrogate in a string."""
    import json
    import math

    def refuse(what: str):
        raise ApiError(400, f"the body is not strict JSON: {what}")

    def no_constant(name: str):
        refuse(f"{name} is not a JSON number")

    def finite(text: str) -> float:
        x = float(text)
        if not math.isfinite(x):
            refuse(f"the number {text[:40]} does not fit a double")
        return x

    try:
        stack = [json.loads(body.decode("utf-8"), parse_constant=no_constant, parse_float=finite)]
    except UnicodeDecodeError:
        refuse("not UTF-8")
    except RecursionError:
        refuse("nested too deeply")
    except ValueError:
        return  # not JSON at all: FastAPI's validation names the error (422)
    while stack:  # a \\uD800 escape unescapes to a lone surrogate, which UTF-8 cannot encode
        x = stack.pop()
        texts = [x] if isinstance(x, str) else list(x) if isinstance(x, dict) else []
        try:
            for t in texts:
                t.encode("utf-8")
        except UnicodeEncodeError:
            refuse("a string holds an unpaired surrogate")
        stack.extend(x.values() if isinstance(x, dict) else x if isinstance(x, list) else ())


def add_refusals(app: FastAPI) -> None:
    """How the app answers what it refuses: an ApiError as its status and detail, a bad
    body as 422 naming each field, a client that hung up as 400."""
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(RequestValidationError, _invalid_body)
    app.add_exception_handler(ClientDisconnect, _gone)


async def _api_error(_request, e: ApiError):
    headers = None
    if e.retry_after_s is not None:
        headers = {"Retry-After": str(max(1, math.ceil(e.retry_after_s)))}
    return JSONResponse({"detail": e.detail}, status_code=e.status, headers=headers)


async def _gone(_request, _e: ClientDisconnect):
    """The client hung up (or was cut off by orchestrator/connections.py) while its
    body was read: no one reads an answer, and it is not the server's error."""
    return Response(status_code=400)


async def _invalid_body(_request, e: RequestValidationError):
    """422 naming each bad field, without echoing its input: a NaN or an infinity (which
    Python's JSON reader accepts) cannot be written back as JSON, and FastAPI's own
    handler would fail on it with a 500."""
    errors = [
        {"loc": [_printable(p) for p in x["loc"]], "msg": _printable(x["msg"]),
         "type": _printable(x["type"])}
        for x in e.errors()
    ]  # fmt: skip
    return JSONResponse({"detail": errors}, status_code=422)


def _printable(part):
    """A location or message part safe to write back: an int as it is, anything else
    as text of at most 100 characters that UTF-8 can encode."""
    if type(part) is int:
        return part
    text = str(part)[:100]
    return text.encode("utf-8", "replace").decode("utf-8")
