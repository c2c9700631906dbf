"""The one typed, frozen configuration object: plain pydantic-settings.

Read once, in this order of precedence: environment variables, then an optional TOML file (path in
``GATEWAY_CONFIG``), then the defaults below. This is the only module that reads ``os.environ``.

Every section is a frozen, strict pydantic model: the file's values are taken as written
(``debug = 'yes'`` is refused, not guessed), while pydantic-settings parses the environment's text
as the declared type. Environment names: pydantic-settings' own ``GATEWAY_<SECTION>__<KEY>``
(complex values as JSON), the documented ``GATEWAY_<SECTION>_<KEY>`` (lists comma-separated) and
the conventional names (``LLM_API_BASE``, ``DATABASE_URL``, ``PORT`` …). Unknown keys, wrong types
and inconsistent settings raise :class:`ConfigError` naming the setting.
"""

from __future__ import annotations

import ipaddress
import json
import os
import tomllib
import typing
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    SecretStr,
    Strict,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
    TomlConfigSettingsSource,
)

MiB = 1024 * 1024

# A list in the file, a tuple in the config (lax only about the container: its items stay strict).
StrList = Annotated[tuple[str, ...], Strict(False)]

# Keys that hold credentials: accepted from the environment only, refused in the file.
SECRET_ENV = {
    "openai_api_key": "OPENAI_API_KEY",
    "secret_key": "GATEWAY_SECRET_KEY",
    "oidc_rp_client_secret": "OIDC_RP_CLIENT_SECRET",
    # Also read from the variable named by [web_search] api_key_env (BRAVE_API_KEY / TAVILY_API_KEY).
    "web_search_api_key": "WEB_SEARCH_API_KEY",
}
# Conventional environment names (besides GATEWAY_<SECTION>_<KEY>): the secrets (these names only) and
# the common settings.
ENV_NAMES = {
    **{var: key for key, var in SECRET_ENV.items()},
    "LLM_API_BASE": "llm_api_base",
    "DATABASE_URL": "database_url",
    "REDIS_URL": "redis_url",
    "UPSTREAM_API": "upstream_api",
    "MODEL": "model",
    "HOST": "server.host",
    "PORT": "server.port",
    "CORS_ALLOWED_ORIGINS": "server.cors_allowed_origins",
    "GATEWAY_DEBUG": "server.debug",
    "LOG_FORMAT": "server.log_format",
    "LOG_LEVEL": "server.log_level",
    "OIDC_ISSUER": "auth.oidc_issuer",
    "OIDC_AUDIENCE": "auth.oidc_audience",
    "GATEWAY_REQUIRE_API_KEY": "auth.require_api_key",
    "OIDC_RP_CLIENT_ID": "auth.oidc_rp_client_id",
    "WEB_SEARCH_PROVIDER": "web_search.provider",
    "WEB_SEARCH_BASE_URL": "web_search.base_url",
    "MCP_ALLOWED_HOSTS": "mcp.allowed_hosts",
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


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


class ServerConfig(_Section):
    host: str = "127.0.0.1"
    port: int = 8000
    max_request_body_size_bytes: PositiveInt = 10 * MiB
    # Request line and headers together (431, or 414 for a request line, beyond it), the number of
    # header fields (431), and how long a request may take to arrive in full, head and body (408).
    max_request_head_size_bytes: PositiveInt = 64 * 1024
    max_request_headers: PositiveInt = 100
    request_read_timeout_s: PositiveFloat = 30.0
    cors_allowed_origins: StrList = ()
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


class UpstreamConfig(_Section):
    connect_timeout_s: PositiveFloat = 10.0
    read_timeout_s: PositiveFloat = 600.0
    stall_timeout_s: PositiveFloat = 300.0
    pool_size: PositiveInt = 1000
    ready_timeout_s: float = 1.0
    # The callback relay polls a lone exchange's wait up to this long before the loop sleeps
    # (gateway.relay.http_client.IdlePoll); 0: never.
    idle_poll_us: NonNegativeInt = 200


class PassthroughConfig(_Section):
    # More upstream paths relayed byte for byte (POST), besides the built-in ones (docs/passthrough.md).
    extra_routes: StrList = ()


class DatabaseConfig(_Section):
    statement_timeout_ms: int = 30_000
    pool_min_size: int = 2
    pool_max_size: PositiveInt = 20
    conn_max_age_s: int = 0
    # PostgreSQL: a statement run often on a connection is prepared (parsed and planned once). Off
    # behind a pooler in transaction mode that does not keep prepared statements per client.
    prepared_statements: bool = True


class ResponsesConfig(_Section):
    max_retained_bytes: PositiveInt = 8 * MiB
    max_upstream_sse_line_bytes: PositiveInt = 16 * MiB
    max_stream_event_bytes: PositiveInt = 16 * MiB
    prompt_cache_options_supported: bool = False
    max_rounds: PositiveInt = 10
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


class WebSocketConfig(_Section):
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


class ToolsConfig(_Section):
    max_concurrent_gateway_calls: PositiveInt = 5
    call_timeout_s: PositiveFloat = 60.0


class WebSearchConfig(_Section):
    provider: Literal["searxng", "brave", "tavily"] = "searxng"
    base_url: str = ""
    api_key_env: str = ""
    max_results: PositiveInt = 5
    max_queries_per_call: PositiveInt = 5
    request_timeout_s: PositiveFloat = 15.0
    allowed_domains: StrList = ()
    blocked_domains: StrList = ()
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


class WebFetchConfig(_Section):
    """The ``web_fetch`` gateway tool (Anthropic Messages' ``web_fetch_20250910``)."""

    # Hosts that may resolve to loopback/private/link-local addresses (exact names, as MCP's).
    allowed_hosts: StrList = ()
    # The most bytes read of one page; a longer one fails with ``content_too_large``.
    max_bytes: PositiveInt = 5 * MiB
    max_redirects: int = 5
    # Text given to the model when the declaration names no ``max_content_tokens`` (about 4 bytes a token).
    max_content_tokens: PositiveInt = 100_000
    max_url_chars: PositiveInt = 2048


class MessagesConfig(_Section):
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


class CodeInterpreterConfig(_Section):
    enabled: bool = True
    bwrap: str = "bwrap"
    python: str = ""
    cpu_time_s: PositiveInt = 10
    wall_time_s: PositiveFloat = 30.0
    memory_bytes: PositiveInt = 512 * MiB
    max_processes: PositiveInt = 16
    max_output_bytes: PositiveInt = 256 * 1024
    max_file_size_bytes: PositiveInt = 16 * MiB
    tmp_size_bytes: PositiveInt = 64 * MiB
    max_code_bytes: PositiveInt = 1 * MiB
    run_as_uid: int = 65534
    run_as_gid: int = 65534
    extra_ro_binds: StrList = ()


class McpConfig(_Section):
    allowed_hosts: StrList = ()
    max_servers: PositiveInt = 64
    max_tools: PositiveInt = 128
    max_list_pages: PositiveInt = 50
    connect_timeout_s: PositiveFloat = 10.0
    discovery_timeout_s: PositiveFloat = 30.0


class McpServerConfig(_Section):
    """One operator-configured MCP server, ``[mcp_servers.<label>]``."""

    url: str
    transport: Literal["streamable_http", "sse"] = "streamable_http"
    headers: dict[str, str] = {}
    # Header name -> environment variable holding its value (a credential): resolved at load.
    headers_env: dict[str, str] = {}
    allowed_tools: StrList | None = None
    secret_headers: dict[str, SecretStr] = Field(default={}, repr=False)

    def all_headers(self) -> dict[str, str]:
        return {**self.headers, **{k: v.get_secret_value() for k, v in self.secret_headers.items()}}

    @field_validator("url")
    @classmethod
    def _http_url(cls, url: str) -> str:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise PydanticCustomError("config", "must be an http(s) URL, got '{url}'", {"url": url})
        return url


class AuthConfig(_Section):
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


class InferenceConfig(_Section):
    """The vLLM engine hosted by inference workers (and by the gateway itself in embedded mode)."""

    served_model_name: str = ""
    dtype: str = "auto"
    max_model_len: int = 0
    tensor_parallel_size: PositiveInt = 1
    chat_template: str = ""
    enable_auto_tool_choice: bool = False
    tool_call_parser: str = ""
    reasoning_parser: str = ""
    generation_config: str = "auto"
    override_generation_config: str = ""
    kv_cache_memory_bytes: int = 0
    gpu_memory_utilization: float = 0.9
    enforce_eager: bool = False
    engine_args: StrList = ()
    models: StrList = ()
    stream_maxlen: PositiveInt = 10_000
    stream_ttl_s: PositiveInt = 900
    heartbeat_interval_s: PositiveFloat = 1.0
    worker_lost_after_s: PositiveFloat = 5.0
    cancel_poll_interval_s: PositiveFloat = 0.2


class Config(BaseSettings):
    """Every setting; built by :func:`load_config` and checked as a whole when built (or replaced)."""

    model_config = SettingsConfigDict(
        frozen=True,
        extra="forbid",
        strict=True,
        env_prefix="GATEWAY_",
        env_nested_delimiter="__",
        case_sensitive=False,
    )

    llm_api_base: str = ""
    database_url: str = ""
    redis_url: str = ""
    upstream_api: Literal["responses", "chat_completions"] = "responses"
    model: str = ""
    server: ServerConfig = ServerConfig()
    upstream: UpstreamConfig = UpstreamConfig()
    passthrough: PassthroughConfig = PassthroughConfig()
    database: DatabaseConfig = DatabaseConfig()
    responses: ResponsesConfig = ResponsesConfig()
    websocket: WebSocketConfig = WebSocketConfig()
    tools: ToolsConfig = ToolsConfig()
    web_search: WebSearchConfig = WebSearchConfig()
    web_fetch: WebFetchConfig = WebFetchConfig()
    messages: MessagesConfig = MessagesConfig()
    code_interpreter: CodeInterpreterConfig = CodeInterpreterConfig()
    mcp: McpConfig = McpConfig()
    auth: AuthConfig = AuthConfig()
    # Operator-configured MCP servers by label: the dynamic ``[mcp_servers.<label>]`` tables.
    mcp_servers: dict[str, McpServerConfig] = {}
    inference: InferenceConfig = InferenceConfig()
    # Secrets: environment only, from the names in SECRET_ENV.
    openai_api_key: SecretStr = SecretStr("")
    secret_key: SecretStr = SecretStr("")
    oidc_rp_client_secret: SecretStr = SecretStr("")
    web_search_api_key: SecretStr = SecretStr("")

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

    @model_validator(mode="after")
    def _consistent(self) -> Config:
        _validate(self)
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        environ = _loading.get(None)
        if environ is None:  # Config(...) outside load_config: the values given over the defaults
            return (init_settings,)
        env = EnvSettingsSource(settings_cls)
        env.env_vars = environ  # pydantic-settings' own parsing, over the environment of this load
        path = environ.get("gateway_config", "")
        return (env, _toml_source(settings_cls, path)) if path else (env,)


# The environment of the load in progress, as pydantic-settings reads it (see _environ).
_loading: ContextVar[dict[str, str]] = ContextVar("gateway_config_environ")

# Documented names -> (key,) or (section, key): the conventional ones, then GATEWAY_<SECTION>_<KEY>.
_ENV_KEYS: dict[str, tuple[str, ...]] = {name: tuple(path.split(".")) for name, path in ENV_NAMES.items()} | {
    f"GATEWAY_{section}_{key}".upper(): (section, key)
    for section, f in Config.model_fields.items()
    if isinstance(f.annotation, type) and issubclass(f.annotation, _Section)
    for key in f.annotation.model_fields
}


def _environ(env: typing.Mapping[str, str]) -> tuple[dict[str, str], dict[tuple[str, ...], str]]:
    """``env`` as pydantic-settings reads it (lower-case names), each documented name also under its
    ``gateway_<section>__<key>`` name (a comma-separated list as JSON); and which name set what."""
    out = {name.lower(): value for name, value in env.items()}
    named: dict[tuple[str, ...], str] = {}
    for name, path in _ENV_KEYS.items():
        nested = "gateway_" + "__".join(path)
        if name not in env or nested in out:
            continue
        value = env[name]
        field = Config.model_fields[path[0]]
        if len(path) == 2:
            field = field.annotation.model_fields[path[1]]  # type: ignore[union-attr]
        if typing.get_origin(field.annotation) is tuple:
            value = json.dumps([part.strip() for part in value.split(",") if part.strip()])
        out[nested] = value
        named[path] = name
    return out, named


_LABEL_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
# Header names whose values are credentials: accepted only through headers_env.
_CREDENTIAL_HEADER_WORDS = ("authorization", "cookie", "token", "secret", "key", "password")


def is_credential_header(name: str) -> bool:
    low = name.lower()
    return any(word in low for word in _CREDENTIAL_HEADER_WORDS)


def _check_file(data: dict[str, Any]) -> None:
    """What only the file can get wrong: secrets written into it, and MCP server labels."""
    for key, var in SECRET_ENV.items():
        if key in data:
            raise ConfigError(f"{key}: secrets are never read from the config file; set {var} instead")
    servers = data.get("mcp_servers")
    for label, table in servers.items() if isinstance(servers, dict) else ():
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
    "dict_type": "must be a table of strings",
    "model_type": "must be a table",
    "missing": "required",
    "extra_forbidden": "unknown setting in the config file",
    "greater_than": "must be positive",
}


def _config_error(exc: ValidationError, named: dict[tuple[str, ...], str] | None = None) -> ConfigError:
    """pydantic's first complaint as a start-up message that names the setting (or, for a value
    that does not parse, the environment variable it came from)."""
    error = exc.errors()[0]
    loc = tuple(str(part) for part in error["loc"])
    kind = error["type"]
    if kind == "literal_error":
        what = f"must be {error['ctx']['expected']}"
    elif kind == "greater_than_equal":
        what = "must not be negative" if error["ctx"]["ge"] == 0 else f"must be at least {error['ctx']['ge']}"
    else:
        what = _TYPE_WORDS.get(kind, error["msg"])
    if kind in ("missing", "extra_forbidden"):
        return ConfigError(f"{'.'.join(loc)}: {what}")
    if len(loc) == 1 and kind in ("model_type", "dict_type"):
        return ConfigError(f"[{loc[0]}]: must be a table")
    name = ".".join(loc)
    if kind not in ("greater_than", "greater_than_equal"):
        name = (named or {}).get(loc, name)
    if (kind in _TYPE_WORDS or kind in ("literal_error", "greater_than_equal")) and "input" in error:
        what += f", got {error['input']!r}"
    return ConfigError(f"{name}: {what}")


def load_config(env: typing.Mapping[str, str] | None = None) -> Config:
    """Build the config from ``env`` (default: the process environment) and the TOML file."""
    environ: typing.Mapping[str, str] = os.environ if env is None else env
    translated, named = _environ(environ)
    token = _loading.set(translated)
    try:
        config = Config()
    except ValidationError as exc:
        raise _config_error(exc, named) from None
    except SettingsError as exc:  # a GATEWAY_<SECTION>__<KEY> list or table that is not JSON
        raise ConfigError(f"environment: {exc}") from None
    finally:
        _loading.reset(token)
    # What the environment holds by reference: MCP header credentials, the provider's search key.
    servers = {}
    for label, server in config.mcp_servers.items():
        secret = {}
        for header, var in server.headers_env.items():
            if var not in environ:
                raise ConfigError(
                    f"mcp_servers.{label}.headers_env.{header}: environment variable {var} is not set"
                )
            secret[header] = SecretStr(environ[var])
        servers[label] = server.model_copy(update={"secret_headers": secret})
    update: dict[str, Any] = {"mcp_servers": servers}
    key_env = config.web_search.key_env
    if "WEB_SEARCH_API_KEY" not in environ and key_env and key_env in environ:
        update["web_search_api_key"] = SecretStr(environ[key_env])
    return config.model_copy(update=update)


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
        if not c.oidc_rp_client_secret.get_secret_value():
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
    """A copy of ``config`` with top-level or ``section__key`` changes (for tests), checked again."""
    values: dict[str, Any] = dict(config)
    for key, value in changes.items():
        section, _, sub = key.partition("__")
        if sub:
            values[section] = {**dict(values[section]), sub: value}
        else:
            values[key] = value
    try:
        return Config(**values)
    except ValidationError as exc:
        raise _config_error(exc) from None


def environ_get(name: str, default: str = "") -> str:
    """Read a process-level variable that is not gateway config (e.g. ``DJANGO_SETTINGS_MODULE``)."""
    return os.environ.get(name, default)


__all__ = ["Config", "ConfigError", "get_config", "load_config", "set_config"]
