"""Routes of the Responses API (included before the ``/v1`` catch-all): lean async views
(``views``) and the DRF resources (``resources``). django-stubs' ``path`` does not model async views,
hence the ignores."""

from django.urls import path

from gateway.core.drf import async_view
from responses_app.api import resources, views

urlpatterns = [
    path("v1/responses", views.responses_create),  # type: ignore[arg-type]
    path("v1/responses/input_tokens", views.response_input_tokens),  # type: ignore[arg-type]
    path("v1/responses/compact", views.response_compact),  # type: ignore[arg-type]
    path("v1/responses/<str:response_id>", async_view(resources.ResponseDetailView)),
    path("v1/responses/<str:response_id>/input_items", async_view(resources.ResponseInputItemsView)),
    path("v1/responses/<str:response_id>/cancel", async_view(resources.ResponseCancelView)),
]
