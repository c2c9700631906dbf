"""The real Codex CLI (0.171.0) against a live gateway in front of the scripted upstream.

Codex is installed from npm into ``tests/.cache/codex`` (git-ignored) on first use and reused
afterwards. Each run gets a temporary ``CODEX_HOME`` whose ``config.toml`` points a
``model_providers`` entry at the gateway; a recording ASGI wrapper proves which transport Codex
used (WebSocket frames vs. HTTP POSTs) and keeps the frames it sent.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.clients import codex_cli
from tests.responses.scripts import Script, call, handler, text
from tests.servers import LiveServer

pytestmark = pytest.mark.slow


class Recorder:
    """An ASGI wrapper that records HTTP requests and WebSocket client frames on the way in."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.http: list[tuple[str, str]] = []
        self.ws_headers: list[dict[str, str]] = []
        self.ws_frames: list[dict[str, Any]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            self.http.append((scope["method"], scope["path"]))
        elif scope["type"] == "websocket":
            self.ws_headers.append({k.decode(): v.decode() for k, v in scope["headers"]})

            async def recording_receive() -> Any:
                message = await receive()
                if message["type"] == "websocket.receive" and message.get("text"):
                    self.ws_frames.append(orjson.loads(message["text"]))
                return message

            await self.app(scope, recording_receive, send)
            return
        await self.app(scope, receive, send)


@pytest.fixture
def codex_gateway(
    transactional_db: None, upstream: Any, gateway_config: Any
) -> Iterator[tuple[str, Recorder]]:
    from gateway.asgi import application

    gateway_config(llm_api_base=upstream.url, upstream_api="responses")
    recorder = Recorder(application)
    server = LiveServer(recorder).start()
    yield server.url, recorder
    server.stop()


def _run_codex(
    url: str,
    tmp_path: Path,
    prompt: str,
    *,
    websockets: bool,
    provider_name: str = "agentic gateway",
    extra: str = "",
) -> subprocess.CompletedProcess[str]:
    binary = codex_cli()
    home = tmp_path / "codex-home"
    work = tmp_path / "work"
    home.mkdir()
    work.mkdir()
    (home / "config.toml").write_text(
        'model = "test-model"\n'
        'model_provider = "gateway"\n'
        f"{extra}\n"
        "[model_providers.gateway]\n"
        f'name = "{provider_name}"\n'
        f'base_url = "{url}/v1"\n'
        'wire_api = "responses"\n'
        f"supports_websockets = {'true' if websockets else 'false'}\n"
        "requires_openai_auth = false\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "CODEX_"))}
    env["CODEX_HOME"] = str(home)
    return subprocess.run(
        [str(binary), "exec", "--skip-git-repo-check", "--sandbox", "danger-full-access", prompt],
        cwd=work,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=180,
    )


def _tool_names(body: dict[str, Any]) -> set[str]:
    return {t.get("name", "") for t in body.get("tools") or () if t.get("type") == "function"}


def test_codex_exec_over_websocket(
    codex_gateway: tuple[str, Recorder], upstream: Any, tmp_path: Path
) -> None:
    url, recorder = codex_gateway
    upstream.script("/v1/responses", handler(Script([text("PONG", "-", "websocket")])))
    result = _run_codex(url, tmp_path, "Reply with the word PONG.", websockets=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "PONG-websocket" in result.stdout

    # Codex used the WebSocket: a generate:false prewarm, then a continuation of it.
    assert recorder.ws_headers and recorder.ws_headers[0]["openai-beta"] == "responses_websockets=2026-02-06"
    assert ("POST", "/v1/responses") not in recorder.http
    prewarm, turn = recorder.ws_frames[0], recorder.ws_frames[1]
    assert prewarm["type"] == "response.create" and prewarm["generate"] is False and prewarm["store"] is False
    assert turn["store"] is False and turn["previous_response_id"]
    # Only the turn reached the model; it carried the prewarm's history plus the new input.
    bodies = [r.json() for r in upstream.requests if r.path == "/v1/responses"]
    assert len(bodies) == 1
    body = bodies[0]
    texts = orjson.dumps(body["input"]).decode()
    assert "Reply with the word PONG." in texts
    assert "You are a coding agent running in the Codex CLI" in texts  # from the prewarm
    # Namespace members are flattened, web_search is withheld (no search provider configured).
    assert "multi_agent_v1__close_agent" in _tool_names(body)
    assert all(t["type"] == "function" for t in body["tools"])
    assert [t["type"] for t in prewarm["tools"]].count("web_search") == 1  # Codex did declare it
    # Codex 0.171.0 never sends response.steer (no such event name in its binary: it folds a
    # mid-turn message into its next response.create); its session works with steering support on.
    assert {f["type"] for f in recorder.ws_frames} == {"response.create"}


def test_codex_exec_over_http_sse(codex_gateway: tuple[str, Recorder], upstream: Any, tmp_path: Path) -> None:
    url, recorder = codex_gateway
    upstream.script("/v1/responses", handler(Script([text("PONG", "-", "sse")])))
    result = _run_codex(url, tmp_path, "Reply with the word PONG.", websockets=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "PONG-sse" in result.stdout
    assert not recorder.ws_frames
    assert ("POST", "/v1/responses") in recorder.http
    body = upstream.last("/v1/responses").json()
    assert "multi_agent_v1__close_agent" in _tool_names(body)
    assert not any(t["type"].startswith("web_search") for t in body["tools"])


def test_codex_runs_the_shell_tool_and_continues(
    codex_gateway: tuple[str, Recorder], upstream: Any, tmp_path: Path
) -> None:
    url, recorder = codex_gateway
    upstream.script(
        "/v1/responses",
        handler(Script([call("exec_command", '{"cmd": "echo codex-tool-', 'ok"}', call_id="call_shell_1")])),
    )
    upstream.script("/v1/responses", handler(Script([text("The command printed codex-tool-ok.")])))
    result = _run_codex(url, tmp_path, "Run echo codex-tool-ok and tell me what it printed.", websockets=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "The command printed codex-tool-ok." in result.stdout

    bodies = [r.json() for r in upstream.requests if r.path == "/v1/responses"]
    assert len(bodies) == 2
    # The second round carries Codex's real tool output for the model's call.
    outputs = [i for i in bodies[1]["input"] if i.get("type") == "function_call_output"]
    assert outputs and outputs[0]["call_id"] == "call_shell_1"
    assert "codex-tool-ok" in orjson.dumps(outputs[0]["output"]).decode()
    calls = [i for i in bodies[1]["input"] if i.get("type") == "function_call"]
    assert calls and calls[0]["name"] == "exec_command"
    # Over the WebSocket the follow-up continued the tool-call response with only the new output.
    follow_up = recorder.ws_frames[-1]
    assert follow_up["previous_response_id"]
    assert [i["type"] for i in follow_up["input"]] == ["function_call_output"]
    assert {f["type"] for f in recorder.ws_frames} == {"response.create"}  # no response.steer (0.171.0)


@pytest.mark.parametrize("websockets", [True, False], ids=["websocket", "http-sse"])
def test_codex_compacts_remotely_and_continues_from_the_window(
    codex_gateway: tuple[str, Recorder], upstream: Any, tmp_path: Path, websockets: bool
) -> None:
    """A provider named "OpenAI" makes Codex compact remotely; a low
    ``model_auto_compact_token_limit`` makes it compact after the first tool round (the upstream
    reports a large usage), and the turn goes on from the compacted window."""
    url, recorder = codex_gateway
    big = {"input_tokens": 90_000, "output_tokens": 10, "total_tokens": 90_010}
    upstream.script(
        "/v1/responses",
        handler(
            Script([call("exec_command", '{"cmd": "echo compact-', 'me"}', call_id="call_c1")], usage=big)
        ),
    )
    upstream.script("/v1/responses", handler(Script([text("SUMMARY: the user ran echo compact-me.")])))
    upstream.script("/v1/responses", handler(Script([text("Done after compaction.")])))
    result = _run_codex(
        url,
        tmp_path,
        "Run echo compact-me and tell me what it printed.",
        websockets=websockets,
        provider_name="OpenAI",
        extra="model_auto_compact_token_limit = 20000\n",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "context compacted" in result.stderr and "Done after compaction." in result.stdout
    # Codex V2 remote compaction: a compaction_trigger as the last input item (0.171.0 sends it
    # rather than calling POST /v1/responses/compact, which test_compaction.py covers with the SDK).
    if websockets:
        assert ("POST", "/v1/responses") not in recorder.http
        triggers = [
            i
            for i, f in enumerate(recorder.ws_frames)
            if f.get("input") and f["input"][-1] == {"type": "compaction_trigger"}
        ]
        # The next turn continues from the compacted window Codex got back: our compaction item.
        follow_up = recorder.ws_frames[triggers[0] + 1]
        compactions = [i for i in follow_up["input"] if i.get("type") == "compaction"]
        assert [c["encrypted_content"] for c in compactions] == ["SUMMARY: the user ran echo compact-me."]
    else:
        assert not recorder.ws_frames and recorder.http.count(("POST", "/v1/responses")) == 3
    bodies = [r.json() for r in upstream.requests if r.path == "/v1/responses"]
    assert len(bodies) == 3  # the tool round, the summary round, the turn after compaction
    summary_request, after = bodies[1], bodies[2]
    assert summary_request["stream"] is False
    assert "compaction_trigger" not in orjson.dumps(summary_request).decode()
    assert any(
        i.get("call_id") == "call_c1" for i in summary_request["input"]
    )  # it summarized the tool round
    # The model saw the summary as an assistant message, and no longer the summarized tool round.
    assistant = [i for i in after["input"] if i.get("type") == "message" and i.get("role") == "assistant"]
    assert assistant[-1]["content"][0]["text"] == "SUMMARY: the user ran echo compact-me."
    assert not any(i.get("call_id") == "call_c1" for i in after["input"])
    assert not any(i.get("type", "").startswith("compaction") for i in after["input"])
