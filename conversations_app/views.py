"""The Conversations API (OpenAI-compatible): DRF views over services and selectors.

Each view is thin: DRF authenticates (the caller's principal, ``gateway.drf``) → a serializer
validates the body with our rules → a service or selector (filtered by the principal's owner: another
owner's id is a 404) → a serializer renders. ``gateway.drf.async_view`` serves each view as one
:func:`gateway.db.run_orm` call, so requests run side by side, never queued on one thread.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from conversations_app import schemas, selectors, serializers, services
from gateway.auth import require_stored_state_access
from gateway.drf import ListParams, ResourceView, list_body
from gateway.http import parse_json_body
from gateway.openapi import ERROR_RESPONSES

TAGS = ["Conversations"]
INCLUDE = OpenApiParameter(
    "include",
    OpenApiTypes.STR,
    many=True,
    enum=list(schemas.INCLUDABLE),
    description="Optional item members to include (``include=a&include=b``; ``include[]=`` too).",
)
CONVERSATION_ID = OpenApiParameter(
    "conversation_id", OpenApiTypes.STR, OpenApiParameter.PATH, pattern=r"^conv_[A-Za-z0-9_\-]*$"
)
ITEM_ID = OpenApiParameter("item_id", OpenApiTypes.STR, OpenApiParameter.PATH)


class ConversationsResource(ResourceView):
    def check_stored_state_access(self, request: Request) -> None:
        require_stored_state_access(request)  # the stored-state rule (gateway.auth)


def _include(request: Request) -> tuple[str, ...]:
    return schemas.validate_include(schemas.query_include(request.query_params))


class ConversationsView(ConversationsResource):
    @extend_schema(
        operation_id="conversations_create",
        tags=TAGS,
        request=serializers.ConversationCreateSerializer,
        responses={200: serializers.ConversationSerializer, **ERROR_RESPONSES},
        examples=[
            OpenApiExample(
                "A conversation with a first message",
                value={"items": [{"role": "user", "content": "Hello!"}], "metadata": {"topic": "demo"}},
                request_only=True,
            )
        ],
    )
    def post(self, request: Request) -> Response:
        """Create a conversation with up to 20 initial items, atomically."""
        body = serializers.ConversationCreateSerializer(data=parse_json_body(request))
        body.is_valid(raise_exception=True)
        conversation, _ = services.conversation_create(owner=self.owner, **body.validated_data)
        return Response(serializers.ConversationSerializer(conversation).data)


class ConversationDetailView(ConversationsResource):
    @extend_schema(
        operation_id="conversations_retrieve",
        tags=TAGS,
        parameters=[CONVERSATION_ID],
        responses={200: serializers.ConversationSerializer, **ERROR_RESPONSES},
    )
    def get(self, request: Request, conversation_id: str) -> Response:
        conversation = selectors.conversation_get(id=conversation_id, owner=self.owner)
        return Response(serializers.ConversationSerializer(conversation).data)

    @extend_schema(
        operation_id="conversations_update",
        tags=TAGS,
        parameters=[CONVERSATION_ID],
        request=serializers.ConversationUpdateSerializer,
        responses={200: serializers.ConversationSerializer, **ERROR_RESPONSES},
    )
    def post(self, request: Request, conversation_id: str) -> Response:
        """Replace the conversation's metadata."""
        selectors.check_conversation_id(conversation_id)
        body = serializers.ConversationUpdateSerializer(data=parse_json_body(request))
        body.is_valid(raise_exception=True)
        conversation = services.conversation_update(
            id=conversation_id, owner=self.owner, **body.validated_data
        )
        return Response(serializers.ConversationSerializer(conversation).data)

    @extend_schema(
        operation_id="conversations_delete",
        tags=TAGS,
        parameters=[CONVERSATION_ID],
        responses={200: serializers.ConversationDeletedSerializer, **ERROR_RESPONSES},
    )
    def delete(self, request: Request, conversation_id: str) -> Response:
        services.conversation_delete(id=conversation_id, owner=self.owner)
        return Response({"id": conversation_id, "object": "conversation.deleted", "deleted": True})


class ConversationItemsView(ConversationsResource):
    @extend_schema(
        operation_id="conversations_items_list",
        tags=TAGS,
        parameters=[CONVERSATION_ID, INCLUDE],
        responses={200: serializers.ItemSerializer(many=True), **ERROR_RESPONSES},
    )
    def get(self, request: Request, conversation_id: str) -> Response:
        """One keyset page of the conversation's items (``after`` an item id, ``order``, ``limit``)."""
        selectors.check_conversation_id(conversation_id)

        def page(params: ListParams) -> tuple[list[dict[str, Any]], bool]:
            include = _include(request)
            found = selectors.conversation_item_data_list(
                conversation_id=conversation_id,
                owner=self.owner,
                after=params.after,
                limit=params.limit,
                order=params.order,
            )
            items = serializers.ItemSerializer(found.items, many=True, context={"include": include})
            return items.data, found.has_more

        return self.paginate(page)

    @extend_schema(
        operation_id="conversations_items_create",
        tags=TAGS,
        parameters=[CONVERSATION_ID, INCLUDE],
        request=serializers.ItemsCreateSerializer,
        responses={200: serializers.ItemListSerializer, **ERROR_RESPONSES},
        examples=[
            OpenApiExample(
                "A user turn and the assistant's reply",
                value={
                    "items": [
                        {"type": "message", "role": "user", "content": "What is 2 + 2?"},
                        {"type": "message", "role": "assistant", "content": "4"},
                    ]
                },
                request_only=True,
            )
        ],
    )
    def post(self, request: Request, conversation_id: str) -> Response:
        """Append up to 20 items at the end of the conversation, atomically."""
        selectors.check_conversation_id(conversation_id)
        include = _include(request)
        body = serializers.ItemsCreateSerializer(data=parse_json_body(request))
        body.is_valid(raise_exception=True)
        stored = services.conversation_items_create(
            id=conversation_id, owner=self.owner, **body.validated_data
        )
        items = serializers.ItemSerializer(stored, many=True, context={"include": include})
        return Response(list_body(items.data, has_more=False))


class ConversationItemView(ConversationsResource):
    @extend_schema(
        operation_id="conversations_items_retrieve",
        tags=TAGS,
        parameters=[CONVERSATION_ID, ITEM_ID, INCLUDE],
        responses={200: serializers.ItemSerializer, **ERROR_RESPONSES},
    )
    def get(self, request: Request, conversation_id: str, item_id: str) -> Response:
        selectors.check_conversation_id(conversation_id)
        selectors.check_item_id(item_id)
        include = _include(request)
        conversation = selectors.conversation_get(id=conversation_id, owner=self.owner)
        item = selectors.conversation_item_get(conversation=conversation, item_id=item_id)
        return Response(serializers.ItemSerializer(item, context={"include": include}).data)

    @extend_schema(
        operation_id="conversations_items_delete",
        tags=TAGS,
        parameters=[CONVERSATION_ID, ITEM_ID],
        responses={200: serializers.ConversationSerializer, **ERROR_RESPONSES},
    )
    def delete(self, request: Request, conversation_id: str, item_id: str) -> Response:
        """Detach the item from the conversation; answers the conversation."""
        selectors.check_conversation_id(conversation_id)
        selectors.check_item_id(item_id)
        conversation = services.conversation_item_delete(
            id=conversation_id, owner=self.owner, item_id=item_id
        )
        return Response(serializers.ConversationSerializer(conversation).data)
