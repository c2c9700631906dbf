"""End to end through the SDK: a chain whose first response expired goes on from its kept successor,
with every item of its history (the purge kept what the successor lists)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

import openai
import orjson
import pytest
from django.utils import timezone

from conversations_app.models import Item
from gateway.data import retention
from responses_app.models import Response
from tests.responses.conftest import Gateway
from tests.responses.scripts import text


def test_a_kept_continuation_still_has_its_expired_parents_items(
    gw: Gateway, gateway_config: Callable[..., Any]
) -> None:
    gw.script(text("Paris."))
    first = gw.client.responses.create(model="test-model", input="Capital of France?")
    gw.script(text("About 2 million."))
    second = gw.client.responses.create(
        model="test-model", input="Its population?", previous_response_id=first.id
    )
    Response.objects.filter(id=first.id).update(created_at=timezone.now() - dt.timedelta(days=40))
    gateway_config(retention__responses_days=30)

    report = retention.purge()

    assert report.responses == 1 and report.items == 0  # every item of the first is in the second
    with pytest.raises(openai.NotFoundError):
        gw.client.responses.retrieve(first.id)
    assert [i.id for i in gw.client.responses.input_items.list(second.id, order="asc")][:1]
    gw.script(text("Yes."))
    third = gw.client.responses.create(model="test-model", input="Sure?", previous_response_id=second.id)
    assert third.output_text == "Yes."
    sent = orjson.dumps(gw.upstream_bodies()[-1]).decode()
    for earlier in ("Capital of France?", "Paris.", "Its population?", "About 2 million."):
        assert earlier in sent

    # Once the whole chain has expired, its items go with its last response.
    stored_items = Item.objects.count()
    assert stored_items == 6  # three inputs, three answers
    Response.objects.update(created_at=timezone.now() - dt.timedelta(days=40))
    report = retention.purge()
    assert report.responses == 2 and report.items == stored_items
    assert not Item.objects.exists()
