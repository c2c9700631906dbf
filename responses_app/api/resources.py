"""The stored-response resource endpoints as DRF views: retrieve, delete, input items, cancel.

Owner-filtered (another owner's id is a 404), each served as one :func:`gateway.core.db.run_orm`
call. ``GET …?stream=true`` replays a background response's stored events as SSE.
"""

from __future__ import annotations

from typing import Any, Literal

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from pydantic import BaseModel, ConfigDict
from rest_framework.request import Request
from rest_framework.response import Response

from gateway.core import errors
from gateway.core.drf import LIST_PARAMETERS, ListPage, ListParams, ResourceView, on_loop
from gateway.core.openapi import ERROR_RESPONSES, sdk_ref
from responses_app import tasks
from responses_app.api.views import sse_tail
from responses_app.engine.tool_loop import RESULTS_INCLUDE, public_item
from responses_app.storage import selectors, services

TAGS = ["Responses"]
RESPONSE_ID = OpenApiParameter("response_id", OpenApiTypes.STR, OpenApiParameter.PATH)
RESPONSE = sdk_ref("openai_Response")  # openai.types.responses.Response (gateway.core.openapi)


class ResponseDeleted(BaseModel):
    id: str
    object: Literal["response"]
    deleted: bool


class ResponseInputItem(BaseModel):
    """A stored input item as the API returns it (``public_item``: the gateway's members removed)."""

    model_config = ConfigDict(extra="allow")

    id: str
    type: str


class ResponseInputItemList(ListPage[ResponseInputItem]):
    pass


def _int_param(request: Request, name: str, *, default: int, minimum: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise errors.BadRequest(
            f"Invalid type for '{name}': expected an integer, but got a string instead.",
            param=name,
            code="invalid_type",
        ) from None
    if value < minimum:
        raise errors.BadRequest(
            f"Invalid '{name}': integer below minimum value. Expected a value >= {minimum}, "
            f"but got {value} instead.",
            param=name,
            code="integer_below_min_value",
        )
    return value


class ResponseDetailView(ResourceView):
    @extend_schema(
        operation_id="responses_retrieve",
        tags=TAGS,
        parameters=[
            RESPONSE_ID,
            OpenApiParameter(
                "stream",
                OpenApiTypes.BOOL,
                description="Replay a background response's events as server-sent events.",
            ),
            OpenApiParameter(
                "starting_after",
                OpenApiTypes.INT,
                description="With `stream`: the sequence number to replay after (-1: from the start).",
            ),
            OpenApiParameter(
                "include",
                OpenApiTypes.STR,
                many=True,
                description="Optional output members to include: `file_search_call.results` "
                "(``include=a&include=b``; ``include[]=`` too).",
            ),
        ],
        responses={
            (200, "application/json"): RESPONSE,
            (200, "text/event-stream"): OpenApiResponse(OpenApiTypes.STR, description="Server-sent events."),
            **{(status, "application/json"): answer for status, answer in ERROR_RESPONSES.items()},
        },
    )
    def get(self, request: Request, response_id: str) -> Any:
        errors.refuse_nul(response_id, "response_id")
        response = selectors.response_get(id=response_id, owner=self.owner)
        if request.query_params.get("stream") in ("true", "1", "True"):
            if not response.background:
                raise errors.BadRequest(
                    "This response cannot be streamed because it was not created with background=true.",
                    param="stream",
                    code="invalid_request",
                )
            starting_after = _int_param(request, "starting_after", default=-1, minimum=-1)
            return sse_tail(response.id, starting_after)
        if response.snapshot is None:
            raise errors.Conflict(
                f"Response with id '{response_id}' has no stored snapshot to return.",
                code="response_snapshot_unavailable",
            )
        include = [*request.query_params.getlist("include"), *request.query_params.getlist("include[]")]
        return Response(
            selectors.snapshot_file_search_results(
                snapshot=response.snapshot, owner=self.owner, include=RESULTS_INCLUDE in include
            )
        )

    @extend_schema(
        operation_id="responses_delete",
        tags=TAGS,
        parameters=[RESPONSE_ID],
        responses={200: ResponseDeleted, **ERROR_RESPONSES},
    )
    def delete(self, request: Request, response_id: str) -> Response:
        errors.refuse_nul(response_id, "response_id")
        services.response_delete(id=response_id, owner=self.owner)
        return Response({"id": response_id, "object": "response", "deleted": True})


class ResponseInputItemsView(ResourceView):
    @extend_schema(
        operation_id="responses_input_items_list",
        tags=TAGS,
        parameters=[RESPONSE_ID, *LIST_PARAMETERS],
        responses={200: ResponseInputItemList, **ERROR_RESPONSES},
    )
    def get(self, request: Request, response_id: str) -> Response:
        """A page of the input items the response was created with."""
        errors.refuse_nul(response_id, "response_id")

        def page(params: ListParams) -> tuple[list[dict[str, Any]], bool]:
            response = selectors.response_get(id=response_id, owner=self.owner)
            data, has_more = selectors.response_input_items(
                response=response, after=params.after, limit=params.limit, order=params.order
            )
            return [public_item(item) for item in data], has_more

        return self.paginate(page)


class ResponseCancelView(ResourceView):
    @extend_schema(
        operation_id="responses_cancel",
        tags=TAGS,
        parameters=[RESPONSE_ID],
        request=None,
        responses={200: RESPONSE, **ERROR_RESPONSES},
    )
    def post(self, request: Request, response_id: str) -> Response:
        """Cancel a background response (queued or in progress)."""
        errors.refuse_nul(response_id, "response_id")
        snapshot = services.response_cancel(id=response_id, owner=self.owner)

        async def cancel() -> None:  # the local task belongs to the event loop
            tasks.cancel_local(response_id)

        on_loop(cancel)
        return Response(snapshot)
