"""File citations: the model's ``[cite:<file_id>]`` markers become ``file_citation`` annotations.

A marker naming a file among this response's ``file_search`` results is removed from the text and
annotated at its position in the final text (``index``, in characters, as OpenAI reports it); one
horizontal space before it goes too. Any other marker stays as plain text: nothing is invented.
Markers may be split across stream deltas, so a tail that could still become one is held back
until the next delta (or the end of the text).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from inference_app.tools.file_search import CITATION_MARKER

# A tail that may still grow into a marker: a prefix of "[cite:", or "[cite:" and an id so far.
_PARTIAL = re.compile(r"\[(?:c(?:i(?:t(?:e(?::[A-Za-z0-9_-]{0,64})?)?)?)?)?")


class CitationText:
    """One ``output_text`` as it streams: :meth:`feed` each delta, :meth:`flush` at the end."""

    def __init__(self, citable: Mapping[str, str]) -> None:
        self.citable = citable  # file_id -> filename of this response's results
        self.held = ""
        self.length = 0  # characters of clean text released so far
        self.annotations: list[dict[str, Any]] = []

    def feed(self, delta: str) -> tuple[str, list[dict[str, Any]]]:
        """The clean text to release now, and the annotations found in it."""
        text = self.held + delta
        self.held = ""
        out: list[str] = []
        found: list[dict[str, Any]] = []
        position = 0
        for match in CITATION_MARKER.finditer(text):
            filename = self.citable.get(match.group(1))
            if filename is None:
                continue  # not one of this response's results: left as written
            before = text[position : match.start()]
            if before.endswith((" ", "\t")):
                before = before[:-1]
            out.append(before)
            self.length += len(before)
            annotation = {
                "type": "file_citation",
                "file_id": match.group(1),
                "filename": filename,
                "index": self.length,
            }
            self.annotations.append(annotation)
            found.append(annotation)
            position = match.end()
        rest = text[position:]
        held = ""
        start = rest.rfind("[")
        if start >= 0 and _PARTIAL.fullmatch(rest, start):
            rest, held = rest[:start], rest[start:]
        if rest.endswith((" ", "\t")):
            rest, held = rest[:-1], rest[-1] + held  # a marker may follow the space
        self.held = held
        out.append(rest)
        self.length += len(rest)
        return "".join(out), found

    def flush(self) -> str:
        """What is still held (an unfinished marker is plain text)."""
        held, self.held = self.held, ""
        self.length += len(held)
        return held
