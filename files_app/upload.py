"""Reading ``POST /v1/files``: Django's own multipart parser with an upload handler that spools the
file to a temporary file on disk (never whole in memory) and refuses it past ``[files]
max_upload_bytes`` while it arrives.

The ASGI layer already refused a body whose declared or counted size is over that ceiling plus the
multipart framing (``gateway.core.pipeline.body_limit``); this is the exact check on the file itself.
On any refusal the temporary file is removed; nothing reaches the storage.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.core.files.uploadedfile import UploadedFile
from django.core.files.uploadhandler import TemporaryFileUploadHandler
from django.http import HttpRequest
from django.http.multipartparser import MultiPartParser, MultiPartParserError

from files_app import schemas
from gateway.core import errors

FORM_FIELDS = ("purpose", "expires_after[anchor]", "expires_after[seconds]")


class LimitedUploadHandler(TemporaryFileUploadHandler):
    """:class:`TemporaryFileUploadHandler` for the one ``file`` field, counting its bytes."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit
        self.received = 0
        self.started = False

    def new_file(self, field_name: str, *args: Any, **kwargs: Any) -> None:
        if field_name != "file":
            raise errors.BadRequest(
                f"Unknown parameter: '{field_name}'.", param=field_name, code="unknown_parameter"
            )
        if self.started:
            raise errors.BadRequest("Only one 'file' may be uploaded per request.", param="file")
        self.started = True
        super().new_file(field_name, *args, **kwargs)

    def receive_data_chunk(self, raw_data: bytes, start: int) -> bytes | None:
        self.received += len(raw_data)
        if self.received > self.limit:
            raise errors.upload_too_large(self.limit)
        super().receive_data_chunk(raw_data, start)
        return None

    def discard(self) -> None:
        """Remove the temporary file (a refused or failed upload)."""
        self.upload_interrupted()


@dataclass
class Upload:
    file: UploadedFile
    purpose: str
    expires_after_s: int | None
    handler: LimitedUploadHandler

    def discard(self) -> None:
        self.handler.discard()


def parse_upload(request: HttpRequest, *, limit: int) -> Upload:
    """The validated upload of ``request`` (``file``, ``purpose``, ``expires_after``), its file on
    disk; the caller stores it and then calls :meth:`Upload.discard`."""
    content_type = request.META.get("CONTENT_TYPE", "")
    if not content_type.lower().startswith("multipart/form-data"):
        raise errors.BadRequest(
            f"Invalid Content-Type header ({content_type or 'none'}), expected multipart/form-data.",
            code="invalid_content_type",
        )
    meta = dict(request.META)
    # Django's ASGI handler has already spooled the whole body (to disk past 2.5 MB); a chunked one
    # declares no length, and Django's parser takes a missing length for an empty body. The parser
    # reads the spooled body to its end either way; the length only tells it the body is not empty.
    if not meta.get("CONTENT_LENGTH"):
        meta["CONTENT_LENGTH"] = str(limit)
    handler = LimitedUploadHandler(limit)
    try:
        parser = MultiPartParser(meta, request, [handler], request.encoding or "utf-8")
        form, files = parser.parse()
        upload = _validate(form, files, handler)
    except MultiPartParserError as exc:
        handler.discard()
        raise errors.BadRequest(f"Invalid multipart body: {exc}", code="invalid_multipart") from None
    except BaseException:
        handler.discard()
        raise
    return upload


def _validate(form: Any, files: Any, handler: LimitedUploadHandler) -> Upload:
    for key in form:
        if key == "file":
            raise errors.BadRequest(
                "Invalid 'file': expected a file (a part with a filename), but got a form field.",
                param="file",
                code="invalid_type",
            )
        if key not in FORM_FIELDS:
            raise errors.BadRequest(f"Unknown parameter: '{key}'.", param=key, code="unknown_parameter")
        if len(form.getlist(key)) > 1:
            raise errors.BadRequest(f"'{key}' is given more than once.", param=key, code="invalid_value")
        errors.refuse_nul(form[key], key)
    if "file" not in files:
        raise errors.missing_parameter("file")
    uploaded: UploadedFile = files["file"]
    purpose = schemas.validate_purpose(form.get("purpose"))
    expires = schemas.validate_file_expires_after(
        form.get("expires_after[anchor]"), form.get("expires_after[seconds]")
    )
    if not uploaded.size:
        raise errors.BadRequest(
            "The file is empty: upload a file with at least one byte.", param="file", code="empty_file"
        )
    errors.refuse_nul(uploaded.name or "", "file")
    return Upload(file=uploaded, purpose=purpose, expires_after_s=expires, handler=handler)
