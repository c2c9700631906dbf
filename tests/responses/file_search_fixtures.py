"""Vector stores, files and chunks made with the ORM for the file_search and input_file tests (the
upload API and ingestion are tested on their own), and the file bytes in the ``files`` storage."""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from typing import Any

from django.core.files.base import ContentFile
from django.core.files.storage import storages

from files_app.models import Chunk, File, VectorStore, VectorStoreFile


def make_file(
    filename: str, data: bytes = b"", *, owner: str = "default", content_type: str = "text/plain"
) -> File:
    """A file row whose bytes are in the ``files`` storage."""
    file_id = f"file-{secrets.token_hex(12)}"
    name = storages["files"].save(f"{file_id}/{filename}", ContentFile(data))
    return File.objects.create(
        id=file_id,
        owner=owner,
        filename=filename,
        purpose="user_data",
        bytes=len(data),
        content_type=content_type,
        storage_name=name,
    )


def make_store(
    documents: Iterable[tuple[str, str, dict[str, Any]]], *, owner: str = "default"
) -> tuple[VectorStore, list[File]]:
    """A store of completed files, one chunk each: ``(filename, text, attributes)``."""
    store = VectorStore.objects.create(id=f"vs_{secrets.token_hex(12)}", owner=owner, name="docs")
    files = []
    for filename, text, attributes in documents:
        file = make_file(filename, text.encode(), owner=owner)
        attached = VectorStoreFile.objects.create(
            vector_store=store,
            file=file,
            status=VectorStoreFile.Status.COMPLETED,
            attributes=attributes,
            usage_bytes=len(text.encode()),
        )
        Chunk.objects.create(
            store_file=attached,
            vector_store=store,
            file_id=file.id,
            position=0,
            text=text,
            tokens=len(text.split()),
        )
        files.append(file)
    return store, files
