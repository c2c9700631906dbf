"""The Conversations API (OpenAI-compatible): thin DRF views over services and selectors.

Principal (``gateway.core.drf``) → pydantic body (``schemas``) → service or selector filtered by
owner (another owner's id is a 404) → the answer in its model's shape. Each view runs as one
:func:`gateway.core.db.run_orm` call (``gateway.core.drf.async_view``).
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from conversations_app import schemas, selectors, services
from conversations_app.models import Conversation, Item
from gateway.core.auth import require_stored_state_access
from gateway.core.drf import LIST_PARAMETERS, ListPage, ListParams, ResourceView, list_body
from gateway.core.http import parse_json_body
from gateway.core.openapi import ERROR_RESPONSES

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


class ConversationItemList(ListPage[schemas.ConversationItem]):
    pass


def _conversation(row: Conversation) -> dict[str, Any]:
    return schemas.ConversationObject(
        id=row.id, created_at=int(row.created_at.timestamp()), metadata=row.metadata or {}
    ).model_dump()


def _items(rows: list[Item] | list[dict[str, Any]], include: tuple[str, ...]) -> list[dict[str, Any]]:
    """Items as the API returns them (a row, or its stored ``data`` as a page's selector reads it)."""
    return [schemas.render_item(row.data if isinstance(row, Item) else row, include) for row in rows]


class ConversationsResource(ResourceView):
    def check_stored_state_access(self, request: Request) -> None:
        require_stored_state_access(request)  # the stored-state rule (gateway.core.auth)


def _include(request: Request) -> tuple[str, ...]:
    return schemas.validate_include(schemas.query_include(request.query_params))


class ConversationsView(ConversationsResource):
    @extend_schema(
        operation_id="conversations_create",
        tags=TAGS,
        request=schemas.ConversationCreateParams,
        responses={200: schemas.ConversationObject, **ERROR_RESPONSES},
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
        body = schemas.ConversationCreateParams.parse(parse_json_body(request))
        conversation, _ = services.conversation_create(owner=self.owner, **body)
        return Response(_conversation(conversation))


class ConversationDetailView(ConversationsResource):
    @extend_schema(
        operation_id="conversations_retrieve",
        tags=TAGS,
        parameters=[CONVERSATION_ID],
        responses={200: schemas.ConversationObject, **ERROR_RESPONSES},
    )
    def get(self, request: Request, conversation_id: str) -> Response:
        conversation = selectors.conversation_get(id=conversation_id, owner=self.owner)
        return Response(_conversation(conversation))

    @extend_schema(
        operation_id="conversations_update",
        tags=TAGS,
        parameters=[CONVERSATION_ID],
        request=schemas.ConversationUpdateParams,
        responses={200: schemas.ConversationObject, **ERROR_RESPONSES},
    )
    def post(self, request: Request, conversation_id: str) -> Response:
        """Replace the conversation's metadata."""
        selectors.check_conversation_id(conversation_id)
        body = schemas.ConversationUpdateParams.parse(parse_json_body(request))
        conversation = services.conversation_update(id=conversation_id, owner=self.owner, **body)
        return Response(_conversation(conversation))

    @extend_schema(
        operation_id="conversations_delete",
        tags=TAGS,
        parameters=[CONVERSATION_ID],
        responses={200: schemas.ConversationDeleted, **ERROR_RESPONSES},
    )
    def delete(self, request: Request, conversation_id: str) -> Response:
        services.conversation_delete(id=conversation_id, owner=self.owner)
        return Response({"id": conversation_id, "object": "conversation.deleted", "deleted": True})


class ConversationItemsView(ConversationsResource):
    @extend_schema(
        operation_id="conversations_items_list",
        tags=TAGS,
        parameters=[CONVERSATION_ID, *LIST_PARAMETERS, INCLUDE],
        responses={200: ConversationItemList, **ERROR_RESPONSES},
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
            return _items(found.items, include), found.has_more

        return self.paginate(page)

    @extend_schema(
        operation_id="conversations_items_create",
        tags=TAGS,
        parameters=[CONVERSATION_ID, INCLUDE],
        request=schemas.ItemCreateParams,
        responses={200: ConversationItemList, **ERROR_RESPONSES},
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
        body = schemas.ItemCreateParams.parse(parse_json_body(request))
        stored = services.conversation_items_create(id=conversation_id, owner=self.owner, **body)
        return Response(list_body(_items(stored, include), has_more=False))


class ConversationItemView(ConversationsResource):
    @extend_schema(
        operation_id="conversations_items_retrieve",
        tags=TAGS,
        parameters=[CONVERSATION_ID, ITEM_ID, INCLUDE],
        responses={200: schemas.ConversationItem, **ERROR_RESPONSES},
    )
    def get(self, request: Request, conversation_id: str, item_id: str) -> Response:
        selectors.check_conversation_id(conversation_id)
        selectors.check_item_id(item_id)
        include = _include(request)
        conversation = selectors.conversation_get(id=conversation_id, owner=self.owner)
        item = selectors.conversation_item_get(conversation=conversation, item_id=item_id)
        return Response(schemas.render_item(item.data, include))

    @extend_schema(
        operation_id="conversations_items_delete",
        tags=TAGS,
        parameters=[CONVERSATION_ID, ITEM_ID],
        responses={200: schemas.ConversationObject, **ERROR_RESPONSES},
    )
    def delete(self, request: Request, conversation_id: str, item_id: str) -> Response:
        """Detach the item from the conversation; answers the conversation."""
        selectors.check_conversation_id(conversation_id)
        selectors.check_item_id(item_id)
        conversation = services.conversation_item_delete(
            id=conversation_id, owner=self.owner, item_id=item_id
        )
        return Response(_conversation(conversation))
