"""Schema fuzzing: schemathesis against a live ``manage.py serve`` in front of the scripted upstream.

Every operation of the served document is generated for (examples, fuzzing, and the stateful phase
that follows the document's links: create → retrieve → list items → delete). The run must find no
server error (5xx), no answer that violates the document (status, content type, headers, body), and
no hang (every request answers within ``REQUEST_TIMEOUT_S``). It is bounded: a fixed seed and a few
examples per operation keep it to about a minute on two cores.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.fuzz_upstream import FuzzUpstream
from tests.servers import GatewayProcess

ST = str(Path(sys.executable).with_name("st"))
CHECKS = (
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_headers_conformance",
    "response_schema_conformance",
)
REQUEST_TIMEOUT_S = 30
RUN_BOUND_S = 480

# A gateway process and the fuzzer: the start, the run (RUN_BOUND_S) and the shutdown.
pytestmark = [pytest.mark.process, pytest.mark.timeout(RUN_BOUND_S + 300)]


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[GatewayProcess, Path]]:
    upstream = FuzzUpstream().start()
    log = tmp_path / "gateway.log"
    env = {"LLM_API_BASE": upstream.url, "UPSTREAM_API": "chat_completions", "LOG_LEVEL": "INFO"}
    gateway = GatewayProcess(env, log=log).wait(120)
    try:
        yield gateway, log
    finally:
        gateway.stop()
        upstream.stop()


def _chains(log: str, resource: str) -> set[str]:
    """Ids that were retrieved, listed and deleted (each with a 200) in the gateway's access log."""
    seen: dict[str, set[str]] = defaultdict(set)
    pattern = rf"(GET|DELETE) /v1/{resource}/([a-z]+_[A-Za-z0-9]+)(/\w+)? 200 "
    for method, ident, tail in re.findall(pattern, log):
        seen[ident].add(f"{method}{tail}")
    listing = "GET/items" if resource == "conversations" else "GET/input_items"
    return {ident for ident, calls in seen.items() if {"GET", listing, "DELETE"} <= calls}


def test_schemathesis_finds_no_server_error_violation_or_hang(
    served: tuple[GatewayProcess, Path], tmp_path: Path
) -> None:
    gateway, log = served
    document = httpx.get(f"{gateway.url}/v1/openapi.json", timeout=180)
    assert document.status_code == 200
    schema = tmp_path / "openapi.json"
    schema.write_bytes(document.content)
    operations = sum(len(ops) for ops in document.json()["paths"].values())

    run = subprocess.run(
        [
            ST,
            "run",
            str(schema),
            "--url",
            gateway.url,
            "--checks",
            ",".join(CHECKS),
            "--phases",
            "examples,fuzzing,stateful",
            "--max-examples",
            "8",
            "--seed",
            "1",
            "--workers",
            "1",  # generation in two threads at once trips CPython 3.11's AST recursion check (SystemError)
            "--request-timeout",
            str(REQUEST_TIMEOUT_S),
            "--suppress-health-check",
            "too_slow",  # generating from the SDKs' large request schemas, not an API finding
            "--output-truncate",
            "true",
        ],
        capture_output=True,
        text=True,
        timeout=RUN_BOUND_S,
        cwd=tmp_path,  # its run cache (.schemathesis/) stays out of the repository
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-12000:]
    assert f"Selected: {operations}/{operations}" in output, output[-4000:]
    assert "Stateful" in output and "🚫" not in output, output[-4000:]
    served_log = log.read_text()
    assert " 500 " not in served_log and "Traceback" not in served_log
    # The stateful phase followed the links through whole chains.
    assert _chains(served_log, "conversations"), "no conversation was retrieved, listed and deleted"
