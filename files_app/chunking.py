"""OpenAI's static chunking strategy over a file's text (docs/file-search.md, "Ingestion").

A file's text is a sequence of tokens, each known by the character offset where it starts. Chunks
are windows of ``max_chunk_size_tokens`` tokens, each starting ``max - overlap`` tokens after the
previous one; a chunk's text is the source text between its first token's offset and the next
window's end, never text rebuilt from token ids.

Token offsets come from the upstream's ``/tokenize`` (vLLM) when it answers: one request per file
(per 200,000 characters of a longer one) with ``return_token_strs``, whose token strings give each
token's bytes for byte-level BPE and SentencePiece vocabularies. When the token strings cannot be
mapped back onto the text, its token *count* calibrates the approximation below for that file.
Without ``/tokenize`` the count is the approximation alone: a word-piece regex (each run of up to six
letters, of up to three digits, each other symbol and each CJK character is one token, leading
whitespace joining the token after it), near the counts of GPT-style BPE vocabularies on English
prose and code. No tokenizer files are read or downloaded.
"""

from __future__ import annotations

import asyncio
import codecs
import logging
import re
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

import orjson

from gateway.core.config import Config

log = logging.getLogger("files.chunking")

DEFAULT_MAX_TOKENS = 800
DEFAULT_OVERLAP_TOKENS = 400
MIN_MAX_TOKENS, MAX_MAX_TOKENS = 100, 4096
# One /tokenize request carries at most this many characters (a longer text is cut at whitespace).
SEGMENT_CHARS = 200_000
# After an upstream said it has no /tokenize (404, 405, 501), it is not asked again for this long.
NO_TOKENIZE_TTL_S = 300.0
TOKENIZE_TIMEOUT_S = 60.0

_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
_APPROX = re.compile(rf"\s*(?:[{_CJK}]|[^\W\d_{_CJK}]{{1,6}}|\d{{1,3}}|[^\w\s]|_)|\s+")


@dataclass(frozen=True)
class Chunk:
    text: str
    tokens: int


@dataclass(frozen=True)
class Tokens:
    """A text's tokens: ``starts[i]`` is where token i starts (``starts[0] == 0``); each span of
    ``starts`` counts ``scale`` real tokens (1 when the offsets are the tokenizer's own)."""

    starts: list[int]
    scale: float
    method: str  # "tokenize" | "calibrated" | "approximate"


def strategy_sizes(strategy: Mapping[str, Any] | None) -> tuple[int, int]:
    """(max_chunk_size_tokens, chunk_overlap_tokens) of a stored ``chunking_strategy``: ``auto``
    (or none) is 800 / 400; a ``static`` one is bounded as OpenAI bounds it (100 to 4096, overlap at
    most half the size)."""
    if not strategy or strategy.get("type") != "static":
        return DEFAULT_MAX_TOKENS, DEFAULT_OVERLAP_TOKENS
    static = strategy.get("static") or {}
    size = int(static.get("max_chunk_size_tokens", DEFAULT_MAX_TOKENS))
    size = min(MAX_MAX_TOKENS, max(MIN_MAX_TOKENS, size))
    overlap = int(static.get("chunk_overlap_tokens", DEFAULT_OVERLAP_TOKENS))
    return size, min(max(0, overlap), size // 2)


def approximate_starts(text: str) -> list[int]:
    """Token start offsets by the word-piece regex (module docstring)."""
    return [m.start() for m in _APPROX.finditer(text)]


def split_chunks(text: str, tokens: Tokens, max_tokens: int, overlap_tokens: int) -> list[Chunk]:
    """The static strategy's windows over ``tokens``, their text cut from ``text``."""
    starts = tokens.starts
    n = len(starts)
    if n == 0:
        return []
    size = max(1, int(max_tokens / tokens.scale))
    overlap = min(int(overlap_tokens / tokens.scale), size - 1)
    chunks: list[Chunk] = []
    begin = 0
    while True:
        end = min(begin + size, n)
        piece = text[starts[begin] : starts[end] if end < n else len(text)]
        if piece.strip():
            count = end - begin if tokens.scale == 1.0 else max(1, round((end - begin) * tokens.scale))
            chunks.append(Chunk(piece, min(count, max_tokens)))
        if end >= n:
            return chunks
        begin = end - overlap


async def count_tokens(text: str, config: Config) -> Tokens:
    """The text's tokens: the upstream tokenizer's offsets, its count calibrating the approximation,
    or the approximation alone (module docstring)."""
    answer = await _upstream_tokens(text, config)
    if answer is not None:
        starts, count = answer
        if starts is not None:
            return Tokens(starts, 1.0, "tokenize")
        approx = await asyncio.to_thread(approximate_starts, text)
        if approx and count > 0:
            return Tokens(approx, count / len(approx), "calibrated")
        return Tokens(approx, 1.0, "approximate")
    return Tokens(await asyncio.to_thread(approximate_starts, text), 1.0, "approximate")


async def chunk_text(
    text: str, strategy: Mapping[str, Any] | None, config: Config
) -> tuple[list[Chunk], str]:
    """The chunks of ``text`` under ``strategy`` and the token counting method used."""
    size, overlap = strategy_sizes(strategy)
    tokens = await count_tokens(text, config)
    chunks = await asyncio.to_thread(split_chunks, text, tokens, size, overlap)
    return chunks, tokens.method


# --- the upstream's /tokenize ---------------------------------------------------------------------
# Per upstream object (weakly: a replaced config's upstream goes with it).
_no_tokenize: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()


def _segments(text: str) -> list[tuple[int, str]]:
    """``text`` in consecutive pieces of at most SEGMENT_CHARS, cut after whitespace where there is."""
    out: list[tuple[int, str]] = []
    start = 0
    while len(text) - start > SEGMENT_CHARS:
        limit = start + SEGMENT_CHARS
        cut = max(text.rfind("\n", start, limit), text.rfind(" ", start, limit))
        cut = cut + 1 if cut > start else limit
        out.append((start, text[start:cut]))
        start = cut
    out.append((start, text[start:]))
    return out


async def _upstream_tokens(text: str, config: Config) -> tuple[list[int] | None, int] | None:
    """(offsets or None, token count) from the upstream's ``/tokenize``; None where it has none or
    fails (the caller approximates; the reason is logged)."""
    from gateway.core import errors
    from inference_app.upstream.http import get_upstream

    upstream = get_upstream()
    if _no_tokenize.get(upstream, 0.0) > time.monotonic():
        return None
    headers = {"content-type": "application/json"}
    if api_key := config.openai_api_key.get_secret_value():
        headers["authorization"] = f"Bearer {api_key}"
    model = config.model or config.inference.served_model_name
    all_starts: list[int] | None = []
    total = 0
    try:
        async with asyncio.timeout(TOKENIZE_TIMEOUT_S):
            for offset, segment in _segments(text):
                body: dict[str, Any] = {
                    "prompt": segment,
                    "add_special_tokens": False,
                    "return_token_strs": True,
                }
                if model:
                    body = {"model": model, **body}
                response = await upstream.send("POST", "/tokenize", body=orjson.dumps(body), headers=headers)
                try:
                    payload = await response.read()
                finally:
                    await response.aclose()
                if response.status in (404, 405, 501):
                    _no_tokenize[upstream] = time.monotonic() + NO_TOKENIZE_TTL_S
                    log.info(
                        "the upstream has no /tokenize (%d): token counts are approximated", response.status
                    )
                    return None
                if response.status != 200:
                    log.warning("/tokenize answered %d: %s", response.status, payload[:300])
                    return None
                answer = orjson.loads(payload)
                count = int(answer["count"])
                total += count
                if all_starts is not None:
                    starts = token_offsets(segment, answer.get("token_strs"))
                    if starts is None or len(starts) != count:
                        all_starts = None
                    else:
                        all_starts.extend(offset + s for s in starts)
    except (errors.GatewayError, TimeoutError, ValueError, KeyError, TypeError) as exc:
        log.warning("/tokenize failed (%s: %s): token counts are approximated", type(exc).__name__, exc)
        return None
    return all_starts, total


@cache
def _byte_decoder() -> dict[str, int]:
    """The inverse of byte-level BPE's byte-to-character table (GPT-2's ``bytes_to_unicode``)."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    table = {chr(b): b for b in printable}
    extra = 0
    for b in range(256):
        if b not in printable:
            table[chr(256 + extra)] = b
            extra += 1
    return table


_SP_BYTE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _byte_level(token: str) -> bytes | None:
    decoder = _byte_decoder()
    try:
        return bytes(decoder[c] for c in token)
    except KeyError:
        return None


def _sentencepiece(token: str) -> bytes:
    byte = _SP_BYTE.fullmatch(token)
    if byte is not None:
        return bytes([int(byte.group(1), 16)])
    return token.replace("\u2581", " ").encode()


def token_offsets(text: str, token_strs: Any) -> list[int] | None:
    """Where each token starts in ``text``, from vLLM's ``token_strs``; None when they do not spell
    ``text`` exactly in a byte-level BPE or SentencePiece vocabulary."""
    if not isinstance(token_strs, list) or not all(isinstance(t, str) for t in token_strs):
        return None
    wanted = text.encode()
    byte_level = [_byte_level(t) for t in token_strs]
    candidates: list[list[bytes]] = []
    if all(p is not None for p in byte_level):
        candidates.append([p for p in byte_level if p is not None])
    candidates.append([_sentencepiece(t) for t in token_strs])
    for pieces in candidates:
        joined = b"".join(pieces)
        if joined != wanted and pieces and joined == b" " + wanted and pieces[0].startswith(b" "):
            pieces = [pieces[0][1:], *pieces[1:]]  # SentencePiece's dummy prefix space
            joined = wanted
        if joined == wanted:
            return _char_starts(pieces)
    return None


def _char_starts(pieces: list[bytes]) -> list[int]:
    """Character offsets of consecutive byte pieces of UTF-8 text (a character split across tokens
    belongs to the token that completes it)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    starts: list[int] = []
    position = 0
    for piece in pieces:
        starts.append(position)
        position += len(decoder.decode(piece))
    return starts
