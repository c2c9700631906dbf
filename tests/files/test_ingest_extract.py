"""Extraction of each file type, token offsets from vLLM's token strings, and the embedding bytes:
the pure functions of ingestion (no database)."""

from __future__ import annotations

import pytest

from files_app import chunking, embeddings
from files_app.extract import Unreadable, extract_text, file_kind
from tests.files.ingest_helpers import make_pdf

# --- extraction ---------------------------------------------------------------------------------
HTML = b"""<html><head><title>T</title><script>var hidden = 1;</script></head><body>
<nav>menu</nav><article><h1>Heading</h1><p>The body paragraph about vector stores and chunking, long
enough to be the page's main content for the extractor to keep.</p><p>A second paragraph.</p></article>
</body></html>"""


@pytest.mark.parametrize(
    ("name", "data", "wanted"),
    [
        ("a.txt", "plain text ünïcode\n".encode(), "plain text ünïcode\n"),
        ("README.md", b"# Title\n\n- item\n", "# Title\n\n- item\n"),
        ("main.py", b"def f():\n    return 1\n", "def f():\n    return 1\n"),
        ("Makefile", b"all:\n\techo hi\n", "all:\n\techo hi\n"),
        ("t.csv", b"a,b\n1,2\n", "a,b\n1,2\n"),
        ("d.json", b'{"k": [1, 2]}', '{"k": [1, 2]}'),
        ("bom.txt", "\ufeffwith a BOM".encode(), "with a BOM"),
        ("u16.txt", "UTF-16 text".encode("utf-16"), "UTF-16 text"),
        ("noext", b"no extension", "no extension"),
    ],
)
def test_text_types_are_read_as_they_are(name: str, data: bytes, wanted: str) -> None:
    assert extract_text(data, name, "") == wanted


def test_html_keeps_the_main_text_and_pdf_its_text_layer() -> None:
    text = extract_text(HTML, "page.html", "text/html")
    assert "The body paragraph about vector stores" in text and "A second paragraph." in text
    assert "var hidden" not in text and "<p>" not in text
    # A page without a main part: the whole page's text rather than nothing.
    assert "just a cell" in extract_text(b"<table><tr><td>just a cell</td></tr></table>", "t.htm")
    pdf = make_pdf(["Hello PDF world", "second (line)"])
    assert extract_text(pdf, "doc.pdf", "application/pdf") == "Hello PDF world\nsecond (line)"
    # Types known by their content type alone.
    assert extract_text(pdf, "download", "application/pdf").startswith("Hello PDF")
    assert file_kind("x.bin", "text/plain") == "text" and file_kind("x.data", "application/json") == "json"


@pytest.mark.parametrize(
    ("name", "data", "code", "says"),
    [
        ("a.txt", b"\x00\x01binary", "invalid_file", "binary"),
        ("a.txt", b"caf\xe9", "invalid_file", "not UTF-8"),
        ("d.json", b"{nope", "invalid_file", "not valid JSON"),
        ("e.txt", b"  \n\t ", "invalid_file", "no text"),
        ("r.docx", b"PK\x03\x04", "unsupported_file", "convert it to PDF"),
        ("i.png", b"\x89PNG\r\n", "unsupported_file", ".png"),
        ("b.pdf", b"%PDF-1.4 garbage", "invalid_file", "PDF"),
        ("s.pdf", make_pdf([]), "invalid_file", "no text layer"),
    ],
)
def test_unreadable_files_say_why(name: str, data: bytes, code: str, says: str) -> None:
    with pytest.raises(Unreadable) as caught:
        extract_text(data, name, "")
    assert caught.value.code == code and says in caught.value.message


def test_token_offsets_split_characters_as_the_tokenizer_does() -> None:
    from tests.upstream import byte_level_tokens

    text = "Grüße aus Köln — 漢字テスト, naïve 12345678 end"
    tokens = byte_level_tokens(text)
    starts = chunking.token_offsets(text, tokens)
    assert starts is not None and len(starts) == len(tokens) and starts[0] == 0
    pieces = [text[a:b] for a, b in zip(starts, [*starts[1:], len(text)], strict=True)]
    assert "".join(pieces) == text and pieces[:5] == ["Grü", "ße", " aus", " Köl", "n"]
    # SentencePiece token strings with its dummy prefix and a byte-fallback token.
    assert chunking.token_offsets("hi\nyou", ["\u2581hi", "<0x0A>", "you"]) == [0, 2, 3]
    # Token strings that do not spell the text: no offsets (the count calibrates instead).
    assert chunking.token_offsets("hello", ["<s>", "hello"]) is None


def test_pack_is_float32_little_endian() -> None:
    assert embeddings.pack([1.0, -2.5]) == b"\x00\x00\x80\x3f\x00\x00\x20\xc0"
    assert list(embeddings.unpack(embeddings.pack([0.5, 3.0]))) == [0.5, 3.0]


def test_a_store_of_another_embedding_model_is_in_another_space() -> None:
    from gateway.core.config import get_config, replace

    config = replace(get_config(), file_search__embedding_model="m")
    assert not embeddings.other_space("", config) and not embeddings.other_space("m", config)
    assert embeddings.other_space("n", config)
    assert embeddings.other_space("m", replace(config, file_search__embedding_model=""))
