"""Config: env > file > defaults, and every start-up refusal with the setting named."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.core.config import ConfigError, MiB, load_config


def write(tmp_path: Path, text: str) -> dict[str, str]:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return {"GATEWAY_CONFIG": str(path)}


def test_defaults() -> None:
    c = load_config({})
    assert c.llm_api_base == ""
    assert c.database_url == "" and c.redis_url == ""
    assert c.server.max_request_body_size_bytes == 10 * MiB
    assert c.server.cors_allowed_origins == ()
    assert c.responses.max_retained_bytes == 8 * MiB
    assert c.responses.max_upstream_sse_line_bytes == 16 * MiB
    assert c.responses.max_stream_event_bytes == 16 * MiB
    assert c.responses.prompt_cache_options_supported is False
    assert c.tools.max_concurrent_gateway_calls == 5
    assert c.server.debug is False
    assert not c.oidc_enabled and not c.broker_enabled


def test_file_then_env_precedence(tmp_path: Path) -> None:
    env = write(
        tmp_path,
        'llm_api_base = "http://file:8000"\n'
        "[server]\nmax_request_body_size_bytes = 2048\ncors_allowed_origins = ['https://a.example']\n"
        "[responses]\nprompt_cache_options_supported = true\n"
        "[tools]\nmax_concurrent_gateway_calls = 3\n",
    )
    c = load_config(env)
    assert c.llm_api_base == "http://file:8000"
    assert c.server.max_request_body_size_bytes == 2048
    assert c.server.cors_allowed_origins == ("https://a.example",)
    assert c.responses.prompt_cache_options_supported is True
    assert c.tools.max_concurrent_gateway_calls == 3
    env |= {
        "LLM_API_BASE": "http://env:9000/v1",
        "GATEWAY_SERVER_MAX_REQUEST_BODY_SIZE_BYTES": "4096",
        "CORS_ALLOWED_ORIGINS": "https://b.example, https://c.example",
        "GATEWAY_RESPONSES_PROMPT_CACHE_OPTIONS_SUPPORTED": "false",
    }
    c = load_config(env)
    assert c.llm_api_base == "http://env:9000/v1"
    assert c.upstream_base == "http://env:9000"
    assert c.server.max_request_body_size_bytes == 4096
    assert c.server.cors_allowed_origins == ("https://b.example", "https://c.example")
    assert c.responses.prompt_cache_options_supported is False
    assert c.tools.max_concurrent_gateway_calls == 3  # file value kept


@pytest.mark.parametrize(
    "base, expected",
    [
        ("http://h:8000", "http://h:8000"),
        ("http://h:8000/", "http://h:8000"),
        ("http://h:8000/v1", "http://h:8000"),
        ("http://h:8000/v1/", "http://h:8000"),
        ("http://h:8000/prefix/v1", "http://h:8000/prefix"),
    ],
)
def test_upstream_base_never_doubles_v1(base: str, expected: str) -> None:
    assert load_config({"LLM_API_BASE": base}).upstream_base == expected


def test_config_is_frozen() -> None:
    from pydantic import ValidationError

    c = load_config({})
    with pytest.raises(ValidationError, match="frozen"):
        c.llm_api_base = "x"  # type: ignore[misc]
    with pytest.raises(ValidationError, match="frozen"):
        c.server.port = 1  # type: ignore[misc]


@pytest.mark.parametrize(
    "text, named",
    [
        ("bogus = 1\n", "bogus: unknown setting"),
        ("[server]\nbogus = 1\n", "server.bogus: unknown setting"),
        ("[nosuchsection]\nx = 1\n", "nosuchsection: unknown setting"),
        (
            "[server]\nmax_request_body_size_bytes = 'big'\n",
            "server.max_request_body_size_bytes: must be an integer",
        ),
        ("[server]\ndebug = 'yes'\n", "server.debug: must be a boolean"),
        ("[server]\ncors_allowed_origins = 'https://a'\n", "server.cors_allowed_origins: must be a list"),
        (
            "[responses]\nprompt_cache_options_supported = 1\n",
            "responses.prompt_cache_options_supported: must be a boolean",
        ),
        (
            "[tools]\nmax_concurrent_gateway_calls = 0\n",
            "tools.max_concurrent_gateway_calls: must be positive",
        ),
        ("upstream_api = 'grpc'\n", "upstream_api: must be 'responses' or 'chat_completions'"),
        ("server = 3\n", "[server]: must be a table"),
        ("openai_api_key = 'sk-x'\n", "openai_api_key: secrets are never read from the config file"),
        ("[database]\npool_min_size = 50\n", "database.pool_min_size: must not exceed"),
        ("[server]\ncors_allowed_origins = ['https://a.example/path']\n", "server.cors_allowed_origins"),
        ("llm_api_base = 'ftp://x'\n", "LLM_API_BASE: must be an http(s) URL"),
        ("database_url = 'mysql://x/y'\n", "DATABASE_URL: unsupported scheme"),
        ("not valid toml [\n", "is not valid TOML"),
        ("[passthrough]\nextra_routes = 'v2/rerank'\n", "passthrough.extra_routes: must be a list"),
        (
            "[passthrough]\nextra_routes = ['v2/rerank']\n",
            "passthrough.extra_routes: 'v2/rerank' is not a path",
        ),
        ("[passthrough]\nextra_routes = ['/v2/rerank?x=1']\n", "'/v2/rerank?x=1' is not a path"),
        (
            "[passthrough]\nextra_routes = ['/v1/responses/compact']\n",
            "passthrough.extra_routes: '/v1/responses/compact' is served by the gateway itself",
        ),
        ("[passthrough]\nextra_routes = ['/health']\n", "'/health' is served by the gateway itself"),
        (
            "[usage]\nledger = false\n[quotas]\ntokens_per_minute = 1000\n",
            "quotas.tokens_per_minute: a token quota is charged from the usage ledger",
        ),
    ],
)
def test_file_refusals_name_the_setting(tmp_path: Path, text: str, named: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text))
    assert named in str(info.value)


@pytest.mark.parametrize(
    "env, named",
    [
        ({"OIDC_ISSUER": "https://idp.example"}, "OIDC_AUDIENCE: must be set together with OIDC_ISSUER"),
        ({"OIDC_AUDIENCE": "gw"}, "OIDC_ISSUER: must be set together with OIDC_AUDIENCE"),
        ({"OIDC_ISSUER": "http://idp.example", "OIDC_AUDIENCE": "gw"}, "OIDC_ISSUER: must use https"),
        ({"PORT": "eighty"}, "PORT: must be an integer"),
        ({"PORT": "70000"}, "server.port: must be between"),
        ({"GATEWAY_DEBUG": "maybe"}, "GATEWAY_DEBUG: must be a boolean"),
        ({"GATEWAY_RESPONSES_MAX_RETAINED_BYTES": "-1"}, "responses.max_retained_bytes: must be positive"),
        ({"REDIS_URL": "http://x"}, "REDIS_URL: must be a redis:// URL"),
        (
            {"GATEWAY_USAGE_LEDGER": "false", "GATEWAY_QUOTAS_TOKENS_PER_DAY": "5000"},
            "quotas.tokens_per_day: a token quota is charged from the usage ledger",
        ),
        (
            {"GATEWAY_CONFIG": "/nonexistent/config.toml"},
            "GATEWAY_CONFIG: file /nonexistent/config.toml does not exist",
        ),
    ],
)
def test_env_refusals_name_the_setting(env: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(env)
    assert named in str(info.value)


def test_extra_pass_through_routes_from_the_file_and_the_environment(tmp_path: Path) -> None:
    c = load_config(write(tmp_path, "[passthrough]\nextra_routes = ['/v2/rerank', '/v1/score/batch']\n"))
    assert c.passthrough.extra_routes == ("/v2/rerank", "/v1/score/batch")
    c = load_config({"GATEWAY_PASSTHROUGH_EXTRA_ROUTES": "/v2/rerank, /invocations"})
    assert c.passthrough.extra_routes == ("/v2/rerank", "/invocations")
    assert load_config({}).passthrough.extra_routes == ()


def test_ledger_off_keeps_the_request_quotas() -> None:
    """Only token quotas need the ledger: request and concurrency limits load with it off."""
    c = load_config(
        {
            "GATEWAY_USAGE_LEDGER": "false",
            "GATEWAY_QUOTAS_REQUESTS_PER_MINUTE": "60",
            "GATEWAY_QUOTAS_MAX_CONCURRENT_REQUESTS": "4",
        }
    )
    assert (c.usage.ledger, c.quotas.requests_per_minute, c.quotas.max_concurrent_requests) == (False, 60, 4)
    assert load_config({}).usage.ledger is True


def test_oidc_on_loopback_http_is_allowed() -> None:
    c = load_config({"OIDC_ISSUER": "http://127.0.0.1:9999", "OIDC_AUDIENCE": "gw"})
    assert c.oidc_enabled


def test_secrets_only_from_environment() -> None:
    c = load_config({"OPENAI_API_KEY": "sk-upstream"})
    assert c.openai_api_key.get_secret_value() == "sk-upstream"
    assert "sk-upstream" not in repr(c) and "sk-upstream" not in str(c.model_dump())


def test_example_config_documents_every_key_and_loads() -> None:
    """config.example.toml loads cleanly and mentions every non-secret key."""
    from pydantic import BaseModel

    from gateway.core.config import SECRET_ENV, Config, UpstreamEntry

    root = Path(__file__).resolve().parents[2]
    example = root / "config.example.toml"
    text = example.read_text()
    load_config({"GATEWAY_CONFIG": str(example)})
    for name, f in Config.model_fields.items():
        if name in SECRET_ENV:
            continue
        if isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel):
            assert f"[{name}]" in text
            for sub in f.annotation.model_fields:
                assert f"{sub} =" in text, f"{name}.{sub} undocumented"
        elif name == "mcp_servers":
            assert "[mcp_servers.docs]" in text  # the dynamic table, documented by example
        elif name == "upstreams":
            assert "[[upstreams]]" in text  # the array of tables, documented by example
            for sub in UpstreamEntry.model_fields.keys() - {"api_key"}:
                assert f"# {sub} =" in text, f"upstreams.{sub} undocumented"
        else:
            assert f"{name} =" in text, f"{name} undocumented"


@pytest.mark.process
def test_startup_refusal_stops_the_process() -> None:
    """A bad setting stops `manage.py serve` with one clear message naming it."""
    import subprocess
    import sys

    from tests.servers import ROOT

    proc = subprocess.run(
        [sys.executable, "manage.py", "serve"],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "OIDC_ISSUER": "https://idp.example"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert "OIDC_AUDIENCE: must be set together with OIDC_ISSUER" in proc.stderr
    assert proc.stderr.count("Traceback") == 0


def test_server_workers_default_to_one_per_core_unless_the_engine_is_embedded() -> None:
    import os

    cores = len(os.sched_getaffinity(0))
    assert load_config({}).server_workers == 1  # the embedded engine: one process loads it
    assert load_config({"LLM_API_BASE": "http://vllm:8000"}).server_workers == cores
    assert load_config({"REDIS_URL": "redis://127.0.0.1:6379/0"}).server_workers == cores
    explicit = {"LLM_API_BASE": "http://vllm:8000", "GATEWAY_SERVER_WORKERS": "3"}
    assert load_config(explicit).server_workers == 3
    with pytest.raises(ConfigError) as info:
        load_config({"GATEWAY_SERVER_WORKERS": "-1"})
    assert "server.workers" in str(info.value)


def test_sections_merge_across_sources_and_only_the_file_is_strict(tmp_path: Path) -> None:
    """pydantic-settings merges a section key by key (env > file > default), the file's values are
    taken as written, and the environment's text is parsed as the declared type."""
    env = write(tmp_path, "[server]\nport = 8100\nhost = '0.0.0.0'\n[upstream]\nread_timeout_s = 5\n")
    c = load_config({**env, "PORT": "8200", "GATEWAY_DEBUG": "on"})
    assert (c.server.port, c.server.host, c.server.debug) == (8200, "0.0.0.0", True)
    assert c.server.max_request_body_size_bytes == 10 * MiB  # default: in neither source
    assert c.upstream.read_timeout_s == 5.0 and isinstance(c.upstream.read_timeout_s, float)
    with pytest.raises(ConfigError, match=r"^server.port: must be an integer, got '8100'$"):
        load_config(write(tmp_path, "[server]\nport = '8100'\n"))
    with pytest.raises(ConfigError, match=r"^server.port: must be an integer, got 8100.5$"):
        load_config(write(tmp_path, "[server]\nport = 8100.5\n"))


def test_pydantic_settings_nested_names_beside_the_documented_ones() -> None:
    """GATEWAY_<SECTION>__<KEY> is pydantic-settings' own (lists as JSON); the documented names
    (GATEWAY_<SECTION>_<KEY>, conventional ones) take lists comma-separated."""
    c = load_config(
        {
            "GATEWAY_SERVER__PORT": "8300",
            "GATEWAY_SERVER__CORS_ALLOWED_ORIGINS": '["https://a.example"]',
            "GATEWAY_WEB_FETCH__ALLOWED_HOSTS": '["intranet"]',
            "GATEWAY_MCP_ALLOWED_HOSTS": "a.example, b.example",
        }
    )
    assert c.server.port == 8300 and c.server.cors_allowed_origins == ("https://a.example",)
    assert c.web_fetch.allowed_hosts == ("intranet",) and c.mcp.allowed_hosts == ("a.example", "b.example")
    # Both spellings of one key: the nested name wins over the documented one.
    assert load_config({"GATEWAY_SERVER__PORT": "8300", "GATEWAY_SERVER_PORT": "8400"}).server.port == 8300
    with pytest.raises(ConfigError, match=r"^server.bogus: unknown setting \(GATEWAY_SERVER__BOGUS\)$"):
        load_config({"GATEWAY_SERVER__BOGUS": "1"})
    with pytest.raises(ConfigError, match=r"^GATEWAY_SERVER_PORT: must be an integer, got 'x'$"):
        load_config({"GATEWAY_SERVER_PORT": "x"})
    with pytest.raises(ConfigError, match=r"^server.port: must be an integer, got 'x'$"):
        load_config({"GATEWAY_SERVER__PORT": "x"})
    with pytest.raises(ConfigError, match='error parsing value for field "server"'):
        load_config({"GATEWAY_SERVER__CORS_ALLOWED_ORIGINS": "https://a.example"})  # not JSON


def test_replace_checks_the_whole_config_again() -> None:
    from gateway.core.config import replace

    c = load_config({})
    with pytest.raises(ConfigError, match=r"responses\.heartbeat_s"):
        replace(c, responses__heartbeat_s=120.0)
    with pytest.raises(ConfigError, match=r"^server.port: must be an integer, got 'x'$"):
        replace(c, server__port="x")


UPSTREAMS = """
[[upstreams]]
base_url = "http://vllm-a:8000/v1"
api_key_env = "VLLM_A_KEY"
models = ["big"]
weight = 3.0

[[upstreams]]
base_url = "http://vllm-b:8000"
"""


def test_the_upstream_table_from_the_file_and_the_short_form(tmp_path: Path) -> None:
    c = load_config(write(tmp_path, UPSTREAMS) | {"VLLM_A_KEY": "key-a", "OPENAI_API_KEY": "key-default"})
    a, b = c.upstream_entries
    assert (a.base, a.models, a.weight, a.api_key.get_secret_value()) == (
        "http://vllm-a:8000",
        ("big",),
        3.0,
        "key-a",
    )
    assert (b.base, b.models, b.weight, b.api_key.get_secret_value()) == (
        "http://vllm-b:8000",
        (),
        1.0,
        "key-default",
    )
    assert c.http_upstreams and c.upstream_base == "http://vllm-a:8000" and c.llm_api_base == ""
    assert "key-a" not in repr(c)
    c = load_config({"LLM_API_BASE": "http://a:8000/v1, http://b:8000", "OPENAI_API_KEY": "k"})
    assert [(e.base, e.models, e.weight, e.api_key.get_secret_value()) for e in c.upstream_entries] == [
        ("http://a:8000", (), 1.0, "k"),
        ("http://b:8000", (), 1.0, "k"),
    ]
    assert c.upstream_base == "http://a:8000"
    assert load_config({"LLM_API_BASE": "http://a:8000"}).upstream_entries[0].base == "http://a:8000"
    assert not load_config({}).http_upstreams and load_config({}).upstream_entries == ()


@pytest.mark.parametrize(
    "text, env, named",
    [
        (UPSTREAMS, {"VLLM_A_KEY": "k", "LLM_API_BASE": "http://c:8000"}, "set it or [[upstreams]]"),
        (
            '[[upstreams]]\nbase_url = "http://a:8000"\napi_key = "sk-x"\n',
            {},
            "upstreams[0].api_key: secrets are never read from the config file",
        ),
        (UPSTREAMS, {}, "upstreams[0].api_key_env: environment variable VLLM_A_KEY is not set"),
        (
            '[[upstreams]]\nbase_url = "http://a:8000/v1"\n[[upstreams]]\nbase_url = "http://a:8000/"\n',
            {},
            "upstreams: http://a:8000 is listed twice",
        ),
        ("", {"LLM_API_BASE": "http://a:8000,http://a:8000/v1"}, "upstreams: http://a:8000 is listed twice"),
        (
            "",
            {"LLM_API_BASE": "http://a:8000,ftp://b"},
            "LLM_API_BASE: must be an http(s) URL, got 'ftp://b'",
        ),
        ('[[upstreams]]\nbase_url = "a:8000"\n', {}, "must be an http(s) URL"),
        ('[[upstreams]]\nbase_url = "http://a:8000"\nweight = 0\n', {}, "weight"),
        (
            "[routing]\nbackoff_s = 10.0\nbackoff_max_s = 5.0\n",
            {},
            "routing.backoff_max_s: must not be shorter",
        ),
        (
            '[routing]\nsession_header = "authorization"\n',
            {},
            "routing.session_header: not a plain header name",
        ),
    ],
)
def test_upstream_table_refusals_name_the_setting(
    tmp_path: Path, text: str, env: dict[str, str], named: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text) | env)
    assert named in str(info.value)
