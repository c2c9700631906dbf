"""DRF serializers of the Conversations API.

Input serializers validate with the rules in ``conversations_app.schemas`` (their errors are OpenAI's
400 envelopes with exact ``param`` and ``code``: DRF's own field errors are never produced); the
declared fields describe the same rules for the OpenAPI document. Output serializers render stored
rows in OpenAI's shapes.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from conversations_app import schemas
from conversations_app.models import Conversation, Item
from gateway import errors

INPUT_ITEM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "A Responses input item: a message (``{role, content}``), a function call, its "
    "output, a reasoning item, an item reference …",
    "additionalProperties": True,
}
ITEM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["id", "type"],
    "properties": {"id": {"type": "string"}, "type": {"type": "string"}},
    "additionalProperties": True,
}
METADATA_SCHEMA: dict[str, Any] = {
    "type": "object",
    "nullable": True,
    "maxProperties": schemas.METADATA_MAX_PAIRS,
    "additionalProperties": {"type": "string", "maxLength": schemas.METADATA_MAX_VALUE_LENGTH},
    "description": "Up to 16 pairs; keys up to 64 characters, values up to 512.",
}


@extend_schema_field(INPUT_ITEM_SCHEMA)
class InputItemField(serializers.JSONField):
    pass


@extend_schema_field(ITEM_SCHEMA)
class ItemField(serializers.JSONField):
    pass


@extend_schema_field(METADATA_SCHEMA)
class MetadataField(serializers.JSONField):
    pass


def reject_unknown(data: Any, allowed: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise errors.BadRequest("The request body must be a JSON object.", code="invalid_json")
    for key in data:
        if key not in allowed:
            raise errors.BadRequest(f"Unknown parameter: '{key}'.", param=key, code="unknown_parameter")
    return data


class GatewayInputSerializer(serializers.Serializer[Any]):
    """Validates by :meth:`validate_body` (our rules, our errors) instead of DRF's field errors."""

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        return self.validate_body(reject_unknown(data, tuple(self.fields)))

    def validate_body(self, data: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError


class ConversationCreateSerializer(GatewayInputSerializer):
    items = serializers.ListField(
        child=InputItemField(), required=False, allow_null=True, max_length=schemas.MAX_ITEMS_PER_REQUEST
    )
    metadata = MetadataField(required=False)

    def validate_body(self, data: dict[str, Any]) -> dict[str, Any]:
        return {
            "items": schemas.validate_items(data.get("items"), required=False),
            "metadata": schemas.validate_metadata(data.get("metadata")),
        }


class ConversationUpdateSerializer(GatewayInputSerializer):
    metadata = MetadataField(required=True)

    def validate_body(self, data: dict[str, Any]) -> dict[str, Any]:
        if "metadata" not in data:
            raise schemas.missing_parameter("metadata")
        return {"metadata": schemas.validate_metadata(data["metadata"])}


class ItemsCreateSerializer(GatewayInputSerializer):
    items = serializers.ListField(
        child=InputItemField(), min_length=1, max_length=schemas.MAX_ITEMS_PER_REQUEST
    )

    def validate_body(self, data: dict[str, Any]) -> dict[str, Any]:
        return {"items": schemas.validate_items(data.get("items"), required=True)}


class ConversationSerializer(serializers.Serializer[Conversation]):
    id = serializers.CharField()
    object = serializers.ChoiceField(choices=["conversation"])
    created_at = serializers.IntegerField(help_text="Unix seconds.")
    metadata = serializers.DictField(child=serializers.CharField())

    def to_representation(self, instance: Conversation) -> dict[str, Any]:
        return {
            "id": instance.id,
            "object": "conversation",
            "created_at": int(instance.created_at.timestamp()),
            "metadata": instance.metadata or {},
        }


class ConversationDeletedSerializer(serializers.Serializer[Any]):
    id = serializers.CharField()
    object = serializers.ChoiceField(choices=["conversation.deleted"])
    deleted = serializers.BooleanField()


class ItemSerializer(serializers.Serializer[Item | dict[str, Any]]):
    """An item as the API returns it (its type's own members besides these); ``include`` (the
    view's context) adds optional members. The instance is an :class:`Item` or its stored ``data``
    (a page read by ``selectors.conversation_item_data_list``)."""

    id = serializers.CharField()
    type = serializers.CharField()

    def to_representation(self, instance: Item | dict[str, Any]) -> dict[str, Any]:
        data = instance.data if isinstance(instance, Item) else instance
        return schemas.render_item(data, self.context.get("include", ()))


class ItemListSerializer(serializers.Serializer[Any]):
    object = serializers.ChoiceField(choices=["list"])
    data = serializers.ListField(child=ItemField())
    first_id = serializers.CharField(allow_null=True)
    last_id = serializers.CharField(allow_null=True)
    has_more = serializers.BooleanField()
