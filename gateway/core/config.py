"""The one typed, frozen configuration object: plain pydantic-settings.

Precedence: environment, then the TOML file named by ``GATEWAY_CONFIG``, then the defaults; every key
is in ``config.example.toml``. The only module that reads ``os.environ``. Sections are strict: file
values are taken as written, environment text is parsed as the declared type; unknown keys, wrong
types and inconsistent settings raise :class:`ConfigError` naming the setting.
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
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    SecretStr,
    Strict,
    TypeAdapter,
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

# A list in the file, a tuple in the config: lax only about the container, its items stay strict.
StrList = Annotated[tuple[str, ...], Strict(False)]

# Keys that hold credentials: accepted from the environment only, refused in the file.
SECRET_ENV = {
    "openai_api_key": "OPENAI_API_KEY",
    "secret_key": "GATEWAY_SECRET_KEY",
    "oidc_rp_client_secret": "OIDC_RP_CLIENT_SECRET",
    # Also read from the variable named by [web_search] api_key_env (BRAVE_API_KEY / TAVILY_API_KEY).
    "web_search_api_key": "WEB_SEARCH_API_KEY",
}
# Conventional environment names -> setting (besides GATEWAY_<SECTION>_<KEY> for every section key).
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

# Per web-search provider: the default key variable, public base URL and search path.
WEB_SEARCH_KEY_ENV = {"searxng": "", "brave": "BRAVE_API_KEY", "tavily": "TAVILY_API_KEY"}
WEB_SEARCH_DEFAULT_BASE = {
    "searxng": "",
    "brave": "https://api.search.brave.com",
    "tavily": "https://api.tavily.com",
}
WEB_SEARCH_PATH = {"searxng": "/search", "brave": "/res/v1/web/search", "tavily": "/search"}

# Paths the gateway serves itself: an extra pass-through route may not take them (or anything below).
GATEWAY_PATHS = (
    *("/v1/responses", "/v1/conversations", "/v1/messages", "/v1/models", "/v1/openapi.json"),
    *("/health", "/ready", "/metrics", "/admin", "/oidc", "/docs", "/v1/organization"),
    *("/v1/files", "/v1/vector_stores"),
)
_PATH_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._~/")
_LABEL_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
# Header names whose values are credentials: accepted only through headers_env.
_CREDENTIAL_HEADER_WORDS = ("authorization", "cookie", "token", "secret", "key", "password")


class ConfigError(Exception):
    """A setting is unknown, mistyped or inconsistent; start-up stops with this message."""


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


class ServerConfig(_Section):
    host: str = "127.0.0.1"
    port: int = 8000
    max_request_body_size_bytes: PositiveInt = 10 * MiB
    # Head size (431, or 414 for the request line), header count (431), and the body's read time after
    # the head (408); a head's own read timeout is the ingress's (docs/operations.md).
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
    workers: NonNegativeInt = 0  # 0: see Config.server_workers
    shutdown_grace_s: NonNegativeFloat = 30.0


class UpstreamConfig(_Section):
    connect_timeout_s: PositiveFloat = 10.0
    read_timeout_s: PositiveFloat = 600.0
    stall_timeout_s: PositiveFloat = 300.0
    pool_size: PositiveInt = 1000
    ready_timeout_s: float = 1.0


class PassthroughConfig(_Section):
    extra_routes: StrList = ()

    @field_validator("extra_routes")
    @classmethod
    def _not_ours(cls, routes: tuple[str, ...]) -> tuple[str, ...]:
        for path in routes:
            where = f"passthrough.extra_routes: {path!r}"
            if not path.startswith("/") or path == "/" or not set(path) <= _PATH_CHARS or "//" in path:
                raise ConfigError(f"{where} is not a path (/segment/…: letters, digits, '-', '.', '_', '~')")
            if any(path == owned or path.startswith(owned + "/") for owned in GATEWAY_PATHS):
                raise ConfigError(f"{where} is served by the gateway itself")
        return routes


class DatabaseConfig(_Section):
    statement_timeout_ms: int = 30_000
    pool_min_size: int = 2
    pool_max_size: PositiveInt = 20
    conn_max_age_s: int = 0
    prepared_statements: bool = True  # off behind a pooler that does not keep them per client


class ResponsesConfig(_Section):
    max_retained_bytes: PositiveInt = 8 * MiB
    max_upstream_sse_line_bytes: PositiveInt = 16 * MiB
    max_stream_event_bytes: PositiveInt = 16 * MiB
    prompt_cache_options_supported: bool = False
    max_rounds: PositiveInt = 10
    history_cache_bytes: int = 64 * MiB
    lease_s: PositiveFloat = 60.0
    heartbeat_s: PositiveFloat = 10.0
    sweep_interval_s: PositiveFloat = 15.0
    compaction_prompt: str = ""  # "": responses_app.features.compaction.DEFAULT_PROMPT
    compaction_max_output_tokens: NonNegativeInt = 0


class WebSocketConfig(_Section):
    max_outstanding_requests: PositiveInt = 64
    max_outstanding_request_bytes: PositiveInt = 12 * MiB
    max_lanes: PositiveInt = 128
    max_checkpoint_items: PositiveInt = 32_768
    max_checkpoint_bytes: PositiveInt = 16 * MiB
    max_connection_checkpoint_bytes: PositiveInt = 32 * MiB
    outbound_queue_events: PositiveInt = 256
    send_timeout_s: PositiveFloat = 30.0
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
        """The base URL (``base_url`` or the public default) plus the provider's path, unless the
        base already ends with it."""
        base = (self.base_url or WEB_SEARCH_DEFAULT_BASE[self.provider]).rstrip("/")
        path = WEB_SEARCH_PATH[self.provider]
        return base if not base or base.endswith(path) else base + path

    @property
    def key_env(self) -> str:
        return self.api_key_env or WEB_SEARCH_KEY_ENV[self.provider]


class WebFetchConfig(_Section):
    allowed_hosts: StrList = ()
    max_bytes: PositiveInt = 5 * MiB
    max_redirects: NonNegativeInt = 5
    max_content_tokens: PositiveInt = 100_000
    max_url_chars: PositiveInt = 2048


class MessagesConfig(_Section):
    tool_aliases: StrList = ()  # "WebSearch=web_search": that client function runs as the gateway tool

    @field_validator("tool_aliases")
    @classmethod
    def _name_eq_tool(cls, entries: tuple[str, ...]) -> tuple[str, ...]:
        for entry in entries:
            name, sep, tool = entry.partition("=")
            if not sep or not name.strip() or tool.strip() not in ("web_search", "web_fetch"):
                raise ConfigError(
                    f"messages.tool_aliases: {entry!r} is not NAME=web_search or NAME=web_fetch"
                )
        return entries

    def aliases(self) -> dict[str, str]:
        """Function name -> gateway tool name (``web_search`` or ``web_fetch``)."""
        return {name.strip(): tool.strip() for name, _, tool in (e.partition("=") for e in self.tool_aliases)}


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
    headers_env: dict[str, str] = {}  # header -> the variable holding its value, read at load
    allowed_tools: StrList | None = None
    secret_headers: dict[str, SecretStr] = {}

    def all_headers(self) -> dict[str, str]:
        return {**self.headers, **{k: v.get_secret_value() for k, v in self.secret_headers.items()}}

    @field_validator("url")
    @classmethod
    def _http(cls, url: str) -> str:
        if not _is_http_url(url):
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
    oidc_rp_client_id: str = ""  # admin single sign-on (mozilla-django-oidc)
    admin_staff_claim: str = "groups"
    admin_staff_value: str = ""
    admin_superuser_value: str = ""
    admin_sso_scopes: str = "openid email profile"
    usage_admin_claim: str = "groups"  # an OIDC principal with this claim value sees everyone's usage
    usage_admin_value: str = ""  # "": no OIDC principal is a usage admin


class QuotasConfig(_Section):
    """Everyone's default limits (an API key may override each); ``None``: unlimited."""

    requests_per_minute: PositiveInt | None = None
    tokens_per_minute: PositiveInt | None = None
    tokens_per_day: PositiveInt | None = None
    max_concurrent_requests: PositiveInt | None = None


class UsageConfig(_Section):
    """The usage ledger (docs/operations.md, "Usage ledger"). Off: no ledger rows, no per-model
    metrics, no usage read from answers; token quotas need it and are refused without it."""

    ledger: bool = True


class FilesConfig(_Section):
    """The Files API's storage (docs/file-search.md). ``storage_backend``: a Django storage class
    (e.g. ``storages.backends.s3.S3Storage`` from django-storages) with ``storage_options`` as its
    keyword arguments; "" keeps the bytes in ``directory`` on local disk ("": ``<data_dir>/files``)."""

    max_upload_bytes: PositiveInt = 512 * MiB
    directory: str = ""
    storage_backend: str = ""
    storage_options: dict[str, Any] = {}


class FileSearchConfig(_Section):
    """Vector store retrieval (docs/file-search.md). ``embedding_model`` "": keyword search only."""

    embedding_model: str = ""
    embedding_base_url: str = ""  # "": the configured upstream
    max_chunks_per_store: PositiveInt = 50_000
    index_cache_bytes: PositiveInt = (
        512 * MiB
    )  # search indexes kept in memory per process (files_app.retrieval)
    ingestion_lease_s: PositiveFloat = 120.0


class ObservabilityConfig(_Section):
    """Tracing (docs/operations.md, "Tracing"); the exporter, sampler and resource come from the
    standard ``OTEL_*`` variables (:func:`otel_environ`). ``capture_content``: prompts and completions
    in span attributes (off: none; credentials are never recorded)."""

    capture_content: bool = False


class RetentionConfig(_Section):
    """How long stored data is kept (docs/operations.md, "Retention"); ``None``: forever. The purge
    deletes in batches of ``batch_size`` rows, every ``interval_s`` (Celery beat with a broker, an
    in-process timer without one) and on demand (``manage.py purge``)."""

    responses_days: PositiveFloat | None = None
    conversations_days: PositiveFloat | None = None
    usage_days: PositiveFloat | None = None
    batch_size: PositiveInt = 1000
    interval_s: PositiveFloat = 3600.0
    batch_pause_s: NonNegativeFloat = 0.0


class UpstreamEntry(_Section):
    """One OpenAI-compatible server, ``[[upstreams]]`` (or one URL of a comma-separated ``LLM_API_BASE``)."""

    base_url: str
    api_key_env: str = ""  # the variable holding this server's key; empty: OPENAI_API_KEY
    models: StrList = ()  # the served model names; empty: discovered from its /v1/models
    weight: PositiveFloat = 1.0
    api_key: SecretStr = SecretStr("")  # read from api_key_env at load, never from the file

    @field_validator("base_url")
    @classmethod
    def _http(cls, url: str) -> str:
        if not _is_http_url(url):
            raise PydanticCustomError("config", "must be an http(s) URL, got '{url}'", {"url": url})
        return url

    @property
    def base(self) -> str:
        """``base_url`` without a trailing ``/`` or ``/v1``, so ``/v1`` is never doubled."""
        return _strip_v1(self.base_url)


class RoutingConfig(_Section):
    """Where model rounds go: KV-cache-affine placement of lineages, and the upstream table's health."""

    # Place every round of one lineage on the inference worker (or HTTP upstream) that served it last.
    affinity: bool = True
    # A header carrying the lineage's tenant-scoped session id to HTTP upstreams (for a KV-aware
    # router such as llm-d); empty: not sent.
    session_header: str = ""
    # A lineage's placement record lives this long after its last round.
    placement_ttl_s: PositiveFloat = 3600.0
    # In-flight plus queued requests on one worker past which its lineages move; 0: the worker's own
    # bound (its engine's max_num_seqs).
    max_worker_load: NonNegativeInt = 0
    # A failing HTTP upstream is out for backoff_s, doubling on each further failure up to backoff_max_s.
    backoff_s: PositiveFloat = 5.0
    backoff_max_s: PositiveFloat = 60.0
    # How long an upstream's discovered /v1/models list is trusted.
    models_ttl_s: PositiveFloat = 30.0


class InferenceConfig(_Section):
    """The vLLM engine of inference workers (and of the gateway itself in embedded mode)."""

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
    quotas: QuotasConfig = QuotasConfig()
    usage: UsageConfig = UsageConfig()
    files: FilesConfig = FilesConfig()
    file_search: FileSearchConfig = FileSearchConfig()
    observability: ObservabilityConfig = ObservabilityConfig()
    retention: RetentionConfig = RetentionConfig()
    mcp_servers: dict[str, McpServerConfig] = {}  # the [mcp_servers.<label>] tables
    upstreams: Annotated[
        tuple[UpstreamEntry, ...], Strict(False)
    ] = ()  # the [[upstreams]] tables (a list in the file)
    routing: RoutingConfig = RoutingConfig()
    inference: InferenceConfig = InferenceConfig()
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
        if not self.http_upstreams and not self.redis_url:
            return 1
        return max(
            1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        )

    @property
    def upstream_base(self) -> str:
        """The first HTTP upstream's base (``llm_api_base`` without a trailing ``/`` or ``/v1``)."""
        entries = self.upstream_entries
        return entries[0].base if entries else ""

    @property
    def http_upstreams(self) -> bool:
        """Inference goes to OpenAI-compatible HTTP servers (``LLM_API_BASE`` or ``[[upstreams]]``)."""
        return bool(self.llm_api_base or self.upstreams)

    @property
    def upstream_entries(self) -> tuple[UpstreamEntry, ...]:
        """The upstream table: ``[[upstreams]]``, or one entry per URL of ``LLM_API_BASE`` (each serving
        what its /v1/models lists, keyed by ``OPENAI_API_KEY``)."""
        if self.upstreams:
            return self.upstreams
        return tuple(
            UpstreamEntry(base_url=url, api_key=self.openai_api_key)
            for url in _split_bases(self.llm_api_base)
        )

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
        field = Config.model_fields[path[0]]
        if len(path) == 2:
            field = field.annotation.model_fields[path[1]]  # type: ignore[union-attr]
        value = env[name]
        if typing.get_origin(field.annotation) is tuple:
            value = json.dumps([part.strip() for part in value.split(",") if part.strip()])
        out[nested], named[path] = value, name
    return out, named


def _toml_source(settings_cls: type[BaseSettings], path: str) -> PydanticBaseSettingsSource:
    """pydantic-settings' TOML source, once the file is checked for what only a file can get wrong:
    secrets written into it, and MCP server labels and headers."""
    if not Path(path).is_file():
        raise ConfigError(f"GATEWAY_CONFIG: file {path} does not exist")
    try:
        source = TomlConfigSettingsSource(settings_cls, toml_file=Path(path))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"GATEWAY_CONFIG: {path} is not valid TOML: {exc}") from None
    for key in SECRET_ENV.keys() & source.toml_data.keys():
        raise ConfigError(
            f"{key}: secrets are never read from the config file; set {SECRET_ENV[key]} instead"
        )
    tables = source.toml_data.get("upstreams")
    for index, table in enumerate(tables if isinstance(tables, list) else ()):
        if isinstance(table, dict) and "api_key" in table:
            raise ConfigError(
                f"upstreams[{index}].api_key: secrets are never read from the config file; "
                f"name an environment variable in upstreams[{index}].api_key_env instead"
            )
    servers = source.toml_data.get("mcp_servers")
    for label, table in servers.items() if isinstance(servers, dict) else ():
        prefix = f"mcp_servers.{label}"
        if not label or len(label) > 64 or not set(label) <= _LABEL_CHARS:
            raise ConfigError(f"{prefix}: a label is 1-64 letters, digits, '_' or '-'")
        if isinstance(table, dict) and "secret_headers" in table:
            raise ConfigError(f"{prefix}.secret_headers: unknown setting in the config file")
        headers = table.get("headers") if isinstance(table, dict) else None
        for header in filter(is_credential_header, headers if isinstance(headers, dict) else ()):
            raise ConfigError(
                f"{prefix}.headers.{header}: secrets are never read from the config file; "
                f"name an environment variable in {prefix}.headers_env instead"
            )
    return source


_TYPE_WORDS = {
    **dict.fromkeys(("int_type", "int_parsing", "int_from_float"), "must be an integer"),
    **dict.fromkeys(("float_type", "float_parsing"), "must be a number"),
    **dict.fromkeys(("bool_type", "bool_parsing"), "must be a boolean"),
    "string_type": "must be a string",
    "tuple_type": "must be a list of strings",
    "dict_type": "must be a table of strings",
    "model_type": "must be a table",
    "greater_than": "must be positive",
}


def _config_error(
    exc: ValidationError, named: dict[tuple[str, ...], str] | None = None, env: typing.Container[str] = ()
) -> ConfigError:
    """pydantic's first complaint as a start-up message that names the setting (or, for a value of
    the wrong type, the environment variable it came from)."""
    error = exc.errors()[0]
    loc = tuple(str(part) for part in error["loc"])
    kind, where = error["type"], ".".join(loc)
    if kind == "int_type" and loc in (named or {}):
        number = _bound_error(loc, error["input"])
        if number is not None:  # "-1" or "0" from the environment: say what is wrong with the number
            return ConfigError(f"{where}: {number}")  # (as a bound is reported below)
    if kind == "missing":
        return ConfigError(f"{where}: required")
    if kind == "extra_forbidden":
        var = "GATEWAY_" + "__".join(loc).upper()
        return ConfigError(
            f"{where}: unknown setting " + (f"({var})" if var.lower() in env else "in the config file")
        )
    if len(loc) == 1 and kind in ("model_type", "dict_type"):
        return ConfigError(f"[{where}]: must be a table")
    if kind == "literal_error":
        what = f"must be {error['ctx']['expected']}"
    elif kind == "greater_than_equal":
        what = "must not be negative"
    else:
        what = _TYPE_WORDS.get(kind, error["msg"])
    if kind not in ("greater_than", "greater_than_equal"):
        where = (named or {}).get(loc, where)
    if kind in _TYPE_WORDS or kind in ("literal_error", "greater_than_equal"):
        what += f", got {error['input']!r}"
    return ConfigError(f"{where}: {what}")


def _bound_error(loc: tuple[str, ...], value: Any) -> str | None:
    """Why the integer in the environment value ``value`` is refused for the setting at ``loc``
    ("must be positive"), or None when ``value`` is no integer (pydantic-settings reads a number
    first, then complains about the text when the number fails a bound)."""
    if not isinstance(value, str) or not value.strip().lstrip("+-").isdigit() or len(loc) != 2:
        return None
    section = Config.model_fields.get(loc[0])
    fields = getattr(section.annotation, "model_fields", {}) if section is not None else {}
    if loc[1] not in fields:
        return None
    try:
        TypeAdapter(fields[loc[1]].annotation).validate_python(int(value))
    except ValidationError as exc:
        kind = exc.errors()[0]["type"]
        return {"greater_than_equal": "must not be negative"}.get(kind, _TYPE_WORDS.get(kind))
    return None


def load_config(env: typing.Mapping[str, str] | None = None) -> Config:
    """Build the config from ``env`` (default: the process environment) and the TOML file."""
    environ: typing.Mapping[str, str] = os.environ if env is None else env
    translated, named = _environ(environ)
    token = _loading.set(translated)
    try:
        config = Config()
    except ValidationError as exc:
        raise _config_error(exc, named, translated) from None
    except SettingsError as exc:  # a GATEWAY_<SECTION>__<KEY> list or table that is not JSON
        raise ConfigError(f"environment: {exc}") from None
    finally:
        _loading.reset(token)
    # What the settings name by reference: MCP header credentials, the provider's search key.
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
    upstreams = []
    for index, entry in enumerate(config.upstreams):
        key = config.openai_api_key
        if entry.api_key_env:
            if entry.api_key_env not in environ:
                raise ConfigError(
                    f"upstreams[{index}].api_key_env: environment variable {entry.api_key_env} is not set"
                )
            key = SecretStr(environ[entry.api_key_env])
        upstreams.append(entry.model_copy(update={"api_key": key}))
    update["upstreams"] = tuple(upstreams)
    key_env = config.web_search.key_env
    if "WEB_SEARCH_API_KEY" not in environ and key_env and key_env in environ:
        update["web_search_api_key"] = SecretStr(environ[key_env])
    return config.model_copy(update=update)


def is_credential_header(name: str) -> bool:
    return any(word in name.lower() for word in _CREDENTIAL_HEADER_WORDS)


def is_loopback_host(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _is_http_url(url: str) -> bool:
    parts = urlsplit(url)
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def _strip_v1(url: str) -> str:
    base = url.rstrip("/")
    return base[: -len("/v1")] if base.endswith("/v1") else base


def _split_bases(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


def _validate(c: Config) -> None:
    """What no single value's type says: settings that only make sense together."""
    r, auth, inference = c.responses, c.auth, c.inference
    if r.heartbeat_s >= r.lease_s:
        raise ConfigError(
            f"responses.heartbeat_s ({r.heartbeat_s:g}) must be shorter than responses.lease_s "
            f"({r.lease_s:g}), or a live runner's lease would expire between two heartbeats"
        )
    if not c.usage.ledger:
        for name in ("tokens_per_minute", "tokens_per_day"):
            if getattr(c.quotas, name) is not None:
                raise ConfigError(
                    f"quotas.{name}: a token quota is charged from the usage ledger; "
                    "set usage.ledger = true or leave the token quotas unset"
                )
    if bool(auth.oidc_issuer) != bool(auth.oidc_audience):
        missing, present = (
            ("OIDC_AUDIENCE", "OIDC_ISSUER") if auth.oidc_issuer else ("OIDC_ISSUER", "OIDC_AUDIENCE")
        )
        raise ConfigError(f"{missing}: must be set together with {present} (set both or neither)")
    if auth.oidc_issuer:
        parts = urlsplit(auth.oidc_issuer)
        if not _is_http_url(auth.oidc_issuer):
            raise ConfigError(f"OIDC_ISSUER: not a URL: {auth.oidc_issuer!r}")
        if parts.scheme == "http" and not is_loopback_host(parts.hostname or ""):
            raise ConfigError("OIDC_ISSUER: must use https (plain http is allowed on loopback only)")
    if auth.oidc_rp_client_id:
        if not auth.oidc_issuer:
            raise ConfigError("OIDC_RP_CLIENT_ID: admin single sign-on needs OIDC_ISSUER and OIDC_AUDIENCE")
        if not c.oidc_rp_client_secret.get_secret_value():
            raise ConfigError("OIDC_RP_CLIENT_SECRET: must be set together with OIDC_RP_CLIENT_ID")
        if not (auth.admin_staff_value or auth.admin_superuser_value):
            raise ConfigError(
                "auth.admin_staff_value: admin single sign-on needs admin_staff_value or "
                "admin_superuser_value (the claim value that grants admin access)"
            )
    for name, url in (
        *(("LLM_API_BASE", base) for base in _split_bases(c.llm_api_base)),
        ("WEB_SEARCH_BASE_URL", c.web_search.base_url),
    ):
        if url and not _is_http_url(url):
            raise ConfigError(f"{name}: must be an http(s) URL, got {url!r}")
    if c.llm_api_base and c.upstreams:
        raise ConfigError("LLM_API_BASE: set it or [[upstreams]] in the config file, not both")
    bases = [entry.base for entry in c.upstream_entries]
    for base in {b for b in bases if bases.count(b) > 1}:
        raise ConfigError(f"upstreams: {base} is listed twice")
    if c.routing.backoff_max_s < c.routing.backoff_s:
        raise ConfigError("routing.backoff_max_s: must not be shorter than routing.backoff_s")
    header = c.routing.session_header
    if header and (not set(header) <= _LABEL_CHARS or is_credential_header(header)):
        raise ConfigError(f"routing.session_header: not a plain header name: {header!r}")
    scheme = urlsplit(c.database_url).scheme
    if c.database_url and scheme not in ("postgres", "postgresql", "sqlite"):
        raise ConfigError(f"DATABASE_URL: unsupported scheme {scheme!r} (use postgres://… or sqlite:///…)")
    if c.redis_url and urlsplit(c.redis_url).scheme not in ("redis", "rediss", "unix"):
        raise ConfigError(f"REDIS_URL: must be a redis:// URL, got {c.redis_url!r}")
    if not 0 < c.server.port < 65536:
        raise ConfigError(f"server.port: must be between 1 and 65535, got {c.server.port}")
    if c.database.pool_min_size > c.database.pool_max_size:
        raise ConfigError("database.pool_min_size: must not exceed database.pool_max_size")
    if inference.worker_lost_after_s <= inference.heartbeat_interval_s:
        raise ConfigError(
            "inference.worker_lost_after_s: must exceed inference.heartbeat_interval_s "
            "(a live worker would be declared lost between two heartbeats)"
        )
    if inference.enable_auto_tool_choice and not inference.tool_call_parser:
        raise ConfigError("inference.enable_auto_tool_choice: needs inference.tool_call_parser")
    if inference.override_generation_config:
        try:
            overrides = json.loads(inference.override_generation_config)
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


def otel_environ(env: typing.Mapping[str, str] | None = None) -> dict[str, str]:
    """The standard ``OTEL_*`` variables of ``env`` (default: the process environment), as
    :mod:`gateway.core.tracing` reads them to decide whether and how to trace. The OpenTelemetry SDK
    also reads its own finer settings (exporter headers, TLS files, batch sizes) from the process
    environment: that is the standard's configuration surface, not a second gateway config."""
    environ: typing.Mapping[str, str] = os.environ if env is None else env
    return {name: value for name, value in environ.items() if name.startswith("OTEL_")}


__all__ = ["Config", "ConfigError", "get_config", "load_config", "set_config"]
