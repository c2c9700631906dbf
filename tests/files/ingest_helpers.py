"""Rows and bytes for the ingestion tests: a store, a file in the "files" storage, an attachment."""

from __future__ import annotations

import secrets
import time
from typing import Any

from django.core.files.base import ContentFile
from django.core.files.storage import storages

from files_app.models import File, VectorStore, VectorStoreFile


def make_store(**fields: Any) -> VectorStore:
    return VectorStore.objects.create(id=f"vs_{secrets.token_hex(12)}", owner="tester", **fields)


def make_attachment(
    data: bytes,
    filename: str = "notes.txt",
    *,
    content_type: str = "",
    store: VectorStore | None = None,
    chunking_strategy: dict[str, Any] | None = None,
) -> VectorStoreFile:
    """A file whose bytes are stored, attached (in progress) to ``store`` (a new one by default)."""
    file_id = f"file-{secrets.token_hex(12)}"
    name = storages["files"].save(f"{file_id}/{filename}", ContentFile(data))
    file = File.objects.create(
        id=file_id,
        owner="tester",
        filename=filename,
        purpose="assistants",
        bytes=len(data),
        content_type=content_type,
        storage_name=name,
    )
    return VectorStoreFile.objects.create(
        vector_store=store or make_store(), file=file, chunking_strategy=chunking_strategy or {}
    )


def static(size: int, overlap: int) -> dict[str, Any]:
    return {"type": "static", "static": {"max_chunk_size_tokens": size, "chunk_overlap_tokens": overlap}}


def wait_status(pk: int, wanted: str, timeout: float = 20.0) -> VectorStoreFile:
    deadline = time.monotonic() + timeout
    row = VectorStoreFile.objects.get(pk=pk)
    while row.status != wanted and time.monotonic() < deadline:
        time.sleep(0.02)
        row = VectorStoreFile.objects.get(pk=pk)
    assert row.status == wanted, f"attachment {pk}: {row.status} {row.last_error}"
    return row


def make_pdf(lines: list[str]) -> bytes:
    """A one-page PDF whose text layer holds ``lines`` (Helvetica, written by hand: no PDF writer)."""

    def escape(text: str) -> str:
        return text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")

    stream = "BT /F1 12 Tf 14 TL 72 720 Td " + " ".join(f"({escape(line)}) Tj T*" for line in lines) + " ET"
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
        b"/Resources << /Font << /F1 5 0 R >> >> >>",
        f"<< /Length {len(stream)} >>\nstream\n{stream}\nendstream".encode(),
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    out = b"%PDF-1.4\n"
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += f"{number} 0 obj\n".encode() + body + b"\nendobj\n"
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    out += b"".join(f"{offset:010d} 00000 n \n".encode() for offset in offsets)
    out += f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    return out
