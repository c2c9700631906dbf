"""The admin pages render for a logged-in staff user: list, search, filters, transcript, delete."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

from conversations_app import schemas, services
from conversations_app.models import Conversation, ConversationItem, Item


def make(owner: str, items: list[dict[str, Any]], metadata: dict[str, str] | None = None) -> Conversation:
    conversation, _ = services.conversation_create(
        owner=owner, metadata=metadata or {}, items=schemas.validate_items(items, required=False)
    )
    return conversation


def staff(*perms: str) -> Client:
    user = User.objects.create_user("ops", password="pw-for-tests-only", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=perms))
    client = Client()
    client.force_login(user)
    return client


TURN = [
    {"type": "message", "role": "user", "content": "What is the weather in Paris?"},
    {"type": "function_call", "call_id": "call_9", "name": "get_weather", "arguments": '{"city":"Paris"}'},
    {"type": "function_call_output", "call_id": "call_9", "output": "18C and sunny"},
    {"type": "reasoning", "id": "rs_r1", "summary": [{"type": "summary_text", "text": "User wants weather"}]},
    {"type": "message", "role": "assistant", "content": "It is 18C and sunny in Paris."},
]


@pytest.mark.django_db
def test_changelist_shows_owner_created_item_count_and_searches_metadata() -> None:
    paris = make("key:alice", TURN, {"ticket": "T-1234"})
    other = make("key:bob", [], {"ticket": "T-9999"})
    client = staff("view_conversation")
    r = client.get("/admin/conversations_app/conversation/")
    assert r.status_code == 200
    page = r.content.decode()
    assert paris.id in page and other.id in page
    assert "key:alice" in page and "key:bob" in page
    assert '<td class="field-item_count">5</td>' in page
    assert "ticket=T-1234" in page
    # Metadata search and owner filter.
    found = client.get("/admin/conversations_app/conversation/", {"q": "T-1234"}).content.decode()
    assert paris.id in found and other.id not in found
    by_owner = client.get("/admin/conversations_app/conversation/", {"owner": "key:bob"}).content.decode()
    assert other.id in by_owner and paris.id not in by_owner
    # Date filter (date hierarchy) renders.
    year = paris.created_at.year
    dated = client.get("/admin/conversations_app/conversation/", {"created_at__year": year})
    assert dated.status_code == 200 and paris.id in dated.content.decode()
    # No add button, no built-in bulk delete (the view-only user has no delete action at all).
    assert "/admin/conversations_app/conversation/add/" not in page
    assert "delete_selected" not in page


@pytest.mark.django_db
def test_detail_page_is_a_readable_transcript_with_raw_json() -> None:
    conversation = make("key:alice", TURN, {"ticket": "T-1"})
    client = staff("view_conversation")
    r = client.get(f"/admin/conversations_app/conversation/{conversation.id}/change/")
    assert r.status_code == 200
    page = r.content.decode()
    order = [
        "What is the weather in Paris?",
        "get_weather({&quot;city&quot;:&quot;Paris&quot;})",
        "18C and sunny",
        "User wants weather",
        "It is 18C and sunny in Paris.",
    ]
    positions = [page.index(text) for text in order]
    assert positions == sorted(positions)
    assert ">user<" in page and ">assistant<" in page and ">tool call<" in page and ">tool output<" in page
    assert page.count("<summary>raw JSON</summary>") == 5
    assert "&quot;call_id&quot;: &quot;call_9&quot;" in page  # the raw JSON itself
    # Read-only: no save buttons and posting a change is refused.
    assert 'name="_save"' not in page
    assert (
        client.post(f"/admin/conversations_app/conversation/{conversation.id}/change/", {}).status_code == 403
    )
    assert client.get("/admin/conversations_app/conversation/add/").status_code == 403


@pytest.mark.django_db
def test_transcript_pages_through_long_conversations() -> None:
    conversation = make("key:alice", [])
    items = [
        Item(
            id=f"msg_{i:05d}",
            owner="key:alice",
            type="message",
            data={
                "id": f"msg_{i:05d}",
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": f"line {i:05d}"}],
            },
        )
        for i in range(250)
    ]
    Item.objects.bulk_create(items)
    ConversationItem.objects.bulk_create(
        ConversationItem(conversation=conversation, item=item, position=i) for i, item in enumerate(items)
    )
    client = staff("view_conversation")
    first = client.get(f"/admin/conversations_app/conversation/{conversation.id}/change/").content.decode()
    assert "line 00000" in first and "line 00199" in first and "line 00200" not in first
    assert "?from=200" in first
    second = client.get(
        f"/admin/conversations_app/conversation/{conversation.id}/change/?from=200"
    ).content.decode()
    assert "line 00200" in second and "line 00249" in second and "line 00199" not in second


@pytest.mark.django_db
def test_delete_action_deletes_conversations_and_keeps_items() -> None:
    keep = make("key:alice", TURN[:1])
    doomed = make("key:bob", TURN)
    client = staff("view_conversation", "delete_conversation")
    page = client.get("/admin/conversations_app/conversation/").content.decode()
    assert "delete_conversations" in page
    r = client.post(
        "/admin/conversations_app/conversation/",
        {"action": "delete_conversations", "_selected_action": [doomed.id]},
        follow=True,
    )
    assert r.status_code == 200
    assert "Deleted 1 conversation(s)." in r.content.decode()
    assert list(Conversation.objects.values_list("id", flat=True)) == [keep.id]
    assert ConversationItem.objects.filter(conversation_id=doomed.id).count() == 0
    assert Item.objects.count() == 6  # detached, not removed


@pytest.mark.django_db
def test_items_admin_renders() -> None:
    conversation = make("key:alice", TURN)
    item = ConversationItem.objects.filter(conversation=conversation).first()
    assert item is not None
    client = staff("view_item")
    assert client.get("/admin/conversations_app/item/").status_code == 200
    detail = client.get(f"/admin/conversations_app/item/{item.item_id}/change/")
    assert detail.status_code == 200
    assert "What is the weather in Paris?" in detail.content.decode()
