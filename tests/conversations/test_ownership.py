"""Cross-owner 404s over HTTP: two principals on one gateway (set by a test middleware)."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from conversations_app.models import Conversation, ConversationItem
from tests.conversations.conftest import OWNER_HEADER, sdk
from tests.servers import LiveServer


def test_another_owners_conversation_is_404_everywhere(owned_gateway: LiveServer) -> None:
    alice = sdk(owned_gateway.url, **{OWNER_HEADER: "key:alice"})
    bob = sdk(owned_gateway.url, **{OWNER_HEADER: "key:bob"})
    default = sdk(owned_gateway.url)
    conversation = alice.conversations.create(
        items=[{"type": "message", "role": "user", "content": "alice's secret"}], metadata={"who": "alice"}
    )
    (item,) = alice.conversations.items.list(conversation.id).data
    assert Conversation.objects.get(id=conversation.id).owner == "key:alice"

    for other in (bob, default):
        calls = [
            lambda c=other: c.conversations.retrieve(conversation.id),
            lambda c=other: c.conversations.update(conversation.id, metadata={"who": "bob"}),
            lambda c=other: c.conversations.delete(conversation.id),
            lambda c=other: c.conversations.items.list(conversation.id),
            lambda c=other: c.conversations.items.create(
                conversation.id, items=[{"type": "message", "role": "user", "content": "intruder"}]
            ),
            lambda c=other: c.conversations.items.retrieve(item.id, conversation_id=conversation.id),
            lambda c=other: c.conversations.items.delete(item.id, conversation_id=conversation.id),
        ]
        for call in calls:
            with pytest.raises(openai.NotFoundError) as exc:
                call()
            assert exc.value.body == {
                "message": f"Conversation with id '{conversation.id}' not found.",
                "type": "invalid_request_error",
                "param": None,
                "code": None,
            }
        # Nor can another owner reference Alice's item from a conversation of their own.
        with pytest.raises(openai.NotFoundError):
            other.conversations.create(items=[{"type": "item_reference", "id": item.id}])

    # Alice's conversation is untouched.
    assert alice.conversations.retrieve(conversation.id).metadata == {"who": "alice"}
    assert [i.id for i in alice.conversations.items.list(conversation.id).data] == [item.id]
    assert ConversationItem.objects.filter(conversation_id=conversation.id).count() == 1
    assert Conversation.objects.filter(owner="key:bob").count() == 0

    # Bob's own conversations work and record him as owner.
    mine = bob.conversations.create()
    assert Conversation.objects.get(id=mine.id).owner == "key:bob"
    with pytest.raises(openai.NotFoundError):
        alice.conversations.retrieve(mine.id)


def test_default_principal_owns_conversations_without_auth(client: openai.OpenAI) -> None:
    conversation = client.conversations.create()
    assert Conversation.objects.get(id=conversation.id).owner == "default"


def test_every_endpoint_checks_stored_state_access(live_gateway: LiveServer, gateway_config: Any) -> None:
    """The ``OPENAI_API_KEY`` rule (``gateway.core.auth.require_stored_state_access``) through the real
    app: on an open gateway with that key set, conversations are for callers presenting it; any
    other caller gets a 401 from every endpoint, before anything is read or stored."""
    gateway_config(openai_api_key="sk-upstream")
    holder = openai.OpenAI(base_url=live_gateway.url + "/v1", api_key="sk-upstream", max_retries=0)
    stranger = openai.OpenAI(base_url=live_gateway.url + "/v1", api_key="sk-other", max_retries=0)
    existing = holder.conversations.create(items=[{"type": "message", "role": "user", "content": "x"}])
    (item,) = holder.conversations.items.list(existing.id).data
    calls = [
        lambda c: c.conversations.create(),
        lambda c: c.conversations.retrieve(existing.id),
        lambda c: c.conversations.update(existing.id, metadata={"a": "b"}),
        lambda c: c.conversations.delete(existing.id),
        lambda c: c.conversations.items.list(existing.id),
        lambda c: c.conversations.items.create(
            existing.id, items=[{"type": "message", "role": "user", "content": "y"}]
        ),
        lambda c: c.conversations.items.retrieve(item.id, conversation_id=existing.id),
        lambda c: c.conversations.items.delete(item.id, conversation_id=existing.id),
    ]
    for call in calls:
        with pytest.raises(openai.AuthenticationError) as exc:
            call(stranger)
        assert exc.value.status_code == 401
        assert exc.value.body["code"] == "invalid_token"
    no_token = httpx.get(f"{live_gateway.url}/v1/conversations/{existing.id}", timeout=10)
    assert no_token.status_code == 401 and no_token.json()["error"]["code"] == "missing_bearer_token"
    assert Conversation.objects.count() == 1
    assert ConversationItem.objects.count() == 1
    assert Conversation.objects.get().metadata == {}
    # The key's holder passes the same rule.
    assert holder.conversations.retrieve(existing.id).id == existing.id
    assert holder.conversations.delete(existing.id).deleted
