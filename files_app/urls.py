"""Routes of the Files and vector stores APIs, included by ``gateway.urls`` before the ``/v1`` catch-all."""

from django.urls import path

from files_app import search_api, views
from gateway.core.drf import async_view

urlpatterns: list = [
    path("v1/files", async_view(views.FilesView)),
    path("v1/files/<str:file_id>", async_view(views.FileDetailView)),
    path("v1/files/<str:file_id>/content", async_view(views.FileContentView)),
    path("v1/vector_stores", async_view(views.VectorStoresView)),
    path("v1/vector_stores/<str:vector_store_id>", async_view(views.VectorStoreDetailView)),
    path("v1/vector_stores/<str:vector_store_id>/files", async_view(views.VectorStoreFilesView)),
    path(
        "v1/vector_stores/<str:vector_store_id>/files/<str:file_id>",
        async_view(views.VectorStoreFileDetailView),
    ),
    path(
        "v1/vector_stores/<str:vector_store_id>/files/<str:file_id>/content",
        async_view(views.VectorStoreFileContentView),
    ),
    path("v1/vector_stores/<str:vector_store_id>/file_batches", async_view(views.FileBatchesView)),
    path(
        "v1/vector_stores/<str:vector_store_id>/file_batches/<str:batch_id>",
        async_view(views.FileBatchDetailView),
    ),
    path(
        "v1/vector_stores/<str:vector_store_id>/file_batches/<str:batch_id>/cancel",
        async_view(views.FileBatchCancelView),
    ),
    path(
        "v1/vector_stores/<str:vector_store_id>/file_batches/<str:batch_id>/files",
        async_view(views.FileBatchFilesView),
    ),
]

# Search (files_app.search_api), kept on its own line for merges.
urlpatterns += [
    path("v1/vector_stores/<str:vector_store_id>/search", async_view(search_api.VectorStoreSearchView))
]
