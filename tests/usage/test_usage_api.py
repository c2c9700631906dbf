"""OpenAI's Usage API over the ledger (``usage_app``): buckets, grouping, filters, pagination, both
list-parameter forms, scoping (own rows, admin key, OIDC admin group) and every refusal, with
exact sums over rows inserted at known times; then through the official SDK."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import openai
import pytest
from django.test import Client

from gateway.core.auth import apikeys
from gateway.core.models import ApiKey
from tests.core.auth.auth_helpers import bearer
from tests.servers import LiveServer
from usage_app.models import UsageRecord

pytestmark = pytest.mark.django_db(transaction=True)

COMPLETIONS = "/v1/organization/usage/completions"
EMBEDDINGS = "/v1/organization/usage/embeddings"
T0 = 1767225600  # 2026-01-01T00:00:00Z
DAY, HOUR, MINUTE = 86400, 3600, 60


def row(
    owner: ApiKey | str,
    at: int,
    *,
    model: str = "m1",
    kind: str = "completions",
    tokens: tuple[int | None, int | None, int | None] = (None, None, None),
) -> UsageRecord:
    """A ledger row at ``at`` (Unix seconds) for a key (its owner and id) or a bare owner."""
    key_id = owner.pk if isinstance(owner, ApiKey) else None
    return UsageRecord(
        created_at=datetime.fromtimestamp(at, UTC),
        owner=owner.owner if isinstance(owner, ApiKey) else owner,
        api_key_id=key_id,
        route="/v1/embeddings" if kind == "embeddings" else "/v1/chat/completions",
        kind=kind,
        model=model,
        input_tokens=tokens[0],
        output_tokens=tokens[1],
        cached_tokens=tokens[2],
        status=200,
        latency_ms=5,
    )


def insert(*rows: UsageRecord) -> None:
    UsageRecord.objects.bulk_create(rows)


def usage(secret: str, path: str = COMPLETIONS, query: Any = None, **params: Any) -> Any:
    """GET the Usage API as the holder of ``secret``; ``query``: a raw query string or a list of pairs."""
    if isinstance(query, str):
        return Client().get(f"{path}?{query}", headers=bearer(secret))
    return Client().get(path, query or params, headers=bearer(secret))


def ok(response: Any) -> dict[str, Any]:
    assert response.status_code == 200, response.content
    body: dict[str, Any] = response.json()
    return body


def result(
    inp: int,
    out: int,
    cached: int,
    requests: int,
    *,
    model: str | None = None,
    api_key_id: str | None = None,
) -> dict[str, Any]:
    return {
        "object": "organization.usage.completions.result",
        "input_tokens": inp,
        "output_tokens": out,
        "input_cached_tokens": cached,
        "input_audio_tokens": 0,
        "output_audio_tokens": 0,
        "num_model_requests": requests,
        "project_id": None,
        "user_id": None,
        "api_key_id": api_key_id,
        "model": model,
        "batch": None,
        "service_tier": None,
    }


def bucket(start: int, end: int, *results: dict[str, Any]) -> dict[str, Any]:
    return {"object": "bucket", "start_time": start, "end_time": end, "results": list(results)}


def public_id(key: ApiKey) -> str:
    return f"key_{key.pk}"


@pytest.fixture
def keys() -> dict[str, tuple[ApiKey, str]]:
    """Two ordinary keys and an admin key: name -> (row, secret)."""
    made = {name: apikeys.apikey_create(name=name) for name in ("alice", "bob")}
    made["root"] = apikeys.apikey_create(name="root", is_admin=True)
    return made


# -- buckets ---------------------------------------------------------------------------------------


def test_daily_buckets_sum_exactly_count_unreported_tokens_as_zero_and_include_empty_days(
    keys: dict[str, tuple[ApiKey, str]],
) -> None:
    alice, secret = keys["alice"]
    bob, _ = keys["bob"]
    insert(
        row(alice, T0 + HOUR, tokens=(10, 5, 2)),
        row(alice, T0 + 2 * HOUR, tokens=(30, 7, None)),
        row(alice, T0 + DAY + 5, tokens=(None, None, None)),  # counted, with 0 tokens
        row(alice, T0 + 3 * DAY + 59, model="m2", tokens=(7, 3, 1)),
        row(alice, T0 + 4 * DAY, tokens=(1000, 1000, 0)),  # end_time is exclusive
        row(alice, T0 - 1, tokens=(1000, 1000, 0)),  # before start_time
        row(alice, T0 + 100, kind="embeddings", tokens=(1000, None, None)),  # another endpoint
        row(alice, T0 + 100, kind="other", tokens=(1000, 1000, None)),  # count_tokens, audio
        row(bob, T0 + 100, tokens=(1000, 1000, 0)),  # another principal
    )
    body = ok(usage(secret, start_time=T0, end_time=T0 + 4 * DAY))
    assert body == {
        "object": "page",
        "data": [
            bucket(T0, T0 + DAY, result(40, 12, 2, 2)),
            bucket(T0 + DAY, T0 + 2 * DAY, result(0, 0, 0, 1)),
            bucket(T0 + 2 * DAY, T0 + 3 * DAY),
            bucket(T0 + 3 * DAY, T0 + 4 * DAY, result(7, 3, 1, 1)),
        ],
        "has_more": False,
        "next_page": None,
    }


def test_hour_and_minute_buckets_are_clipped_to_an_unaligned_range(
    keys: dict[str, tuple[ApiKey, str]],
) -> None:
    alice, secret = keys["alice"]
    insert(
        row(alice, T0 + 600, tokens=(1, 1, 0)),  # before start_time, in the first hour
        row(alice, T0 + 1800, tokens=(2, 0, 0)),
        row(alice, T0 + 3 * HOUR + 599, tokens=(4, 0, 0)),
        row(alice, T0 + 3 * HOUR + 600, tokens=(8, 0, 0)),  # at end_time: excluded
    )
    body = ok(usage(secret, start_time=T0 + 1800, end_time=T0 + 3 * HOUR + 600, bucket_width="1h"))
    assert body["data"] == [
        bucket(T0 + 1800, T0 + HOUR, result(2, 0, 0, 1)),
        bucket(T0 + HOUR, T0 + 2 * HOUR),
        bucket(T0 + 2 * HOUR, T0 + 3 * HOUR),
        bucket(T0 + 3 * HOUR, T0 + 3 * HOUR + 600, result(4, 0, 0, 1)),
    ]
    body = ok(usage(secret, start_time=T0 + 1800, end_time=T0 + 1800 + 3 * MINUTE, bucket_width="1m"))
    assert body["data"] == [
        bucket(T0 + 1800, T0 + 1860, result(2, 0, 0, 1)),
        bucket(T0 + 1860, T0 + 1920),
        bucket(T0 + 1920, T0 + 1980),
    ]


def test_without_end_time_buckets_run_to_the_end_of_the_bucket_in_progress(
    keys: dict[str, tuple[ApiKey, str]],
) -> None:
    alice, secret = keys["alice"]
    now = int(datetime.now(UTC).timestamp())
    insert(row(alice, now - 5, tokens=(3, 4, 0)))
    body = ok(usage(secret, start_time=now - 2 * DAY))
    assert len(body["data"]) == 3 and body["has_more"] is False
    assert body["data"][0]["start_time"] == now - 2 * DAY
    assert body["data"][-1]["end_time"] == (now // DAY + 1) * DAY
    assert body["data"][-1]["results"] == [result(3, 4, 0, 1)]
    last = ok(usage(secret, start_time=253402300000, bucket_width="1h"))["data"]  # the year 9999's end
    assert last == [bucket(253402300000, 253402300799)]


# -- grouping and filters --------------------------------------------------------------------------


@pytest.fixture
def traffic(keys: dict[str, tuple[ApiKey, str]]) -> dict[str, tuple[ApiKey, str]]:
    """A day of traffic: alice on m1 and m2, bob on m1, and a call without a key (the admin sees all)."""
    alice, bob = keys["alice"][0], keys["bob"][0]
    insert(
        row(alice, T0 + 10, model="m1", tokens=(1, 2, 0)),
        row(alice, T0 + 20, model="m1", tokens=(10, 20, 5)),
        row(alice, T0 + 30, model="m2", tokens=(100, 200, 0)),
        row(bob, T0 + 40, model="m1", tokens=(1000, 2000, 0)),
        row("default", T0 + 50, model="m2", tokens=(5, 5, 5)),
    )
    return keys


def one_day(secret: str, query: Any = None, **params: Any) -> list[dict[str, Any]]:
    if isinstance(query, str):
        query = f"start_time={T0}&end_time={T0 + DAY}&{query}"
    else:
        params.update(start_time=T0, end_time=T0 + DAY)
    body = ok(usage(secret, query=query, **params))
    assert len(body["data"]) == 1
    results: list[dict[str, Any]] = body["data"][0]["results"]
    return results


def test_group_by_model_api_key_or_both(traffic: dict[str, tuple[ApiKey, str]]) -> None:
    (alice, secret), (bob, _), (_, root) = traffic["alice"], traffic["bob"], traffic["root"]
    assert one_day(secret, group_by="model") == [
        result(11, 22, 5, 2, model="m1"),
        result(100, 200, 0, 1, model="m2"),
    ]
    assert one_day(secret, group_by="api_key_id") == [result(111, 222, 5, 3, api_key_id=public_id(alice))]
    assert one_day(root, group_by="api_key_id") == [  # calls without a key first, then by key
        result(5, 5, 5, 1, api_key_id=None),
        result(111, 222, 5, 3, api_key_id=public_id(alice)),
        result(1000, 2000, 0, 1, api_key_id=public_id(bob)),
    ]
    both = one_day(root, query="group_by=model&group_by=api_key_id")
    assert {(r["model"], r["api_key_id"]): r for r in both} == {
        ("m1", public_id(alice)): result(11, 22, 5, 2, model="m1", api_key_id=public_id(alice)),
        ("m2", public_id(alice)): result(100, 200, 0, 1, model="m2", api_key_id=public_id(alice)),
        ("m1", public_id(bob)): result(1000, 2000, 0, 1, model="m1", api_key_id=public_id(bob)),
        ("m2", None): result(5, 5, 5, 1, model="m2", api_key_id=None),
    }
    assert len(both) == 4
    assert one_day(root) == [result(1116, 2227, 10, 5)]  # ungrouped: one result a bucket


def test_both_list_forms_give_the_same_answer(traffic: dict[str, tuple[ApiKey, str]]) -> None:
    (bob, _), (_, root) = traffic["bob"], traffic["root"]
    plain = one_day(root, query=f"group_by=model&group_by=api_key_id&models=m1&api_key_ids={public_id(bob)}")
    brackets = one_day(
        root, query=f"group_by[]=model&group_by[]=api_key_id&models[]=m1&api_key_ids[]={public_id(bob)}"
    )
    assert plain == brackets == [result(1000, 2000, 0, 1, model="m1", api_key_id=public_id(bob))]


def test_models_and_api_key_ids_filter(traffic: dict[str, tuple[ApiKey, str]]) -> None:
    (alice, secret), (bob, _), (_, root) = traffic["alice"], traffic["bob"], traffic["root"]
    assert one_day(root, models="m2") == [result(105, 205, 5, 2)]
    assert one_day(root, query="models=m2&models=m1") == [result(1116, 2227, 10, 5)]
    assert one_day(root, models="nope") == []
    assert one_day(root, api_key_ids=public_id(alice)) == [result(111, 222, 5, 3)]
    assert one_day(root, query=f"api_key_ids={public_id(alice)}&api_key_ids={public_id(bob)}") == [
        result(1111, 2222, 5, 4)
    ]
    # An ordinary key filtering on another key's id still sees only its own rows: nothing.
    assert one_day(secret, api_key_ids=public_id(bob)) == []


def test_embeddings_count_only_embedding_calls_in_their_shape(keys: dict[str, tuple[ApiKey, str]]) -> None:
    alice, secret = keys["alice"]
    insert(
        row(alice, T0 + 10, model="e5", kind="embeddings", tokens=(12, None, None)),
        row(alice, T0 + 20, model="e5", kind="embeddings", tokens=(None, None, None)),
        row(alice, T0 + 30, model="m1", tokens=(1000, 1000, 0)),
    )
    body = ok(usage(secret, EMBEDDINGS, start_time=T0, end_time=T0 + DAY, group_by="model"))
    assert body["data"] == [
        bucket(
            T0,
            T0 + DAY,
            {
                "object": "organization.usage.embeddings.result",
                "input_tokens": 12,
                "num_model_requests": 2,
                "project_id": None,
                "user_id": None,
                "api_key_id": None,
                "model": "e5",
            },
        )
    ]
    completions = ok(usage(secret, start_time=T0, end_time=T0 + DAY))["data"][0]["results"]
    assert completions == [result(1000, 1000, 0, 1)]


# -- pagination ------------------------------------------------------------------------------------


def test_pages_of_limit_buckets_chain_with_next_page_and_sum_exactly(
    keys: dict[str, tuple[ApiKey, str]],
) -> None:
    alice, secret = keys["alice"]
    insert(*(row(alice, T0 + n * DAY + n, tokens=(n + 1, 2 * n, n % 3)) for n in range(10)))
    params: dict[str, Any] = {"start_time": T0 + 1, "end_time": T0 + 10 * DAY, "limit": 3}
    pages, cursor = [], None
    while True:
        body = ok(usage(secret, **params, **({"page": cursor} if cursor else {})))
        pages.append(body)
        cursor = body["next_page"]
        assert body["has_more"] is (cursor is not None)
        if cursor is None:
            break
        assert cursor.startswith("page_")
    assert [len(p["data"]) for p in pages] == [3, 3, 3, 1]
    starts = [b["start_time"] for p in pages for b in p["data"]]
    assert starts == [T0 + 1, *(T0 + n * DAY for n in range(1, 10))]  # the first clipped to start_time
    results = [r for p in pages for b in p["data"] for r in b["results"]]
    assert sum(r["input_tokens"] for r in results) == sum(n + 1 for n in range(1, 10))  # n=0 is before start
    assert sum(r["output_tokens"] for r in results) == sum(2 * n for n in range(10))
    assert sum(r["input_cached_tokens"] for r in results) == sum(n % 3 for n in range(1, 10))
    assert sum(r["num_model_requests"] for r in results) == 9
    # The default limit for 1d is 7 buckets.
    first = ok(usage(secret, start_time=T0, end_time=T0 + 10 * DAY))
    assert len(first["data"]) == 7 and first["has_more"] is True


@pytest.mark.parametrize(("width", "default", "maximum"), [("1d", 7, 31), ("1h", 24, 168), ("1m", 60, 1440)])
def test_limit_defaults_and_maxima_per_bucket_width(
    keys: dict[str, tuple[ApiKey, str]], width: str, default: int, maximum: int
) -> None:
    _, secret = keys["alice"]
    seconds = {"1d": DAY, "1h": HOUR, "1m": MINUTE}[width]
    end = T0 + 2000 * seconds
    assert len(ok(usage(secret, start_time=T0, end_time=end, bucket_width=width))["data"]) == default
    widest = ok(usage(secret, start_time=T0, end_time=end, bucket_width=width, limit=maximum))
    assert len(widest["data"]) == maximum and widest["has_more"] is True
    refused = usage(secret, start_time=T0, end_time=end, bucket_width=width, limit=maximum + 1)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "limit"


# -- scoping ---------------------------------------------------------------------------------------


def test_a_key_sees_its_own_usage_and_an_admin_key_everyones(traffic: dict[str, tuple[ApiKey, str]]) -> None:
    (_, alice), (_, bob), (_, root) = traffic["alice"], traffic["bob"], traffic["root"]
    assert one_day(alice) == [result(111, 222, 5, 3)]
    assert one_day(bob) == [result(1000, 2000, 0, 1)]
    assert one_day(root) == [result(1116, 2227, 10, 5)]


def test_the_admin_flag_takes_effect_when_set_on_a_key(traffic: dict[str, tuple[ApiKey, str]]) -> None:
    _, bob = traffic["bob"]
    apikeys.apikey_update(name_or_id="bob", is_admin=True)
    assert one_day(bob) == [result(1116, 2227, 10, 5)]
    apikeys.apikey_update(name_or_id="bob", is_admin=False)
    assert one_day(bob) == [result(1000, 2000, 0, 1)]


def test_an_oidc_principal_in_the_configured_group_sees_everyones_usage(
    idp: Any, oidc: Callable[..., Any], traffic: dict[str, tuple[ApiKey, str]]
) -> None:
    insert(row(f"oidc:{idp.issuer}#carol", T0 + 60, model="m3", tokens=(3, 3, 3)))
    carol = idp.mint(sub="carol", groups=["staff", "usage-admins"])
    assert one_day(carol) == [result(3, 3, 3, 1)]  # usage_admin_value unset: no OIDC admin
    oidc(auth__usage_admin_value="usage-admins")
    assert one_day(carol) == [result(1119, 2230, 13, 6)]
    outsider = idp.mint(sub="carol", groups=["staff"])
    assert one_day(outsider) == [result(3, 3, 3, 1)]
    oidc(auth__usage_admin_claim="roles")  # another claim: the groups no longer count
    assert one_day(carol) == [result(3, 3, 3, 1)]
    assert one_day(idp.mint(sub="carol", roles="usage-admins")) == [result(1119, 2230, 13, 6)]


def test_the_usage_api_needs_a_credential(keys: dict[str, tuple[ApiKey, str]]) -> None:
    response = Client().get(COMPLETIONS, {"start_time": T0})
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "missing_bearer_token"


def test_on_an_open_gateway_usage_follows_the_stored_state_rule(gateway_config: Callable[..., Any]) -> None:
    """With no named key, ``OPENAI_API_KEY`` guards stored state, usage included (docs/auth.md)."""
    insert(row("default", T0 + 10, tokens=(4, 2, 0)))
    gateway_config(openai_api_key="sk-upstream")
    assert usage("wrong", start_time=T0, end_time=T0 + DAY).status_code == 401
    assert one_day("sk-upstream") == [result(4, 2, 0, 1)]


# -- refusals --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "query", "param", "code"),
    [
        (COMPLETIONS, "", "start_time", "missing_required_parameter"),
        (COMPLETIONS, "start_time=", "start_time", "missing_required_parameter"),
        (COMPLETIONS, "start_time=yesterday", "start_time", "invalid_type"),
        (COMPLETIONS, "start_time=-1", "start_time", "invalid_value"),
        (COMPLETIONS, "start_time=99999999999999999999", "start_time", "invalid_value"),
        (COMPLETIONS, "start_time=253402300799", "start_time", "invalid_value"),  # no time after it
        (COMPLETIONS, f"start_time={T0}&end_time={T0}", "end_time", "invalid_value"),
        (COMPLETIONS, f"start_time={T0}&end_time=1.5", "end_time", "invalid_type"),
        (COMPLETIONS, f"start_time={T0}&bucket_width=1w", "bucket_width", "invalid_value"),
        (COMPLETIONS, f"start_time={T0}&limit=0", "limit", "invalid_value"),
        (COMPLETIONS, f"start_time={T0}&limit=32", "limit", "invalid_value"),
        (COMPLETIONS, f"start_time={T0}&limit=many", "limit", "invalid_type"),
        (COMPLETIONS, f"start_time={T0}&group_by=project_id", "group_by", "invalid_value"),
        (COMPLETIONS, f"start_time={T0}&group_by[]=model&group_by[]=batch", "group_by", "invalid_value"),
        (COMPLETIONS, f"start_time={T0}&group_by=service_tier", "group_by", "invalid_value"),
        (EMBEDDINGS, f"start_time={T0}&group_by=user_id", "group_by", "invalid_value"),
        (COMPLETIONS, f"start_time={T0}&api_key_ids=sk-gw-abc", "api_key_ids", "invalid_value"),
        (COMPLETIONS, f"start_time={T0}&project_ids=proj_1", "project_ids", "unsupported_parameter"),
        (COMPLETIONS, f"start_time={T0}&user_ids[]=u1", "user_ids", "unsupported_parameter"),
        (COMPLETIONS, f"start_time={T0}&batch=true", "batch", "unsupported_parameter"),
        (COMPLETIONS, f"start_time={T0}&page=nonsense", "page", "invalid_value"),
        (COMPLETIONS, f"start_time={T0}&models=a%00b", "models", "invalid_value"),
    ],
)
def test_invalid_parameters_are_refused_with_openais_envelope(
    keys: dict[str, tuple[ApiKey, str]], path: str, query: str, param: str, code: str
) -> None:
    _, secret = keys["alice"]
    response = usage(secret, path, query=query)
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert (error["param"], error["code"]) == (param, code), error
    assert error["message"]


def test_a_cursor_only_continues_the_query_it_came_from(keys: dict[str, tuple[ApiKey, str]]) -> None:
    _, secret = keys["alice"]
    cursor = ok(usage(secret, start_time=T0, end_time=T0 + 10 * DAY, limit=2))["next_page"]
    assert (
        ok(usage(secret, start_time=T0, end_time=T0 + 10 * DAY, limit=2, page=cursor))["data"][0][
            "start_time"
        ]
        == T0 + 2 * DAY
    )
    for other in (
        {"start_time": T0, "end_time": T0 + DAY},  # the cursor is past the range
        {"start_time": T0 + 5 * DAY, "end_time": T0 + 10 * DAY},  # ... or before it
        {"start_time": T0 + 7, "end_time": T0 + 10 * DAY, "bucket_width": "1h", "page": "page_"},
    ):
        refused = usage(secret, **{"page": cursor, **other})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "page"


# -- the official SDK ------------------------------------------------------------------------------


def test_the_openai_sdk_reads_usage_with_an_admin_key(
    live_gateway: LiveServer, traffic: dict[str, tuple[ApiKey, str]]
) -> None:
    (alice, _), (_, root) = traffic["alice"], traffic["root"]
    client = openai.OpenAI(
        base_url=live_gateway.url + "/v1", api_key="unused", admin_api_key=root, max_retries=0
    )
    page = client.admin.organization.usage.completions(
        start_time=T0, end_time=T0 + 2 * DAY, group_by=["model", "api_key_id"], models=["m1"]
    )
    assert page.object == "page" and page.has_more is False and page.next_page is None
    assert [(b.start_time, b.end_time) for b in page.data] == [(T0, T0 + DAY), (T0 + DAY, T0 + 2 * DAY)]
    first = {(r.model, r.api_key_id): r for r in page.data[0].results}
    assert set(first) == {("m1", public_id(alice)), ("m1", f"key_{traffic['bob'][0].pk}")}
    assert first[("m1", public_id(alice))].input_tokens == 11
    assert first[("m1", public_id(alice))].input_cached_tokens == 5
    assert page.data[1].results == []
    embeddings = client.admin.organization.usage.embeddings(start_time=T0, end_time=T0 + DAY)
    assert embeddings.data[0].results == []
    with pytest.raises(openai.BadRequestError) as refused:
        client.admin.organization.usage.completions(start_time=T0, group_by=["project_id"])
    assert refused.value.body["param"] == "group_by"  # type: ignore[index]
