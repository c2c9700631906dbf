"""The one typed, frozen configuration object, loaded with pydantic-settings.

Read once, in this order of precedence: environment variables, then an optional TOML file (path in
``GATEWAY_CONFIG``), then the defaults below. This is the only module that reads ``os.environ``.

Every section is a frozen pydantic dataclass: pydantic checks each value against its declared type
(strictly for the file: ``debug = 'yes'`` is refused, not guessed), and pydantic-settings merges the
two sources (:class:`GatewayEnvSource`, then pydantic-settings' own ``TomlConfigSettingsSource``)
section by section. Every key of every section can also be set from the environment as
``GATEWAY_<SECTION>_<KEY>`` (``GATEWAY_SERVER_MAX_REQUEST_BODY_SIZE_BYTES=…``); top-level keys and a
few well-known settings have their conventional names (``LLM_API_BASE``, ``DATABASE_URL``,
``REDIS_URL``, ``OIDC_ISSUER`` …). Unknown keys, wrong types and inconsistent settings raise
:class:`ConfigError` naming the setting.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import tomllib
import typing
from contextvars import ContextVar
from dataclasses import field
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import ConfigDict, Field, Strict, TypeAdapter, ValidationError, create_model, field_validator
from pydantic.dataclasses import dataclass
from pydantic_core import PydanticCustomError
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

MiB = 1024 * 1024

# Leaf types: strict, so the file's values are taken as written (an integer where an integer is
# declared; a number may be written as an integer). Environment values are parsed from their text
# first (GatewayEnvSource), so only the file meets the strictness.
Int = Annotated[int, Strict()]
Float = Annotated[float, Strict()]
Bool = Annotated[bool, Strict()]
Str = Annotated[str, Strict()]
StrList = tuple[Str, ...]
# Sizes, counts and durations that must be above zero.
PositiveInt = Annotated[int, Strict(), Field(gt=0)]
PositiveFloat = Annotated[float, Strict(), Field(gt=0)]

# Every section refuses keys it does not declare.
_SECTION = ConfigDict(extra="forbid")

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


@dataclass(frozen=True, config=_SECTION)
class ServerConfig:
    host: Str = "127.0.0.1"
    port: Int = 8000
    max_request_body_size_bytes: PositiveInt = 10 * MiB
    # Request line and headers together (431, or 414 for a request line, beyond it), the number of
    # header fields (431), and how long a request's body may take to arrive after its head (408).
    # A head's own read timeout is the ingress's (docs/operations.md).
    max_request_head_size_bytes: PositiveInt = 64 * 1024
    max_request_headers: PositiveInt = 100
    request_read_timeout_s: PositiveFloat = 30.0
    cors_allowed_origins: StrList = ()
    debug: Bool = False
    log_format: Literal["text", "json"] = "text"
    log_level: Str = "INFO"
    access_log: Bool = True
    metrics_public: Bool = True
    data_dir: Str = "var"
    sse_keepalive_s: Float = 15.0
    asgi_server: Literal["uvicorn", "daphne"] = "uvicorn"
    # Server processes; 0: one per core when inference runs elsewhere, 1 with the embedded engine.
    workers: Int = 0
    # SIGTERM: stop accepting, let in-flight responses finish this long, then end them as failed.
    shutdown_grace_s: Float = 30.0


@dataclass(frozen=True, config=_SECTION)
class UpstreamConfig:
    connect_timeout_s: PositiveFloat = 10.0
    read_timeout_s: PositiveFloat = 600.0
    stall_timeout_s: PositiveFloat = 300.0
    pool_size: PositiveInt = 1000
    ready_timeout_s: Float = 1.0


@dataclass(frozen=True, config=_SECTION)
class PassthroughConfig:
    # More upstream paths relayed byte for byte (POST), besides the built-in ones (docs/passthrough.md).
    extra_routes: StrList = ()


@dataclass(frozen=True, config=_SECTION)
class DatabaseConfig:
    statement_timeout_ms: Int = 30_000
    pool_min_size: Int = 2
    pool_max_size: PositiveInt = 20
    conn_max_age_s: Int = 0
    # PostgreSQL: a statement run often on a connection is prepared (parsed and planned once). Off
    # behind a pooler in transaction mode that does not keep prepared statements per client.
    prepared_statements: Bool = True


@dataclass(frozen=True, config=_SECTION)
class ResponsesConfig:
    max_retained_bytes: PositiveInt = 8 * MiB
    max_upstream_sse_line_bytes: PositiveInt = 16 * MiB
    max_stream_event_bytes: PositiveInt = 16 * MiB
    prompt_cache_options_supported: Bool = False
    max_rounds: PositiveInt = 10
    # In-process cache of stored responses' checkpoints (serialized), for previous_response_id
    # continuations on the same process; 0 disables it.
    history_cache_bytes: Int = 64 * MiB
    # A running background response (or stored stream) holds a lease its runner renews every heartbeat; a lease
    # that expires (its process died) is failed by the sweep every gateway and worker runs.
    lease_s: Float = 60.0
    heartbeat_s: Float = 10.0
    sweep_interval_s: Float = 15.0
    # Compaction's summary round (docs/responses.md → Compaction): the request that asks the model
    # for the summary ("" = the built-in prompt, responses_app.compaction.DEFAULT_PROMPT) and its
    # output cap (0 = none sent).
    compaction_prompt: Str = ""
    compaction_max_output_tokens: Int = 0


@dataclass(frozen=True, config=_SECTION)
class WebSocketConfig:
    """Per-connection limits of the ``/v1/responses`` WebSocket transport (spec defaults)."""

    max_outstanding_requests: PositiveInt = 64
    max_outstanding_request_bytes: PositiveInt = 12 * MiB
    max_lanes: PositiveInt = 128
    max_checkpoint_items: PositiveInt = 32_768
    max_checkpoint_bytes: PositiveInt = 16 * MiB
    max_connection_checkpoint_bytes: PositiveInt = 32 * MiB
    # Backpressure: events waiting for a slow client, and how long one send may block.
    outbound_queue_events: PositiveInt = 256
    send_timeout_s: PositiveFloat = 30.0
    # Steering (response.steer): queued updates per target, the three connection budgets (accepted
    # steering echoes, retained successor settings, failure echoes awaiting delivery), and how long
    # a completed target stays steerable.
    steer_max_queued: PositiveInt = 32
    steer_input_bytes: PositiveInt = 12 * MiB
    steer_settings_bytes: PositiveInt = 12 * MiB
    steer_failure_bytes: PositiveInt = 12 * MiB
    steer_target_ttl_s: PositiveFloat = 60.0


@dataclass(frozen=True, config=_SECTION)
class ToolsConfig:
    max_concurrent_gateway_calls: PositiveInt = 5
    call_timeout_s: PositiveFloat = 60.0


@dataclass(frozen=True, config=_SECTION)
class WebSearchConfig:
    provider: Literal["searxng", "brave", "tavily"] = "searxng"
    base_url: Str = ""
    api_key_env: Str = ""
    max_results: PositiveInt = 5
    max_queries_per_call: PositiveInt = 5
    request_timeout_s: PositiveFloat = 15.0
    allowed_domains: StrList = ()
    blocked_domains: StrList = ()
    max_snippet_chars: Int = 500

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


@dataclass(frozen=True, config=_SECTION)
class WebFetchConfig:
    """The ``web_fetch`` gateway tool (Anthropic Messages' ``web_fetch_20250910``)."""

    # Hosts that may resolve to loopback/private/link-local addresses (exact names, as MCP's).
    allowed_hosts: StrList = ()
    # The most bytes read of one page; a longer one fails with ``content_too_large``.
    max_bytes: PositiveInt = 5 * MiB
    max_redirects: Int = 5
    # Text given to the model when the declaration names no ``max_content_tokens`` (about 4 bytes a token).
    max_content_tokens: PositiveInt = 100_000
    max_url_chars: PositiveInt = 2048


@dataclass(frozen=True, config=_SECTION)
class MessagesConfig:
    """The Anthropic Messages route's server-tool loop."""

    # ``"WebSearch=web_search"``: a plain client function so named is run by the gateway as that tool.
    tool_aliases: StrList = ()

    def aliases(self) -> dict[str, str]:
        """Function name -> gateway tool name (``web_search`` or ``web_fetch``)."""
        out: dict[str, str] = {}
        for entry in self.tool_aliases:
            name, _, tool = entry.partition("=")
            out[name.strip()] = tool.strip()
        return out


@dataclass(frozen=True, config=_SECTION)
class CodeInterpreterConfig:
    enabled: Bool = True
    bwrap: Str = "bwrap"
    python: Str = ""
    cpu_time_s: PositiveInt = 10
    wall_time_s: PositiveFloat = 30.0
    memory_bytes: PositiveInt = 512 * MiB
    max_processes: PositiveInt = 16
    max_output_bytes: PositiveInt = 256 * 1024
    max_file_size_bytes: PositiveInt = 16 * MiB
    tmp_size_bytes: PositiveInt = 64 * MiB
    max_code_bytes: PositiveInt = 1 * MiB
    run_as_uid: Int = 65534
    run_as_gid: Int = 65534
    extra_ro_binds: StrList = ()


@dataclass(frozen=True, config=_SECTION)
class McpConfig:
    allowed_hosts: StrList = ()
    max_servers: PositiveInt = 64
    max_tools: PositiveInt = 128
    max_list_pages: PositiveInt = 50
    connect_timeout_s: PositiveFloat = 10.0
    discovery_timeout_s: PositiveFloat = 30.0


@dataclass(frozen=True, config=_SECTION)
class McpServerConfig:
    """One operator-configured MCP server, ``[mcp_servers.<label>]``."""

    url: Str
    transport: Literal["streamable_http", "sse"] = "streamable_http"
    headers: dict[Str, Str] = field(default_factory=dict)
    # Header name -> environment variable holding its value (a credential): resolved at load.
    headers_env: dict[Str, Str] = field(default_factory=dict)
    allowed_tools: StrList | None = None
    secret_headers: dict[Str, Str] = field(default_factory=dict, repr=False)

    def all_headers(self) -> dict[str, str]:
        return {**self.headers, **self.secret_headers}

    @field_validator("url")
    @classmethod
    def _http_url(cls, url: str) -> str:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise PydanticCustomError("config", "must be an http(s) URL, got '{url}'", {"url": url})
        return url


@dataclass(frozen=True, config=_SECTION)
class AuthConfig:
    oidc_issuer: Str = ""
    oidc_audience: Str = ""
    leeway_s: Int = 30
    jwks_ttl_s: Int = 300
    jwks_min_refresh_interval_s: Float = 5.0
    http_timeout_s: Float = 5.0
    max_provider_response_bytes: Int = 1 * MiB
    require_api_key: Bool = False
    # Admin single sign-on (authorization-code flow through mozilla-django-oidc).
    oidc_rp_client_id: Str = ""
    admin_staff_claim: Str = "groups"
    admin_staff_value: Str = ""
    admin_superuser_value: Str = ""
    admin_sso_scopes: Str = "openid email profile"


@dataclass(frozen=True, config=_SECTION)
class InferenceConfig:
    """The vLLM engine hosted by inference workers (and by the gateway itself in embedded mode)."""

    served_model_name: Str = ""
    dtype: Str = "auto"
    max_model_len: Int = 0
    tensor_parallel_size: PositiveInt = 1
    chat_template: Str = ""
    enable_auto_tool_choice: Bool = False
    tool_call_parser: Str = ""
    reasoning_parser: Str = ""
    generation_config: Str = "auto"
    override_generation_config: Str = ""
    kv_cache_memory_bytes: Int = 0
    gpu_memory_utilization: Float = 0.9
    enforce_eager: Bool = False
    engine_args: StrList = ()
    models: StrList = ()
    stream_maxlen: PositiveInt = 10_000
    stream_ttl_s: PositiveInt = 900
    heartbeat_interval_s: PositiveFloat = 1.0
    worker_lost_after_s: PositiveFloat = 5.0
    cancel_poll_interval_s: PositiveFloat = 0.2


@dataclass(frozen=True, config=_SECTION)
class Config:
    """Every setting; built by :func:`load_config` and checked as a whole when built (or replaced)."""

    llm_api_base: Str = ""
    database_url: Str = ""
    redis_url: Str = ""
    upstream_api: Literal["responses", "chat_completions"] = "responses"
    model: Str = ""
    server: ServerConfig = field(default_factory=ServerConfig)
    upstream: UpstreamConfig = field(default_factory=UpstreamConfig)
    passthrough: PassthroughConfig = field(default_factory=PassthroughConfig)
    database: DatabaseConfig = field(default_factory=DatabaseConfig)
    responses: ResponsesConfig = field(default_factory=ResponsesConfig)
    websocket: WebSocketConfig = field(default_factory=WebSocketConfig)
    tools: ToolsConfig = field(default_factory=ToolsConfig)
    web_search: WebSearchConfig = field(default_factory=WebSearchConfig)
    web_fetch: WebFetchConfig = field(default_factory=WebFetchConfig)
    messages: MessagesConfig = field(default_factory=MessagesConfig)
    code_interpreter: CodeInterpreterConfig = field(default_factory=CodeInterpreterConfig)
    mcp: McpConfig = field(default_factory=McpConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)
    # Operator-configured MCP servers by label: the dynamic ``[mcp_servers.<label>]`` tables.
    mcp_servers: dict[str, McpServerConfig] = field(default_factory=dict)
    inference: InferenceConfig = field(default_factory=InferenceConfig)
    # Secrets: environment only.
    openai_api_key: Str = field(default="", repr=False)
    secret_key: Str = field(default="", repr=False)
    oidc_rp_client_secret: Str = field(default="", repr=False)
    web_search_api_key: Str = field(default="", repr=False)

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

    def __post_init__(self) -> None:
        _validate(self)


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


_LABEL_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
# Header names whose values are credentials: accepted only through headers_env.
_CREDENTIAL_HEADER_WORDS = ("authorization", "cookie", "token", "secret", "key", "password")


def is_credential_header(name: str) -> bool:
    low = name.lower()
    return any(word in low for word in _CREDENTIAL_HEADER_WORDS)


def _env_name(section: str | None, key: str) -> str:
    if (section, key) in ENV_ALIASES:
        return ENV_ALIASES[(section, key)]
    if section is None:
        return f"GATEWAY_{key.upper()}"
    return f"GATEWAY_{section.upper()}_{key.upper()}"


def _hints(cls: type) -> dict[str, Any]:
    """Declared field types without their strictness marks (environment text is parsed, not checked)."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _is_section(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _parse_env(name: str, tp: Any, text: str) -> Any:
    """One environment variable's text as its declared type; lists are comma-separated."""
    if typing.get_origin(tp) is tuple:
        return tuple(part.strip() for part in text.split(",") if part.strip())
    text = text.strip()
    if tp is bool and text == "":
        return False
    try:
        return TypeAdapter(tp).validate_python(text, strict=False)
    except ValidationError as exc:
        if tp is bool:
            raise ConfigError(f"{name}: must be a boolean (true/false), got {text!r}") from None
        raise ConfigError(f"{name}: {_describe(exc.errors()[0])}, got {text!r}") from None


class GatewayEnvSource(PydanticBaseSettingsSource):
    """The environment: ``GATEWAY_<SECTION>_<KEY>``, the conventional names of :data:`ENV_ALIASES`
    and the secrets of :data:`SECRET_ENV`, as one nested mapping (pydantic-settings' own env source
    splits nested names on a delimiter, which ``GATEWAY_WEB_SEARCH_BASE_URL`` cannot have)."""

    def __init__(self, settings_cls: type[BaseSettings], env: typing.Mapping[str, str]) -> None:
        super().__init__(settings_cls)
        self.env = env

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # the whole mapping is built in __call__

    def __call__(self) -> dict[str, Any]:
        env = self.env
        values: dict[str, Any] = {}
        for key, tp in _hints(Config).items():
            if _is_section(tp):
                for sub, subtp in _hints(tp).items():
                    name = _env_name(key, sub)
                    if name in env:
                        values.setdefault(key, {})[sub] = _parse_env(name, subtp, env[name])
            elif key in SECRET_ENV:
                if SECRET_ENV[key] in env:
                    values[key] = env[SECRET_ENV[key]]
            elif key != "mcp_servers":  # file only: a table per label
                name = _env_name(None, key)
                if name in env:
                    values[key] = _parse_env(name, tp, env[name])
        return values


def _check_file(data: dict[str, Any]) -> None:
    """What only the file can get wrong: secrets written into it, and MCP server labels."""
    for key in data:
        if key in SECRET_ENV:
            raise ConfigError(
                f"{key}: secrets are never read from the config file; set {SECRET_ENV[key]} instead"
            )
    servers = data.get("mcp_servers")
    if not isinstance(servers, dict):
        return
    for label, table in servers.items():
        prefix = f"mcp_servers.{label}"
        if not label or len(label) > 64 or not set(label) <= _LABEL_CHARS:
            raise ConfigError(f"{prefix}: a label is 1-64 letters, digits, '_' or '-'")
        if not isinstance(table, dict):
            continue
        if "secret_headers" in table:
            raise ConfigError(f"{prefix}.secret_headers: unknown setting in the config file")
        headers = table.get("headers")
        for header in headers if isinstance(headers, dict) else ():
            if is_credential_header(header):
                raise ConfigError(
                    f"{prefix}.headers.{header}: secrets are never read from the config file; "
                    f"name an environment variable in {prefix}.headers_env instead"
                )


def _toml_source(settings_cls: type[BaseSettings], path: str) -> PydanticBaseSettingsSource:
    if not Path(path).is_file():
        raise ConfigError(f"GATEWAY_CONFIG: file {path} does not exist")
    try:
        source = TomlConfigSettingsSource(settings_cls, toml_file=Path(path))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"GATEWAY_CONFIG: {path} is not valid TOML: {exc}") from None
    _check_file(source.toml_data)
    return source


_TYPE_WORDS = {
    "int_type": "must be an integer",
    "int_parsing": "must be an integer",
    "int_from_float": "must be an integer",
    "float_type": "must be a number",
    "float_parsing": "must be a number",
    "bool_type": "must be a boolean",
    "bool_parsing": "must be a boolean",
    "string_type": "must be a string",
    "tuple_type": "must be a list of strings",
    "list_type": "must be a list of strings",
    "dict_type": "must be a table of strings",
    "dataclass_type": "must be a table",
    "missing": "required",
    "missing_argument": "required",
    "extra_forbidden": "unknown setting in the config file",
    "greater_than": "must be positive",
    "unexpected_keyword_argument": "unknown setting in the config file",
}


def _describe(error: Any) -> str:
    if error["type"] == "literal_error":
        return f"must be {error['ctx']['expected']}"
    if error["type"] == "greater_than_equal":
        bound = error["ctx"]["ge"]
        return "must not be negative" if bound == 0 else f"must be at least {bound}"
    return _TYPE_WORDS.get(error["type"], error["msg"])


def _config_error(exc: ValidationError, prefix: tuple[str, ...] = ()) -> ConfigError:
    """pydantic's first complaint as a start-up message that names the setting."""
    error = exc.errors()[0]
    loc = prefix + tuple(str(part) for part in error["loc"])
    what = _describe(error)
    if error["type"] in ("missing", "missing_argument", "extra_forbidden", "unexpected_keyword_argument"):
        return ConfigError(f"{'.'.join(loc)}: {what}")
    if len(loc) == 1 and error["type"] in ("dataclass_type", "dict_type"):
        return ConfigError(f"[{loc[0]}]: must be a table")
    name = ".".join(loc)
    if (
        error["type"] in _TYPE_WORDS or error["type"] in ("literal_error", "greater_than_equal")
    ) and "input" in error:
        what += f", got {error['input']!r}"
    return ConfigError(f"{name}: {what}")


class _SettingsBase(BaseSettings):
    """Its sources: the environment over the TOML file; which environment and file, per load."""

    model_config = SettingsConfigDict(extra="forbid", case_sensitive=True, frozen=True)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        environ = _loading.get()
        env_source = GatewayEnvSource(settings_cls, environ)
        path = environ.get("GATEWAY_CONFIG", "")
        return (env_source, _toml_source(settings_cls, path)) if path else (env_source,)


# The environment of the load in progress (load_config's argument, or os.environ).
_loading: ContextVar[typing.Mapping[str, str]] = ContextVar("gateway_config_environ")


def _settings_class() -> type[BaseSettings]:
    """A pydantic-settings class with the fields of :class:`Config` (declared once, there)."""
    hints = typing.get_type_hints(Config, include_extras=True)
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(Config):
        if f.default_factory is not dataclasses.MISSING:
            fields[f.name] = (hints[f.name], Field(default_factory=f.default_factory))
        else:
            fields[f.name] = (hints[f.name], f.default)
    return create_model("GatewaySettings", __base__=_SettingsBase, **fields)  # type: ignore[no-any-return]


_settings_cls: type[BaseSettings] | None = None


def load_config(env: typing.Mapping[str, str] | None = None) -> Config:
    """Build the config from ``env`` (default: the process environment) and the TOML file."""
    global _settings_cls
    environ: typing.Mapping[str, str] = os.environ if env is None else env
    if _settings_cls is None:
        _settings_cls = _settings_class()
    token = _loading.set(environ)
    try:
        settings = _settings_cls()
    except ValidationError as exc:
        raise _config_error(exc) from None
    finally:
        _loading.reset(token)
    values = {f.name: getattr(settings, f.name) for f in dataclasses.fields(Config)}
    values["mcp_servers"] = _resolve_headers_env(values["mcp_servers"], environ)
    if "WEB_SEARCH_API_KEY" not in environ:
        key_env = values["web_search"].key_env
        if key_env and key_env in environ:
            values["web_search_api_key"] = environ[key_env]
    try:
        return Config(**values)
    except ValidationError as exc:
        raise _config_error(exc) from None


def _resolve_headers_env(
    servers: dict[str, McpServerConfig], env: typing.Mapping[str, str]
) -> dict[str, McpServerConfig]:
    """Each MCP server's ``headers_env``: header name -> the value of the variable it names."""
    resolved = {}
    for label, server in servers.items():
        secret: dict[str, str] = {}
        for header, var in server.headers_env.items():
            if var not in env:
                raise ConfigError(
                    f"mcp_servers.{label}.headers_env.{header}: environment variable {var} is not set"
                )
            secret[header] = env[var]
        resolved[label] = dataclasses.replace(server, secret_headers=secret)
    return resolved


def is_loopback_host(host: str) -> bool:
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
        if parts.scheme == "http" and not is_loopback_host(parts.hostname):
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
    if c.web_fetch.max_redirects < 0:
        raise ConfigError(f"web_fetch.max_redirects: must be 0 or more, got {c.web_fetch.max_redirects}")
    for entry in c.messages.tool_aliases:
        name, sep, tool = entry.partition("=")
        if not sep or not name.strip() or tool.strip() not in ("web_search", "web_fetch"):
            raise ConfigError(f"messages.tool_aliases: {entry!r} is not NAME=web_search or NAME=web_fetch")
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
    for path in c.passthrough.extra_routes:
        _check_extra_route(path)
    for origin in c.server.cors_allowed_origins:
        parts = urlsplit(origin)
        if parts.scheme not in ("http", "https") or not parts.netloc or parts.path not in ("", "/"):
            raise ConfigError(
                f"server.cors_allowed_origins: {origin!r} is not an origin (scheme://host[:port])"
            )


# Paths the gateway serves itself: an extra pass-through route may not take them (or anything below).
GATEWAY_PATHS = (
    "/v1/responses",
    "/v1/conversations",
    "/v1/messages",
    "/v1/models",
    "/v1/openapi.json",
    "/health",
    "/ready",
    "/metrics",
    "/admin",
    "/oidc",
    "/docs",
)
_PATH_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._~/")


def _check_extra_route(path: str) -> None:
    where = f"passthrough.extra_routes: {path!r}"
    if not path.startswith("/") or path == "/" or not set(path) <= _PATH_CHARS or "//" in path:
        raise ConfigError(f"{where} is not a path (/segment/…: letters, digits, '-', '.', '_', '~')")
    if any(path == owned or path.startswith(owned + "/") for owned in GATEWAY_PATHS):
        raise ConfigError(f"{where} is served by the gateway itself")


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
    try:
        for sec, subs in nested.items():
            section = getattr(config, sec)
            try:
                top[sec] = dataclasses.replace(section, **subs)
            except ValidationError as exc:
                raise _config_error(exc, prefix=(sec,)) from None
        return dataclasses.replace(config, **top)  # validated again, as a whole, in __post_init__
    except ValidationError as exc:
        raise _config_error(exc) from None


def environ_get(name: str, default: str = "") -> str:
    """Read a process-level variable that is not gateway config (e.g. ``DJANGO_SETTINGS_MODULE``)."""
    return os.environ.get(name, default)


__all__ = ["Config", "ConfigError", "get_config", "load_config", "set_config"]
