"""A principal's data: exported as JSON lines and deleted (command and admin action), nothing of
another principal read or touched."""

from __future__ import annotations

import builtins
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from django.contrib.auth.models import User
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import CommandError, call_command
from django.test import Client

from conversations_app.models import Conversation, ConversationItem, Item
from files_app import services as file_services
from files_app.models import File, VectorStore
from files_app.schemas import static_strategy
from gateway.core.models import ApiKey
from responses_app.models import Response, ResponseEvent
from tests.retention.test_purge import NOW, conversation, item, response, usage
from usage_app.models import QuotaState, UsageRecord

pytestmark = pytest.mark.django_db(transaction=True)  # files commit their bytes' deletion on commit

MODELS = (
    Response,
    ResponseEvent,
    Conversation,
    ConversationItem,
    Item,
    File,
    VectorStore,
    UsageRecord,
    QuotaState,
)


@pytest.fixture(autouse=True)
def file_storage(settings: Any, tmp_path: Path) -> Iterator[Path]:
    location = tmp_path / "files"
    settings.STORAGES = {
        **settings.STORAGES,
        "files": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(location)},
        },
    }
    yield location


def stored(owner: str) -> dict[str, list[Any]]:
    """Every kind of row a principal has, one or more of each."""
    a, b = item(owner), item(owner)
    first = response([a], NOW, owner=owner, events=2)
    second = response([a, b], NOW, owner=owner, previous=first)
    conv = conversation([b], NOW, owner=owner)
    upload = file_services.file_create(
        owner=owner, upload=SimpleUploadedFile("n.txt", b"notes"), purpose="assistants"
    )
    store = file_services.vector_store_create(
        owner=owner,
        name="s",
        description="",
        file_ids=[],
        metadata={},
        expires_after=None,
        chunking_strategy=static_strategy(800, 400),
    )
    QuotaState.objects.create(owner=owner)
    return {
        "item": [a.id, b.id],
        "response": [first.id, second.id],
        "conversation": [conv.id],
        "file": [upload.id],
        "vector_store": [store.id],
        "usage_record": [usage(NOW, owner=owner).pk],
    }


def counts(owner: str) -> dict[str, int]:
    return {
        "responses": Response.objects.filter(owner=owner).count(),
        "events": ResponseEvent.objects.filter(response__owner=owner).count(),
        "conversations": Conversation.objects.filter(owner=owner).count(),
        "entries": ConversationItem.objects.filter(conversation__owner=owner).count(),
        "items": Item.objects.filter(owner=owner).count(),
        "files": File.objects.filter(owner=owner).count(),
        "stores": VectorStore.objects.filter(owner=owner).count(),
        "usage": UsageRecord.objects.filter(owner=owner).count(),
        "quota": QuotaState.objects.filter(owner=owner).count(),
    }


ALICE, BOB = "oidc:https://idp.example#alice", "key:7"


def test_export_writes_every_row_of_one_principal_only(tmp_path: Path, capsysbinary: Any) -> None:
    mine, theirs = stored(ALICE), stored(BOB)
    out = tmp_path / "alice.jsonl"
    call_command("export_principal", ALICE, output=str(out))
    lines = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    by_type: dict[str, list[dict[str, Any]]] = {}
    for line in lines:
        by_type.setdefault(line["type"], []).append(line["data"])
    for kind, ids in mine.items():
        assert sorted(row.get("id") for row in by_type[kind]) == sorted(ids), kind
    assert len(by_type["response_event"]) == 2 and len(by_type["conversation_item"]) == 1
    assert len(by_type["quota_state"]) == 1
    assert by_type["item"][0]["data"]["role"] == "user"  # the stored content itself
    text = out.read_text()
    for kind, ids in theirs.items():
        if kind != "usage_record":  # a number: its row is checked by id above
            assert not any(i in text for i in ids)
    assert BOB not in text
    # Standard output by default.
    call_command("export_principal", BOB)
    printed = capsysbinary.readouterr()
    assert printed.out.count(b"\n") == len(lines) and b"exported key:7" in printed.err


def test_delete_removes_everything_of_one_principal_only(file_storage: Path) -> None:
    stored(ALICE)
    theirs = stored(BOB)
    before = counts(BOB)
    assert all(counts(ALICE).values())
    call_command("delete_principal", ALICE, yes=True)
    assert not any(counts(ALICE).values())
    assert counts(BOB) == before
    names = sorted(p.name for p in file_storage.rglob("*") if p.is_file())
    assert names == theirs["file"]  # alice's bytes are gone, bob's stay
    second = Response.objects.get(id=theirs["response"][1])
    assert second.previous_response_id == theirs["response"][0]


def test_delete_asks_first_and_refuses_unknown_subject_forms(monkeypatch: pytest.MonkeyPatch) -> None:
    stored(ALICE)
    before = counts(ALICE)
    monkeypatch.setattr(builtins, "input", lambda prompt: "no")
    with pytest.raises(CommandError, match="not deleted"):
        call_command("delete_principal", ALICE)
    assert counts(ALICE) == before
    for wrong in ("alice", "key:abc", "oidc:https://idp.example", "user:1"):
        with pytest.raises(CommandError, match="not an owner key"):
            call_command("delete_principal", wrong, yes=True)
        with pytest.raises(CommandError, match="not an owner key"):
            call_command("export_principal", wrong)
    monkeypatch.setattr(builtins, "input", lambda prompt: "yes")
    call_command("delete_principal", ALICE)
    assert not any(counts(ALICE).values())


def test_the_admin_deletes_a_keys_principal_data() -> None:
    key, other = (
        ApiKey.objects.create(name="alice", key_hash="a" * 64),
        ApiKey.objects.create(name="bob", key_hash="b" * 64),
    )
    stored(key.owner)
    stored(other.owner)
    before = counts(other.owner)
    client = Client()
    client.force_login(User.objects.create_superuser("root", password="pw-for-tests-only"))
    r = client.post(
        "/admin/gateway/apikey/",
        {"action": "delete_principal_data", "_selected_action": [key.pk]},
        follow=True,
    )
    assert r.status_code == 200
    assert (
        f"Deleted the data of {key.owner} (alice): 2 responses, 1 conversations, 2 items"
        in r.content.decode()
    )
    assert not any(counts(key.owner).values())
    assert counts(other.owner) == before
    assert ApiKey.objects.filter(pk=key.pk).exists()  # the key itself stays
