"""HTTP routes. Every unknown ``/v1/…`` path answers in the OpenAI envelope."""

from django.contrib import admin
from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularJSONAPIView, SpectacularSwaggerView

from gateway import views
from gateway.core.drf import async_view
from passthrough_app import catalog as models_catalog

urlpatterns = [
    path("", views.head_root),
    path("health", views.health),
    path("ready", views.ready),
    path("metrics", views.metrics),
    path("admin/", admin.site.urls),
    path("oidc/", include("mozilla_django_oidc.urls")),  # admin single sign-on
    # The OpenAPI document of /v1 (gateway.core.openapi) and a Swagger UI with bundled assets; public
    # like /health (gateway.core.auth.requires_auth).
    path("v1/openapi.json", async_view(SpectacularJSONAPIView), name="openapi"),
    path("docs/", async_view(SpectacularSwaggerView, url_name="openapi"), name="swagger-ui"),
    path("", include("responses_app.urls")),
    path("", include("conversations_app.urls")),
    path("", include("usage_app.urls")),
    path("", include("files_app.urls")),
    path("v1/models", models_catalog.models_list),
    # ``path`` matches ids with a slash (``meta-llama/Llama-3.1-8B-Instruct``), encoded or not.
    path("v1/models/<path:model>", models_catalog.model_retrieve),
    # The pass-through routes are served below Django (gateway.fastpath); their CORS preflights arrive here.
    re_path(r"^v1/.*$", views.unknown_route),
]

handler400 = "gateway.views.handler400"
handler403 = "gateway.views.handler403"
handler404 = "gateway.views.handler404"
handler500 = "gateway.views.handler500"
