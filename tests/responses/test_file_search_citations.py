"""Citation markers in streamed text: removed and annotated at their position in the final text,
whatever the delta boundaries; markers of files not among the results stay as written."""

from __future__ import annotations

import pytest

from responses_app.engine.citations import CitationText

CITABLE = {"file-a": "a.txt", "file-b": "b.md"}
TEXT = "Launch in May [cite:file-a]. Budget is low[cite:file-b][cite:file-a]; see [cite:file-z] and [cite:x"
CLEAN = "Launch in May. Budget is low; see [cite:file-z] and [cite:x"
ANNOTATIONS = [
    {"type": "file_citation", "file_id": "file-a", "filename": "a.txt", "index": 13},
    {"type": "file_citation", "file_id": "file-b", "filename": "b.md", "index": 28},
    {"type": "file_citation", "file_id": "file-a", "filename": "a.txt", "index": 28},
]


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 11, 200])
def test_markers_become_annotations_across_any_delta_boundaries(size: int) -> None:
    cited = CitationText(CITABLE)
    released = []
    found = []
    for start in range(0, len(TEXT), size):
        text, annotations = cited.feed(TEXT[start : start + size])
        released.append(text)
        found += annotations
    released.append(cited.flush())
    assert "".join(released) == CLEAN
    assert found == cited.annotations == ANNOTATIONS
    assert CLEAN[:13] == "Launch in May" and CLEAN[:28] == "Launch in May. Budget is low"


def test_without_markers_text_passes_through() -> None:
    cited = CitationText(CITABLE)
    assert cited.feed("a [b] c ") == ("a [b] c", [])
    assert cited.feed("d") == (" d", [])
    assert cited.flush() == ""
