"""Routes of the Conversations API, included by ``gateway.urls`` before the ``/v1`` catch-all."""

from typing import Any, cast

from django.urls import path

from conversations_app import views

# django-stubs types view callables as sync; these are async views, which Django supports.
urlpatterns = [
    path("v1/conversations", cast(Any, views.conversations)),
    path("v1/conversations/<str:conversation_id>", cast(Any, views.conversation_detail)),
    path("v1/conversations/<str:conversation_id>/items", cast(Any, views.conversation_items)),
    path("v1/conversations/<str:conversation_id>/items/<str:item_id>", cast(Any, views.conversation_item)),
]
