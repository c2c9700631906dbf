"""Routes of the Conversations API, included by ``gateway.urls`` before the ``/v1`` catch-all."""

from django.urls import path

from conversations_app import views

urlpatterns = [
    path("v1/conversations", views.conversations),
    path("v1/conversations/<str:conversation_id>", views.conversation_detail),
    path("v1/conversations/<str:conversation_id>/items", views.conversation_items),
    path("v1/conversations/<str:conversation_id>/items/<str:item_id>", views.conversation_item),
]
