"""Django REST framework for the resource endpoints, through DRF's documented extension points only.

:class:`ResourceView` views get the principal as ``request.user`` (:class:`PrincipalAuthentication`),
the ``OPENAI_API_KEY`` rule as a permission (:class:`StoredStateAccess`), errors rendered through
``gateway.core.errors`` (:func:`exception_handler`) and OpenAI's list shape
(:class:`OpenAIListPagination`). :func:`async_view` runs the whole sync view as one
:func:`gateway.core.db.run_orm` call, so the event loop never waits on the database.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import json
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, Generic, Literal, TypeVar

import orjson
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBase
from drf_spectacular.utils import OpenApiParameter
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.json_schema import SkipJsonSchema
from rest_framework import exceptions as drf_exceptions
from rest_framework.authentication import BaseAuthentication
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.pagination import BasePagination
from rest_framework.parsers import JSONParser
from rest_framework.permissions import BasePermission
from rest_framework.renderers import BaseRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from gateway.core import errors
from gateway.core.auth import require_stored_state_access
from gateway.core.db import run_orm
from gateway.core.principal import Principal, request_principal

T = TypeVar("T")

# -- errors --------------------------------------------------------------------------------------


def to_gateway_error(exc: Exception) -> errors.GatewayError | None:
    """The gateway error a DRF (or Django) exception stands for; ``None``: not a client error."""
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
    if isinstance(exc, drf_exceptions.NotFound | Http404):
        return errors.NotFound(str(exc))
    if isinstance(exc, drf_exceptions.PermissionDenied):
        return errors.PermissionDenied(str(exc.detail))
    if isinstance(exc, drf_exceptions.Throttled):
        return errors.RateLimited(str(exc.detail))
    if isinstance(exc, drf_exceptions.APIException):
        if exc.status_code >= 500:
            return errors.ServerError(str(exc.detail), status=exc.status_code, code=exc.default_code)
        return errors.BadRequest(str(exc.detail), status=exc.status_code, code=exc.default_code)
    return None


def exception_handler(exc: Exception, context: dict[str, Any]) -> HttpResponse | None:
    """DRF's ``EXCEPTION_HANDLER``: ``gateway.core.errors``' envelope, or ``None`` (a 500) for anything
    that is not a client error."""
    gerr = to_gateway_error(exc)
    if gerr is None:
        return None
    response: HttpResponse = errors.django_response(gerr, context["request"])
    return response


# -- authentication and permission ---------------------------------------------------------------


class PrincipalAuthentication(BaseAuthentication):
    """DRF's ``request.user`` is the principal the gateway's auth layer already set (it refused bad
    credentials before routing)."""

    def authenticate(self, request: Request) -> tuple[Principal, None]:
        return request_principal(request), None

    def authenticate_header(self, request: Request) -> str:
        return "Bearer"  # without it DRF would turn a 401 into a 403


class StoredStateAccess(BasePermission):
    """Stored state on an open gateway with ``OPENAI_API_KEY`` set is for that key's holder only (401)."""

    def has_permission(self, request: Request, view: Any) -> bool:
        view.check_stored_state_access(request)  # raises the 401
        return True


# -- rendering and negotiation -------------------------------------------------------------------


class JSONRenderer(BaseRenderer):
    """``application/json`` by orjson, the serializer every lean route uses."""

    media_type = "application/json"
    format = "json"
    charset = None

    def render(
        self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None
    ) -> bytes:
        try:
            return orjson.dumps(data)
        except TypeError:
            # An integer beyond 64 bits: PostgreSQL's jsonb hands back 1e+23 as 100000000000000000000000.
            return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()


class JSONOnly(BaseContentNegotiation):
    """Every resource endpoint answers JSON whatever ``Accept`` says (as the lean routes do): no 406."""

    def select_parser(self, request: Request, parsers: list[Any]) -> Any:
        return parsers[0] if parsers else None

    def select_renderer(
        self, request: Request, renderers: list[Any], format_suffix: str | None = None
    ) -> tuple[Any, str]:
        return renderers[0], renderers[0].media_type


# -- pagination ----------------------------------------------------------------------------------

LIST_LIMIT_DEFAULT = 20
LIST_LIMIT_MAX = 100


class ListParams(BaseModel):
    """OpenAI's list parameters (the query of every list endpoint; :func:`parse_list_params`)."""

    model_config = ConfigDict(frozen=True)

    after: str | SkipJsonSchema[None] = Field(
        None, description="An item id; the page continues past it in the chosen order."
    )
    limit: int = Field(LIST_LIMIT_DEFAULT, ge=1, le=LIST_LIMIT_MAX, description="Items per page, 1 to 100.")
    order: Literal["asc", "desc"] = "desc"


# ``ListParams`` as the document's query parameters of a list endpoint.
LIST_PARAMETERS = [
    OpenApiParameter(
        name,
        {k: v for k, v in schema.items() if k not in ("title", "description") and v is not None},
        description=schema.get("description", ""),
    )
    for name, schema in ListParams.model_json_schema()["properties"].items()
]


class ListPage(BaseModel, Generic[T]):
    """OpenAI's list (:func:`list_body`); an endpoint's answer is a named subclass of ``ListPage[Item]``."""

    object: Literal["list"]
    data: list[T]
    first_id: str | None
    last_id: str | None
    has_more: bool


def _integer(param: str, raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise errors.BadRequest(
            f"Invalid '{param}': expected an integer, but got '{raw}' instead.",
            param=param,
            code="invalid_type",
        ) from None


def parse_list_params(query: Mapping[str, Any]) -> ListParams:
    """The query's :class:`ListParams`; anything else is a 400 naming the parameter."""
    raw: dict[str, Any] = {"after": query.get("after") or None, "order": query.get("order", "desc")}
    if "limit" in query:
        raw["limit"] = _integer("limit", query.get("limit") or "")
    errors.refuse_nul(raw["after"], "after")
    try:
        return ListParams.model_validate(raw)
    except ValidationError as exc:
        raise errors.validation_error(exc, raw) from None


PageFetch = Callable[[ListParams], tuple[list[dict[str, Any]], bool]]


class OpenAIListPagination(BasePagination):
    """OpenAI's list shape with ``after`` / ``order`` / ``limit``; a keyset page read by the view's
    selector, never an offset."""

    def paginate(self, request: Request, fetch: PageFetch) -> list[dict[str, Any]]:
        self.params = parse_list_params(request.query_params)
        data, self.has_more = fetch(self.params)
        return data

    def get_paginated_response(self, data: Any) -> Response:
        return Response(list_body(data, has_more=self.has_more))


def list_body(data: list[dict[str, Any]], *, has_more: bool) -> dict[str, Any]:
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": has_more,
    }


# -- views ---------------------------------------------------------------------------------------


class ResourceView(APIView):
    """The base of every resource endpoint (see the module docstring)."""

    authentication_classes = [PrincipalAuthentication]
    permission_classes = [StoredStateAccess]
    renderer_classes = [JSONRenderer]
    parser_classes = [JSONParser]  # documents the JSON bodies; bodies are read by parse_body
    content_negotiation_class = JSONOnly
    metadata_class = None  # OPTIONS is a 405 like on every other route (CORS preflights never get here)
    http_method_names = ["get", "post", "delete"]  # HEAD too is a 405
    pagination_class = OpenAIListPagination

    def check_stored_state_access(self, request: Request) -> None:
        """The stored-state rule (``gateway.core.auth``); a view module may name its own entry point."""
        require_stored_state_access(request)

    @property
    def principal(self) -> Principal:
        principal: Principal = self.request.user
        return principal

    @property
    def owner(self) -> str:
        return self.principal.owner

    @property
    def allowed_methods(self) -> list[str]:
        return sorted(m.upper() for m in self.http_method_names if hasattr(self, m))

    def http_method_not_allowed(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        raise errors.MethodNotAllowed(
            f"Method {request.method} is not allowed on {request.path}.",
            headers={"Allow": ", ".join(self.allowed_methods)},
        )

    def paginate(self, fetch: PageFetch) -> Response:
        paginator = self.pagination_class()
        return paginator.get_paginated_response(paginator.paginate(self.request, fetch))


_loop: contextvars.ContextVar[asyncio.AbstractEventLoop] = contextvars.ContextVar("gateway_drf_loop")


def on_loop(fn: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run ``fn()`` on the event loop serving this request (from a view :func:`async_view` runs)."""
    return asyncio.run_coroutine_threadsafe(fn(), _loop.get()).result()


def _respond(view: Callable[..., HttpResponseBase], request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
    response = view(request, *args, **kwargs)
    if isinstance(response, Response):
        # Rendered here, on the ORM thread: a DRF Response handed to async Django would cost
        # another hop to a thread of asgiref's just to be rendered.
        response.render()
        plain = HttpResponse(response.content, status=response.status_code)
        for name, value in response.items():
            plain[name] = value
        return plain
    return response


def async_view(
    view_class: type[APIView], **initkwargs: Any
) -> Callable[..., Coroutine[Any, Any, HttpResponseBase]]:
    """``view_class.as_view(**initkwargs)`` served from async Django as one ``run_orm`` call; keeps
    ``cls`` / ``initkwargs`` so drf-spectacular still sees a DRF view."""
    view = view_class.as_view(**initkwargs)

    @functools.wraps(view)
    async def serve(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        token = _loop.set(asyncio.get_running_loop())
        try:
            response: HttpResponseBase = await run_orm(_respond, view, request, *args, **kwargs)
        finally:
            _loop.reset(token)
        return response

    return serve
