"""Routes of OpenAI's Usage API, included by ``gateway.urls`` before the ``/v1`` catch-all."""

from django.urls import path

from gateway.core.drf import async_view
from usage_app import views

urlpatterns = [
    path("v1/organization/usage/completions", async_view(views.UsageCompletionsView)),
    path("v1/organization/usage/embeddings", async_view(views.UsageEmbeddingsView)),
]
