"""Rows for the retrieval tests, made with the ORM (uploads and ingestion are tested elsewhere), and
the query embedder they use: the configured upstream's ``/v1/embeddings`` over HTTP, behind the
interface of ``files_app.embeddings.embed``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import aiohttp
import numpy as np

from files_app.models import Chunk, File, VectorStore, VectorStoreFile
from gateway.core.ids import new_id

EMBEDDING_MODEL = "test-embedder"


def make_store(*, owner: str = "default", model: str = "", dimensions: int | None = None) -> VectorStore:
    return VectorStore.objects.create(
        id=new_id("vs"), owner=owner, name="docs", embedding_model=model, embedding_dimensions=dimensions
    )


def pack(vector: Sequence[float]) -> bytes:
    return np.asarray(vector, dtype="<f4").tobytes()


def add_file(
    store: VectorStore,
    filename: str,
    chunks: Sequence[str | tuple[str, Sequence[float]]],
    *,
    status: str = VectorStoreFile.Status.COMPLETED,
    attributes: dict[str, Any] | None = None,
    bump: bool = True,
) -> VectorStoreFile:
    """A file attached to ``store`` with its chunks (text, or text and embedding); publishing bumps
    the store's revision as ingestion does."""
    file = File.objects.create(
        id=new_id("file"),
        owner=store.owner,
        filename=filename,
        purpose="assistants",
        bytes=1,
        storage_name=filename,
    )
    attached = VectorStoreFile.objects.create(
        vector_store=store, file=file, status=status, attributes=attributes or {}
    )
    for position, chunk in enumerate(chunks):
        text, vector = (chunk, None) if isinstance(chunk, str) else chunk
        Chunk.objects.create(
            store_file=attached,
            vector_store=store,
            file_id=file.id,
            position=position,
            text=text,
            tokens=len(text.split()),
            embedding=pack(vector) if vector is not None else None,
        )
    if bump:
        store.revision += 1
        store.save(update_fields=["revision"])
    return attached


def embedder(base_url: str) -> Any:
    """``embed(texts)`` against ``base_url``'s ``/v1/embeddings`` (vLLM's wire format)."""

    async def embed(texts: list[str]) -> list[list[float]]:
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                base_url + "/v1/embeddings", json={"model": EMBEDDING_MODEL, "input": texts}
            ) as answer,
        ):
            body = await answer.json()
        return [item["embedding"] for item in sorted(body["data"], key=lambda item: item["index"])]

    return embed
