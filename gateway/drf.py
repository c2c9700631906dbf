"""DRF glue: DRF's own exceptions rendered through ``gateway.errors``."""

from __future__ import annotations

from typing import Any

from django.http import HttpResponse
from rest_framework import exceptions as drf_exceptions

from gateway import errors


def to_gateway_error(exc: Exception) -> errors.GatewayError | None:
    if isinstance(exc, errors.GatewayError):
        return exc
    if isinstance(exc, drf_exceptions.ParseError):
        return errors.BadRequest(
            "We could not parse the JSON body of your request. The request body must be valid JSON.",
            code="invalid_json",
        )
    if isinstance(exc, drf_exceptions.UnsupportedMediaType):
        return errors.UnsupportedMediaType(str(exc.detail))
    if isinstance(exc, drf_exceptions.MethodNotAllowed):
        return errors.MethodNotAllowed(str(exc.detail))
    if isinstance(exc, drf_exceptions.NotAuthenticated | drf_exceptions.AuthenticationFailed):
        return errors.AuthenticationFailed(code="missing_bearer_token")
    if isinstance(exc, drf_exceptions.NotFound):
        return errors.NotFound(str(exc.detail))
    if isinstance(exc, drf_exceptions.APIException):
        return errors.GatewayError(str(exc.detail), status=exc.status_code, code=exc.default_code)
    return None


def exception_handler(exc: Exception, context: dict[str, Any]) -> HttpResponse | None:
    """DRF's ``EXCEPTION_HANDLER``: the envelope, already rendered (a plain Django response, which
    DRF passes on as it is)."""
    gerr = to_gateway_error(exc)
    if gerr is None:
        return None
    request = context["request"]  # DRF's Request: attributes it lacks are its HttpRequest's
    status, body, headers = errors.render(gerr, request.path, errors.request_id_of(request))
    return HttpResponse(body, status=status, headers=headers)
