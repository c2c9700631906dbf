"""Stored-state access: objects record the caller's principal, another owner's id answers 404, and an
open gateway with ``OPENAI_API_KEY`` set serves stored state only to a caller presenting that key."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from asgiref.sync import sync_to_async
from django.test import AsyncClient

from conversations_app.models import Item
from gateway.core import errors
from gateway.core.auth import apikeys, owned, owned_get, owner_filter
from gateway.core.principal import Principal
from tests.core.auth.auth_helpers import WHOAMI, assert_refused, bearer, get, make_item
from tests.oidc_provider import IdentityProvider

pytestmark = [pytest.mark.urls("tests.core.auth.urls_auth_testing"), pytest.mark.django_db(transaction=True)]


def not_found(item_id: str) -> dict[str, Any]:
    return {
        "error": {
            "message": f"Item with id '{item_id}' not found.",
            "type": "invalid_request_error",
            "param": None,
            "code": "not_found",
        }
    }


async def test_cross_owner_read_and_delete_answer_404_with_api_keys() -> None:
    (a, secret_a) = await sync_to_async(apikeys.apikey_create)(name="alice")
    (_, secret_b) = await sync_to_async(apikeys.apikey_create)(name="bob")
    client = AsyncClient()
    created = await client.post(
        "/v1/test/items", {"text": "hi"}, content_type="application/json", headers=bearer(secret_a)
    )
    assert created.status_code == 201
    item_id = created.json()["id"]
    stored = await Item.objects.aget(id=item_id)
    assert stored.owner == f"key:{a.pk}"

    assert (await client.get(f"/v1/test/items/{item_id}", headers=bearer(secret_a))).status_code == 200
    other = await client.get(f"/v1/test/items/{item_id}", headers=bearer(secret_b))
    assert other.status_code == 404
    # Exactly the answer for an id that does not exist: nothing to probe.
    assert other.json() == not_found(item_id)
    missing = await client.get("/v1/test/items/msg_nope", headers=bearer(secret_b))
    assert missing.json() == not_found("msg_nope")

    refused = await client.delete(f"/v1/test/items/{item_id}", headers=bearer(secret_b))
    assert refused.status_code == 404
    assert await Item.objects.filter(id=item_id).aexists()


async def test_refused_request_stores_nothing() -> None:
    await sync_to_async(apikeys.apikey_create)(name="only")
    response = await AsyncClient().post("/v1/test/items", {"text": "hi"}, content_type="application/json")
    assert response.status_code == 401
    assert await Item.objects.acount() == 0


def test_cross_owner_read_answers_404_with_oidc_subjects(
    live_gateway: Any, idp: IdentityProvider, oidc: Any
) -> None:
    alice, bob = bearer(idp.mint(sub="alice")), bearer(idp.mint(sub="bob"))
    created = httpx.post(f"{live_gateway.url}/v1/test/items", json={"t": 1}, headers=alice)
    assert created.status_code == 201
    item_id = created.json()["id"]
    assert Item.objects.get(id=item_id).owner == f"oidc:{idp.issuer}#alice"
    assert httpx.get(f"{live_gateway.url}/v1/test/items/{item_id}", headers=alice).status_code == 200
    r = httpx.get(f"{live_gateway.url}/v1/test/items/{item_id}", headers=bob)
    assert r.status_code == 404
    assert r.json() == not_found(item_id)


def test_selector_helpers_filter_by_owner() -> None:
    mine, theirs = Principal(owner="key:1", kind="api_key"), Principal(owner="key:2", kind="api_key")
    Item.objects.create(id="msg_a", owner="key:1", type="message", data={})
    Item.objects.create(id="msg_b", owner="key:2", type="message", data={})
    assert owner_filter(mine) == {"owner": "key:1"}
    assert list(owned(Item.objects.all(), mine).values_list("id", flat=True)) == ["msg_a"]
    assert owned_get(Item.objects.all(), mine, id="msg_a").id == "msg_a"
    with pytest.raises(errors.NotFound) as info:
        owned_get(Item.objects.all(), theirs, id="msg_a", not_found="Item with id 'msg_a' not found.")
    assert info.value.status == 404 and info.value.message == "Item with id 'msg_a' not found."


# --- the OPENAI_API_KEY rule ------------------------------------------------------------------


async def test_stored_state_needs_the_upstream_key_as_bearer(gateway_config: Any) -> None:
    gateway_config(openai_api_key="upstream-secret")
    item = await make_item()
    path = f"/v1/test/items/{item.id}"
    assert_refused(await get(path), "missing_bearer_token")
    assert_refused(await get(path, bearer("not-the-key")), "invalid_token")
    response = await get(path, bearer("upstream-secret"))
    assert response.status_code == 200
    assert response.json() == {"id": item.id, "data": {"n": 1}}
    # Deletes are stored-state access too; a refused delete removes nothing.
    refused = await AsyncClient().delete(path)
    assert refused.status_code == 401
    assert await Item.objects.filter(id=item.id).aexists()
    deleted = await AsyncClient().delete(path, headers=bearer("upstream-secret"))
    assert deleted.status_code == 200
    assert not await Item.objects.filter(id=item.id).aexists()


async def test_stored_state_is_open_without_an_upstream_key(gateway_config: Any) -> None:
    gateway_config(openai_api_key="")
    item = await make_item()
    assert (await get(f"/v1/test/items/{item.id}")).status_code == 200


async def test_upstream_key_is_not_a_password_on_pass_through_routes(gateway_config: Any) -> None:
    gateway_config(openai_api_key="upstream-secret")
    response = await get(WHOAMI)
    assert response.status_code == 200
    assert response.json()["kind"] == "default"
    response = await get(WHOAMI, bearer("upstream-secret"))
    assert response.json()["kind"] == "upstream_key"
    assert response.json()["owner"] == "default"
