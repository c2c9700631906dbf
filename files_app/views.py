"""The Files and vector stores APIs (OpenAI-compatible): thin DRF views over services and selectors.

Principal (``gateway.core.drf``) → body (``schemas``; a multipart upload: ``upload``) → service or
selector filtered by owner (another owner's id is a 404) → the answer in the SDK's shape. Each view
runs as one :func:`gateway.core.db.run_orm` call; a file's bytes are streamed back on the event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import IO, Any

from django.http import HttpRequest, StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from files_app import schemas, selectors, services
from files_app.models import File, VectorStore, VectorStoreFile, VectorStoreFileBatch
from files_app.upload import parse_upload
from gateway.core import errors
from gateway.core.config import get_config
from gateway.core.drf import LIST_PARAMETERS, ListPage, ResourceView, list_body, parse_list_params
from gateway.core.http import parse_json_body
from gateway.core.openapi import ERROR_RESPONSES

FILES_TAGS = ["Files"]
STORES_TAGS = ["Vector stores"]
DOWNLOAD_CHUNK_BYTES = 256 * 1024

FILE_ID = OpenApiParameter("file_id", OpenApiTypes.STR, OpenApiParameter.PATH)
VECTOR_STORE_ID = OpenApiParameter("vector_store_id", OpenApiTypes.STR, OpenApiParameter.PATH)
BATCH_ID = OpenApiParameter("batch_id", OpenApiTypes.STR, OpenApiParameter.PATH)
BEFORE = OpenApiParameter("before", OpenApiTypes.STR, description="An id; the page ends just before it.")
STATUS_FILTER = OpenApiParameter("filter", OpenApiTypes.STR, enum=list(schemas.STORE_FILE_STATUSES))
FILE_LIST_PARAMETERS = [
    OpenApiParameter("after", OpenApiTypes.STR),
    OpenApiParameter("limit", OpenApiTypes.INT, description="1 to 10000 (default 10000)."),
    OpenApiParameter("order", OpenApiTypes.STR, enum=["asc", "desc"]),
    OpenApiParameter("purpose", OpenApiTypes.STR),
]
UPLOAD_ERRORS = {**ERROR_RESPONSES, 413: ERROR_RESPONSES[400]}


class FileList(ListPage[schemas.FileObject]):
    pass


class VectorStoreList(ListPage[schemas.VectorStoreObject]):
    pass


class VectorStoreFileList(ListPage[schemas.VectorStoreFileObject]):
    pass


# ------------------------------------------------------------------------------------------ rendering
def _seconds(value: Any) -> int | None:
    return int(value.timestamp()) if value is not None else None


def render_file(row: File) -> dict[str, Any]:
    return schemas.FileObject(
        id=row.id,
        bytes=row.bytes,
        created_at=int(row.created_at.timestamp()),
        expires_at=_seconds(row.expires_at),
        filename=row.filename,
        purpose=row.purpose,
    ).model_dump()


def render_stores(stores: list[VectorStore]) -> list[dict[str, Any]]:
    counts = selectors.store_counts([s.id for s in stores])
    return [
        {
            "id": store.id,
            "object": "vector_store",
            "created_at": int(store.created_at.timestamp()),
            "name": store.name,
            "usage_bytes": counts[store.id].usage_bytes,
            "file_counts": counts[store.id].file_counts(),
            "status": selectors.store_status(store, counts[store.id]),
            "expires_after": store.expires_after or None,
            "expires_at": _seconds(store.expires_at),
            "last_active_at": _seconds(store.last_active_at),
            "metadata": store.metadata or {},
        }
        for store in stores
    ]


def render_store_file(row: VectorStoreFile) -> dict[str, Any]:
    return {
        "id": row.file_id,
        "object": "vector_store.file",
        "usage_bytes": row.usage_bytes,
        "created_at": int(row.created_at.timestamp()),
        "vector_store_id": row.vector_store_id,
        "status": row.status,
        "last_error": row.last_error or None,
        "chunking_strategy": row.chunking_strategy or None,
        "attributes": row.attributes or {},
    }


def render_batch(batch: VectorStoreFileBatch) -> dict[str, Any]:
    counts = selectors.batch_counts([batch.id])[batch.id]
    return {
        "id": batch.id,
        "object": "vector_store.files_batch",
        "created_at": int(batch.created_at.timestamp()),
        "vector_store_id": batch.vector_store_id,
        "status": selectors.batch_status(batch, counts),
        "file_counts": counts.file_counts(),
    }


# ---------------------------------------------------------------------------------------- list query
def _query_int(query: Mapping[str, Any], name: str, default: int, high: int) -> int:
    raw = query.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise errors.BadRequest(
            f"Invalid '{name}': expected an integer, but got '{raw}' instead.",
            param=name,
            code="invalid_type",
        ) from None
    if not 1 <= value <= high:
        raise errors.BadRequest(
            f"Invalid '{name}': expected a value between 1 and {high}, but got {value} instead.",
            param=name,
            code="invalid_value",
        )
    return value


def _order(query: Mapping[str, Any]) -> str:
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise errors.invalid_value("order", order, ("asc", "desc"))
    return str(order)


def _refuse_unknown_query(query: Mapping[str, Any], known: tuple[str, ...]) -> None:
    for name in query:
        if name not in known:
            raise errors.BadRequest(f"Unknown parameter: '{name}'.", param=name, code="unknown_parameter")


def _list(rows: list[dict[str, Any]], has_more: bool) -> Response:
    return Response(list_body(rows, has_more=has_more))


# -------------------------------------------------------------------------------------------- files
class FilesView(ResourceView):
    def initialize_request(self, request: HttpRequest, *args: Any, **kwargs: Any) -> Request:
        self.http_request = request  # the upload is parsed from Django's request (files_app.upload)
        return super().initialize_request(request, *args, **kwargs)

    @extend_schema(
        operation_id="files_create",
        tags=FILES_TAGS,
        request={"multipart/form-data": schemas.FileUploadParams},
        responses={200: schemas.FileObject, **UPLOAD_ERRORS},
    )
    def post(self, request: Request) -> Response:
        """Upload a file (``multipart/form-data``: ``file``, ``purpose``, optional ``expires_after``)."""
        limit = get_config().files.max_upload_bytes
        upload = parse_upload(self.http_request, limit=limit)
        try:
            row = services.file_create(
                owner=self.owner,
                upload=upload.file,
                purpose=upload.purpose,
                expires_after_s=upload.expires_after_s,
            )
        finally:
            upload.discard()
        return Response(render_file(row))

    @extend_schema(
        operation_id="files_list",
        tags=FILES_TAGS,
        parameters=FILE_LIST_PARAMETERS,
        responses={200: FileList, **ERROR_RESPONSES},
    )
    def get(self, request: Request) -> Response:
        query = request.query_params
        _refuse_unknown_query(query, ("after", "limit", "order", "purpose"))
        after = query.get("after") or None
        page = selectors.file_list(
            owner=self.owner,
            purpose=query.get("purpose") or None,
            after=after,
            limit=_query_int(query, "limit", schemas.FILE_LIST_LIMIT_DEFAULT, schemas.FILE_LIST_LIMIT_MAX),
            order=_order(query),
        )
        return _list([render_file(row) for row in page.rows], page.has_more)


class FileDetailView(ResourceView):
    @extend_schema(
        operation_id="files_retrieve",
        tags=FILES_TAGS,
        parameters=[FILE_ID],
        responses={200: schemas.FileObject, **ERROR_RESPONSES},
    )
    def get(self, request: Request, file_id: str) -> Response:
        return Response(render_file(selectors.file_get(id=file_id, owner=self.owner)))

    @extend_schema(
        operation_id="files_delete",
        tags=FILES_TAGS,
        parameters=[FILE_ID],
        responses={200: schemas.FileDeleted, **ERROR_RESPONSES},
    )
    def delete(self, request: Request, file_id: str) -> Response:
        """Delete the file, its attachments and chunks in every vector store, and its bytes."""
        services.file_delete(id=file_id, owner=self.owner)
        return Response({"id": file_id, "object": "file", "deleted": True})


async def _stream(handle: IO[bytes]) -> AsyncIterator[bytes]:
    try:
        while chunk := await asyncio.to_thread(handle.read, DOWNLOAD_CHUNK_BYTES):
            yield chunk
    finally:
        await asyncio.to_thread(handle.close)


class FileContentView(ResourceView):
    @extend_schema(
        operation_id="files_content",
        tags=FILES_TAGS,
        parameters=[FILE_ID],
        responses={(200, "application/octet-stream"): OpenApiTypes.BINARY, **ERROR_RESPONSES},
    )
    def get(self, request: Request, file_id: str) -> StreamingHttpResponse:
        """The file's bytes, streamed from storage."""
        row = selectors.file_get(id=file_id, owner=self.owner)
        handle = services.file_storage().open(row.storage_name, "rb")
        response = StreamingHttpResponse(_stream(handle), content_type="application/octet-stream")
        response["Content-Length"] = str(row.bytes)
        response["Content-Disposition"] = _attachment(row.filename)
        return response


def _attachment(filename: str) -> str:
    from urllib.parse import quote

    return f"attachment; filename*=UTF-8''{quote(filename, safe='')}"


# ------------------------------------------------------------------------------------ vector stores
def _json(request: Request) -> Any:
    return parse_json_body(request)


class VectorStoresView(ResourceView):
    @extend_schema(
        operation_id="vector_stores_create",
        tags=STORES_TAGS,
        request=schemas.VectorStoreCreateParams,
        responses={200: schemas.VectorStoreObject, **ERROR_RESPONSES},
    )
    def post(self, request: Request) -> Response:
        body = schemas.VectorStoreCreateParams.parse(_json(request))
        store = services.vector_store_create(owner=self.owner, **body)
        return Response(render_stores([store])[0])

    @extend_schema(
        operation_id="vector_stores_list",
        tags=STORES_TAGS,
        parameters=[*LIST_PARAMETERS, BEFORE],
        responses={200: VectorStoreList, **ERROR_RESPONSES},
    )
    def get(self, request: Request) -> Response:
        query = request.query_params
        _refuse_unknown_query(query, ("after", "before", "limit", "order"))
        params = parse_list_params(query)
        page = selectors.vector_store_list(
            owner=self.owner,
            after=params.after,
            before=query.get("before") or None,
            limit=params.limit,
            order=params.order,
        )
        return _list(render_stores(page.rows), page.has_more)


class VectorStoreDetailView(ResourceView):
    @extend_schema(
        operation_id="vector_stores_retrieve",
        tags=STORES_TAGS,
        parameters=[VECTOR_STORE_ID],
        responses={200: schemas.VectorStoreObject, **ERROR_RESPONSES},
    )
    def get(self, request: Request, vector_store_id: str) -> Response:
        store = selectors.vector_store_get(id=vector_store_id, owner=self.owner)
        return Response(render_stores([store])[0])

    @extend_schema(
        operation_id="vector_stores_update",
        tags=STORES_TAGS,
        parameters=[VECTOR_STORE_ID],
        request=schemas.VectorStoreUpdateParams,
        responses={200: schemas.VectorStoreObject, **ERROR_RESPONSES},
    )
    def post(self, request: Request, vector_store_id: str) -> Response:
        selectors.vector_store_get(id=vector_store_id, owner=self.owner)
        changes = schemas.VectorStoreUpdateParams.parse(_json(request))
        store = services.vector_store_update(id=vector_store_id, owner=self.owner, changes=changes)
        return Response(render_stores([store])[0])

    @extend_schema(
        operation_id="vector_stores_delete",
        tags=STORES_TAGS,
        parameters=[VECTOR_STORE_ID],
        responses={200: schemas.VectorStoreDeleted, **ERROR_RESPONSES},
    )
    def delete(self, request: Request, vector_store_id: str) -> Response:
        """Delete the store with its attachments and chunks; the files stay."""
        services.vector_store_delete(id=vector_store_id, owner=self.owner)
        return Response({"id": vector_store_id, "object": "vector_store.deleted", "deleted": True})


def _store_file_page(
    request: Request, store: VectorStore, batch: VectorStoreFileBatch | None = None
) -> Response:
    query = request.query_params
    _refuse_unknown_query(query, ("after", "before", "limit", "order", "filter"))
    params = parse_list_params(query)
    page = selectors.store_file_list(
        store=store,
        batch=batch,
        status=schemas.validate_status_filter(query.get("filter")),
        after=params.after,
        before=query.get("before") or None,
        limit=params.limit,
        order=params.order,
    )
    return _list([render_store_file(row) for row in page.rows], page.has_more)


class VectorStoreFilesView(ResourceView):
    @extend_schema(
        operation_id="vector_stores_files_create",
        tags=STORES_TAGS,
        parameters=[VECTOR_STORE_ID],
        request=schemas.StoreFileCreateParams,
        responses={200: schemas.VectorStoreFileObject, **ERROR_RESPONSES},
    )
    def post(self, request: Request, vector_store_id: str) -> Response:
        """Attach a file; its ingestion starts in the background (``status`` ``in_progress``)."""
        selectors.vector_store_get(id=vector_store_id, owner=self.owner)
        body = schemas.StoreFileCreateParams.parse(_json(request))
        attachment = schemas.NewAttachment(
            file_id=body["file_id"],
            param="file_id",
            attributes=body["attributes"],
            chunking=body["chunking_strategy"],
        )
        row = services.store_file_create(
            vector_store_id=vector_store_id, owner=self.owner, attachment=attachment
        )
        return Response(render_store_file(row))

    @extend_schema(
        operation_id="vector_stores_files_list",
        tags=STORES_TAGS,
        parameters=[VECTOR_STORE_ID, *LIST_PARAMETERS, BEFORE, STATUS_FILTER],
        responses={200: VectorStoreFileList, **ERROR_RESPONSES},
    )
    def get(self, request: Request, vector_store_id: str) -> Response:
        store = selectors.vector_store_get(id=vector_store_id, owner=self.owner)
        return _store_file_page(request, store)


class VectorStoreFileDetailView(ResourceView):
    @extend_schema(
        operation_id="vector_stores_files_retrieve",
        tags=STORES_TAGS,
        parameters=[VECTOR_STORE_ID, FILE_ID],
        responses={200: schemas.VectorStoreFileObject, **ERROR_RESPONSES},
    )
    def get(self, request: Request, vector_store_id: str, file_id: str) -> Response:
        store = selectors.vector_store_get(id=vector_store_id, owner=self.owner)
        return Response(render_store_file(selectors.store_file_get(store=store, file_id=file_id)))

    @extend_schema(
        operation_id="vector_stores_files_update",
        tags=STORES_TAGS,
        parameters=[VECTOR_STORE_ID, FILE_ID],
        request=schemas.StoreFileUpdateParams,
        responses={200: schemas.VectorStoreFileObject, **ERROR_RESPONSES},
    )
    def post(self, request: Request, vector_store_id: str, file_id: str) -> Response:
        """Replace the attachment's ``attributes``."""
        store = selectors.vector_store_get(id=vector_store_id, owner=self.owner)
        selectors.store_file_get(store=store, file_id=file_id)
        body = schemas.StoreFileUpdateParams.parse(_json(request))
        row = services.store_file_update(
            vector_store_id=vector_store_id, owner=self.owner, file_id=file_id, **body
        )
        return Response(render_store_file(row))

    @extend_schema(
        operation_id="vector_stores_files_delete",
        tags=STORES_TAGS,
        parameters=[VECTOR_STORE_ID, FILE_ID],
        responses={200: schemas.VectorStoreFileDeleted, **ERROR_RESPONSES},
    )
    def delete(self, request: Request, vector_store_id: str, file_id: str) -> Response:
        """Detach the file from the store (its chunks there go with it); the file stays."""
        services.store_file_delete(vector_store_id=vector_store_id, owner=self.owner, file_id=file_id)
        return Response({"id": file_id, "object": "vector_store.file.deleted", "deleted": True})


class VectorStoreFileContentView(ResourceView):
    @extend_schema(
        operation_id="vector_stores_files_content",
        tags=STORES_TAGS,
        parameters=[VECTOR_STORE_ID, FILE_ID],
        responses={200: schemas.VectorStoreFileContent, **ERROR_RESPONSES},
    )
    def get(self, request: Request, vector_store_id: str, file_id: str) -> Response:
        """The file's parsed text as this store chunked it: one entry per chunk, in order (chunks
        overlap by the strategy's ``chunk_overlap_tokens``); empty until it is ``completed``."""
        store = selectors.vector_store_get(id=vector_store_id, owner=self.owner)
        row = selectors.store_file_get(store=store, file_id=file_id)
        parts = [{"type": "text", "text": text} for text in selectors.store_file_chunks(row)]
        return Response(
            {"object": "vector_store.file_content.page", "data": parts, "has_more": False, "next_page": None}
        )


class FileBatchesView(ResourceView):
    @extend_schema(
        operation_id="vector_stores_file_batches_create",
        tags=STORES_TAGS,
        parameters=[VECTOR_STORE_ID],
        request=schemas.FileBatchCreateParams,
        responses={200: schemas.VectorStoreFileBatchObject, **ERROR_RESPONSES},
    )
    def post(self, request: Request, vector_store_id: str) -> Response:
        """Attach up to 2000 files at once (``file_ids`` or ``files``)."""
        selectors.vector_store_get(id=vector_store_id, owner=self.owner)
        body = schemas.FileBatchCreateParams.parse(_json(request))
        batch = services.batch_create(
            vector_store_id=vector_store_id, owner=self.owner, attachments=body["files"]
        )
        return Response(render_batch(batch))


class FileBatchDetailView(ResourceView):
    @extend_schema(
        operation_id="vector_stores_file_batches_retrieve",
        tags=STORES_TAGS,
        parameters=[VECTOR_STORE_ID, BATCH_ID],
        responses={200: schemas.VectorStoreFileBatchObject, **ERROR_RESPONSES},
    )
    def get(self, request: Request, vector_store_id: str, batch_id: str) -> Response:
        store = selectors.vector_store_get(id=vector_store_id, owner=self.owner)
        return Response(render_batch(selectors.batch_get(store=store, batch_id=batch_id)))


class FileBatchCancelView(ResourceView):
    @extend_schema(
        operation_id="vector_stores_file_batches_cancel",
        tags=STORES_TAGS,
        parameters=[VECTOR_STORE_ID, BATCH_ID],
        request=None,
        responses={200: schemas.VectorStoreFileBatchObject, **ERROR_RESPONSES},
    )
    def post(self, request: Request, vector_store_id: str, batch_id: str) -> Response:
        """Cancel the batch: its files still in progress become ``cancelled``."""
        batch = services.batch_cancel(vector_store_id=vector_store_id, owner=self.owner, batch_id=batch_id)
        return Response(render_batch(batch))


class FileBatchFilesView(ResourceView):
    @extend_schema(
        operation_id="vector_stores_file_batches_list_files",
        tags=STORES_TAGS,
        parameters=[VECTOR_STORE_ID, BATCH_ID, *LIST_PARAMETERS, BEFORE, STATUS_FILTER],
        responses={200: VectorStoreFileList, **ERROR_RESPONSES},
    )
    def get(self, request: Request, vector_store_id: str, batch_id: str) -> Response:
        store = selectors.vector_store_get(id=vector_store_id, owner=self.owner)
        batch = selectors.batch_get(store=store, batch_id=batch_id)
        return _store_file_page(request, store, batch)
