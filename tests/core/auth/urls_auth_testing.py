"""A test-only URLconf for the auth tests: who am I, an upstream forward, owned stored items."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from django.urls import include, path

from conversations_app.models import Item
from gateway.core import errors
from gateway.core.auth import aowned_get, owned, stored_state_view
from gateway.core.config import get_config
from gateway.core.http import allow_methods, json_response, parse_json_body
from gateway.core.ids import new_id
from gateway.core.principal import credential_consumed, request_principal
from inference_app.upstream.http import forward_headers, get_upstream


@allow_methods("GET")
async def whoami(request: HttpRequest) -> HttpResponse:
    principal = request_principal(request)
    return json_response(
        {
            "owner": principal.owner,
            "kind": principal.kind,
            "subject": principal.subject,
            "expires_at": principal.expires_at,
            "credential_consumed": credential_consumed(request),
        }
    )


@allow_methods("POST")
async def forward(request: HttpRequest) -> HttpResponse:
    """What a pass-through route does: the caller's headers, minus a consumed credential."""
    headers = forward_headers(
        list(request.headers.items()),
        get_config(),
        caller_credential_consumed=credential_consumed(request),
    )
    answer = await get_upstream().send("POST", "/v1/chat/completions", body=request.body, headers=headers)
    body = await answer.read()
    return HttpResponse(body, status=answer.status, content_type=answer.content_type or "application/json")


@allow_methods("POST")
async def item_create(request: HttpRequest) -> HttpResponse:
    data = parse_json_body(request)
    item = await Item.objects.acreate(
        id=new_id("msg"), owner=request_principal(request).owner, type="message", data=data
    )
    return json_response({"id": item.id, "data": item.data}, status=201)


@allow_methods("GET", "DELETE")
@stored_state_view
async def item_detail(request: HttpRequest, item_id: str) -> HttpResponse:
    principal = request_principal(request)
    item = await aowned_get(
        Item.objects.all(), principal, id=item_id, not_found=f"Item with id '{item_id}' not found."
    )
    if request.method == "DELETE":
        deleted, _ = await owned(Item.objects.filter(id=item.id), principal).adelete()
        if not deleted:
            raise errors.NotFound(f"Item with id '{item_id}' not found.")
        return json_response({"id": item_id, "deleted": True})
    return json_response({"id": item.id, "data": item.data})


urlpatterns: list[Any] = [
    path("v1/test/whoami", whoami),
    path("v1/test/forward", forward),
    path("v1/test/items", item_create),
    path("v1/test/items/<str:item_id>", item_detail),
    path("", include("gateway.urls")),
]
