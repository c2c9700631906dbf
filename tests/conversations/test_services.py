"""The service/selector layer the Responses executor calls: history, optimistic appends, owners."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection

from conversations_app import schemas, selectors, services
from conversations_app.models import Conversation, ConversationItem, Item
from gateway.core import errors
from gateway.core.ids import new_id

ALICE = "key:alice"
BOB = "key:bob"


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": text}


def make_conversation(owner: str, *texts: str) -> Conversation:
    items = schemas.validate_items([user(t) for t in texts], required=False)
    conversation, _ = services.conversation_create(owner=owner, metadata={}, items=items)
    return conversation


def response_items(owner: str, *texts: str) -> list[str]:
    """Items as the Responses engine stores them (one Item row each) before appending."""
    ids = []
    for text in texts:
        item_id = new_id("msg")
        Item.objects.create(
            id=item_id,
            owner=owner,
            type="message",
            data={
                "id": item_id,
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            },
        )
        ids.append(item_id)
    return ids


def item_texts(items: list[Item]) -> list[str]:
    return [item.data["content"][0]["text"] for item in items]


@pytest.mark.django_db
def test_history_returns_items_in_order_and_revision() -> None:
    conversation = make_conversation(ALICE, "a", "b")
    items, revision = selectors.conversation_history(conversation_id=conversation.id, owner=ALICE)
    assert item_texts(items) == ["a", "b"]
    assert revision == 1
    empty = make_conversation(ALICE)
    assert selectors.conversation_history(conversation_id=empty.id, owner=ALICE) == ([], 0)


@pytest.mark.django_db
def test_history_of_unknown_or_foreign_conversation_is_not_found() -> None:
    conversation = make_conversation(ALICE, "secret")
    for conversation_id, owner in ((conversation.id, BOB), ("conv_missing", ALICE)):
        with pytest.raises(errors.NotFound) as exc:
            selectors.conversation_history(conversation_id=conversation_id, owner=owner)
        assert exc.value.status == 404
        assert exc.value.message == f"Conversation with id '{conversation_id}' not found."
    with pytest.raises(errors.BadRequest) as bad:
        selectors.conversation_history(conversation_id="resp_1", owner=ALICE)
    assert (bad.value.param, bad.value.code) == ("conversation", "invalid_value")


@pytest.mark.django_db
def test_response_with_conversation_appends_its_items() -> None:
    """What the executor does: read the history, run, store the turn's items, append them."""
    conversation = make_conversation(ALICE, "question")
    history, revision = selectors.conversation_history(conversation_id=conversation.id, owner=ALICE)
    assert item_texts(history) == ["question"]
    turn = response_items(ALICE, "input echo", "answer")
    new_revision = services.conversation_append_items(
        conversation_id=conversation.id, owner=ALICE, item_ids=turn, expected_revision=revision
    )
    assert new_revision == revision + 1
    items, current = selectors.conversation_history(conversation_id=conversation.id, owner=ALICE)
    assert item_texts(items) == ["question", "input echo", "answer"]
    assert current == new_revision
    conversation.refresh_from_db()
    assert conversation.item_count == 3
    page = selectors.conversation_items_list(conversation=conversation, order="asc")
    assert [item.id for item in page.items][1:] == turn


@pytest.mark.django_db
def test_stale_revision_is_409_conversation_locked_and_appends_nothing() -> None:
    conversation = make_conversation(ALICE, "q")
    _, revision = selectors.conversation_history(conversation_id=conversation.id, owner=ALICE)
    services.conversation_append_items(
        conversation_id=conversation.id,
        owner=ALICE,
        item_ids=response_items(ALICE, "first"),
        expected_revision=revision,
    )
    late = response_items(ALICE, "late")
    with pytest.raises(errors.Conflict) as exc:
        services.conversation_append_items(
            conversation_id=conversation.id, owner=ALICE, item_ids=late, expected_revision=revision
        )
    assert (exc.value.status, exc.value.code, exc.value.type) == (
        409,
        "conversation_locked",
        "invalid_request_error",
    )
    items, current = selectors.conversation_history(conversation_id=conversation.id, owner=ALICE)
    assert item_texts(items) == ["q", "first"]
    assert current == revision + 1


@pytest.mark.django_db
def test_append_refusals_roll_back_the_revision() -> None:
    conversation = make_conversation(ALICE, "q")
    mine = response_items(ALICE, "mine")
    theirs = response_items(BOB, "theirs")
    with pytest.raises(errors.NotFound):  # another owner's conversation
        services.conversation_append_items(
            conversation_id=conversation.id, owner=BOB, item_ids=theirs, expected_revision=1
        )
    with pytest.raises(errors.NotFound):  # another owner's item
        services.conversation_append_items(
            conversation_id=conversation.id, owner=ALICE, item_ids=[*mine, *theirs], expected_revision=1
        )
    first = ConversationItem.objects.get(conversation=conversation).item_id
    with pytest.raises(errors.BadRequest) as dup:
        services.conversation_append_items(
            conversation_id=conversation.id, owner=ALICE, item_ids=[first], expected_revision=1
        )
    assert dup.value.code == "item_already_in_conversation"
    conversation.refresh_from_db()
    assert (conversation.revision, conversation.item_count, conversation.next_position) == (1, 1, 1)
    assert ConversationItem.objects.filter(conversation=conversation).count() == 1


@pytest.mark.django_db
def test_every_membership_change_bumps_the_revision() -> None:
    conversation = make_conversation(ALICE)
    assert conversation.revision == 0
    (added,) = services.conversation_items_create(
        id=conversation.id, owner=ALICE, items=schemas.validate_items([user("x")], required=True)
    )
    _, revision = selectors.conversation_history(conversation_id=conversation.id, owner=ALICE)
    assert revision == 1
    services.conversation_item_delete(id=conversation.id, owner=ALICE, item_id=added.id)
    _, revision = selectors.conversation_history(conversation_id=conversation.id, owner=ALICE)
    assert revision == 2
    services.conversation_update(id=conversation.id, owner=ALICE, metadata={"a": "b"})
    assert selectors.conversation_history(conversation_id=conversation.id, owner=ALICE)[1] == 2


@pytest.mark.django_db
def test_services_and_selectors_filter_by_owner() -> None:
    conversation = make_conversation(ALICE, "hers")
    item_id = ConversationItem.objects.get(conversation=conversation).item_id
    foreign: list[Any] = [
        lambda: selectors.conversation_get(id=conversation.id, owner=BOB),
        lambda: services.conversation_update(id=conversation.id, owner=BOB, metadata={}),
        lambda: services.conversation_delete(id=conversation.id, owner=BOB),
        lambda: services.conversation_items_create(
            id=conversation.id, owner=BOB, items=schemas.validate_items([user("x")], required=True)
        ),
        lambda: services.conversation_item_delete(id=conversation.id, owner=BOB, item_id=item_id),
    ]
    for call in foreign:
        with pytest.raises(errors.NotFound):
            call()
    assert list(selectors.conversation_list(owner=BOB)) == []
    assert list(selectors.conversation_list(owner=ALICE)) == [conversation]
    # Bob cannot pull Alice's item into his own conversation by reference either.
    bobs = make_conversation(BOB)
    with pytest.raises(errors.NotFound):
        services.conversation_items_create(
            id=bobs.id,
            owner=BOB,
            items=schemas.validate_items([{"type": "item_reference", "id": item_id}], required=True),
        )
    assert ConversationItem.objects.filter(conversation=bobs).count() == 0
    assert selectors.conversation_get(id=conversation.id, owner=ALICE).metadata == {}


# ---------------------------------------------------------------------------------- concurrency
def _run_threads(count: int, target: Any) -> list[Any]:
    results: list[Any] = [None] * count
    barrier = threading.Barrier(count)

    def run(index: int) -> None:
        try:
            results[index] = target(index, barrier)
        except BaseException as exc:  # reported by the assertion below
            results[index] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return results


@pytest.mark.django_db(transaction=True)
def test_racing_appends_one_wins_the_others_get_409() -> None:
    conversation = make_conversation(ALICE, "q")
    writers = 8
    batches = [response_items(ALICE, f"w{i}-a", f"w{i}-b", f"w{i}-c") for i in range(writers)]

    def turn(index: int, barrier: threading.Barrier) -> int:
        _, revision = selectors.conversation_history(conversation_id=conversation.id, owner=ALICE)
        barrier.wait()  # everyone computed from the same history; now all append at once
        return services.conversation_append_items(
            conversation_id=conversation.id, owner=ALICE, item_ids=batches[index], expected_revision=revision
        )

    results = _run_threads(writers, turn)
    winners = [i for i, r in enumerate(results) if r == 2]
    losers = [r for r in results if isinstance(r, errors.Conflict)]
    assert len(winners) == 1, results
    assert len(losers) == writers - 1 and all(r.code == "conversation_locked" for r in losers)
    items, revision = selectors.conversation_history(conversation_id=conversation.id, owner=ALICE)
    assert [item.id for item in items] == [items[0].id, *batches[winners[0]]]
    assert revision == 2


@pytest.mark.django_db(transaction=True)
def test_racing_appends_that_retry_lose_and_interleave_nothing() -> None:
    conversation = make_conversation(ALICE, "q")
    writers, turns = 6, 4
    batches = [
        [response_items(ALICE, *(f"w{w}t{t}i{i}" for i in range(3))) for t in range(turns)]
        for w in range(writers)
    ]

    def run(index: int, barrier: threading.Barrier) -> int:
        conflicts = 0
        barrier.wait()
        for batch in batches[index]:
            while True:
                _, revision = selectors.conversation_history(conversation_id=conversation.id, owner=ALICE)
                try:
                    services.conversation_append_items(
                        conversation_id=conversation.id,
                        owner=ALICE,
                        item_ids=batch,
                        expected_revision=revision,
                    )
                    break
                except errors.Conflict:
                    conflicts += 1
        return conflicts

    results = _run_threads(writers, run)
    assert all(isinstance(r, int) for r in results), results
    items, revision = selectors.conversation_history(conversation_id=conversation.id, owner=ALICE)
    ids = [item.id for item in items][1:]
    assert len(ids) == writers * turns * 3 == len(set(ids))  # nothing lost, nothing doubled
    # Every batch is contiguous (no interleaving) and each writer's turns keep their order.
    positions = {item_id: i for i, item_id in enumerate(ids)}
    for writer_batches in batches:
        starts = []
        for batch in writer_batches:
            where = [positions[i] for i in batch]
            assert where == list(range(where[0], where[0] + 3))
            starts.append(where[0])
        assert starts == sorted(starts)
    assert revision == 1 + writers * turns
    conversation.refresh_from_db()
    assert conversation.item_count == 1 + writers * turns * 3
    positions_in_db = list(
        ConversationItem.objects.filter(conversation=conversation)
        .order_by("position")
        .values_list("position", flat=True)
    )
    assert positions_in_db == list(range(len(positions_in_db)))


@pytest.mark.django_db
def test_an_id_another_owner_stored_is_refused() -> None:
    make_conversation(ALICE)
    alices = schemas.validate_items([{**user("mine"), "id": "msg_taken"}], required=True)
    services.conversation_create(owner=ALICE, metadata={}, items=alices)
    bobs = schemas.validate_items([{**user("not yours"), "id": "msg_taken"}], required=True)
    with pytest.raises(errors.BadRequest) as exc:
        services.conversation_create(owner=BOB, metadata={}, items=bobs)
    assert (exc.value.param, exc.value.message) == ("items[0].id", "Item with id 'msg_taken' already exists.")
    assert Item.objects.get(id="msg_taken").data["content"][0]["text"] == "mine"
    assert Conversation.objects.filter(owner=BOB).count() == 0


@pytest.mark.django_db
def test_resending_a_stored_item_references_it() -> None:
    first = make_conversation(ALICE)
    item = schemas.validate_items([{**user("once"), "id": "msg_once"}], required=True)
    services.conversation_items_create(id=first.id, owner=ALICE, items=item)
    _, stored = services.conversation_create(owner=ALICE, metadata={}, items=item)
    assert [i.id for i in stored] == ["msg_once"]
    assert Item.objects.filter(id="msg_once").count() == 1
    assert ConversationItem.objects.filter(item_id="msg_once").count() == 2
