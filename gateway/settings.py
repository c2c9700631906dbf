"""Django settings, derived from the one typed config object (``gateway.core.config``)."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import dj_database_url

from gateway.core.config import get_config

CONFIG = get_config()

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = (BASE_DIR / CONFIG.server.data_dir).resolve()
DATA_DIR.mkdir(parents=True, exist_ok=True)


def _secret_key() -> str:
    """The configured secret, or one generated once and kept in the data directory."""
    if configured := CONFIG.secret_key.get_secret_value():
        return configured
    path = DATA_DIR / "secret_key"
    if not path.exists():
        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()


SECRET_KEY = _secret_key()
DEBUG = CONFIG.server.debug
ALLOWED_HOSTS = ["*"]

# daphne is not an app here: `manage.py serve --server daphne` runs its server directly, and as an app
# it would load twisted and autobahn into every process (25 MiB) for the sake of `runserver`.
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "corsheaders",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI's assets, served from /static/ (no CDN)
    "mozilla_django_oidc",
    "gateway.core",
    "gateway",
    "usage_app",
    "inference_app",
    "files_app",
    "conversations_app",
    "responses_app",
    "passthrough_app",
    "messages_app",
]

# Every middleware is async-capable (streams stay unbuffered under ASGI); the Site* ones run for the
# admin, its SSO and static files only.
MIDDLEWARE = [
    "corsheaders.middleware.CorsMiddleware",
    "gateway.site_middleware.SiteSecurityMiddleware",
    "gateway.site_middleware.SiteSessionMiddleware",
    "gateway.site_middleware.SiteCsrfViewMiddleware",
    "gateway.site_middleware.SiteAuthenticationMiddleware",
    "gateway.site_middleware.SiteMessageMiddleware",
    "gateway.site_middleware.SiteXFrameOptionsMiddleware",
    "gateway.core.auth.middleware.AuthMiddleware",
    "gateway.core.middleware.GatewayErrorMiddleware",
]


ROOT_URLCONF = "gateway.urls"
ASGI_APPLICATION = "gateway.asgi.application"
APPEND_SLASH = False

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]


def _databases() -> dict[str, Any]:
    url = CONFIG.database_url
    if not url:
        return {
            "default": {
                "ENGINE": "django.db.backends.sqlite3",
                "NAME": str(DATA_DIR / "gateway.sqlite3"),
                # Keep each worker thread's connection: reopening costs the PRAGMAs every time.
                "CONN_MAX_AGE": None,
                "OPTIONS": {
                    "timeout": 20,
                    "transaction_mode": "IMMEDIATE",
                    # WAL: readers never wait for the writer, and a commit is one append
                    # (synchronous=NORMAL stays crash-safe in WAL mode).
                    "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
                },
                # Tests use a file too: on Django's shared-cache memory database concurrent
                # writers fail at once instead of waiting.
                "TEST": {"NAME": str(DATA_DIR / "test_gateway.sqlite3")},
            }
        }
    db = dj_database_url.parse(url)
    if db["ENGINE"] == "django.db.backends.postgresql":
        db["CONN_MAX_AGE"] = 0  # the pool owns connection lifetime
        # With a pool each connection is checked before it is handed out: no dead one after a restart.
        db["CONN_HEALTH_CHECKS"] = True
        db["OPTIONS"] = {
            "pool": {
                "min_size": CONFIG.database.pool_min_size,
                "max_size": CONFIG.database.pool_max_size,
                "timeout": 10,
            },
            "options": f"-c statement_timeout={CONFIG.database.statement_timeout_ms}",
            # Server-side binding, and statements prepared from their fifth run on (psycopg's
            # prepare_threshold; Django's default is never): less PostgreSQL CPU (docs/performance.md).
            "server_side_binding": True,
            "prepare_threshold": 5 if CONFIG.database.prepared_statements else None,
        }
    return {"default": db}


DATABASES = _databases()
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
AUTHENTICATION_BACKENDS = [
    "django.contrib.auth.backends.ModelBackend",
    # Admin single sign-on; inert unless OIDC_ISSUER + OIDC_RP_CLIENT_ID/SECRET are configured.
    "gateway.core.auth.admin_sso.GatewayOIDCBackend",
]
# mozilla-django-oidc: endpoints, client id and secret come from the gateway config and the issuer's
# discovery document (gateway/core/auth/admin_sso.py), not from settings.
OIDC_AUTHENTICATE_CLASS = "gateway.core.auth.admin_sso.SsoAuthenticateView"
OIDC_USE_PKCE = True
OIDC_TIMEOUT = CONFIG.auth.http_timeout_s
LOGIN_REDIRECT_URL = "/admin/"
LOGIN_REDIRECT_URL_FAILURE = "/admin/login/?sso=failed"
LOGOUT_REDIRECT_URL = "/admin/login/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = DATA_DIR / "static"

# "files": the Files API's bytes (files_app), on local disk or any Django storage backend.
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    "files": {
        "BACKEND": CONFIG.files.storage_backend or "django.core.files.storage.FileSystemStorage",
        "OPTIONS": dict(CONFIG.files.storage_options)
        if CONFIG.files.storage_backend
        else {"location": str((BASE_DIR / (CONFIG.files.directory or str(DATA_DIR / "files"))).resolve())},
    },
}

# The ASGI layer enforces the request-body ceiling; Django's own in-memory cap would refuse
# large audio uploads with a 400 of its own.
DATA_UPLOAD_MAX_MEMORY_SIZE = None
DATA_UPLOAD_MAX_NUMBER_FIELDS = None
FILE_UPLOAD_MAX_MEMORY_SIZE = 1024 * 1024

# CORS applies to the API only; the admin is same-origin.
CORS_ALLOWED_ORIGINS = list(CONFIG.server.cors_allowed_origins)
CORS_URLS_REGEX = r"^/v1/.*$"
CORS_ALLOW_HEADERS = [
    "accept",
    "authorization",
    "content-type",
    "openai-beta",
    "openai-organization",
    "openai-project",
    "x-api-key",
    "x-request-id",
    "anthropic-version",
    "anthropic-beta",
    "x-stainless-os",
    "x-stainless-lang",
    "x-stainless-package-version",
    "x-stainless-runtime",
    "x-stainless-runtime-version",
    "x-stainless-arch",
    "x-stainless-retry-count",
    "x-stainless-timeout",
]
CORS_EXPOSE_HEADERS = ["x-request-id", "request-id"]

if CONFIG.redis_url:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [CONFIG.redis_url]},
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [],
    "DEFAULT_PERMISSION_CLASSES": [],
    "UNAUTHENTICATED_USER": None,
    "EXCEPTION_HANDLER": "gateway.core.drf.exception_handler",
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
}

# The OpenAPI document (gateway/core/openapi.py): DRF views by drf-spectacular, lean routes by the hook.
SPECTACULAR_SETTINGS = {
    "TITLE": "Agentic API gateway",
    "DESCRIPTION": "OpenAI Responses, Conversations, pass-through and Anthropic Messages APIs "
    "in front of vLLM. `POST /v1/responses` also speaks WebSocket on the same path.",
    "VERSION": "1",
    "OAS_VERSION": "3.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_PUBLIC": True,
    "SERVE_AUTHENTICATION": [],
    "SERVE_PERMISSIONS": [],
    "SCHEMA_PATH_PREFIX": r"/v1",
    "COMPONENT_SPLIT_REQUEST": True,
    "POSTPROCESSING_HOOKS": ["gateway.core.openapi.add_lean_routes"],  # enums stay inline
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"request_id": {"()": "gateway.core.logging.RequestIdFilter"}},
    "handlers": {
        "console": {
            "()": "gateway.core.logging.QueuedConsoleHandler",
            "format": CONFIG.server.log_format,
            "filters": ["request_id"],
        }
    },
    "root": {"handlers": ["console"], "level": CONFIG.server.log_level.upper()},
    "loggers": {
        "django.request": {"level": "ERROR"},
        "daphne": {"level": "WARNING"},
        "gateway.access": {"level": "INFO" if CONFIG.server.access_log else "WARNING"},
    },
}

SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = False
