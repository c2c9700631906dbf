"""Wire models of the Files and vector stores APIs and the validation of what clients send.

The models follow the ``openai`` SDK's types (``openai.types.file_object``, ``vector_store``,
``vector_stores.*``) and describe the OpenAPI document; the ``validate_*`` functions check a body field
by field, and every refusal is an OpenAI-shaped 400 whose ``param`` is the field's JSON path
(``file_ids[0]``, ``files[1].attributes.author``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gateway.core import errors
from gateway.core.params import (
    METADATA_MAX_KEY_LENGTH,
    METADATA_MAX_PAIRS,
    METADATA_MAX_VALUE_LENGTH,
    refuse_long_key,
    refuse_too_many_properties,
    validate_metadata,
)

# OpenAI's limits.
FILE_PURPOSES = ("assistants", "batch", "fine-tune", "vision", "user_data", "evals")
FILE_EXPIRES_MIN_S = 3600
FILE_EXPIRES_MAX_S = 30 * 24 * 3600
FILE_LIST_LIMIT_DEFAULT = 10_000
FILE_LIST_LIMIT_MAX = 10_000
ATTRIBUTES_MAX_PAIRS = 16
ATTRIBUTES_MAX_KEY_LENGTH = 64
ATTRIBUTES_MAX_VALUE_LENGTH = 512
STORE_NAME_MAX_LENGTH = 512
STORE_EXPIRES_MIN_DAYS = 1
STORE_EXPIRES_MAX_DAYS = 365
MAX_FILES_PER_REQUEST = 2000  # OpenAI's batch size; also bounds file_ids of a store's creation
CHUNK_SIZE_MIN = 100
CHUNK_SIZE_MAX = 4096
# OpenAI's ``auto`` strategy, resolved when a file is attached (what the API reports back).
AUTO_CHUNK_SIZE = 800
AUTO_CHUNK_OVERLAP = 400
STORE_FILE_STATUSES = ("in_progress", "completed", "failed", "cancelled")
MAX_ID_LENGTH = 64

invalid_type = errors.invalid_type
invalid_value = errors.invalid_value
missing_parameter = errors.missing_parameter


# ------------------------------------------------------------------------------------------- answers
class FileObject(BaseModel):
    """``openai.types.FileObject``."""

    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int = Field(description="Unix seconds.")
    expires_at: int | None = None
    filename: str
    purpose: str
    status: Literal["uploaded", "processed", "error"] = "processed"
    status_details: str | None = None


class FileDeleted(BaseModel):
    id: str
    object: Literal["file"] = "file"
    deleted: bool


class FileCounts(BaseModel):
    in_progress: int
    completed: int
    failed: int
    cancelled: int
    total: int


class StoreExpiresAfter(BaseModel):
    model_config = ConfigDict(extra="forbid")

    anchor: Literal["last_active_at"]
    days: int = Field(ge=STORE_EXPIRES_MIN_DAYS, le=STORE_EXPIRES_MAX_DAYS)


class VectorStoreObject(BaseModel):
    """``openai.types.VectorStore``."""

    id: str
    object: Literal["vector_store"] = "vector_store"
    created_at: int
    name: str
    usage_bytes: int
    file_counts: FileCounts
    status: Literal["expired", "in_progress", "completed"]
    expires_after: StoreExpiresAfter | None = None
    expires_at: int | None = None
    last_active_at: int | None = None
    metadata: dict[str, str] | None = None


class VectorStoreDeleted(BaseModel):
    id: str
    object: Literal["vector_store.deleted"] = "vector_store.deleted"
    deleted: bool


class StaticChunking(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_chunk_size_tokens: int = Field(ge=CHUNK_SIZE_MIN, le=CHUNK_SIZE_MAX)
    chunk_overlap_tokens: int = Field(ge=0)


class StaticChunkingStrategy(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["static"]
    static: StaticChunking


class AutoChunkingStrategy(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["auto"]


ChunkingStrategy = Annotated[AutoChunkingStrategy | StaticChunkingStrategy, Field(discriminator="type")]
AttributeValue = str | float | bool
Attributes = Annotated[dict[str, AttributeValue] | None, Field(max_length=ATTRIBUTES_MAX_PAIRS)]


class LastError(BaseModel):
    code: Literal["server_error", "unsupported_file", "invalid_file"]
    message: str


class VectorStoreFileObject(BaseModel):
    """``openai.types.vector_stores.VectorStoreFile``."""

    id: str = Field(description="The file's id.")
    object: Literal["vector_store.file"] = "vector_store.file"
    usage_bytes: int
    created_at: int
    vector_store_id: str
    status: Literal["in_progress", "completed", "cancelled", "failed"]
    last_error: LastError | None = None
    chunking_strategy: StaticChunkingStrategy | None = None
    attributes: dict[str, AttributeValue] | None = None


class VectorStoreFileDeleted(BaseModel):
    id: str
    object: Literal["vector_store.file.deleted"] = "vector_store.file.deleted"
    deleted: bool


class VectorStoreFileBatchObject(BaseModel):
    """``openai.types.vector_stores.VectorStoreFileBatch``."""

    id: str
    object: Literal["vector_store.files_batch"] = "vector_store.files_batch"
    created_at: int
    vector_store_id: str
    status: Literal["in_progress", "completed", "cancelled", "failed"]
    file_counts: FileCounts


class FileContentPart(BaseModel):
    type: Literal["text"] = "text"
    text: str


class VectorStoreFileContent(BaseModel):
    """The parsed content of a store file: its chunks in order (``SyncPage[FileContentResponse]``)."""

    object: Literal["vector_store.file_content.page"] = "vector_store.file_content.page"
    data: list[FileContentPart]
    has_more: bool = False
    next_page: str | None = None


# ------------------------------------------------------------------------------------ request bodies
class FileUploadParams(BaseModel):
    """``POST /v1/files``, a ``multipart/form-data`` body (``expires_after[anchor]``, ``[seconds]``)."""

    file: bytes = Field(json_schema_extra={"format": "binary"}, description="The file's bytes.")
    purpose: Literal["assistants", "batch", "fine-tune", "vision", "user_data", "evals"]


class _Params(BaseModel):
    """A JSON request body: the model describes it; :meth:`parse` checks it (OpenAI's 400s)."""

    model_config = ConfigDict(extra="forbid")

    @classmethod
    def parse(cls, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise errors.BadRequest("The request body must be a JSON object.", code="invalid_json")
        for key in body:
            if key not in cls.model_fields:
                raise errors.BadRequest(f"Unknown parameter: '{key}'.", param=key, code="unknown_parameter")
        errors.refuse_nul(body, "")
        return cls.check(body)

    @classmethod
    def check(cls, body: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError


Metadata = Annotated[
    dict[
        Annotated[str, Field(max_length=METADATA_MAX_KEY_LENGTH)],
        Annotated[str, Field(max_length=METADATA_MAX_VALUE_LENGTH)],
    ]
    | None,
    Field(max_length=METADATA_MAX_PAIRS, description="Up to 16 pairs; keys ≤ 64, values ≤ 512 characters."),
]
FileIds = Annotated[list[str], Field(max_length=MAX_FILES_PER_REQUEST)]


class VectorStoreCreateParams(_Params):
    name: str | None = Field(None, max_length=STORE_NAME_MAX_LENGTH)
    description: str | None = Field(None, max_length=STORE_NAME_MAX_LENGTH)
    file_ids: FileIds | None = None
    metadata: Metadata = None
    expires_after: StoreExpiresAfter | None = None
    chunking_strategy: ChunkingStrategy | None = None

    @classmethod
    def check(cls, body: dict[str, Any]) -> dict[str, Any]:
        return {
            "name": validate_name(body.get("name")),
            "description": validate_name(body.get("description"), param="description"),
            "file_ids": validate_file_ids(body.get("file_ids"), required=False),
            "metadata": validate_metadata(body.get("metadata")),
            "expires_after": validate_store_expires_after(body.get("expires_after")),
            "chunking_strategy": validate_chunking_strategy(body.get("chunking_strategy")),
        }


class VectorStoreUpdateParams(_Params):
    name: str | None = Field(None, max_length=STORE_NAME_MAX_LENGTH)
    metadata: Metadata = None
    expires_after: StoreExpiresAfter | None = None

    @classmethod
    def check(cls, body: dict[str, Any]) -> dict[str, Any]:
        """Only the fields sent change: ``name: null`` keeps the name, ``metadata: null`` clears it,
        ``expires_after: null`` removes the expiry."""
        changes: dict[str, Any] = {}
        if body.get("name") is not None:
            changes["name"] = validate_name(body["name"])
        if "metadata" in body:
            changes["metadata"] = validate_metadata(body["metadata"])
        if "expires_after" in body:
            changes["expires_after"] = validate_store_expires_after(body["expires_after"])
        return changes


class StoreFileCreateParams(_Params):
    file_id: str
    attributes: Attributes = None
    chunking_strategy: ChunkingStrategy | None = None

    @classmethod
    def check(cls, body: dict[str, Any]) -> dict[str, Any]:
        if "file_id" not in body:
            raise missing_parameter("file_id")
        return {
            "file_id": validate_file_id(body["file_id"], param="file_id"),
            "attributes": validate_attributes(body.get("attributes")),
            "chunking_strategy": validate_chunking_strategy(body.get("chunking_strategy")),
        }


class StoreFileUpdateParams(_Params):
    attributes: Attributes

    @classmethod
    def check(cls, body: dict[str, Any]) -> dict[str, Any]:
        if "attributes" not in body:
            raise missing_parameter("attributes")
        return {"attributes": validate_attributes(body["attributes"])}


class BatchFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    file_id: str
    attributes: Attributes = None
    chunking_strategy: ChunkingStrategy | None = None


class FileBatchCreateParams(_Params):
    file_ids: FileIds | None = None
    files: Annotated[list[BatchFile], Field(max_length=MAX_FILES_PER_REQUEST)] | None = None
    attributes: Attributes = None
    chunking_strategy: ChunkingStrategy | None = None

    @classmethod
    def check(cls, body: dict[str, Any]) -> dict[str, Any]:
        """``file_ids`` (with the batch's ``attributes`` and ``chunking_strategy``) or ``files`` (each
        with its own), not both: a list of :class:`NewAttachment`."""
        has_ids, has_files = body.get("file_ids") is not None, body.get("files") is not None
        if has_ids and has_files:
            raise errors.BadRequest(
                "Only one of 'file_ids' and 'files' may be given.", param="files", code="invalid_value"
            )
        if not has_ids and not has_files:
            raise missing_parameter("file_ids")
        if has_ids:
            attributes = validate_attributes(body.get("attributes"))
            strategy = validate_chunking_strategy(body.get("chunking_strategy"))
            ids = validate_file_ids(body["file_ids"], required=True)
            return {
                "files": [
                    NewAttachment(
                        file_id=file_id, param=f"file_ids[{i}]", attributes=attributes, chunking=strategy
                    )
                    for i, file_id in enumerate(ids)
                ]
            }
        for key in ("attributes", "chunking_strategy"):
            if body.get(key) is not None:
                # OpenAI ignores them with ``files``; silently dropping a client's value would mislead.
                raise errors.BadRequest(
                    f"'{key}' applies to 'file_ids' only; with 'files', give it for each file.",
                    param=key,
                    code="invalid_value",
                )
        raw = body["files"]
        if not isinstance(raw, list):
            raise invalid_type("files", "an array", raw)
        if not raw:
            raise errors.BadRequest(
                "Invalid 'files': empty array. Expected an array with minimum length 1, but got an empty "
                "array instead.",
                param="files",
                code="empty_array",
            )
        _refuse_too_many("files", raw)
        files = []
        for i, entry in enumerate(raw):
            param = f"files[{i}]"
            if not isinstance(entry, dict):
                raise invalid_type(param, "an object", entry)
            for key in entry:
                if key not in BatchFile.model_fields:
                    raise errors.BadRequest(
                        f"Unknown parameter: '{param}.{key}'.",
                        param=f"{param}.{key}",
                        code="unknown_parameter",
                    )
            if "file_id" not in entry:
                raise missing_parameter(f"{param}.file_id")
            files.append(
                NewAttachment(
                    file_id=validate_file_id(entry["file_id"], param=f"{param}.file_id"),
                    param=f"{param}.file_id",
                    attributes=validate_attributes(entry.get("attributes"), param=f"{param}.attributes"),
                    chunking=validate_chunking_strategy(
                        entry.get("chunking_strategy"), param=f"{param}.chunking_strategy"
                    ),
                )
            )
        _refuse_duplicates([(f.file_id, f.param) for f in files])
        return {"files": files}


class NewAttachment(BaseModel):
    """One file to attach, validated: its id, where the request named it, attributes, chunking."""

    file_id: str
    param: str
    attributes: dict[str, Any]
    chunking: dict[str, Any]


# ---------------------------------------------------------------------------------------- validation
def validate_name(raw: Any, *, param: str = "name") -> str:
    if raw is None:
        return ""
    if not isinstance(raw, str):
        raise invalid_type(param, "a string", raw)
    errors.refuse_too_long(raw, param, STORE_NAME_MAX_LENGTH)
    return raw


def validate_attributes(raw: Any, *, param: str = "attributes") -> dict[str, Any]:
    """Up to 16 pairs; keys ≤ 64 characters; values strings (≤ 512), booleans or numbers."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise invalid_type(param, "an object", raw)
    refuse_too_many_properties(param, raw, ATTRIBUTES_MAX_PAIRS)
    for key, value in raw.items():
        field = f"{param}.{key}"
        refuse_long_key(param, key, ATTRIBUTES_MAX_KEY_LENGTH)
        if isinstance(value, str):
            errors.refuse_too_long(value, field, ATTRIBUTES_MAX_VALUE_LENGTH)
        elif not isinstance(value, bool | int | float):
            raise invalid_type(field, "a string, a number or a boolean", value)
    return dict(raw)


def validate_chunking_strategy(raw: Any, *, param: str = "chunking_strategy") -> dict[str, Any]:
    """``auto`` (or nothing) or ``static`` with 100 ≤ ``max_chunk_size_tokens`` ≤ 4096 and
    0 ≤ ``chunk_overlap_tokens`` ≤ half of it; answered as the resolved ``static`` object."""
    if raw is None:
        return static_strategy(AUTO_CHUNK_SIZE, AUTO_CHUNK_OVERLAP)
    if not isinstance(raw, dict):
        raise invalid_type(param, "an object", raw)
    kind = raw.get("type")
    if kind is None:
        raise missing_parameter(f"{param}.type")
    if kind not in ("auto", "static"):
        raise invalid_value(f"{param}.type", kind, ("auto", "static"))
    allowed = {"type"} if kind == "auto" else {"type", "static"}
    for key in raw:
        if key not in allowed:
            raise errors.BadRequest(
                f"Unknown parameter: '{param}.{key}'.", param=f"{param}.{key}", code="unknown_parameter"
            )
    if kind == "auto":
        return static_strategy(AUTO_CHUNK_SIZE, AUTO_CHUNK_OVERLAP)
    static = raw.get("static")
    where = f"{param}.static"
    if static is None:
        raise missing_parameter(where)
    if not isinstance(static, dict):
        raise invalid_type(where, "an object", static)
    for key in static:
        if key not in ("max_chunk_size_tokens", "chunk_overlap_tokens"):
            raise errors.BadRequest(
                f"Unknown parameter: '{where}.{key}'.", param=f"{where}.{key}", code="unknown_parameter"
            )
    size = _integer_in(static, "max_chunk_size_tokens", where, CHUNK_SIZE_MIN, CHUNK_SIZE_MAX)
    overlap = _integer_in(static, "chunk_overlap_tokens", where, 0, size // 2)
    return static_strategy(size, overlap)


def static_strategy(size: int, overlap: int) -> dict[str, Any]:
    return {"type": "static", "static": {"max_chunk_size_tokens": size, "chunk_overlap_tokens": overlap}}


def validate_store_expires_after(raw: Any, *, param: str = "expires_after") -> dict[str, Any] | None:
    """``{"anchor": "last_active_at", "days": 1..365}``; ``null``: never expires."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise invalid_type(param, "an object", raw)
    for key in raw:
        if key not in ("anchor", "days"):
            raise errors.BadRequest(
                f"Unknown parameter: '{param}.{key}'.", param=f"{param}.{key}", code="unknown_parameter"
            )
    if "anchor" not in raw:
        raise missing_parameter(f"{param}.anchor")
    if raw["anchor"] != "last_active_at":
        raise invalid_value(f"{param}.anchor", raw["anchor"], ("last_active_at",))
    days = _integer_in(raw, "days", param, STORE_EXPIRES_MIN_DAYS, STORE_EXPIRES_MAX_DAYS)
    return {"anchor": "last_active_at", "days": days}


def validate_file_id(raw: Any, *, param: str) -> str:
    if not isinstance(raw, str):
        raise invalid_type(param, "a string", raw)
    errors.refuse_nul(raw, param)
    return raw


def validate_file_ids(raw: Any, *, required: bool, param: str = "file_ids") -> list[str]:
    if raw is None:
        if required:
            raise missing_parameter(param)
        return []
    if not isinstance(raw, list):
        raise invalid_type(param, "an array", raw)
    if required and not raw:
        raise errors.BadRequest(
            f"Invalid '{param}': empty array. Expected an array with minimum length 1, but got an empty "
            "array instead.",
            param=param,
            code="empty_array",
        )
    _refuse_too_many(param, raw)
    ids = [validate_file_id(value, param=f"{param}[{i}]") for i, value in enumerate(raw)]
    _refuse_duplicates([(file_id, f"{param}[{i}]") for i, file_id in enumerate(ids)])
    return ids


def validate_purpose(raw: str | None) -> str:
    if raw is None or raw == "":
        raise missing_parameter("purpose")
    if raw not in FILE_PURPOSES:
        raise invalid_value("purpose", raw, FILE_PURPOSES)
    return raw


def validate_file_expires_after(anchor: str | None, seconds: str | None) -> int | None:
    """The upload's ``expires_after[anchor]`` / ``expires_after[seconds]`` form fields: the seconds
    after ``created_at`` (3600 to 2592000), or None without them."""
    if anchor is None and seconds is None:
        return None
    if anchor is None:
        raise missing_parameter("expires_after.anchor")
    if anchor != "created_at":
        raise invalid_value("expires_after.anchor", anchor, ("created_at",))
    if seconds is None:
        raise missing_parameter("expires_after.seconds")
    try:
        value = int(seconds)
    except ValueError:
        raise invalid_type("expires_after.seconds", "an integer", seconds) from None
    _refuse_out_of_range("expires_after.seconds", value, FILE_EXPIRES_MIN_S, FILE_EXPIRES_MAX_S)
    return value


def validate_status_filter(raw: str | None) -> str | None:
    if raw is None:
        return None
    if raw not in STORE_FILE_STATUSES:
        raise invalid_value("filter", raw, STORE_FILE_STATUSES)
    return raw


def _integer_in(data: dict[str, Any], key: str, where: str, low: int, high: int) -> int:
    param = f"{where}.{key}"
    if key not in data:
        raise missing_parameter(param)
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid_type(param, "an integer", value)
    _refuse_out_of_range(param, value, low, high)
    return value


def _refuse_out_of_range(param: str, value: int, low: int, high: int) -> None:
    if value < low:
        raise errors.BadRequest(
            f"Invalid '{param}': integer below minimum value. Expected a value >= {low}, but got {value} "
            "instead.",
            param=param,
            code="integer_below_min_value",
        )
    if value > high:
        raise errors.BadRequest(
            f"Invalid '{param}': integer above maximum value. Expected a value <= {high}, but got {value} "
            "instead.",
            param=param,
            code="integer_above_max_value",
        )


def _refuse_too_many(param: str, raw: list[Any]) -> None:
    if len(raw) > MAX_FILES_PER_REQUEST:
        raise errors.BadRequest(
            f"Invalid '{param}': array too long. Expected an array with maximum length "
            f"{MAX_FILES_PER_REQUEST}, but got an array with length {len(raw)} instead.",
            param=param,
            code="array_above_max_length",
        )


def _refuse_duplicates(ids: list[tuple[str, str]]) -> None:
    seen: set[str] = set()
    for file_id, param in ids:
        if file_id in seen:
            raise errors.BadRequest(
                f"Invalid '{param}': file '{file_id}' is given more than once.",
                param=param,
                code="duplicate_file_id",
            )
        seen.add(file_id)
