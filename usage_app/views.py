"""OpenAI's Usage API over the ledger: ``GET /v1/organization/usage/completions`` and ``/embeddings``.

Thin DRF views (``gateway.core.drf``): the principal → the checked query (``schemas``) → one
aggregated read (``selectors.usage_page``) → OpenAI's page. docs/operations.md describes the API.
"""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from gateway.core.drf import ResourceView
from gateway.core.openapi import ERROR_RESPONSES
from usage_app import schemas, selectors

TAGS = ["Usage"]
PARAMETERS = [
    OpenApiParameter(
        "start_time",
        OpenApiTypes.INT,
        required=True,
        description="Start time (Unix seconds) of the query time range, inclusive.",
    ),
    OpenApiParameter(
        "end_time",
        OpenApiTypes.INT,
        description="End time (Unix seconds), exclusive; default: the end of the bucket in progress.",
    ),
    OpenApiParameter("bucket_width", OpenApiTypes.STR, enum=list(schemas.BUCKET_SECONDS), default="1d"),
    OpenApiParameter(
        "group_by",
        OpenApiTypes.STR,
        many=True,
        enum=list(schemas.GROUP_BY),
        description="Group by these fields (`group_by=model&group_by=api_key_id`; `group_by[]=` too).",
    ),
    OpenApiParameter("models", OpenApiTypes.STR, many=True, description="Only these models."),
    OpenApiParameter(
        "api_key_ids", OpenApiTypes.STR, many=True, description="Only these API keys (`key_<id>`)."
    ),
    OpenApiParameter(
        "limit",
        OpenApiTypes.INT,
        description="Buckets per page: `1d` default 7, at most 31; `1h` 24 and 168; `1m` 60 and 1440.",
    ),
    OpenApiParameter("page", OpenApiTypes.STR, description="The `next_page` of the previous answer."),
]


class UsageView(ResourceView):
    kind: str  # the ledger rows' kind this endpoint sums

    def usage(self, request: Request) -> Response:
        query = schemas.parse_usage_query(request.query_params)
        return Response(selectors.usage_page(query=query, kind=self.kind, principal=self.principal))


class UsageCompletionsView(UsageView):
    kind = "completions"

    @extend_schema(
        operation_id="usage_completions",
        tags=TAGS,
        parameters=PARAMETERS,
        responses={200: schemas.UsageCompletionsPage, **ERROR_RESPONSES},
    )
    def get(self, request: Request) -> Response:
        """Completions usage (chat/completions, completions, Responses rounds, Messages) in time
        buckets: the caller's own, or everyone's for an admin key or OIDC admin group."""
        return self.usage(request)


class UsageEmbeddingsView(UsageView):
    kind = "embeddings"

    @extend_schema(
        operation_id="usage_embeddings",
        tags=TAGS,
        parameters=PARAMETERS,
        responses={200: schemas.UsageEmbeddingsPage, **ERROR_RESPONSES},
    )
    def get(self, request: Request) -> Response:
        """Embeddings usage in time buckets (the caller's own, or everyone's for an admin)."""
        return self.usage(request)
