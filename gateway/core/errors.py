"""Every error the gateway answers, and every way of rendering one.

Views and services raise a :class:`GatewayError`; only this module builds the bodies: the OpenAI
envelope, the Anthropic one on ``/v1/messages*`` (with ``request-id``), and the SSE and WebSocket
error events.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from pydantic import ValidationError

ANTHROPIC_PREFIX = "/v1/messages"

# Anthropic's error ``type`` for each status.
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    409: "invalid_request_error",
    413: "request_too_large",
    414: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    431: "request_too_large",
    503: "overloaded_error",
    529: "overloaded_error",
}


class GatewayError(Exception):
    """Base of every error that reaches a client. Subclasses fix status and type."""

    status: int = 500
    type: str = "server_error"
    code: str | None = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
        status: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        if status is not None:
            self.status = status
        self.headers = dict(headers or {})

    def to_dict(self) -> dict[str, Any]:
        return {"message": self.message, "type": self.type, "param": self.param, "code": self.code}


class BadRequest(GatewayError):
    status = 400
    type = "invalid_request_error"


class AuthenticationFailed(GatewayError):
    status = 401
    type = "authentication_error"
    code = "invalid_token"

    def __init__(self, message: str = "invalid bearer token", **kwargs: Any) -> None:
        kwargs.setdefault("headers", {"WWW-Authenticate": "Bearer"})
        super().__init__(message, **kwargs)


class PermissionDenied(GatewayError):
    status = 403
    type = "permission_error"
    code = "permission_denied"


class NotFound(GatewayError):
    status = 404
    type = "invalid_request_error"
    code = "not_found"


class MethodNotAllowed(GatewayError):
    status = 405
    type = "invalid_request_error"
    code = "method_not_allowed"


class Conflict(GatewayError):
    status = 409
    type = "invalid_request_error"
    code = "conflict"


class RequestTimeout(GatewayError):
    status = 408
    type = "invalid_request_error"
    code = "request_timeout"


class PayloadTooLarge(GatewayError):
    status = 413
    type = "invalid_request_error"
    code = "request_too_large"


class UriTooLong(GatewayError):
    status = 414
    type = "invalid_request_error"
    code = "uri_too_long"


class UnsupportedMediaType(GatewayError):
    status = 415
    type = "invalid_request_error"
    code = "unsupported_media_type"


class Unprocessable(GatewayError):
    status = 422
    type = "invalid_request_error"
    code = "unprocessable_entity"


class HeaderFieldsTooLarge(GatewayError):
    status = 431
    type = "invalid_request_error"
    code = "request_header_fields_too_large"


class RateLimited(GatewayError):
    status = 429
    type = "rate_limit_error"
    code = "rate_limit_exceeded"


class ServerError(GatewayError):
    status = 500
    type = "server_error"
    code = "internal_error"


class NotImplementedFeature(GatewayError):
    status = 501
    type = "invalid_request_error"
    code = "not_implemented"


class UpstreamError(GatewayError):
    """The upstream model server could not be reached or failed (502)."""

    status = 502
    type = "server_error"
    code = "upstream_error"


class ServiceUnavailable(GatewayError):
    status = 503
    type = "server_error"
    code = "service_unavailable"


class UpstreamTimeout(GatewayError):
    status = 504
    type = "server_error"
    code = "upstream_timeout"


def json_type_name(value: Any) -> str:
    """OpenAI's words for a JSON value's type, as in "expected an integer, but got X instead"."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a decimal number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list | tuple):
        return "an array"
    return "an object"


def invalid_type(param: str, expected: str, value: Any) -> BadRequest:
    """The 400 ``invalid_type`` refusal: ``Invalid type for 'p': expected X, but got Y instead.``"""
    return BadRequest(
        f"Invalid type for '{param}': expected {expected}, but got {json_type_name(value)} instead.",
        param=param,
        code="invalid_type",
    )


def _nul_path(value: Any, param: str) -> str | None:
    """The JSON path of the first string (key or value) in ``value`` that holds U+0000."""
    if isinstance(value, str):
        return param if "\x00" in value else None
    if isinstance(value, list):
        for index, member in enumerate(value):
            found = _nul_path(member, f"{param}[{index}]")
            if found is not None:
                return found
    elif isinstance(value, dict):
        for key, member in value.items():
            path = f"{param}.{key}" if param else str(key)
            if isinstance(key, str) and "\x00" in key:
                return param  # the key itself cannot be named: the object holding it is
            found = _nul_path(member, path)
            if found is not None:
                return found
    return None


def refuse_nul(value: Any, param: str) -> None:
    """No stored string or id may hold U+0000 (PostgreSQL cannot store it): a 400 whose ``param`` is
    the path of the first offending string in ``value``."""
    found = _nul_path(value, param)
    if found is not None:
        where = f"'{found}'" if found else "request body"
        raise BadRequest(
            f"Invalid {where}: strings must not contain U+0000, which this service cannot store.",
            param=found or None,
            code="invalid_value",
        )


def refuse_too_long(value: Any, param: str, max_length: int) -> None:
    """A string stored in a column of ``max_length`` characters: longer is a 400, on every database."""
    if isinstance(value, str) and len(value) > max_length:
        raise BadRequest(
            f"Invalid '{param}': string too long. Expected a string with maximum length {max_length}, "
            f"but got a string with length {len(value)} instead.",
            param=param,
            code="string_above_max_length",
        )


# ------------------------------------------------------------------ pydantic validation -> OpenAI 400
# What a type error expected, in OpenAI's words (pydantic's error type -> "expected X").
_EXPECTED_TYPES = {
    "string_type": "a string",
    "list_type": "an array",
    "tuple_type": "an array",
    "dict_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
    "dataclass_type": "an object",
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "int_parsing_size": "an integer",
    "float_type": "a decimal",
    "float_parsing": "a decimal",
    "bool_type": "a boolean",
    "bool_parsing": "a boolean",
}


def quoted_list(values: Sequence[str]) -> str:
    """``'a' and 'b'``, ``'a', 'b', and 'c'``: how OpenAI lists supported values."""
    quoted = [f"'{v}'" for v in values]
    if len(quoted) <= 2:
        return " and ".join(quoted)
    return ", ".join(quoted[:-1]) + ", and " + quoted[-1]


def missing_parameter(param: str) -> BadRequest:
    return BadRequest(
        f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter"
    )


def invalid_value(param: str, value: Any, supported: Sequence[str]) -> BadRequest:
    return BadRequest(
        f"Invalid value: '{value}'. Supported values are: {quoted_list(supported)}.",
        param=param,
        code="invalid_value",
    )


def _json_path(prefix: str, loc: tuple[Any, ...], data: Any, *, missing: bool) -> tuple[str, Any]:
    """``input[0].content[1].text`` for a pydantic ``loc``, and the value there; union branches and
    discriminator tags (in ``loc``, not in the data) are dropped by walking the data alongside."""
    path = prefix
    value = data
    for i, segment in enumerate(loc):
        last = i == len(loc) - 1
        if isinstance(segment, int) and isinstance(value, list) and 0 <= segment < len(value):
            path += f"[{segment}]"
            value = value[segment]
        elif (
            isinstance(segment, str) and isinstance(value, dict) and (segment in value or (missing and last))
        ):
            # A missing field is named in loc and absent from the data.
            path += f".{segment}" if path else segment
            value = value.get(segment)
    return path, value


def validation_error(
    exc: ValidationError, data: Any, *, param: str = "", tags: Sequence[str] | None = None
) -> BadRequest:
    """The one mapping of a pydantic :class:`ValidationError` to the OpenAI 400.

    ``param`` is ``data``'s JSON path in the request; ``tags`` the supported ``type`` values of a
    tagged union. Of a union's per-branch failures, the deepest is the branch the client chose.
    """
    located = [
        (_json_path(param, tuple(f["loc"]), data, missing=f["type"] in ("missing", "missing_argument")), f)
        for f in exc.errors(include_url=False)
    ]
    (path, value), first = max(located, key=lambda pair: pair[0][0].count(".") + pair[0][0].count("["))
    kind = first["type"]
    ctx = first.get("ctx") or {}
    if kind in ("missing", "missing_argument"):
        return missing_parameter(path)
    if kind == "union_tag_invalid":
        expected = tags if tags is not None else _quoted_words(str(ctx.get("expected_tags", "")))
        return invalid_value(f"{path}.type" if path else "type", ctx.get("tag"), expected)
    if kind == "union_tag_not_found":
        return missing_parameter(f"{path}.type" if path else "type")
    if kind == "literal_error":
        return invalid_value(path, value, _quoted_words(str(ctx.get("expected", ""))))
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        below = kind.startswith("greater")
        bound = ctx.get("ge", ctx.get("gt")) if below else ctx.get("le", ctx.get("lt"))
        what = "integer" if isinstance(value, int) else "decimal"
        return BadRequest(
            f"Invalid '{path}': {what} {'below minimum' if below else 'above maximum'} value. "
            f"Expected a value {'>=' if below else '<='} {bound}, but got {value} instead.",
            param=path,
            code=f"{what}_{'below_min' if below else 'above_max'}_value",
        )
    if kind in _EXPECTED_TYPES:
        # ``content: str | list`` reports both branches; say both in one sentence.
        branches = {f["type"] for (at, _), f in located if at == path}
        if {"string_type", "list_type"} <= branches:
            return invalid_type(path, "a string or an array", value)
        return invalid_type(path, _EXPECTED_TYPES[kind], value)
    return BadRequest(f"Invalid '{path}': {first['msg']}.", param=path or None, code="invalid_value")


def _quoted_words(expected: str) -> list[str]:
    """pydantic's ``'a', 'b' or 'c'`` as a list."""
    return re.findall(r"'([^']*)'", expected)


def is_anthropic_path(path: str) -> bool:
    return path == ANTHROPIC_PREFIX or path.startswith(ANTHROPIC_PREFIX + "/")


def anthropic_request_id(request_id: str | None) -> str:
    """The ``req_``-prefixed id Anthropic clients expect; reuses the request's id when it fits."""
    from gateway.core.ids import new_request_id

    if request_id and request_id.startswith("req_"):
        return request_id
    return new_request_id()


def server_error() -> GatewayError:
    """The 500 for a failure of ours the client is told nothing more about (OpenAI's wording)."""
    return ServerError("The server had an error while processing your request.")


def as_gateway_error(exc: BaseException) -> GatewayError:
    if isinstance(exc, GatewayError):
        return exc
    return server_error()


def payload_too_large(limit: int) -> GatewayError:
    """The 413 for a request body over the ceiling (the connection is closed after it)."""
    return PayloadTooLarge(
        f"Request body exceeds the maximum size of {limit} bytes.", headers={"Connection": "close"}
    )


def upload_too_large(limit: int) -> GatewayError:
    """The 413 for a file upload over ``[files] max_upload_bytes`` (the connection is closed after it)."""
    return PayloadTooLarge(
        f"File exceeds the maximum upload size of {limit} bytes.",
        param="file",
        code="file_too_large",
        headers={"Connection": "close"},
    )


def unknown_route(method: str, path: str) -> GatewayError:
    """The 404 for a path nothing serves."""
    return NotFound(f"Invalid URL ({method} {path})", code="unknown_route")


_CLOSE = {"Connection": "close"}


def request_timeout(seconds: float) -> GatewayError:
    """The 408 for a request whose head or body did not arrive in time (the connection is closed)."""
    return RequestTimeout(f"The request was not received within {seconds:g}s.", headers=_CLOSE)


def head_too_large(limit: int) -> GatewayError:
    """The 431 for a request line and headers over ``limit`` bytes together."""
    return HeaderFieldsTooLarge(
        f"The request headers exceed the maximum size of {limit} bytes.", headers=_CLOSE
    )


def too_many_headers(limit: int) -> GatewayError:
    return HeaderFieldsTooLarge(f"The request has more than {limit} header fields.", headers=_CLOSE)


def uri_too_long(limit: int) -> GatewayError:
    return UriTooLong(f"The request line exceeds the maximum size of {limit} bytes.", headers=_CLOSE)


def shutting_down() -> GatewayError:
    """The 503 for a request that arrives while the server drains (SIGTERM; ``gateway.core.lifecycle``)."""
    return ServiceUnavailable(
        "The server is shutting down; send this request again on a new connection.",
        code="server_shutting_down",
        headers=_CLOSE,
    )


def quota_exceeded(kind: str, message: str, headers: dict[str, str]) -> GatewayError:
    """The 429 of a quota: OpenAI's envelope carries ``type`` ``requests`` or ``tokens`` (what ran
    out) and ``code`` ``rate_limit_exceeded``; Anthropic's is its ``rate_limit_error``."""
    exc = RateLimited(message, headers=headers)
    exc.type = kind
    return exc


def render(exc: GatewayError, path: str, request_id: str | None) -> tuple[int, bytes, dict[str, str]]:
    """Status, JSON body and extra headers for ``exc`` in the envelope of ``path``."""
    headers = dict(exc.headers)
    headers["Content-Type"] = "application/json"
    if is_anthropic_path(path):
        rid = anthropic_request_id(request_id)
        body = {
            "type": "error",
            "error": {"type": _ANTHROPIC_TYPES.get(exc.status, "api_error"), "message": exc.message},
            "request_id": rid,
        }
        headers["request-id"] = rid
    else:
        body = {"error": exc.to_dict()}
    return exc.status, orjson.dumps(body), headers


def django_response(exc: GatewayError, request: Any) -> Any:
    """A Django ``HttpResponse`` for ``exc`` answering ``request``."""
    from django.http import HttpResponse

    status, body, headers = render(exc, request.path, request_id_of(request))
    response = HttpResponse(body, status=status, content_type="application/json")
    for name, value in headers.items():
        response[name] = value
    return response


async def asgi_send(send: Any, exc: GatewayError, scope: dict[str, Any]) -> None:
    """Answer an ASGI HTTP request with ``exc`` (used below Django, e.g. by the body ceiling)."""
    status, body, headers = render(exc, scope.get("path", ""), scope.get("gateway.request_id"))
    raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
    raw.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def request_id_of(request: Any) -> str | None:
    scope = getattr(request, "scope", None)
    if isinstance(scope, dict):
        return scope.get("gateway.request_id")
    return None


def responses_sse_error(exc: GatewayError, sequence_number: int) -> bytes:
    """The Responses stream ``error`` event (``openai.types.responses.ResponseErrorEvent``)."""
    event = {
        "type": "error",
        "code": exc.code,
        "message": exc.message,
        "param": exc.param,
        "sequence_number": sequence_number,
    }
    return b"event: error\ndata: " + orjson.dumps(event) + b"\n\n"


def openai_sse_error(exc: GatewayError) -> bytes:
    """An error chunk in the Chat Completions stream style (``data: {"error": …}``)."""
    return b"data: " + orjson.dumps({"error": exc.to_dict()}) + b"\n\n"


def anthropic_sse_error(exc: GatewayError) -> bytes:
    """The Anthropic Messages stream ``error`` event."""
    event = {
        "type": "error",
        "error": {"type": _ANTHROPIC_TYPES.get(exc.status, "api_error"), "message": exc.message},
    }
    return b"event: error\ndata: " + orjson.dumps(event) + b"\n\n"


def ws_error_event(exc: GatewayError, stream_id: str | None = None) -> dict[str, Any]:
    """The WebSocket error event: ``{"type":"error","stream_id","status","error":{…}}``."""
    event: dict[str, Any] = {"type": "error"}
    if stream_id is not None:
        event["stream_id"] = stream_id
    event["status"] = exc.status
    event["error"] = {
        "message": exc.message,
        "type": exc.type,
        "code": exc.code,
        "param": exc.param,
    }
    return event


def ws_steer_failed_event(
    *,
    code: str,
    message: str,
    previous_response_id: str,
    submitted_input: Any,
    steer_id: str | None,
    sequence_number: int,
    stream_id: str | None,
) -> dict[str, Any]:
    """``response.steer.failed`` (the SDK's ``BetaResponseSteerFailedEvent``): the submitted input
    comes back with the failure code, and the steering ID once one was allocated."""
    steer: dict[str, Any] = {"input": submitted_input, "previous_response_id": previous_response_id}
    if steer_id is not None:
        steer["id"] = steer_id
    event: dict[str, Any] = {
        "type": "response.steer.failed",
        "error": {"code": code, "message": message, "type": "invalid_request_error"},
        "sequence_number": sequence_number,
        "steer": steer,
    }
    if stream_id is not None:
        event["stream_id"] = stream_id
    return event
