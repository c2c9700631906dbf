"""Routes of the Conversations API, included by ``gateway.urls`` before the ``/v1`` catch-all."""

from django.urls import path

from conversations_app import views
from gateway.core.drf import async_view

urlpatterns = [
    path("v1/conversations", async_view(views.ConversationsView)),
    path("v1/conversations/<str:conversation_id>", async_view(views.ConversationDetailView)),
    path("v1/conversations/<str:conversation_id>/items", async_view(views.ConversationItemsView)),
    path(
        "v1/conversations/<str:conversation_id>/items/<str:item_id>", async_view(views.ConversationItemView)
    ),
]
