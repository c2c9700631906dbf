"""The one typed, frozen configuration object.

Read once, in this order of precedence: environment variables, then an optional TOML file (path in
``GATEWAY_CONFIG``), then the defaults below. This is the only module that reads ``os.environ``.

Every key of every section can also be set from the environment as ``GATEWAY_<SECTION>_<KEY>``
(``GATEWAY_SERVER_MAX_REQUEST_BODY_SIZE_BYTES=…``); top-level keys and a few well-known settings
have their conventional names (``LLM_API_BASE``, ``DATABASE_URL``, ``REDIS_URL``, ``OIDC_ISSUER`` …).
Unknown keys, wrong types and inconsistent settings raise :class:`ConfigError` naming the setting.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import tomllib
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

MiB = 1024 * 1024

# Keys that hold credentials: accepted from the environment only, refused in the file.
SECRET_ENV = {
    "openai_api_key": "OPENAI_API_KEY",
    "secret_key": "GATEWAY_SECRET_KEY",
    "oidc_rp_client_secret": "OIDC_RP_CLIENT_SECRET",
    # Also read from the variable named by [web_search] api_key_env (BRAVE_API_KEY / TAVILY_API_KEY).
    "web_search_api_key": "WEB_SEARCH_API_KEY",
}

# The key variable each web-search provider reads when [web_search] api_key_env is empty.
WEB_SEARCH_KEY_ENV = {"searxng": "", "brave": "BRAVE_API_KEY", "tavily": "TAVILY_API_KEY"}
WEB_SEARCH_DEFAULT_BASE = {
    "searxng": "",
    "brave": "https://api.search.brave.com",
    "tavily": "https://api.tavily.com",
}
# The path each provider's search API has under its base URL ([web_search] base_url).
WEB_SEARCH_PATH = {"searxng": "/search", "brave": "/res/v1/web/search", "tavily": "/search"}


class ConfigError(Exception):
    """A setting is unknown, mistyped or inconsistent; start-up stops with this message."""


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    max_request_body_size_bytes: int = 10 * MiB
    # Request line and headers together (431, or 414 for a request line, beyond it), the number of
    # header fields (431), and how long a request may take to arrive in full, head and body (408).
    max_request_head_size_bytes: int = 64 * 1024
    max_request_headers: int = 100
    request_read_timeout_s: float = 30.0
    cors_allowed_origins: tuple[str, ...] = ()
    debug: bool = False
    log_format: Literal["text", "json"] = "text"
    log_level: str = "INFO"
    access_log: bool = True
    metrics_public: bool = True
    data_dir: str = "var"
    sse_keepalive_s: float = 15.0
    asgi_server: Literal["uvicorn", "daphne"] = "uvicorn"
    # Server processes; 0: one per core when inference runs elsewhere, 1 with the embedded engine.
    workers: int = 0
    # false: manage.py serve runs uvicorn's protocol with the gateway's limits but no callback relay
    # (every request through the ASGI app).
    direct_relay: bool = True
    # SIGTERM: stop accepting, let in-flight responses finish this long, then end them as failed.
    shutdown_grace_s: float = 30.0


@dataclass(frozen=True)
class UpstreamConfig:
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 600.0
    stall_timeout_s: float = 300.0
    pool_size: int = 1000
    ready_timeout_s: float = 1.0


@dataclass(frozen=True)
class DatabaseConfig:
    statement_timeout_ms: int = 30_000
    pool_min_size: int = 2
    pool_max_size: int = 20
    conn_max_age_s: int = 0


@dataclass(frozen=True)
class ResponsesConfig:
    max_retained_bytes: int = 8 * MiB
    max_upstream_sse_line_bytes: int = 16 * MiB
    max_stream_event_bytes: int = 16 * MiB
    prompt_cache_options_supported: bool = False
    max_rounds: int = 10
    # In-process cache of stored responses' checkpoints (serialized), for previous_response_id
    # continuations on the same process; 0 disables it.
    history_cache_bytes: int = 64 * MiB
    # A running background response (or stored stream) holds a lease its runner renews every heartbeat; a lease
    # that expires (its process died) is failed by the sweep every gateway and worker runs.
    lease_s: float = 60.0
    heartbeat_s: float = 10.0
    sweep_interval_s: float = 15.0
    # Compaction's summary round (docs/responses.md → Compaction): the request that asks the model
    # for the summary ("" = the built-in prompt, responses_app.compaction.DEFAULT_PROMPT) and its
    # output cap (0 = none sent).
    compaction_prompt: str = ""
    compaction_max_output_tokens: int = 0


@dataclass(frozen=True)
class WebSocketConfig:
    """Per-connection limits of the ``/v1/responses`` WebSocket transport (spec defaults)."""

    max_outstanding_requests: int = 64
    max_outstanding_request_bytes: int = 12 * MiB
    max_lanes: int = 128
    max_checkpoint_items: int = 32_768
    max_checkpoint_bytes: int = 16 * MiB
    max_connection_checkpoint_bytes: int = 32 * MiB
    # Backpressure: events waiting for a slow client, and how long one send may block.
    outbound_queue_events: int = 256
    send_timeout_s: float = 30.0
    # Steering (response.steer): queued updates per target, the three connection budgets (accepted
    # steering echoes, retained successor settings, failure echoes awaiting delivery), and how long
    # a completed target stays steerable.
    steer_max_queued: int = 32
    steer_input_bytes: int = 12 * MiB
    steer_settings_bytes: int = 12 * MiB
    steer_failure_bytes: int = 12 * MiB
    steer_target_ttl_s: float = 60.0


@dataclass(frozen=True)
class ToolsConfig:
    max_concurrent_gateway_calls: int = 5
    call_timeout_s: float = 60.0


@dataclass(frozen=True)
class WebSearchConfig:
    provider: Literal["searxng", "brave", "tavily"] = "searxng"
    base_url: str = ""
    api_key_env: str = ""
    max_results: int = 5
    max_queries_per_call: int = 5
    request_timeout_s: float = 15.0
    allowed_domains: tuple[str, ...] = ()
    blocked_domains: tuple[str, ...] = ()
    max_snippet_chars: int = 500

    @property
    def endpoint(self) -> str:
        """The provider's search URL: its base URL (``base_url`` or the public default) plus the
        provider's path; a base that already ends with that path is taken as it is."""
        base = (self.base_url or WEB_SEARCH_DEFAULT_BASE[self.provider]).rstrip("/")
        if not base:
            return ""
        path = WEB_SEARCH_PATH[self.provider]
        return base if base.endswith(path) else base + path

    @property
    def key_env(self) -> str:
        return self.api_key_env or WEB_SEARCH_KEY_ENV[self.provider]


@dataclass(frozen=True)
class CodeInterpreterConfig:
    enabled: bool = True
    bwrap: str = "bwrap"
    python: str = ""
    cpu_time_s: int = 10
    wall_time_s: float = 30.0
    memory_bytes: int = 512 * MiB
    max_processes: int = 16
    max_output_bytes: int = 256 * 1024
    max_file_size_bytes: int = 16 * MiB
    tmp_size_bytes: int = 64 * MiB
    max_code_bytes: int = 1 * MiB
    run_as_uid: int = 65534
    run_as_gid: int = 65534
    extra_ro_binds: tuple[str, ...] = ()


@dataclass(frozen=True)
class McpConfig:
    allowed_hosts: tuple[str, ...] = ()
    max_servers: int = 64
    max_tools: int = 128
    max_list_pages: int = 50
    connect_timeout_s: float = 10.0
    discovery_timeout_s: float = 30.0


@dataclass(frozen=True)
class McpServerConfig:
    """One operator-configured MCP server, ``[mcp_servers.<label>]``."""

    url: str
    transport: Literal["streamable_http", "sse"] = "streamable_http"
    headers: dict[str, str] = field(default_factory=dict)
    # Header name -> environment variable holding its value (a credential): resolved at load.
    headers_env: dict[str, str] = field(default_factory=dict)
    allowed_tools: tuple[str, ...] | None = None
    secret_headers: dict[str, str] = field(default_factory=dict, repr=False)

    def all_headers(self) -> dict[str, str]:
        return {**self.headers, **self.secret_headers}


@dataclass(frozen=True)
class AuthConfig:
    oidc_issuer: str = ""
    oidc_audience: str = ""
    leeway_s: int = 30
    jwks_ttl_s: int = 300
    jwks_min_refresh_interval_s: float = 5.0
    http_timeout_s: float = 5.0
    max_provider_response_bytes: int = 1 * MiB
    require_api_key: bool = False
    # Admin single sign-on (authorization-code flow through mozilla-django-oidc).
    oidc_rp_client_id: str = ""
    admin_staff_claim: str = "groups"
    admin_staff_value: str = ""
    admin_superuser_value: str = ""
    admin_sso_scopes: str = "openid email profile"


@dataclass(frozen=True)
class InferenceConfig:
    """The vLLM engine hosted by inference workers (and by the gateway itself in embedded mode)."""

    served_model_name: str = ""
    dtype: str = "auto"
    max_model_len: int = 0
    tensor_parallel_size: int = 1
    chat_template: str = ""
    enable_auto_tool_choice: bool = False
    tool_call_parser: str = ""
    reasoning_parser: str = ""
    generation_config: str = "auto"
    override_generation_config: str = ""
    kv_cache_memory_bytes: int = 0
    gpu_memory_utilization: float = 0.9
    enforce_eager: bool = False
    engine_args: tuple[str, ...] = ()
    models: tuple[str, ...] = ()
    stream_maxlen: int = 10_000
    stream_ttl_s: int = 900
    heartbeat_interval_s: float = 1.0
    worker_lost_after_s: float = 5.0
    cancel_poll_interval_s: float = 0.2


@dataclass(frozen=True)
class Config:
    llm_api_base: str = ""
    database_url: str = ""
    redis_url: str = ""
    upstream_api: Literal["responses", "chat_completions"] = "responses"
    model: str = ""
    server: ServerConfig = field(default_factory=ServerConfig)
    upstream: UpstreamConfig = field(default_factory=UpstreamConfig)
    database: DatabaseConfig = field(default_factory=DatabaseConfig)
    responses: ResponsesConfig = field(default_factory=ResponsesConfig)
    websocket: WebSocketConfig = field(default_factory=WebSocketConfig)
    tools: ToolsConfig = field(default_factory=ToolsConfig)
    web_search: WebSearchConfig = field(default_factory=WebSearchConfig)
    code_interpreter: CodeInterpreterConfig = field(default_factory=CodeInterpreterConfig)
    mcp: McpConfig = field(default_factory=McpConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)
    # Operator-configured MCP servers by label: the dynamic ``[mcp_servers.<label>]`` tables.
    mcp_servers: dict[str, McpServerConfig] = field(default_factory=dict)
    inference: InferenceConfig = field(default_factory=InferenceConfig)
    # Secrets: environment only.
    openai_api_key: str = field(default="", repr=False)
    secret_key: str = field(default="", repr=False)
    oidc_rp_client_secret: str = field(default="", repr=False)
    web_search_api_key: str = field(default="", repr=False)

    @property
    def oidc_enabled(self) -> bool:
        return bool(self.auth.oidc_issuer and self.auth.oidc_audience)

    @property
    def broker_enabled(self) -> bool:
        return bool(self.redis_url)

    @property
    def server_workers(self) -> int:
        """Server processes: ``[server] workers``, or when 0 one per core, unless the gateway hosts
        the embedded engine (neither ``LLM_API_BASE`` nor ``REDIS_URL``), where each would load its own."""
        if self.server.workers:
            return self.server.workers
        if not self.llm_api_base and not self.redis_url:
            return 1
        return max(
            1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        )

    @property
    def upstream_base(self) -> str:
        """``llm_api_base`` without a trailing ``/`` or ``/v1``, so ``/v1`` is never doubled."""
        base = self.llm_api_base.rstrip("/")
        if base.endswith("/v1"):
            base = base[: -len("/v1")]
        return base


# Conventional environment names: (section or None, key) -> variable.
ENV_ALIASES: dict[tuple[str | None, str], str] = {
    (None, "llm_api_base"): "LLM_API_BASE",
    (None, "database_url"): "DATABASE_URL",
    (None, "redis_url"): "REDIS_URL",
    (None, "upstream_api"): "UPSTREAM_API",
    (None, "model"): "MODEL",
    ("server", "host"): "HOST",
    ("server", "port"): "PORT",
    ("server", "cors_allowed_origins"): "CORS_ALLOWED_ORIGINS",
    ("server", "debug"): "GATEWAY_DEBUG",
    ("server", "log_format"): "LOG_FORMAT",
    ("server", "log_level"): "LOG_LEVEL",
    ("auth", "oidc_issuer"): "OIDC_ISSUER",
    ("auth", "oidc_audience"): "OIDC_AUDIENCE",
    ("auth", "require_api_key"): "GATEWAY_REQUIRE_API_KEY",
    ("auth", "oidc_rp_client_id"): "OIDC_RP_CLIENT_ID",
    ("web_search", "provider"): "WEB_SEARCH_PROVIDER",
    ("web_search", "base_url"): "WEB_SEARCH_BASE_URL",
    ("mcp", "allowed_hosts"): "MCP_ALLOWED_HOSTS",
}

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is Literal:
        return " or ".join(repr(a) for a in typing.get_args(tp))
    if typing.get_origin(tp) is tuple:
        return "list of strings"
    return {int: "integer", float: "number", bool: "boolean", str: "string"}.get(tp, str(tp))


def _coerce(name: str, tp: Any, value: Any, from_env: bool) -> Any:
    """Check (file) or parse (environment) one value against its declared type."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            raise ConfigError(f"{name}: must be {_type_name(tp)}, got {value!r}")
        return value
    if origin is tuple:
        if from_env:
            return tuple(part.strip() for part in str(value).split(",") if part.strip())
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{name}: must be a list of strings, got {value!r}")
        return tuple(value)
    if tp is bool:
        if from_env:
            low = str(value).strip().lower()
            if low in _TRUE:
                return True
            if low in _FALSE:
                return False
            raise ConfigError(f"{name}: must be a boolean (true/false), got {value!r}")
        if not isinstance(value, bool):
            raise ConfigError(f"{name}: must be a boolean, got {value!r}")
        return value
    if tp is int:
        if from_env:
            try:
                return int(str(value).strip())
            except ValueError:
                raise ConfigError(f"{name}: must be an integer, got {value!r}") from None
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{name}: must be an integer, got {value!r}")
        return value
    if tp is float:
        if from_env:
            try:
                return float(str(value).strip())
            except ValueError:
                raise ConfigError(f"{name}: must be a number, got {value!r}") from None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{name}: must be a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{name}: must be a string, got {value!r}")
        return value
    raise ConfigError(f"{name}: unsupported type")  # pragma: no cover - programming error


def _fields(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _is_section(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _env_name(section: str | None, key: str) -> str:
    if (section, key) in ENV_ALIASES:
        return ENV_ALIASES[(section, key)]
    if section is None:
        return f"GATEWAY_{key.upper()}"
    return f"GATEWAY_{section.upper()}_{key.upper()}"


def _load_file(env: typing.Mapping[str, str]) -> dict[str, Any]:
    path = env.get("GATEWAY_CONFIG", "")
    if not path:
        return {}
    p = Path(path)
    try:
        with p.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"GATEWAY_CONFIG: file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"GATEWAY_CONFIG: {path} is not valid TOML: {exc}") from None


def load_config(env: typing.Mapping[str, str] | None = None) -> Config:
    """Build the config from ``env`` (default: the process environment) and the TOML file."""
    env = os.environ if env is None else env
    data = _load_file(env)
    top_fields = _fields(Config)
    values: dict[str, Any] = {}
    sections: dict[str, dict[str, Any]] = {}

    for key, raw in data.items():
        if key in SECRET_ENV:
            raise ConfigError(
                f"{key}: secrets are never read from the config file; set {SECRET_ENV[key]} instead"
            )
        if key not in top_fields:
            raise ConfigError(f"{key}: unknown setting in the config file")
        if key == "mcp_servers":
            values[key] = _load_mcp_servers(raw, env)
            continue
        tp = top_fields[key]
        if _is_section(tp):
            if not isinstance(raw, dict):
                raise ConfigError(f"[{key}]: must be a table")
            sec_fields = _fields(tp)
            for sub, subraw in raw.items():
                if sub not in sec_fields:
                    raise ConfigError(f"{key}.{sub}: unknown setting in the config file")
                sections.setdefault(key, {})[sub] = _coerce(
                    f"{key}.{sub}", sec_fields[sub], subraw, from_env=False
                )
        else:
            values[key] = _coerce(key, tp, raw, from_env=False)

    for key, tp in top_fields.items():
        if _is_section(tp):
            for sub, subtp in _fields(tp).items():
                name = _env_name(key, sub)
                if name in env:
                    sections.setdefault(key, {})[sub] = _coerce(name, subtp, env[name], True)
        elif key in SECRET_ENV:
            if SECRET_ENV[key] in env:
                values[key] = env[SECRET_ENV[key]]
        elif key == "mcp_servers":
            continue  # file only: a table per label
        else:
            name = _env_name(None, key)
            if name in env:
                values[key] = _coerce(name, tp, env[name], from_env=True)

    for key, sec_values in sections.items():
        values[key] = top_fields[key](**sec_values)
    if "web_search_api_key" not in values:
        key_env = values.get("web_search", WebSearchConfig()).key_env
        if key_env and key_env in env:
            values["web_search_api_key"] = env[key_env]
    config = Config(**values)
    _validate(config)
    return config


_LABEL_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
# Header names whose values are credentials: accepted only through headers_env.
_CREDENTIAL_HEADER_WORDS = ("authorization", "cookie", "token", "secret", "key", "password")


def is_credential_header(name: str) -> bool:
    low = name.lower()
    return any(word in low for word in _CREDENTIAL_HEADER_WORDS)


def _string_table(name: str, raw: Any) -> dict[str, str]:
    if not isinstance(raw, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in raw.items()
    ):
        raise ConfigError(f"{name}: must be a table of strings")
    return dict(raw)


def _load_mcp_servers(raw: Any, env: typing.Mapping[str, str]) -> dict[str, McpServerConfig]:
    """``[mcp_servers.<label>]`` tables: the one dynamic table, every key inside still checked."""
    if not isinstance(raw, dict):
        raise ConfigError("[mcp_servers]: must be a table of [mcp_servers.<label>] tables")
    known = _fields(McpServerConfig)
    servers: dict[str, McpServerConfig] = {}
    for label, table in raw.items():
        prefix = f"mcp_servers.{label}"
        if not label or len(label) > 64 or not set(label) <= _LABEL_CHARS:
            raise ConfigError(f"{prefix}: a label is 1-64 letters, digits, '_' or '-'")
        if not isinstance(table, dict):
            raise ConfigError(f"{prefix}: must be a table")
        kwargs: dict[str, Any] = {}
        for sub, value in table.items():
            name = f"{prefix}.{sub}"
            if sub not in known or sub == "secret_headers":
                raise ConfigError(f"{name}: unknown setting in the config file")
            if sub in ("headers", "headers_env"):
                kwargs[sub] = _string_table(name, value)
            elif sub == "allowed_tools":
                kwargs[sub] = _coerce(name, tuple[str, ...], value, from_env=False)
            else:
                kwargs[sub] = _coerce(name, known[sub], value, from_env=False)
        if "url" not in kwargs:
            raise ConfigError(f"{prefix}.url: required")
        parts = urlsplit(kwargs["url"])
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"{prefix}.url: must be an http(s) URL, got {kwargs['url']!r}")
        for header in kwargs.get("headers", {}):
            if is_credential_header(header):
                raise ConfigError(
                    f"{prefix}.headers.{header}: secrets are never read from the config file; "
                    f"name an environment variable in {prefix}.headers_env instead"
                )
        secret: dict[str, str] = {}
        for header, var in kwargs.get("headers_env", {}).items():
            if var not in env:
                raise ConfigError(f"{prefix}.headers_env.{header}: environment variable {var} is not set")
            secret[header] = env[var]
        servers[label] = McpServerConfig(**kwargs, secret_headers=secret)
    return servers


def _is_loopback_host(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _validate(c: Config) -> None:
    if c.server.shutdown_grace_s < 0:
        raise ConfigError("server.shutdown_grace_s: must be >= 0")
    r = c.responses
    if min(r.lease_s, r.heartbeat_s, r.sweep_interval_s) <= 0:
        raise ConfigError("responses.lease_s, heartbeat_s and sweep_interval_s: must be > 0")
    if r.compaction_max_output_tokens < 0:
        raise ConfigError("responses.compaction_max_output_tokens: must be >= 0 (0: no cap sent)")
    if r.heartbeat_s >= r.lease_s:
        raise ConfigError(
            f"responses.heartbeat_s ({r.heartbeat_s:g}) must be shorter than responses.lease_s "
            f"({r.lease_s:g}), or a live runner's lease would expire between two heartbeats"
        )
    if bool(c.auth.oidc_issuer) != bool(c.auth.oidc_audience):
        missing = "OIDC_AUDIENCE" if c.auth.oidc_issuer else "OIDC_ISSUER"
        present = "OIDC_ISSUER" if c.auth.oidc_issuer else "OIDC_AUDIENCE"
        raise ConfigError(f"{missing}: must be set together with {present} (set both or neither)")
    if c.auth.oidc_issuer:
        parts = urlsplit(c.auth.oidc_issuer)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"OIDC_ISSUER: not a URL: {c.auth.oidc_issuer!r}")
        if parts.scheme == "http" and not _is_loopback_host(parts.hostname):
            raise ConfigError("OIDC_ISSUER: must use https (plain http is allowed on loopback only)")
    if c.auth.oidc_rp_client_id:
        if not c.auth.oidc_issuer:
            raise ConfigError("OIDC_RP_CLIENT_ID: admin single sign-on needs OIDC_ISSUER and OIDC_AUDIENCE")
        if not c.oidc_rp_client_secret:
            raise ConfigError("OIDC_RP_CLIENT_SECRET: must be set together with OIDC_RP_CLIENT_ID")
        if not (c.auth.admin_staff_value or c.auth.admin_superuser_value):
            raise ConfigError(
                "auth.admin_staff_value: admin single sign-on needs admin_staff_value or "
                "admin_superuser_value (the claim value that grants admin access)"
            )
    if c.llm_api_base:
        parts = urlsplit(c.llm_api_base)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"LLM_API_BASE: must be an http(s) URL, got {c.llm_api_base!r}")
    if c.database_url:
        scheme = urlsplit(c.database_url).scheme
        if scheme not in ("postgres", "postgresql", "sqlite"):
            raise ConfigError(
                f"DATABASE_URL: unsupported scheme {scheme!r} (use postgres://… or sqlite:///…)"
            )
    if c.redis_url and urlsplit(c.redis_url).scheme not in ("redis", "rediss", "unix"):
        raise ConfigError(f"REDIS_URL: must be a redis:// URL, got {c.redis_url!r}")
    positive = {
        "server.max_request_body_size_bytes": c.server.max_request_body_size_bytes,
        "server.max_request_head_size_bytes": c.server.max_request_head_size_bytes,
        "server.max_request_headers": c.server.max_request_headers,
        "server.request_read_timeout_s": c.server.request_read_timeout_s,
        "responses.max_retained_bytes": c.responses.max_retained_bytes,
        "responses.max_upstream_sse_line_bytes": c.responses.max_upstream_sse_line_bytes,
        "responses.max_stream_event_bytes": c.responses.max_stream_event_bytes,
        "responses.max_rounds": c.responses.max_rounds,
        "websocket.max_outstanding_requests": c.websocket.max_outstanding_requests,
        "websocket.max_outstanding_request_bytes": c.websocket.max_outstanding_request_bytes,
        "websocket.max_lanes": c.websocket.max_lanes,
        "websocket.max_checkpoint_items": c.websocket.max_checkpoint_items,
        "websocket.max_checkpoint_bytes": c.websocket.max_checkpoint_bytes,
        "websocket.max_connection_checkpoint_bytes": c.websocket.max_connection_checkpoint_bytes,
        "websocket.outbound_queue_events": c.websocket.outbound_queue_events,
        "websocket.send_timeout_s": c.websocket.send_timeout_s,
        "websocket.steer_max_queued": c.websocket.steer_max_queued,
        "websocket.steer_input_bytes": c.websocket.steer_input_bytes,
        "websocket.steer_settings_bytes": c.websocket.steer_settings_bytes,
        "websocket.steer_failure_bytes": c.websocket.steer_failure_bytes,
        "websocket.steer_target_ttl_s": c.websocket.steer_target_ttl_s,
        "tools.max_concurrent_gateway_calls": c.tools.max_concurrent_gateway_calls,
        "tools.call_timeout_s": c.tools.call_timeout_s,
        "web_search.max_results": c.web_search.max_results,
        "web_search.max_queries_per_call": c.web_search.max_queries_per_call,
        "web_search.request_timeout_s": c.web_search.request_timeout_s,
        "code_interpreter.cpu_time_s": c.code_interpreter.cpu_time_s,
        "code_interpreter.wall_time_s": c.code_interpreter.wall_time_s,
        "code_interpreter.memory_bytes": c.code_interpreter.memory_bytes,
        "code_interpreter.max_processes": c.code_interpreter.max_processes,
        "code_interpreter.max_output_bytes": c.code_interpreter.max_output_bytes,
        "code_interpreter.max_file_size_bytes": c.code_interpreter.max_file_size_bytes,
        "code_interpreter.tmp_size_bytes": c.code_interpreter.tmp_size_bytes,
        "code_interpreter.max_code_bytes": c.code_interpreter.max_code_bytes,
        "mcp.max_servers": c.mcp.max_servers,
        "mcp.max_tools": c.mcp.max_tools,
        "mcp.max_list_pages": c.mcp.max_list_pages,
        "mcp.connect_timeout_s": c.mcp.connect_timeout_s,
        "mcp.discovery_timeout_s": c.mcp.discovery_timeout_s,
        "upstream.connect_timeout_s": c.upstream.connect_timeout_s,
        "upstream.read_timeout_s": c.upstream.read_timeout_s,
        "upstream.stall_timeout_s": c.upstream.stall_timeout_s,
        "upstream.pool_size": c.upstream.pool_size,
        "database.pool_max_size": c.database.pool_max_size,
        "inference.tensor_parallel_size": c.inference.tensor_parallel_size,
        "inference.stream_maxlen": c.inference.stream_maxlen,
        "inference.stream_ttl_s": c.inference.stream_ttl_s,
        "inference.heartbeat_interval_s": c.inference.heartbeat_interval_s,
        "inference.worker_lost_after_s": c.inference.worker_lost_after_s,
        "inference.cancel_poll_interval_s": c.inference.cancel_poll_interval_s,
    }
    for name, value in positive.items():
        if value <= 0:
            raise ConfigError(f"{name}: must be positive, got {value}")
    if c.server.workers < 0:
        raise ConfigError(f"server.workers: must be 0 (automatic) or positive, got {c.server.workers}")
    if not 0 < c.server.port < 65536:
        raise ConfigError(f"server.port: must be between 1 and 65535, got {c.server.port}")
    if c.database.pool_min_size > c.database.pool_max_size:
        raise ConfigError("database.pool_min_size: must not exceed database.pool_max_size")
    if c.web_search.base_url:
        parts = urlsplit(c.web_search.base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"WEB_SEARCH_BASE_URL: must be an http(s) URL, got {c.web_search.base_url!r}")
    if c.inference.worker_lost_after_s <= c.inference.heartbeat_interval_s:
        raise ConfigError(
            "inference.worker_lost_after_s: must exceed inference.heartbeat_interval_s "
            "(a live worker would be declared lost between two heartbeats)"
        )
    if c.inference.enable_auto_tool_choice and not c.inference.tool_call_parser:
        raise ConfigError("inference.enable_auto_tool_choice: needs inference.tool_call_parser")
    if c.inference.override_generation_config:
        import json

        try:
            overrides = json.loads(c.inference.override_generation_config)
        except ValueError:
            overrides = None
        if not isinstance(overrides, dict):
            raise ConfigError("inference.override_generation_config: must be a JSON object")
    for origin in c.server.cors_allowed_origins:
        parts = urlsplit(origin)
        if parts.scheme not in ("http", "https") or not parts.netloc or parts.path not in ("", "/"):
            raise ConfigError(
                f"server.cors_allowed_origins: {origin!r} is not an origin (scheme://host[:port])"
            )


_config: Config | None = None


def get_config() -> Config:
    """The process-wide config, loaded on first use."""
    global _config
    if _config is None:
        _config = load_config()
    return _config


def set_config(config: Config | None) -> None:
    """Replace the process-wide config (tests and the test server use this)."""
    global _config
    _config = config


def replace(config: Config, **changes: Any) -> Config:
    """A copy of ``config`` with top-level or ``section__key`` changes (for tests)."""
    top: dict[str, Any] = {}
    nested: dict[str, dict[str, Any]] = {}
    for key, value in changes.items():
        if "__" in key:
            sec, sub = key.split("__", 1)
            nested.setdefault(sec, {})[sub] = value
        else:
            top[key] = value
    for sec, subs in nested.items():
        top[sec] = dataclasses.replace(getattr(config, sec), **subs)
    new = dataclasses.replace(config, **top)
    _validate(new)
    return new


def environ_get(name: str, default: str = "") -> str:
    """Read a process-level variable that is not gateway config (e.g. ``DJANGO_SETTINGS_MODULE``)."""
    return os.environ.get(name, default)


__all__ = ["Config", "ConfigError", "get_config", "load_config", "set_config"]
