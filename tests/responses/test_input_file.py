"""``input_file`` by ``file_id`` on the executor: the file's text (plain text, PDF) given to the
model with its filename, kept for continuations; other types, unknown and other owners' files
refused with the part's ``param``, nothing stored."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from aiohttp import web
from openai import OpenAI

from conversations_app.models import Item
from responses_app.models import Response
from tests.responses.conftest import Gateway
from tests.responses.file_search_fixtures import make_file
from tests.responses.scripts import text
from tests.responses.tool_fixtures import model_input

NOTES = "Meeting notes: the deploy freeze starts on Friday."


@pytest.fixture(autouse=True)
def files_storage(settings: Any, tmp_path: Path) -> Iterator[None]:
    storages = dict(settings.STORAGES)
    storages["files"] = {
        "BACKEND": "django.core.files.storage.FileSystemStorage",
        "OPTIONS": {"location": str(tmp_path / "files")},
    }
    settings.STORAGES = storages
    yield


def pdf_with_text(line: str) -> bytes:
    """A one-page PDF whose content stream shows ``line`` in Helvetica."""
    stream = f"BT /F1 12 Tf 72 720 Td ({line}) Tj ET".encode()
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
        b"/Resources << /Font << /F1 5 0 R >> >> >>",
        b"<< /Length " + str(len(stream)).encode() + b" >>\nstream\n" + stream + b"\nendstream",
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


def user(*parts: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [{"type": "input_text", "text": "Summarize."}, *parts]}]


def test_text_and_pdf_files_reach_the_model_as_text(gw: Gateway) -> None:
    notes = make_file("notes.txt", NOTES.encode())
    report = make_file(
        "report.pdf", pdf_with_text("Revenue grew nine percent."), content_type="application/pdf"
    )
    gw.script(text("Done."))
    gw.script(text("Still done."))
    first = gw.client.responses.create(
        model="m",
        input=user({"type": "input_file", "file_id": notes.id}, {"type": "input_file", "file_id": report.id}),
    )
    assert first.status == "completed"
    seen = model_input(gw, 0)
    shown = seen[0]["text"][1]
    assert "Summarize." in shown
    assert f'<file filename="notes.txt" file_id="{notes.id}">\n{NOTES}\n</file>' in shown
    assert f'<file filename="report.pdf" file_id="{report.id}">' in shown
    assert "Revenue grew nine percent." in shown
    # The stored input keeps the parts as sent (the text is the gateway's own).
    items = gw.client.responses.input_items.list(first.id).data
    assert [p.type for p in items[0].content] == ["input_text", "input_file", "input_file"]  # type: ignore[union-attr]
    assert "_gateway" not in httpx.get(f"{gw.url}/v1/responses/{first.id}/input_items").text

    # A continuation shows the model the same text again.
    gw.client.responses.create(model="m", input="And?", previous_response_id=first.id)
    assert NOTES in model_input(gw, 1)[0]["text"][1]


@pytest.fixture
def sdk(live_gateway: Any, upstream: Any, gateway_config: Callable[..., Any]) -> Iterator[OpenAI]:
    gateway_config(llm_api_base=upstream.url, upstream_api="responses")
    client = OpenAI(base_url=f"{live_gateway.url}/v1", api_key="sk-test", max_retries=0, timeout=30)
    yield client
    client.close()


def refused(sdk: OpenAI, upstream: Any, part: dict[str, Any], **fields: Any) -> tuple[int, dict[str, Any]]:
    with pytest.raises(openai.APIStatusError) as caught:
        sdk.responses.create(model="m", input=user(part), **fields)  # type: ignore[arg-type]
    assert not upstream.requests
    assert Response.objects.count() == 0 and Item.objects.count() == 0
    body = caught.value.body
    assert isinstance(body, dict)
    return caught.value.status_code, body


def test_unreadable_unknown_and_foreign_files_are_refused(sdk: OpenAI, upstream: Any) -> None:
    image = make_file("photo.png", b"\x89PNG\r\n\x1a\n" + bytes(64), content_type="image/png")
    theirs = make_file("secret.txt", b"theirs", owner="oidc:other")
    status, error = refused(sdk, upstream, {"type": "input_file", "file_id": image.id})
    assert (status, error["param"], error["code"]) == (400, "input[0].content[1].file_id", "unsupported_file")
    assert "photo.png" in error["message"]
    for file_id in (theirs.id, "file-missing"):
        status, error = refused(sdk, upstream, {"type": "input_file", "file_id": file_id})
        assert (status, error["param"]) == (404, "input[0].content[1].file_id")
        assert error["message"] == f"File with id '{file_id}' not found."
    # Stateless requests too (they would otherwise go straight to the model server).
    status, error = refused(sdk, upstream, {"type": "input_file", "file_id": "file-missing"}, store=False)
    assert (status, error["param"]) == (404, "input[0].content[1].file_id")


def test_file_data_and_file_url_stay_refused_on_the_executor(sdk: OpenAI, upstream: Any) -> None:
    for part in (
        {"type": "input_file", "filename": "a.txt", "file_data": "data:text/plain;base64,aGk="},
        {"type": "input_file", "file_url": "https://example.com/a.pdf"},
    ):
        status, error = refused(sdk, upstream, part, tools=[{"type": "function", "name": "f"}])
        assert (status, error["param"], error["code"]) == (
            400,
            "input[0].content[1]",
            "unsupported_parameter",
        )


def test_input_tokens_count_the_files_text(gw: Gateway) -> None:
    notes = make_file("notes.txt", NOTES.encode())

    async def tokenize(request: web.Request, rec: Any) -> web.StreamResponse:
        return web.json_response({"count": 9, "max_model_len": 4096, "tokens": [1] * 9, "token_strs": None})

    gw.upstream.script("/tokenize", tokenize)
    r = httpx.post(
        f"{gw.url}/v1/responses/input_tokens",
        json={"model": "m", "input": user({"type": "input_file", "file_id": notes.id})},
    )
    assert r.status_code == 200, r.text
    sent = gw.upstream.last("/tokenize").json()
    assert NOTES in sent["messages"][0]["content"]
