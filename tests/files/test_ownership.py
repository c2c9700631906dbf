"""Files and vector stores belong to their principal: another owner's id is a 404 everywhere, in the
URL and in a body, and nothing of the owner's changes."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from files_app.models import File, VectorStore, VectorStoreFile, VectorStoreFileBatch
from tests.files.conftest import OWNER_HEADER, sdk, stored_names
from tests.servers import LiveServer


def test_another_owners_files_and_stores_are_404_everywhere(
    owned_gateway: LiveServer, file_storage: Path
) -> None:
    alice = sdk(owned_gateway.url, **{OWNER_HEADER: "key:alice"})
    bob = sdk(owned_gateway.url, **{OWNER_HEADER: "key:bob"})
    default = sdk(owned_gateway.url)
    secret = alice.files.create(file=("secret.txt", b"alice's secret"), purpose="assistants")
    store = alice.vector_stores.create(name="alice's", file_ids=[secret.id])
    batch = alice.vector_stores.file_batches.create(vector_store_id=store.id, file_ids=[secret.id])
    assert File.objects.get(id=secret.id).owner == "key:alice"
    assert VectorStore.objects.get(id=store.id).owner == "key:alice"

    for other in (bob, default):
        assert other.files.list().data == [] and other.vector_stores.list().data == []
        file_calls = [
            lambda c=other: c.files.retrieve(secret.id),
            lambda c=other: c.files.content(secret.id),
            lambda c=other: c.files.delete(secret.id),
        ]
        for call in file_calls:
            with pytest.raises(openai.NotFoundError) as exc:
                call()
            assert exc.value.body["message"] == f"No file found with id '{secret.id}'."
        store_calls = [
            lambda c=other: c.vector_stores.retrieve(store.id),
            lambda c=other: c.vector_stores.update(store.id, name="mine"),
            lambda c=other: c.vector_stores.delete(store.id),
            lambda c=other: c.vector_stores.files.list(vector_store_id=store.id),
            lambda c=other: c.vector_stores.files.create(vector_store_id=store.id, file_id=secret.id),
            lambda c=other: c.vector_stores.files.retrieve(secret.id, vector_store_id=store.id),
            lambda c=other: c.vector_stores.files.update(secret.id, vector_store_id=store.id, attributes={}),
            lambda c=other: c.vector_stores.files.delete(secret.id, vector_store_id=store.id),
            lambda c=other: c.vector_stores.files.content(secret.id, vector_store_id=store.id),
            lambda c=other: c.vector_stores.file_batches.create(
                vector_store_id=store.id, file_ids=[secret.id]
            ),
            lambda c=other: c.vector_stores.file_batches.retrieve(batch.id, vector_store_id=store.id),
            lambda c=other: c.vector_stores.file_batches.cancel(batch.id, vector_store_id=store.id),
            lambda c=other: c.vector_stores.file_batches.list_files(batch.id, vector_store_id=store.id),
        ]
        for call in store_calls:
            with pytest.raises(openai.NotFoundError) as exc:
                call()
            assert exc.value.body == {
                "message": f"No vector store found with id '{store.id}'.",
                "type": "invalid_request_error",
                "param": None,
                "code": None,
            }
        # Nor can Alice's file be put into a store of one's own (a body id: 404 naming the field).
        own = other.vector_stores.create(name="own")
        with pytest.raises(openai.NotFoundError) as exc:
            other.vector_stores.files.create(vector_store_id=own.id, file_id=secret.id)
        assert exc.value.body["param"] == "file_id"
        with pytest.raises(openai.NotFoundError) as exc:
            other.vector_stores.create(file_ids=[secret.id])
        assert exc.value.body["param"] == "file_ids[0]"
        with pytest.raises(openai.NotFoundError) as exc:
            other.vector_stores.file_batches.create(vector_store_id=own.id, files=[{"file_id": secret.id}])
        assert exc.value.body["param"] == "files[0].file_id"
        with pytest.raises(openai.NotFoundError):
            other.vector_stores.files.list(vector_store_id=store.id, after=secret.id)

    # Alice's things are untouched.
    assert alice.files.content(secret.id).read() == b"alice's secret"
    assert alice.vector_stores.retrieve(store.id).name == "alice's"
    assert VectorStoreFile.objects.filter(file_id=secret.id).count() == 1
    assert VectorStoreFileBatch.objects.count() == 1
    assert stored_names(file_storage) == [File.objects.get(id=secret.id).storage_name]
    assert VectorStore.objects.filter(owner="key:bob").count() == 1


def test_every_endpoint_checks_stored_state_access(live_gateway: LiveServer, gateway_config: object) -> None:
    """The ``OPENAI_API_KEY`` rule: on an open gateway with that key set, files and stores are for
    callers presenting it; anyone else gets a 401 before anything is read or stored."""
    gateway_config(openai_api_key="sk-upstream")  # type: ignore[operator]
    holder = openai.OpenAI(base_url=live_gateway.url + "/v1", api_key="sk-upstream", max_retries=0)
    stranger = openai.OpenAI(base_url=live_gateway.url + "/v1", api_key="sk-other", max_retries=0)
    existing = holder.files.create(file=("a.txt", b"a"), purpose="assistants")
    calls = [
        lambda c: c.files.create(file=("b.txt", b"b"), purpose="assistants"),
        lambda c: c.files.list(),
        lambda c: c.files.retrieve(existing.id),
        lambda c: c.files.content(existing.id),
        lambda c: c.vector_stores.create(name="x"),
        lambda c: c.vector_stores.list(),
    ]
    for call in calls:
        with pytest.raises(openai.AuthenticationError):
            call(stranger)
    assert File.objects.count() == 1 and VectorStore.objects.count() == 0
