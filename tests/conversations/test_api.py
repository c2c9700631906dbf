"""Every Conversations endpoint and error, with the official ``openai`` SDK against a live gateway."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from conversations_app.models import Conversation, ConversationItem, Item
from tests.servers import LiveServer


def user(text: str, **extra: Any) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": text, **extra}


def error_of(exc: pytest.ExceptionInfo[openai.APIStatusError]) -> Any:
    return exc.value.body


def not_found(conversation_id: str) -> dict[str, Any]:
    return {
        "message": f"Conversation with id '{conversation_id}' not found.",
        "type": "invalid_request_error",
        "param": None,
        "code": None,
    }


def texts(items: Any) -> list[str]:
    return [item.content[0].text for item in items]


# ---------------------------------------------------------------------------------------- create
def test_create_empty(client: openai.OpenAI) -> None:
    conversation = client.conversations.create()
    assert conversation.object == "conversation"
    assert conversation.id.startswith("conv_")
    assert conversation.metadata == {}
    assert isinstance(conversation.created_at, int)
    again = client.conversations.retrieve(conversation.id)
    assert again.model_dump() == conversation.model_dump()
    assert client.conversations.items.list(conversation.id).data == []


def test_create_with_items_and_metadata_normalizes_items(client: openai.OpenAI) -> None:
    conversation = client.conversations.create(
        items=[
            {"role": "system", "content": "be brief"},
            user("hi"),
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "hello"}]},
            {"type": "function_call", "call_id": "call_1", "name": "lookup", "arguments": '{"q":"x"}'},
            {"type": "function_call_output", "call_id": "call_1", "output": "42"},
            {
                "type": "reasoning",
                "id": "rs_given",
                "summary": [{"type": "summary_text", "text": "thinking"}],
            },
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "dev"}]},
        ],
        metadata={"topic": "demo"},
    )
    assert conversation.metadata == {"topic": "demo"}
    items = client.conversations.items.list(conversation.id, order="asc").data
    assert [item.type for item in items] == [
        "message",
        "message",
        "message",
        "function_call",
        "function_call_output",
        "reasoning",
        "message",
    ]
    system, hi, hello, call, output, reasoning, dev = items
    assert system.model_dump(exclude_none=True) == {
        "id": system.id,
        "type": "message",
        "role": "system",
        "status": "completed",
        "content": [{"type": "input_text", "text": "be brief"}],
    }
    assert system.id.startswith("msg_") and hi.id.startswith("msg_")
    assert hi.content[0].type == "input_text"
    assert hello.content[0].type == "output_text" and hello.content[0].text == "hello"
    assert call.id.startswith("fc_") and call.arguments == '{"q":"x"}' and call.name == "lookup"
    assert output.output == "42" and output.call_id == "call_1"
    assert reasoning.id == "rs_given"
    assert dev.role == "developer"


def test_assistant_string_content_becomes_output_text(client: openai.OpenAI) -> None:
    conversation = client.conversations.create(items=[{"role": "assistant", "content": "sure"}])
    (item,) = client.conversations.items.list(conversation.id).data
    assert item.content[0].model_dump(exclude_none=True) == {
        "type": "output_text",
        "text": "sure",
        "annotations": [],
        "logprobs": [],
    }


def test_create_at_most_20_items(client: openai.OpenAI) -> None:
    ok = client.conversations.create(items=[user(str(i)) for i in range(20)])
    assert len(client.conversations.items.list(ok.id, limit=100).data) == 20
    with pytest.raises(openai.BadRequestError) as exc:
        client.conversations.create(items=[user(str(i)) for i in range(21)])
    assert exc.value.status_code == 400
    assert error_of(exc) == {
        "message": "Invalid 'items': array too long. Expected an array with maximum length 20, "
        "but got an array with length 21 instead.",
        "type": "invalid_request_error",
        "param": "items",
        "code": "array_above_max_length",
    }
    assert Conversation.objects.count() == 1
    assert Item.objects.count() == 20


def test_creation_is_atomic_a_bad_item_stores_nothing(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as exc:
        client.conversations.create(
            items=[user("fine"), {"type": "message", "role": "wizard", "content": "x"}],
            metadata={"a": "b"},
        )
    assert error_of(exc) == {
        "message": "Invalid value: 'wizard'. Supported values are: 'user', 'assistant', 'system', "
        "and 'developer'.",
        "type": "invalid_request_error",
        "param": "items[1].role",
        "code": "invalid_value",
    }
    assert Conversation.objects.count() == 0
    assert Item.objects.count() == 0


def test_creation_is_atomic_when_the_database_refuses(client: openai.OpenAI) -> None:
    """A refusal found only while writing (a reference to no stored item) rolls back everything."""
    with pytest.raises(openai.NotFoundError) as exc:
        client.conversations.create(items=[user("first"), {"type": "item_reference", "id": "msg_nothing"}])
    assert error_of(exc) == {
        "message": "Item with id 'msg_nothing' not found.",
        "type": "invalid_request_error",
        "param": "items[1].id",
        "code": None,
    }
    assert Conversation.objects.count() == 0
    assert Item.objects.count() == 0
    assert ConversationItem.objects.count() == 0


@pytest.mark.parametrize(
    ("item", "param", "code", "message"),
    [
        ({"type": "bogus"}, "items[0].type", "invalid_value", None),
        ({"content": "no role or type"}, "items[0].type", "missing_required_parameter", None),
        (
            {"type": "function_call", "name": "f", "arguments": "{}"},
            "items[0].call_id",
            "missing_required_parameter",
            "Missing required parameter: 'items[0].call_id'.",
        ),
        (
            {"type": "message", "role": "user", "content": 5},
            "items[0].content",
            "invalid_type",
            "Invalid type for 'items[0].content': expected a string or an array, but got an integer instead.",
        ),
        (
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": 1}]},
            "items[0].content[0].text",
            "invalid_type",
            "Invalid type for 'items[0].content[0].text': expected a string, but got an integer instead.",
        ),
        (
            {"type": "message", "role": "user", "content": [{"type": "hologram"}]},
            "items[0].content[0].type",
            "invalid_value",
            None,
        ),
        (
            user("x", id="bad"),
            "items[0].id",
            "invalid_value",
            "Invalid 'items[0].id': 'bad'. Expected an ID that begins with 'msg'.",
        ),
        (
            {"type": "function_call", "id": "msg_1", "call_id": "c", "name": "f", "arguments": "{}"},
            "items[0].id",
            "invalid_value",
            "Invalid 'items[0].id': 'msg_1'. Expected an ID that begins with 'fc'.",
        ),
        (
            {"type": "reasoning", "id": "x", "summary": []},
            "items[0].id",
            "invalid_value",
            "Invalid 'items[0].id': 'x'. Expected an ID that begins with 'rs'.",
        ),
    ],
)
def test_invalid_items(
    client: openai.OpenAI, item: dict[str, Any], param: str, code: str, message: str | None
) -> None:
    with pytest.raises(openai.BadRequestError) as exc:
        client.conversations.create(items=[item])  # type: ignore[list-item]
    body = error_of(exc)
    assert (body["type"], body["param"], body["code"]) == ("invalid_request_error", param, code)
    if message is not None:
        assert body["message"] == message
    assert Conversation.objects.count() == 0


# -------------------------------------------------------------------------------------- metadata
METADATA_ERRORS = [
    (
        {str(i): "v" for i in range(17)},
        "metadata",
        "object_above_max_properties",
        "Invalid 'metadata': too many properties. Expected an object with at most 16 properties, "
        "but got an object with 17 properties instead.",
    ),
    (
        {"k" * 65: "v"},
        "metadata." + "k" * 65,
        "property_name_above_max_length",
        "Invalid property name in 'metadata': 'kkk...kkk' is too long. Expected a string with "
        "maximum length 64, but got a string with length 65 instead.",
    ),
    (
        {"k": "v" * 513},
        "metadata.k",
        "string_above_max_length",
        "Invalid 'metadata.k': string too long. Expected a string with maximum length 512, but got "
        "a string with length 513 instead.",
    ),
    (
        {"k": 1},
        "metadata.k",
        "invalid_type",
        "Invalid type for 'metadata.k': expected a string, but got an integer instead.",
    ),
]


@pytest.mark.parametrize(("metadata", "param", "code", "message"), METADATA_ERRORS)
def test_metadata_limits_on_create(
    client: openai.OpenAI, metadata: dict[str, Any], param: str, code: str, message: str
) -> None:
    with pytest.raises(openai.BadRequestError) as exc:
        client.conversations.create(metadata=metadata, items=[user("x")])
    assert error_of(exc) == {
        "message": message,
        "type": "invalid_request_error",
        "param": param,
        "code": code,
    }
    assert Conversation.objects.count() == 0
    assert Item.objects.count() == 0


@pytest.mark.parametrize(("metadata", "param", "code", "message"), METADATA_ERRORS)
def test_metadata_limits_on_update(
    client: openai.OpenAI, metadata: dict[str, Any], param: str, code: str, message: str
) -> None:
    conversation = client.conversations.create(metadata={"keep": "me"})
    with pytest.raises(openai.BadRequestError) as exc:
        client.conversations.update(conversation.id, metadata=metadata)
    assert error_of(exc) == {
        "message": message,
        "type": "invalid_request_error",
        "param": param,
        "code": code,
    }
    assert client.conversations.retrieve(conversation.id).metadata == {"keep": "me"}


def test_metadata_at_the_limits_is_accepted(client: openai.OpenAI) -> None:
    metadata = {f"{i:02d}" + "k" * 62: "v" * 512 for i in range(16)}
    conversation = client.conversations.create(metadata=metadata)
    assert client.conversations.retrieve(conversation.id).metadata == metadata


def test_update_replaces_and_null_clears_metadata(client: openai.OpenAI) -> None:
    conversation = client.conversations.create(metadata={"a": "1", "b": "2"})
    updated = client.conversations.update(conversation.id, metadata={"c": "3"})
    assert updated.id == conversation.id and updated.object == "conversation"
    assert updated.metadata == {"c": "3"}
    assert updated.created_at == conversation.created_at
    assert client.conversations.retrieve(conversation.id).metadata == {"c": "3"}
    assert client.conversations.update(conversation.id, metadata=None).metadata == {}


def test_update_requires_metadata(live_gateway: LiveServer, client: openai.OpenAI) -> None:
    conversation = client.conversations.create()
    r = httpx.post(f"{live_gateway.url}/v1/conversations/{conversation.id}", json={})
    assert r.status_code == 400
    assert r.json()["error"] == {
        "message": "Missing required parameter: 'metadata'.",
        "type": "invalid_request_error",
        "param": "metadata",
        "code": "missing_required_parameter",
    }


def test_unknown_parameter_and_bad_json(live_gateway: LiveServer) -> None:
    r = httpx.post(f"{live_gateway.url}/v1/conversations", json={"itemz": []})
    assert r.status_code == 400
    assert r.json()["error"] == {
        "message": "Unknown parameter: 'itemz'.",
        "type": "invalid_request_error",
        "param": "itemz",
        "code": "unknown_parameter",
    }
    r = httpx.post(
        f"{live_gateway.url}/v1/conversations", content=b"{nope", headers={"content-type": "application/json"}
    )
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "invalid_json"
    assert Conversation.objects.count() == 0


def test_method_not_allowed(live_gateway: LiveServer) -> None:
    r = httpx.get(f"{live_gateway.url}/v1/conversations")
    assert r.status_code == 405
    assert r.json()["error"]["code"] == "method_not_allowed"
    assert r.headers["allow"] == "POST"


# ---------------------------------------------------------------------------------------- delete
def test_delete_conversation_keeps_items(client: openai.OpenAI) -> None:
    conversation = client.conversations.create(items=[user("keep me")])
    (item,) = client.conversations.items.list(conversation.id).data
    deleted = client.conversations.delete(conversation.id)
    assert deleted.model_dump() == {"id": conversation.id, "object": "conversation.deleted", "deleted": True}
    with pytest.raises(openai.NotFoundError) as exc:
        client.conversations.retrieve(conversation.id)
    assert error_of(exc) == not_found(conversation.id)
    with pytest.raises(openai.NotFoundError):
        client.conversations.items.list(conversation.id)
    with pytest.raises(openai.NotFoundError):
        client.conversations.delete(conversation.id)
    # The stored item outlives the conversation (responses may still reference it).
    assert Item.objects.filter(id=item.id).exists()
    assert ConversationItem.objects.count() == 0


# --------------------------------------------------------------------------------- unknown ids
def test_unknown_conversation_is_404_everywhere(client: openai.OpenAI) -> None:
    missing = "conv_000000000000doesnotexist"
    calls = [
        lambda: client.conversations.retrieve(missing),
        lambda: client.conversations.update(missing, metadata={"a": "b"}),
        lambda: client.conversations.delete(missing),
        lambda: client.conversations.items.list(missing),
        lambda: client.conversations.items.create(missing, items=[user("x")]),
        lambda: client.conversations.items.retrieve("msg_1", conversation_id=missing),
        lambda: client.conversations.items.delete("msg_1", conversation_id=missing),
    ]
    for call in calls:
        with pytest.raises(openai.NotFoundError) as exc:
            call()
        assert exc.value.status_code == 404
        assert error_of(exc) == not_found(missing)
    assert Item.objects.count() == 0


@pytest.mark.parametrize("bad", ["abc", "resp_123", "conv_", "msg_123"])
def test_malformed_conversation_id_is_400(client: openai.OpenAI, bad: str) -> None:
    expected = {
        "message": f"Invalid 'conversation_id': '{bad}'. Expected an ID that begins with 'conv'.",
        "type": "invalid_request_error",
        "param": "conversation_id",
        "code": "invalid_value",
    }
    calls = [
        lambda: client.conversations.retrieve(bad),
        lambda: client.conversations.update(bad, metadata={}),
        lambda: client.conversations.delete(bad),
        lambda: client.conversations.items.list(bad),
        lambda: client.conversations.items.create(bad, items=[user("x")]),
        lambda: client.conversations.items.retrieve("msg_1", conversation_id=bad),
        lambda: client.conversations.items.delete("msg_1", conversation_id=bad),
    ]
    for call in calls:
        with pytest.raises(openai.BadRequestError) as exc:
            call()
        assert error_of(exc) == expected


def test_item_ids_malformed_400_unknown_404(client: openai.OpenAI) -> None:
    conversation = client.conversations.create(items=[user("x")])
    for call in (
        lambda: client.conversations.items.retrieve("abc", conversation_id=conversation.id),
        lambda: client.conversations.items.delete("abc", conversation_id=conversation.id),
    ):
        with pytest.raises(openai.BadRequestError) as bad:
            call()
        assert error_of(bad)["param"] == "item_id"
        assert error_of(bad)["code"] == "invalid_value"
        assert "'abc'" in error_of(bad)["message"]
    for call in (
        lambda: client.conversations.items.retrieve("msg_unknown", conversation_id=conversation.id),
        lambda: client.conversations.items.delete("msg_unknown", conversation_id=conversation.id),
    ):
        with pytest.raises(openai.NotFoundError) as missing:
            call()
        assert error_of(missing) == {
            "message": "Item with id 'msg_unknown' not found.",
            "type": "invalid_request_error",
            "param": None,
            "code": None,
        }


# ----------------------------------------------------------------------------------------- items
def test_items_create_appends_and_returns_the_batch(client: openai.OpenAI) -> None:
    conversation = client.conversations.create(items=[user("one")])
    batch = client.conversations.items.create(conversation.id, items=[user("two"), user("three")])
    assert batch.object == "list"
    assert texts(batch.data) == ["two", "three"]
    assert batch.first_id == batch.data[0].id and batch.last_id == batch.data[1].id
    assert batch.has_more is False
    assert texts(client.conversations.items.list(conversation.id, order="asc").data) == [
        "one",
        "two",
        "three",
    ]


def test_item_already_in_conversation_is_400_and_stores_nothing(client: openai.OpenAI) -> None:
    conversation = client.conversations.create(items=[user("x", id="msg_fixed1")])
    with pytest.raises(openai.BadRequestError) as exc:
        client.conversations.items.create(conversation.id, items=[user("new"), user("x", id="msg_fixed1")])
    assert error_of(exc) == {
        "message": "Item already in conversation",
        "type": "invalid_request_error",
        "param": "items",
        "code": "item_already_in_conversation",
    }
    assert texts(client.conversations.items.list(conversation.id).data) == ["x"]
    assert Item.objects.count() == 1


def test_same_id_twice_in_one_request_is_listed_twice(client: openai.OpenAI) -> None:
    """OpenAI answers 200 and lists both occurrences under the same public id."""
    conversation = client.conversations.create(items=[user("x")])
    added = client.conversations.items.create(
        conversation.id, items=[user("a", id="msg_twice"), user("b"), user("a", id="msg_twice")]
    )
    assert [i.id for i in added.data][0::2] == ["msg_twice", "msg_twice"]
    listed = client.conversations.items.list(conversation.id, order="asc").data
    assert [i.id for i in listed][1:] == ["msg_twice", added.data[1].id, "msg_twice"]
    assert texts(listed) == ["x", "a", "b", "a"]
    assert Item.objects.filter(id="msg_twice").count() == 1  # stored once
    # Re-adding an id already in the conversation stays a 400.
    with pytest.raises(openai.BadRequestError) as again:
        client.conversations.items.create(conversation.id, items=[user("a", id="msg_twice")])
    assert error_of(again)["code"] == "item_already_in_conversation"
    # Deleting the id detaches every occurrence.
    client.conversations.items.delete("msg_twice", conversation_id=conversation.id)
    assert texts(client.conversations.items.list(conversation.id, order="asc").data) == ["x", "b"]
    assert Conversation.objects.get(id=conversation.id).item_count == 2


def test_assistant_output_text_always_carries_logprobs(client: openai.OpenAI) -> None:
    said = {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "hi", "annotations": []}],
    }
    conversation = client.conversations.create(items=[user("q"), said])
    for include in ([], ["message.output_text.logprobs"]):
        listed = httpx.get(
            f"{client.base_url}conversations/{conversation.id}/items",
            params={"order": "asc", "include": include},
            headers={"authorization": "Bearer sk-test"},
        ).json()["data"]
        assert listed[1]["content"] == [
            {"type": "output_text", "text": "hi", "annotations": [], "logprobs": []}
        ]
        assert "logprobs" not in listed[0]["content"][0]  # input_text has none


def test_items_create_limits(client: openai.OpenAI) -> None:
    conversation = client.conversations.create()
    with pytest.raises(openai.BadRequestError) as too_many:
        client.conversations.items.create(conversation.id, items=[user(str(i)) for i in range(21)])
    assert error_of(too_many)["code"] == "array_above_max_length"
    with pytest.raises(openai.BadRequestError) as empty:
        client.conversations.items.create(conversation.id, items=[])
    assert error_of(empty)["param"] == "items"
    with pytest.raises(openai.BadRequestError) as bad:
        client.conversations.items.create(conversation.id, items=[user("ok"), {"type": "function_call"}])
    assert error_of(bad)["param"].startswith("items[1].")
    assert client.conversations.items.list(conversation.id).data == []
    assert Item.objects.count() == 0


def test_item_reference_stores_items_once(client: openai.OpenAI) -> None:
    first = client.conversations.create(items=[user("shared")])
    (shared,) = client.conversations.items.list(first.id).data
    second = client.conversations.create(items=[{"type": "item_reference", "id": shared.id}, user("more")])
    listed = client.conversations.items.list(second.id, order="asc").data
    assert listed[0].id == shared.id
    assert texts(listed) == ["shared", "more"]
    assert Item.objects.count() == 2  # "shared" is stored once


def test_item_retrieve_and_detach(client: openai.OpenAI) -> None:
    conversation = client.conversations.create(items=[user("a"), user("b"), user("c")])
    a, b, c = client.conversations.items.list(conversation.id, order="asc").data
    got = client.conversations.items.retrieve(b.id, conversation_id=conversation.id)
    assert got.model_dump() == b.model_dump()
    detached = client.conversations.items.delete(b.id, conversation_id=conversation.id)
    assert detached.model_dump() == client.conversations.retrieve(conversation.id).model_dump()
    assert detached.object == "conversation"
    assert [i.id for i in client.conversations.items.list(conversation.id, order="asc").data] == [a.id, c.id]
    with pytest.raises(openai.NotFoundError):
        client.conversations.items.retrieve(b.id, conversation_id=conversation.id)
    with pytest.raises(openai.NotFoundError):
        client.conversations.items.delete(b.id, conversation_id=conversation.id)
    # Detaching does not remove the stored item, and it can be referenced again.
    assert Item.objects.filter(id=b.id).exists()
    client.conversations.items.create(conversation.id, items=[{"type": "item_reference", "id": b.id}])
    assert [i.id for i in client.conversations.items.list(conversation.id, order="asc").data] == [
        a.id,
        c.id,
        b.id,
    ]


# ------------------------------------------------------------------------------------ pagination
def test_list_order_default_desc_and_cursor_fields(client: openai.OpenAI) -> None:
    conversation = client.conversations.create(items=[user(str(i)) for i in range(5)])
    page = client.conversations.items.list(conversation.id)
    assert texts(page.data) == ["4", "3", "2", "1", "0"]
    assert page.has_more is False
    assert page.first_id == page.data[0].id and page.last_id == page.data[-1].id
    page = client.conversations.items.list(conversation.id, limit=2)
    assert texts(page.data) == ["4", "3"] and page.has_more is True
    nxt = client.conversations.items.list(conversation.id, limit=2, after=page.last_id)
    assert texts(nxt.data) == ["2", "1"] and nxt.has_more is True
    asc = client.conversations.items.list(conversation.id, limit=2, order="asc", after=page.last_id)
    assert texts(asc.data) == ["4"] and asc.has_more is False


def test_pagination_edges(client: openai.OpenAI) -> None:
    conversation = client.conversations.create(items=[user(str(i)) for i in range(6)])
    # The SDK follows last_id/has_more: every item once, in order.
    assert texts(client.conversations.items.list(conversation.id, limit=4, order="asc")) == [
        "0",
        "1",
        "2",
        "3",
        "4",
        "5",
    ]
    assert texts(client.conversations.items.list(conversation.id, limit=1)) == ["5", "4", "3", "2", "1", "0"]
    # Exactly `limit` items left: no more.
    exact = client.conversations.items.list(conversation.id, limit=6)
    assert len(exact.data) == 6 and exact.has_more is False
    # `after` the last item (either order): an empty page.
    asc = client.conversations.items.list(conversation.id, order="asc").data
    tail = client.conversations.items.list(conversation.id, order="asc", after=asc[-1].id)
    assert tail.data == [] and tail.has_more is False
    head = client.conversations.items.list(conversation.id, order="desc", after=asc[0].id)
    assert head.data == [] and head.has_more is False
    middle = client.conversations.items.list(conversation.id, order="asc", after=asc[2].id, limit=2)
    assert texts(middle.data) == ["3", "4"] and middle.has_more is True


def test_empty_list_shape(live_gateway: LiveServer, client: openai.OpenAI) -> None:
    conversation = client.conversations.create()
    r = httpx.get(f"{live_gateway.url}/v1/conversations/{conversation.id}/items")
    assert r.status_code == 200
    assert r.json() == {"object": "list", "data": [], "first_id": None, "last_id": None, "has_more": False}


def test_list_parameter_errors(client: openai.OpenAI) -> None:
    conversation = client.conversations.create(items=[user("x")])
    cases: list[tuple[dict[str, Any], str, str]] = [
        ({"limit": 0}, "limit", "integer_below_min_value"),
        ({"limit": 101}, "limit", "integer_above_max_value"),
        ({"order": "sideways"}, "order", "invalid_value"),
        ({"include": ["nope"]}, "include", "invalid_value"),
        ({"after": "not-an-id"}, "after", "invalid_value"),
    ]
    for kwargs, param, code in cases:
        with pytest.raises(openai.BadRequestError) as exc:
            client.conversations.items.list(conversation.id, **kwargs)
        assert (error_of(exc)["param"], error_of(exc)["code"]) == (param, code)
    with pytest.raises(openai.BadRequestError) as exc:
        client.conversations.items.list(conversation.id, limit=0)
    assert error_of(exc)["message"] == (
        "Invalid 'limit': integer below minimum value. Expected a value >= 1, but got 0 instead."
    )
    with pytest.raises(openai.NotFoundError) as missing:
        client.conversations.items.list(conversation.id, after="msg_notinhere")
    assert error_of(missing) == {
        "message": "No item found with id 'msg_notinhere'",  # OpenAI's wording for a cursor
        "type": "invalid_request_error",
        "param": "after",
        "code": None,
    }
    assert len(client.conversations.items.list(conversation.id, limit=100).data) == 1


def test_include_reveals_encrypted_reasoning(client: openai.OpenAI) -> None:
    conversation = client.conversations.create(
        items=[{"type": "reasoning", "id": "rs_enc1", "summary": [], "encrypted_content": "SECRET"}]
    )
    (plain,) = client.conversations.items.list(conversation.id).data
    assert plain.encrypted_content is None
    (full,) = client.conversations.items.list(conversation.id, include=["reasoning.encrypted_content"]).data
    assert full.encrypted_content == "SECRET"
    one = client.conversations.items.retrieve(
        "rs_enc1", conversation_id=conversation.id, include=["reasoning.encrypted_content"]
    )
    assert one.encrypted_content == "SECRET"
    assert (
        client.conversations.items.retrieve("rs_enc1", conversation_id=conversation.id).encrypted_content
        is None
    )
