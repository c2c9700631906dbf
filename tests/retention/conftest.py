"""The live gateway with a scripted upstream (tests/responses' fixtures), on the Responses wire."""

from __future__ import annotations

import pytest

from tests.responses.conftest import gw


@pytest.fixture
def wire() -> str:
    return "responses"


__all__ = ["gw", "wire"]
