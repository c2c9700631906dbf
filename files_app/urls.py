"""Routes of the Files and vector stores APIs, included by ``gateway.urls`` before the ``/v1`` catch-all."""

from django.urls import path

from files_app import search_api
from gateway.core.drf import async_view

urlpatterns: list = []

# Search (files_app.search_api), kept on its own line for merges.
urlpatterns += [
    path("v1/vector_stores/<str:vector_store_id>/search", async_view(search_api.VectorStoreSearchView))
]
