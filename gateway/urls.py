"""HTTP routes. Every unknown ``/v1/…`` path answers in the OpenAI envelope."""

from django.contrib import admin
from django.urls import include, path, re_path

from gateway import views

urlpatterns = [
    path("", views.head_root),
    path("health", views.health),
    path("ready", views.ready),
    path("metrics", views.metrics),
    path("admin/", admin.site.urls),
    path("oidc/", include("mozilla_django_oidc.urls")),  # admin single sign-on
    path("", include("responses_app.urls")),
    path("", include("conversations_app.urls")),
    re_path(r"^v1/.*$", views.unknown_route),
]

handler400 = "gateway.views.handler400"
handler403 = "gateway.views.handler403"
handler404 = "gateway.views.handler404"
handler500 = "gateway.views.handler500"
