"""Routes of the Responses API (included by ``gateway/urls.py`` before the ``/v1`` catch-all).

The views are async (``allow_methods`` types them as returning an awaitable), which django-stubs'
``path`` signature does not model; hence the ignores.
"""

from django.urls import path

from responses_app import views

urlpatterns = [
    path("v1/responses", views.responses_create),  # type: ignore[arg-type]
    path("v1/responses/input_tokens", views.response_input_tokens),  # type: ignore[arg-type]
    path("v1/responses/compact", views.response_compact),  # type: ignore[arg-type]
    path("v1/responses/<str:response_id>", views.response_detail),  # type: ignore[arg-type]
    path("v1/responses/<str:response_id>/input_items", views.response_input_items),  # type: ignore[arg-type]
    path("v1/responses/<str:response_id>/cancel", views.response_cancel),  # type: ignore[arg-type]
]
