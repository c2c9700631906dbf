"""Listing a 10,000-item conversation walks the (conversation, position) index: no scan, no OFFSET."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from conversations_app import selectors, services
from conversations_app.models import Conversation, ConversationItem, Item

SIZE = 10_000


def big_conversation(owner: str = "default") -> Conversation:
    conversation = Conversation.objects.create(
        id="conv_big", owner=owner, revision=1, item_count=SIZE, next_position=SIZE
    )
    items = [
        Item(
            id=f"msg_{i:06d}",
            owner=owner,
            type="message",
            data={
                "id": f"msg_{i:06d}",
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": str(i)}],
            },
        )
        for i in range(SIZE)
    ]
    Item.objects.bulk_create(items, batch_size=2000)
    ConversationItem.objects.bulk_create(
        (ConversationItem(conversation=conversation, item=item, position=i) for i, item in enumerate(items)),
        batch_size=2000,
    )
    # A second conversation so the planner cannot answer "everything in the table".
    other = Conversation.objects.create(id="conv_other", owner=owner)
    ConversationItem.objects.bulk_create(
        ConversationItem(conversation=other, item=item, position=i) for i, item in enumerate(items[:500])
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")  # fresh statistics, as autovacuum would have after the bulk load
    return conversation


@pytest.mark.django_db
@pytest.mark.parametrize("order", ["asc", "desc"])
@pytest.mark.parametrize("as_data", [False, True], ids=["items", "item data"])
def test_item_pages_use_the_position_index(order: str, as_data: bool) -> None:
    conversation = big_conversation()
    with CaptureQueriesContext(connection) as queries:
        if as_data:  # what the list endpoint reads
            page: Any = selectors.conversation_item_data_list(
                conversation_id=conversation.id,
                owner=conversation.owner,
                after="msg_005000",
                limit=100,
                order=order,
            )
        else:
            page = selectors.conversation_items_list(
                conversation=conversation, after="msg_005000", limit=100, order=order
            )
    expected = range(5001, 5101) if order == "asc" else range(4999, 4899, -1)
    ids = [item["id"] for item in page.items] if as_data else [item.id for item in page.items]
    assert ids == [f"msg_{i:06d}" for i in expected]
    assert page.has_more is True
    for query in queries.captured_queries:
        assert "OFFSET" not in query["sql"].upper()
    # The anchor lookup, the page of ids and the items by primary key: each an index search.
    anchor_sql, page_sql, items_sql = (q["sql"] for q in queries.captured_queries[-3:])
    assert "conversationitem" in anchor_sql and "conversationitem" in page_sql
    assert "JOIN" not in page_sql.upper()
    for sql in (anchor_sql, page_sql, items_sql):
        explained = _explain_literal(sql)
        if connection.vendor == "postgresql":
            assert "Seq Scan" not in explained, explained
            assert "Index" in explained, explained
        else:
            assert " SCAN " not in f" {explained} ".replace("\n", " "), explained
            assert "USING" in explained and "INDEX" in explained, explained


def _explain_literal(sql: str) -> str:
    """EXPLAIN a statement captured with its literal values inlined (as Django logs it)."""
    with connection.cursor() as cursor:
        prefix = "EXPLAIN " if connection.vendor == "postgresql" else "EXPLAIN QUERY PLAN "
        cursor.execute(prefix + sql)
        return "\n".join(" ".join(str(c) for c in row) for row in cursor.fetchall())


@pytest.mark.django_db
def test_appending_a_turn_does_not_count_or_scan() -> None:
    conversation = big_conversation()
    Item.objects.create(
        id="msg_turn", owner="default", type="message", data={"id": "msg_turn", "type": "message"}
    )
    with CaptureQueriesContext(connection) as queries:
        revision = services.conversation_append_items(
            conversation_id=conversation.id, owner="default", item_ids=["msg_turn"], expected_revision=1
        )
    assert revision == 2
    sqls = [q["sql"].upper() for q in queries.captured_queries]
    assert not any("COUNT(" in sql or "MAX(" in sql or "OFFSET" in sql for sql in sqls), sqls
    last = ConversationItem.objects.get(conversation=conversation, item_id="msg_turn")
    assert last.position == SIZE
