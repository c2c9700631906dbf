"""The admin pages for files and vector stores: status and chunk counts, deleting through the services."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.contrib.auth.models import Permission, User
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from files_app import services
from files_app.models import Chunk, File, VectorStore, VectorStoreFile
from files_app.schemas import static_strategy
from tests.files.conftest import stored_names

pytestmark = pytest.mark.django_db(transaction=True)


def staff(*perms: str) -> Client:
    user = User.objects.create_user("ops", password="pw-for-tests-only", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=perms))
    client = Client()
    client.force_login(user)
    return client


def stored_file(owner: str, name: str) -> File:
    return services.file_create(owner=owner, upload=SimpleUploadedFile(name, b"hello"), purpose="assistants")


def store_with(owner: str, files: list[File]) -> VectorStore:
    return services.vector_store_create(
        owner=owner,
        name="manuals",
        description="",
        file_ids=[f.id for f in files],
        metadata={"team": "ops"},
        expires_after=None,
        chunking_strategy=static_strategy(800, 400),
    )


def test_lists_show_status_and_chunk_counts(file_storage: Path, held_ingestion: list[int]) -> None:
    done, pending = stored_file("key:alice", "done.txt"), stored_file("key:alice", "pending.txt")
    store = store_with("key:alice", [done, pending])
    finished = VectorStoreFile.objects.get(file=done)
    for position in range(3):
        Chunk.objects.create(
            store_file=finished, vector_store=store, file_id=done.id, position=position, text="t", tokens=1
        )
    VectorStoreFile.objects.filter(pk=finished.pk).update(status="completed", usage_bytes=42)
    client = staff("view_vectorstore", "view_file", "view_vectorstorefilebatch", "view_vectorstorefile")

    page = client.get("/admin/files_app/vectorstore/").content.decode()
    assert store.id in page and "key:alice" in page
    assert '<td class="field-status">in_progress</td>' in page
    assert '<td class="field-files_total">2</td>' in page
    assert '<td class="field-files_in_progress">1</td>' in page
    assert '<td class="field-chunks">3</td>' in page
    assert '<td class="field-usage">42</td>' in page
    detail = client.get(f"/admin/files_app/vectorstore/{store.id}/change/").content.decode()
    assert done.id in detail and "completed" in detail and "team" in detail

    files = client.get("/admin/files_app/file/").content.decode()
    assert done.id in files and "done.txt" in files and '<td class="field-stores">1</td>' in files
    assert client.get("/admin/files_app/file/", {"q": "pending"}).content.decode().count(pending.id) >= 1
    assert client.get("/admin/files_app/vectorstorefilebatch/").status_code == 200
    assert client.get("/admin/files_app/file/add/").status_code == 403


def test_deleting_a_file_in_the_admin_removes_its_bytes_chunks_and_attachments(
    file_storage: Path, held_ingestion: list[int]
) -> None:
    gone, kept = stored_file("key:bob", "gone.txt"), stored_file("key:bob", "kept.txt")
    store = store_with("key:bob", [gone, kept])
    attachment = VectorStoreFile.objects.get(file=gone)
    Chunk.objects.create(
        store_file=attachment, vector_store=store, file_id=gone.id, position=0, text="t", tokens=1
    )
    client = staff("view_file", "delete_file", "view_vectorstore", "delete_vectorstore")

    answer = client.post(
        "/admin/files_app/file/", {"action": "delete_selected", "_selected_action": [gone.id], "post": "yes"}
    )
    assert answer.status_code == 302
    assert list(File.objects.values_list("id", flat=True)) == [kept.id]
    assert list(VectorStoreFile.objects.values_list("file_id", flat=True)) == [kept.id]
    assert Chunk.objects.count() == 0
    assert stored_names(file_storage) == [kept.storage_name]

    answer = client.post(f"/admin/files_app/file/{kept.id}/delete/", {"post": "yes"})
    assert answer.status_code == 302 and File.objects.count() == 0
    assert stored_names(file_storage) == []

    # Deleting a store keeps its files.
    other = stored_file("key:bob", "other.txt")
    second = store_with("key:bob", [other])
    answer = client.post(f"/admin/files_app/vectorstore/{second.id}/delete/", {"post": "yes"})
    assert answer.status_code == 302
    assert not VectorStore.objects.filter(id=second.id).exists()
    assert File.objects.filter(id=other.id).exists() and stored_names(file_storage) == [other.storage_name]
