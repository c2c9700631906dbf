"""Config of the gateway tools: [web_search], [code_interpreter], [mcp] and the dynamic
[mcp_servers.<label>] tables, with secrets from the environment only."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.core.config import ConfigError, load_config


def write(tmp_path: Path, text: str) -> dict[str, str]:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return {"GATEWAY_CONFIG": str(path)}


def test_defaults() -> None:
    c = load_config({})
    assert c.tools.max_concurrent_gateway_calls == 5 and c.tools.call_timeout_s == 60.0
    assert c.web_search.provider == "searxng" and c.web_search.endpoint == ""
    assert c.code_interpreter.enabled and c.code_interpreter.max_processes == 16
    assert c.mcp.allowed_hosts == () and (c.mcp.max_servers, c.mcp.max_tools) == (64, 128)
    assert c.mcp_servers == {}


def test_web_search_env_overrides_and_provider_keys() -> None:
    c = load_config({"WEB_SEARCH_PROVIDER": "brave", "BRAVE_API_KEY": "bk", "TAVILY_API_KEY": "tk"})
    assert c.web_search.endpoint == "https://api.search.brave.com/res/v1/web/search"
    assert c.web_search_api_key.get_secret_value() == "bk"
    assert "bk" not in repr(c)
    c = load_config({"WEB_SEARCH_PROVIDER": "tavily", "BRAVE_API_KEY": "bk", "TAVILY_API_KEY": "tk"})
    assert (
        c.web_search.endpoint == "https://api.tavily.com/search"
        and c.web_search_api_key.get_secret_value() == "tk"
    )
    c = load_config({"WEB_SEARCH_PROVIDER": "searxng", "WEB_SEARCH_BASE_URL": "http://searx:8080"})
    assert (
        c.web_search.endpoint == "http://searx:8080/search" and c.web_search_api_key.get_secret_value() == ""
    )


@pytest.mark.parametrize(
    ("provider", "base", "endpoint"),
    [
        ("brave", "http://127.0.0.1:8080", "http://127.0.0.1:8080/res/v1/web/search"),
        ("brave", "http://127.0.0.1:8080/", "http://127.0.0.1:8080/res/v1/web/search"),
        ("tavily", "http://127.0.0.1:8080", "http://127.0.0.1:8080/search"),
        ("searxng", "http://searx:8080/", "http://searx:8080/search"),
        ("searxng", "http://searx:8080/search", "http://searx:8080/search"),
        ("brave", "", "https://api.search.brave.com/res/v1/web/search"),
        ("tavily", "", "https://api.tavily.com/search"),
    ],
)
def test_base_url_is_the_providers_base_for_all_three(provider: str, base: str, endpoint: str) -> None:
    c = load_config({"WEB_SEARCH_PROVIDER": provider, "WEB_SEARCH_BASE_URL": base})
    assert c.web_search.endpoint == endpoint


def test_api_key_env_names_the_variable(tmp_path: Path) -> None:
    env = write(tmp_path, '[web_search]\nprovider = "brave"\napi_key_env = "MY_SEARCH_KEY"\n')
    assert (
        load_config(
            {**env, "MY_SEARCH_KEY": "mine", "BRAVE_API_KEY": "other"}
        ).web_search_api_key.get_secret_value()
        == "mine"
    )
    # WEB_SEARCH_API_KEY, when set, wins.
    c = load_config({**env, "MY_SEARCH_KEY": "mine", "WEB_SEARCH_API_KEY": "w"})
    assert c.web_search_api_key.get_secret_value() == "w"


@pytest.mark.parametrize(
    "text, named",
    [
        ('web_search_api_key = "k"\n', "web_search_api_key: secrets are never read from the config file"),
        ('[web_search]\nprovider = "bing"\n', "web_search.provider: must be"),
        ("[web_search]\nbogus = 1\n", "web_search.bogus: unknown setting"),
        ('[web_search]\nbase_url = "searx:8080"\n', "WEB_SEARCH_BASE_URL: must be an http(s) URL"),
        ("[code_interpreter]\nmax_processes = 0\n", "code_interpreter.max_processes: must be positive"),
        ("[mcp]\nmax_tools = -1\n", "mcp.max_tools: must be positive"),
        ("[mcp]\nallowed_hosts = 'a'\n", "mcp.allowed_hosts: must be a list of strings"),
        ("[mcp_servers]\nx = 1\n", "mcp_servers.x: must be a table"),
        ("[mcp_servers.docs]\ntransport = 'sse'\n", "mcp_servers.docs.url: required"),
        ("[mcp_servers.docs]\nurl = 'ftp://x'\n", "mcp_servers.docs.url: must be an http(s) URL"),
        ("[mcp_servers.docs]\nurl = 'https://x'\nbogus = 1\n", "mcp_servers.docs.bogus: unknown setting"),
        (
            "[mcp_servers.docs]\nurl = 'https://x'\nsecret_headers = {}\n",
            "mcp_servers.docs.secret_headers: unknown",
        ),
        ("[mcp_servers.docs]\nurl = 'https://x'\ntransport = 'ws'\n", "mcp_servers.docs.transport: must be"),
        (
            "[mcp_servers.docs]\nurl = 'https://x'\nallowed_tools = 'a'\n",
            "mcp_servers.docs.allowed_tools: must be",
        ),
        (
            "[mcp_servers.docs]\nurl = 'https://x'\nheaders = { Authorization = 'Bearer s' }\n",
            "mcp_servers.docs.headers.Authorization: secrets are never read from the config file",
        ),
        (
            "[mcp_servers.docs]\nurl = 'https://x'\nheaders = { X-Api-Key = 's' }\n",
            "mcp_servers.docs.headers.X-Api-Key: secrets are never read",
        ),
        (
            "[mcp_servers.docs]\nurl = 'https://x'\nheaders_env = { Authorization = 'NOPE_NOT_SET' }\n",
            "mcp_servers.docs.headers_env.Authorization: environment variable NOPE_NOT_SET is not set",
        ),
        ('[mcp_servers."bad label"]\nurl = "https://x"\n', "a label is 1-64 letters"),
    ],
)
def test_refusals_name_the_setting(tmp_path: Path, text: str, named: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text))
    assert named in str(info.value)


def test_mcp_servers_table(tmp_path: Path) -> None:
    env = write(
        tmp_path,
        "[mcp_servers.docs]\n"
        'url = "https://mcp.example.com/mcp"\n'
        'headers = { "X-Team" = "search" }\n'
        'headers_env = { "Authorization" = "DOCS_MCP_AUTH" }\n'
        'allowed_tools = ["search"]\n'
        "[mcp_servers.wiki]\n"
        'url = "http://wiki.internal:9000/sse"\n'
        'transport = "sse"\n',
    )
    c = load_config({**env, "DOCS_MCP_AUTH": "Bearer s3cret", "MCP_ALLOWED_HOSTS": "a.example, *.b.example"})
    docs, wiki = c.mcp_servers["docs"], c.mcp_servers["wiki"]
    assert docs.url == "https://mcp.example.com/mcp" and docs.transport == "streamable_http"
    assert docs.allowed_tools == ("search",)
    assert docs.all_headers() == {"X-Team": "search", "Authorization": "Bearer s3cret"}
    assert "s3cret" not in repr(c)
    assert wiki.transport == "sse" and wiki.allowed_tools is None and wiki.all_headers() == {}
    assert c.mcp.allowed_hosts == ("a.example", "*.b.example")


def test_env_overrides_for_tool_sections() -> None:
    c = load_config(
        {
            "GATEWAY_CODE_INTERPRETER_CPU_TIME_S": "3",
            "GATEWAY_TOOLS_CALL_TIMEOUT_S": "5",
            "GATEWAY_CODE_INTERPRETER_EXTRA_RO_BINDS": "/opt/venv,/srv/data",
        }
    )
    assert c.code_interpreter.cpu_time_s == 3 and c.tools.call_timeout_s == 5.0
    assert c.code_interpreter.extra_ro_binds == ("/opt/venv", "/srv/data")
