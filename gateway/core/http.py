"""Small helpers shared by the JSON views: method checks and strict JSON body parsing."""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine
from typing import Any

import orjson
from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt

from gateway.core import errors

View = Callable[..., Coroutine[Any, Any, HttpResponse]]


def allow_methods(*methods: str) -> Callable[[View], View]:
    """Refuse other methods with a 405 envelope (and an ``Allow`` header); render refusals."""
    allowed = {m.upper() for m in methods}

    def decorate(view: View) -> View:
        @functools.wraps(view)
        async def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            try:
                if request.method not in allowed:
                    raise errors.MethodNotAllowed(
                        f"Method {request.method} is not allowed on {request.path}.",
                        headers={"Allow": ", ".join(sorted(allowed))},
                    )
                return await view(request, *args, **kwargs)
            except errors.GatewayError as exc:
                # Rendered here, on the event loop: Django's exception middleware hook is
                # synchronous and would cost a thread hop for every refusal.
                return errors.django_response(exc, request)

        wrapper.allowed_methods = frozenset(allowed)  # type: ignore[attr-defined]  # for the OpenAPI test
        return csrf_exempt(wrapper)  # type: ignore[return-value]

    return decorate


def parse_json_body(request: HttpRequest, *, require_object: bool = True) -> Any:
    """The request's JSON body; a wrong content type or malformed JSON is a 400 envelope."""
    content_type = request.content_type or ""
    if content_type != "application/json" and not content_type.endswith("+json"):
        raise errors.BadRequest(
            f"Invalid Content-Type header ({content_type or 'none'}), expected application/json.",
            code="invalid_content_type",
        )
    try:
        data = orjson.loads(request.body)
    except orjson.JSONDecodeError:
        raise errors.BadRequest(
            "We could not parse the JSON body of your request. The request body must be valid JSON.",
            code="invalid_json",
        ) from None
    if require_object and not isinstance(data, dict):
        raise errors.BadRequest("The request body must be a JSON object.", code="invalid_json")
    return data


def json_response(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> HttpResponse:
    response = HttpResponse(orjson.dumps(data), status=status, content_type="application/json")
    for key, value in (headers or {}).items():
        response[key] = value
    return response
