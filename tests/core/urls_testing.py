"""A test-only URLconf: one JSON view using the shared parsing helpers."""

from django.http import HttpRequest, HttpResponse
from django.urls import include, path

from gateway.core.http import allow_methods, json_response, parse_json_body


@allow_methods("POST")
async def echo(request: HttpRequest) -> HttpResponse:
    return json_response({"echo": parse_json_body(request)})


@allow_methods("POST")
async def boom(request: HttpRequest) -> HttpResponse:
    raise RuntimeError("secret internal detail")


urlpatterns = [
    path("v1/test/echo", echo),
    path("v1/test/boom", boom),
    path("", include("gateway.urls")),
]
