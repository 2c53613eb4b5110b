"""Every refusal as OpenAI's error JSON: ``{"error": {"message", "type", "param", "code"}}``.

    a body the models refuse       400, the field in ``param`` (pydantic's error -> one line that
                                   says what the field must be and what was sent, in JSON's spelling)
    a body that is not JSON        400; sent as another content type (a form): 415
    a route or method not served   404 / 405 (OpenAI's "Invalid URL"), not FastAPI's {"detail": ...}
    ApiError                       whatever api.py raises: its own status, type and param

A message is one line: the problem and the fix.
"""
from __future__ import annotations

import json

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException

from .protocol import MODELS, ChatMessage, ResponseFormat, StreamOptions, TextPart

#: a nested object's name and model, by the top-level field that holds it (for "unknown field" errors)
NESTED = {"stream_options": ("stream_options", StreamOptions), "messages": ("a message", ChatMessage),
          "response_format": ("response_format", ResponseFormat)}
DOCS = ("/docs", "/redoc", "/openapi.json")
TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict"}     # pydantic's names for a union's members


class ApiError(Exception):
    """An error the client gets as OpenAI's JSON."""

    def __init__(self, status: int, message: str, param: str | None = None, type: str = "invalid_request_error",
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.type, self.code = status, message, param, type, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def error_response(e: ApiError, headers: dict | None = None) -> Response:
    """OpenAI's error JSON, ASCII-escaped: a message may quote the request, lone surrogates and all."""
    return Response(json.dumps(e.body()), status_code=e.status, media_type="application/json", headers=headers)


def spell(value, limit: int = 60) -> str:
    """A value as JSON writes it (true, null, "text"), cut to ``limit`` characters."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _where(loc: tuple) -> str:
    """("messages", 1, "str", "content") -> "messages[1].content" (a union member's tag left out)."""
    out = str(loc[0])
    for x in loc[1:]:
        if isinstance(x, int):
            out += f"[{x}]"
        elif x.isidentifier() and x not in TYPE_TAGS:
            out += f".{x}"
    return out


def _unknown(loc: tuple, model) -> ApiError:
    name, where = loc[-1], _where(loc)
    if len(loc) == 1:
        return ApiError(400, f"{name}: unknown parameter (this server takes: {', '.join(sorted(model.model_fields))})",
                        name)
    inner = ("a content part", TextPart) if loc[0] == "messages" and "content" in loc else NESTED.get(loc[0])
    takes = f" ({inner[0]} takes: {', '.join(inner[1].model_fields)})" if inner else ""
    return ApiError(400, f"{where}: unknown field{takes}: leave it out", str(loc[0]))


def _body_error(e: dict, body) -> ApiError:
    """An error about the body as a whole (loc is just ("body",))."""
    if e["type"] == "string_unicode" and isinstance(body, dict):        # a key pydantic cannot read
        bad = next((k for k in body if isinstance(k, str) and not k.isascii() and _surrogate(k)), None)
        if bad is not None:
            return ApiError(400, f"{spell(bad)}: a field name with an unpaired surrogate (UTF-8 cannot encode it): "
                                 "leave it out", bad)
    got = "nothing" if e["type"] == "missing" else spell(e.get("input"))
    return ApiError(400, f"the request body must be a JSON object, got {got}")


def _surrogate(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def from_validation(request: Request, exc: RequestValidationError) -> ApiError:
    """pydantic's first error (an unknown field first, as it says the most) -> one ApiError."""
    ctype = request.headers.get("content-type", "application/json").split(";")[0].strip().lower()
    if not (ctype == "application/json" or ctype.endswith("+json")):
        return ApiError(415, f"the request body must be JSON: send Content-Type: application/json, not {ctype}")
    errors = exc.errors()
    e = next((x for x in errors if x["type"] == "extra_forbidden"), errors[0])
    loc = tuple(e["loc"][1:]) if tuple(e["loc"][:1]) == ("body",) else tuple(e["loc"])
    model = MODELS.get(request.url.path)
    if e["type"] == "json_invalid":
        at = f" at character {loc[0]}" if loc else ""
        return ApiError(400, f"the request body is not valid JSON: {e.get('ctx', {}).get('error', e['msg'])}{at}")
    if e["type"] == "refused":                         # a model validator's own check (protocol.refuse)
        return ApiError(400, e["ctx"]["message"], e["ctx"]["param"])
    if not loc:
        return _body_error(e, exc.body)
    param = str(loc[0])
    if e["type"] == "extra_forbidden":
        return _unknown(loc, model)
    info = model.model_fields.get(param) if model else None
    if e["type"] == "missing":
        what = f": {info.description}" if len(loc) == 1 else f" ({param} must be {info.description})"
        return ApiError(400, f"{_where(loc)}: is required" + (what if info and info.description else ""), param)
    if info is None or not info.description:
        return ApiError(400, f"{_where(loc)}: {e['msg']}, got {spell(e.get('input'))}", param)
    where = _where(loc)
    at = f" at {where}" if where != param else ""
    return ApiError(400, f"{param}: must be {info.description}, got {spell(e.get('input'))}{at}", param)


def from_http(request: Request, exc: HTTPException) -> tuple[ApiError, dict | None]:
    """Starlette's own refusals: no such route (404), wrong method (405), a body it could not read."""
    method, path = request.method, request.url.path
    if exc.status_code == 404:
        routes = sorted(f"{m} {r.path}" for r in request.app.routes for m in getattr(r, "methods", None) or ()
                        if m != "HEAD" and not r.path.startswith(DOCS))
        return ApiError(404, f"Invalid URL ({method} {path}): this server serves {', '.join(routes)} "
                             "(GET /docs describes them)"), None
    if exc.status_code == 405:
        allow = (exc.headers or {}).get("Allow", "")
        return ApiError(405, f"Invalid method ({method} {path}): use {allow}"), exc.headers
    if exc.status_code == 400 and isinstance(exc.__cause__, RecursionError):
        return ApiError(400, "the request body is nested too deeply: send a flatter JSON object"), None
    return ApiError(exc.status_code, f"{exc.detail}"), exc.headers


def install(app: FastAPI) -> None:
    """The handlers, so that every refusal the app makes is OpenAI's error JSON."""
    @app.exception_handler(ApiError)
    async def api_error(request, e: ApiError):
        return error_response(e)

    @app.exception_handler(RequestValidationError)
    async def invalid(request, exc: RequestValidationError):
        return error_response(from_validation(request, exc))

    @app.exception_handler(HTTPException)
    async def http_error(request, exc: HTTPException):
        err, headers = from_http(request, exc)
        return error_response(err, headers)
