"""``input_file`` content by ``file_id``: the file's text, extracted once, given to the model.

At preparation (before any work, nothing stored on a refusal) each ``input_file`` part of the new
input that names a ``file_id`` is resolved: the caller's file, read from the ``files`` storage and
extracted by ``files_app.extract`` (text, Markdown, code, CSV, JSON, HTML, PDF). The text the model
reads is kept with the item under the tool loop's private key (``{"input_files": {"<j>": text}}``),
so a continuation (``previous_response_id``, ``conversation``) shows the model the same text
without reading the file again; the public item keeps the ``input_file`` part as sent.
"""

from __future__ import annotations

from typing import Any

from gateway.core import errors
from gateway.core.config import Config

# The key under the item's private view, and the largest file read for the model.
INPUT_FILES = "input_files"
MAX_INPUT_FILE_BYTES = 32 * 1024 * 1024


def wants_files(items: Any) -> bool:
    """Whether request ``input`` holds an ``input_file`` part naming a ``file_id``."""
    if not isinstance(items, list):
        return False
    for item in items:
        content = item.get("content") if isinstance(item, dict) else None
        if isinstance(content, list) and any(
            isinstance(part, dict) and part.get("type") == "input_file" and part.get("file_id") is not None
            for part in content
        ):
            return True
    return False


def model_text(filename: str, file_id: str, text: str) -> str:
    """An extracted file as the model reads it: its name, then its text."""
    return f'<file filename="{filename}" file_id="{file_id}">\n{text}\n</file>'


def resolve_input_files(items: list[dict[str, Any]], owner: str, config: Config, private_key: str) -> None:
    """Attach the model's text of every ``input_file`` by ``file_id`` in ``items`` (the request's new
    input, index for index); a missing, foreign or unreadable file is refused naming
    ``input[i].content[j].file_id``. Synchronous: it reads the database and the storage."""
    budget = config.server.max_request_body_size_bytes
    used = 0
    for index, item in enumerate(items):
        content = item.get("content")
        if item.get("type") != "message" or not isinstance(content, list) or private_key in item:
            continue  # a stored item (referenced) already carries the text it was given with
        texts: dict[str, str] = {}
        for part_index, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "input_file":
                continue
            from django.core.files.storage import storages

            from files_app import extract  # pypdf and trafilatura only once a request needs them
            from files_app.models import File

            file_id = part.get("file_id")
            param = f"input[{index}].content[{part_index}].file_id"
            if not isinstance(file_id, str):
                raise errors.invalid_type(param, "a string", file_id)
            row = File.objects.filter(id=file_id, owner=owner).first()
            if row is None:
                raise errors.NotFound(f"File with id '{file_id}' not found.", param=param, code="not_found")
            if row.bytes > MAX_INPUT_FILE_BYTES:
                raise errors.BadRequest(
                    f"File '{row.filename}' ({file_id}) is {row.bytes} bytes; an input_file may be at most "
                    f"{MAX_INPUT_FILE_BYTES} bytes.",
                    param=param,
                    code="file_too_large",
                )
            try:
                # An unsupported type is refused before its bytes are read.
                extract.file_kind(row.filename, row.content_type)
                with storages["files"].open(row.storage_name, "rb") as handle:
                    data = handle.read()
                text = extract.extract_text(data, row.filename, row.content_type)
            except extract.Unreadable as exc:
                raise errors.BadRequest(
                    f"File '{row.filename}' ({file_id}) cannot be given to the model: {exc}",
                    param=param,
                    code=getattr(exc, "code", "invalid_file"),
                ) from None
            shown = model_text(row.filename, file_id, text)
            used += len(shown.encode())
            if used > budget:
                raise errors.BadRequest(
                    f"The text of the input files exceeds {budget} bytes (the request body limit).",
                    param=param,
                    code="file_too_large",
                )
            texts[str(part_index)] = shown
        if texts:
            item[private_key] = {INPUT_FILES: texts}


def input_file_view(item: dict[str, Any], private_key: str) -> dict[str, Any]:
    """``item`` as the model reads it when it is a message with input files, else as it is."""
    view = item.get(private_key)
    if item.get("type") == "message" and isinstance(view, dict) and INPUT_FILES in view:
        return model_message(item, view)
    return item


def model_message(item: dict[str, Any], view: dict[str, Any]) -> dict[str, Any]:
    """A message with its ``input_file`` parts replaced by the text the model was given."""
    texts = view.get(INPUT_FILES) or {}
    content = []
    for part_index, part in enumerate(item.get("content") or ()):
        shown = texts.get(str(part_index))
        content.append({"type": "input_text", "text": shown} if shown is not None else part)
    return {**{k: v for k, v in item.items() if not k.startswith("_")}, "content": content}
