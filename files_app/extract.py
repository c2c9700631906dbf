"""The text of an uploaded file, for ingestion and for ``input_file`` (docs/file-search.md).

:func:`extract_text` reads plain text, Markdown, code, CSV, JSON, HTML (main text by trafilatura,
the library web_fetch uses) and PDF text (pypdf). Anything else, or bytes that are not what their
name says, raises :class:`Unreadable` with a reason a client can act on. CPU work: call it in a thread.
"""

from __future__ import annotations

import codecs
import io
import json
import logging
import posixpath
from html.parser import HTMLParser
from typing import IO, Literal

log = logging.getLogger("files.extract")

# Extensions read as text as they are (code and markup keep their syntax: it is searchable).
TEXT_EXTENSIONS = frozenset(
    {
        # prose and data
        ".txt", ".text", ".md", ".markdown", ".mdx", ".rst", ".adoc", ".org", ".tex", ".log",
        ".csv", ".tsv", ".jsonl", ".ndjson", ".xml", ".yaml", ".yml", ".toml", ".ini", ".cfg",
        ".conf", ".properties", ".env", ".srt", ".vtt",
        # code
        ".py", ".pyi", ".ipynb", ".js", ".mjs", ".cjs", ".ts", ".tsx", ".jsx", ".c", ".h", ".cc",
        ".cpp", ".cxx", ".hpp", ".hh", ".cs", ".java", ".kt", ".kts", ".go", ".rs", ".rb", ".php",
        ".sh", ".bash", ".zsh", ".fish", ".ps1", ".bat", ".sql", ".swift", ".scala", ".lua", ".pl",
        ".pm", ".r", ".m", ".mm", ".css", ".scss", ".sass", ".less", ".vue", ".svelte", ".dart",
        ".ex", ".exs", ".erl", ".hrl", ".hs", ".clj", ".cljs", ".ml", ".mli", ".fs", ".fsx", ".jl",
        ".proto", ".graphql", ".gql", ".tf", ".hcl", ".gradle", ".groovy", ".cmake", ".mk",
        ".dockerfile", ".vim", ".el", ".lisp", ".scm", ".zig", ".nim", ".v", ".sv", ".vhd",
        ".asm", ".s", ".patch", ".diff",
    }
)  # fmt: skip
JSON_EXTENSIONS = frozenset({".json"})
HTML_EXTENSIONS = frozenset({".html", ".htm", ".xhtml"})
PDF_EXTENSIONS = frozenset({".pdf"})
SUPPORTED_EXTENSIONS = TEXT_EXTENSIONS | JSON_EXTENSIONS | HTML_EXTENSIONS | PDF_EXTENSIONS

_HTML_TYPES = frozenset({"text/html", "application/xhtml+xml"})
_JSON_TYPES = frozenset({"application/json"})
_TEXT_TYPES = frozenset(
    {"application/xml", "application/javascript", "application/x-yaml", "application/yaml", "application/toml",
     "application/x-sh", "application/sql", "application/x-ndjson", "application/jsonl"}
)  # fmt: skip
# Types a client may name that are known not to be readable here (the message says what to do).
_OFFICE = frozenset({".doc", ".docx", ".pptx", ".ppt", ".xls", ".xlsx", ".odt", ".odp", ".ods", ".rtf"})

Kind = Literal["text", "json", "html", "pdf"]


class Unreadable(Exception):
    """The file gives no text: ``code`` is OpenAI's ``last_error.code`` (``unsupported_file`` for a
    type this gateway does not read, ``invalid_file`` for bytes that are not what they claim)."""

    def __init__(
        self, message: str, code: Literal["unsupported_file", "invalid_file"] = "invalid_file"
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


def file_kind(filename: str, content_type: str = "") -> Kind:
    """How a file is read, by its extension first, then by its content type; :class:`Unreadable`
    (``unsupported_file``) for any other. A name without an extension (``Makefile``) is text."""
    ext = posixpath.splitext(filename.rsplit("\\", 1)[-1].lower())[1]
    media = content_type.split(";")[0].strip().lower()
    if ext in PDF_EXTENSIONS:
        return "pdf"
    if ext in HTML_EXTENSIONS:
        return "html"
    if ext in JSON_EXTENSIONS:
        return "json"
    if ext in TEXT_EXTENSIONS:
        return "text"
    if ext in _OFFICE:
        raise Unreadable(
            f"Files of type {ext} are not supported for file search here; convert it to PDF, "
            "Markdown or plain text.",
            "unsupported_file",
        )
    if media == "application/pdf":
        return "pdf"
    if media in _HTML_TYPES:
        return "html"
    if media in _JSON_TYPES or media.endswith("+json"):
        return "json"
    if media.startswith("text/") or media in _TEXT_TYPES or media.endswith("+xml"):
        return "text"
    if not ext:
        return "text"  # README, Makefile, LICENSE: read as text if the bytes are text
    raise Unreadable(
        f"Files of type {ext} are not supported for file search (text, Markdown, code, CSV, JSON, "
        "HTML and PDF are).",
        "unsupported_file",
    )


def is_supported(filename: str, content_type: str = "") -> bool:
    try:
        file_kind(filename, content_type)
    except Unreadable:
        return False
    return True


def extract_text(data: bytes | IO[bytes], filename: str, content_type: str = "") -> str:
    """The text of a file (see the module docstring); :class:`Unreadable` when it has none."""
    kind = file_kind(filename, content_type)
    raw = data if isinstance(data, bytes | bytearray | memoryview) else data.read()
    raw = bytes(raw)
    if kind == "pdf":
        text = _pdf_text(raw)
    elif kind == "html":
        text = _html_text(decode_text(raw, filename))
    else:
        text = decode_text(raw, filename)
        if kind == "json":
            try:
                json.loads(text)
            except ValueError as exc:
                raise Unreadable(f"{filename} is not valid JSON: {exc}") from None
    if not text.strip():
        raise Unreadable(f"{filename} contains no text.")
    return text


_BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32"),
    (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF8, "utf-8-sig"),
    (codecs.BOM_UTF16_LE, "utf-16"),
    (codecs.BOM_UTF16_BE, "utf-16"),
)


def decode_text(raw: bytes, filename: str = "the file") -> str:
    """UTF-8 text (UTF-16/32 with a byte order mark); binary bytes (a NUL) or another encoding are
    :class:`Unreadable` (``invalid_file``) rather than guessed."""
    for bom, encoding in _BOMS:
        if raw.startswith(bom):
            try:
                return raw.decode(encoding)
            except UnicodeDecodeError:
                raise Unreadable(f"{filename} is not valid {encoding.upper()} text.") from None
    if b"\x00" in raw:
        raise Unreadable(f"{filename} is binary, not text.")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Unreadable(
            f"{filename} is not UTF-8 text (invalid byte at offset {exc.start}); save it as UTF-8."
        ) from None


def _html_text(html: str) -> str:
    """The main text of a page (trafilatura); the whole page's text when it finds no main part."""
    import trafilatura

    text = trafilatura.extract(html, output_format="txt", favor_recall=True, include_tables=True)
    if not text or not text.strip():
        text = trafilatura.html2txt(html) or ""
    if not text.strip():  # a fragment lxml's HTML tree refuses: the standard library's parser
        parser = _PlainText()
        parser.feed(html)
        parser.close()
        text = "".join(parser.parts)
    return text


class _PlainText(HTMLParser):
    """The text of an HTML fragment, without scripts and styles, a line per block."""

    _SKIP = frozenset({"script", "style", "template", "noscript"})
    _BLOCK = frozenset({"p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "table", "pre"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._skipping = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self._SKIP:
            self._skipping += 1
        elif tag in self._BLOCK:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in self._SKIP and self._skipping:
            self._skipping -= 1

    def handle_data(self, data: str) -> None:
        if not self._skipping:
            self.parts.append(data)


def _pdf_text(raw: bytes) -> str:
    from pypdf import PdfReader
    from pypdf.errors import PdfReadError, PyPdfError

    try:
        reader = PdfReader(io.BytesIO(raw))
        if reader.is_encrypted and not reader.decrypt(""):
            raise Unreadable("The PDF is encrypted with a password.")
        pages = [page.extract_text() or "" for page in reader.pages]
    except Unreadable:
        raise
    except (
        PdfReadError,
        PyPdfError,
        ValueError,
        KeyError,
        TypeError,
        AttributeError,
        IndexError,
        NotImplementedError,
    ) as exc:
        # pypdf raises several kinds on damaged files; each means the same to a client.
        log.info("PDF extraction failed: %s: %s", type(exc).__name__, exc)
        raise Unreadable(f"The PDF cannot be read: {exc}") from None
    text = "\n\n".join(page.strip("\n") for page in pages if page.strip())
    if not text.strip():
        raise Unreadable("The PDF has no text layer (scanned pages are not read; OCR it first).")
    return text
