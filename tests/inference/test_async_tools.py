"""Async client tools on real vLLM (issue 22): the round trip on vLLM's own wire output.

The tiny model writes gibberish, so the call is forced with a named ``tool_choice`` (vLLM's
structured output writes the arguments) and only the shape is checked: the async call comes back
with ``async: true`` (its arguments cut short, see :func:`_closing_bias`), the gateway runs a second round with the call pending (its note as the
call's ``tool`` message, rendered by the model's chat template), and stops after two async rounds
in a row because the forced model calls the tool again.

The executor talks to the engine over the ``chat_completions`` wire here: vLLM 0.32's
``/v1/responses`` usage carries per-turn lists that the executor accepts only once the compaction
branch's fix (``upstream_events``) is merged.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from tests.inference.conftest import SERVED, Gateway, embedded_gateway_for

pytestmark = pytest.mark.slow

LOOKUP = {
    "type": "function",
    "name": "lookup",
    "description": "Look it up.",
    "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
    "async": True,
}


@pytest.fixture(scope="module")
def chat_wire_gateway(tiny_model_dir: Path) -> Iterator[Gateway]:
    """The gateway hosting the engine in-process, its executor on the chat wire."""
    yield from embedded_gateway_for(tiny_model_dir, UPSTREAM_API="chat_completions")


def _closing_bias(model_dir: Path) -> dict[str, int]:
    """``logit_bias`` (a vLLM sampling field the gateway forwards) that closes the forced call
    quickly and then stops: vLLM forces the hermes call's frame (``<tool_call>{"name": "lookup",
    "arguments": …}</tool_call>``), but the random-weight model would fill the arguments until the
    token budget ends."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    vocab = tokenizer.get_vocab()
    # The argument value vLLM's grammar lets the model open here starts ``["``: closing tokens
    # first (a token the grammar masks at a position stays masked whatever its bias).
    wanted = ["{}", "{", '"', '"]', "]", "}", "</tool_call>"]
    ids = {vocab[token] for token in wanted if token in vocab} | {tokenizer.eos_token_id}
    return {str(i): 100 for i in sorted(ids)}


def test_an_async_round_runs_end_to_end(chat_wire_gateway: Gateway, tiny_model_dir: Path) -> None:
    body = {
        "model": SERVED,
        "input": "hi",
        "tools": [LOOKUP],
        "tool_choice": {"type": "function", "name": "lookup"},
        "store": False,
        "stream": True,
        "temperature": 0,
        # The forced call is written in the hermes format (<tool_call>{"name": …, "arguments": {}}
        # </tool_call>): about twenty tokens.
        "max_output_tokens": 64,
        "logit_bias": _closing_bias(tiny_model_dir),
    }
    r = httpx.post(f"{chat_wire_gateway.url}/v1/responses", json=body, timeout=300)
    assert r.status_code == 200, r.text
    events = [orjson.loads(block.split("\ndata: ", 1)[1]) for block in r.text.split("\n\n") if block.strip()]
    final = events[-1]
    arguments = [i.get("arguments") for i in final["response"]["output"]]
    assert final["type"] == "response.completed", (final["response"]["error"], arguments)
    output = final["response"]["output"]
    # Round 1: the async call; round 2 (the call pending): the forced model calls again; the
    # gateway stops after two async rounds in a row.
    assert [(i["type"], i["name"], i["async"]) for i in output] == [("function_call", "lookup", True)] * 2
    assert all(isinstance(i["arguments"], str) for i in output)  # gibberish: only the type is checked
    assert len({i["call_id"] for i in output}) == 2
    added = [e["item"] for e in events if e["type"] == "response.output_item.added"]
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert [i["async"] for i in added + done] == [True] * 4
    assert final["response"]["tools"] == [{**LOOKUP, "output_schema": None}]  # no hint echoed
    usage = final["response"]["usage"]
    assert usage["input_tokens"] > 0 and usage["output_tokens"] > 0
