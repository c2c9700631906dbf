"""The usage admin pages (the read-only ledger, the report with its server-drawn charts), the API-key
admin's admin flag and quota overrides, and ``manage.py apikey``'s quota options and refusals."""

from __future__ import annotations

import io
import re

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client

from gateway.core.auth import apikeys
from gateway.core.models import ApiKey
from tests.conversations.test_admin import staff
from tests.usage.test_usage_api import DAY, T0, insert, row
from usage_app.models import UsageRecord

pytestmark = pytest.mark.django_db

LEDGER = "/admin/usage_app/usagerecord/"
REPORT = "/admin/usage_app/usagerecord/report/"
RANGE = {"since": "2026-01-01", "until": "2026-01-03"}


def bars(page: str, label: str) -> dict[str, tuple[str, str]]:
    """The bars of the chart captioned ``label``: day -> (height, value)."""
    figure = page.split(f"<strong>{label}</strong>", 1)[1].split("</figure>", 1)[0]
    found = re.findall(r'<rect [^>]*height="([^"]+)" data-day="([^"]+)" data-value="([^"]+)"', figure)
    return {day: (height, value) for height, day, value in found}


@pytest.fixture
def ledger() -> tuple[ApiKey, ApiKey]:
    """Two keys' traffic over three days (tokens = input + output)."""
    alice, _ = apikeys.apikey_create(name="alice")
    bob, _ = apikeys.apikey_create(name="bob")
    insert(
        row(alice, T0 + 10, model="m1", tokens=(60, 40, 5)),  # day 1: alice 100 on m1
        row(alice, T0 + DAY + 10, model="m2", tokens=(30, 20, 0)),  # day 2: alice 50 on m2
        row(bob, T0 + 20, model="m1", tokens=(20, 5, 0)),  # day 1: bob 25 on m1
        row(bob, T0 + 30, model="m1", tokens=(None, None, None)),  # counted, 0 tokens
        row(alice, T0 + 3 * DAY, model="m1", tokens=(900, 900, 0)),  # after the range
    )
    return alice, bob


def test_the_ledger_is_listed_read_only_with_filters_and_dates(ledger: tuple[ApiKey, ApiKey]) -> None:
    alice, bob = ledger
    client = staff("view_usagerecord")
    page = client.get(LEDGER)
    assert page.status_code == 200
    html = page.content.decode()
    assert html.count('<td class="field-owner">') == 5 and alice.owner in html and bob.owner in html
    assert REPORT in html  # the report's link
    assert 'class="toplinks"' in html  # the date hierarchy
    assert f"{LEDGER}add/" not in html and "delete_selected" not in html
    for name in ("kind", "status", "model", "owner", "api_key_id"):  # the filters
        assert f"?{name}" in html or f"&amp;{name}" in html, name
    by_owner = client.get(LEDGER, {"owner": bob.owner}).content.decode()
    assert by_owner.count(f'<td class="field-owner">{bob.owner}</td>') == 2
    assert f'<td class="field-owner">{alice.owner}</td>' not in by_owner
    day_two = client.get(LEDGER, {"created_at__year": 2026, "created_at__month": 1, "created_at__day": 2})
    assert day_two.content.decode().count('<td class="field-owner">') == 1  # the date hierarchy
    record = UsageRecord.objects.filter(owner=alice.owner).first()
    assert record is not None
    detail = client.get(f"{LEDGER}{record.pk}/change/")
    assert detail.status_code == 200 and 'name="_save"' not in detail.content.decode()
    assert client.post(f"{LEDGER}{record.pk}/delete/", {"post": "yes"}).status_code == 403
    assert UsageRecord.objects.count() == 5


def test_the_report_sums_per_principal_key_and_model_and_draws_daily_bars(
    ledger: tuple[ApiKey, ApiKey],
) -> None:
    alice, bob = ledger
    response = staff("view_usagerecord").get(REPORT, RANGE)
    assert response.status_code == 200
    page = response.content.decode()
    # Per principal: alice 2 calls 90 in / 60 out / 5 cached; bob 2 calls (one unreported) 20 / 5.
    assert re.search(
        rf"<td>{alice.owner}</td><td class=\"num\">2</td><td class=\"num\">90</td>\s*"
        r'<td class="num">5</td><td class="num">60</td><td class="num">150</td>',
        page,
    )
    assert re.search(
        rf"<td>{bob.owner}</td><td class=\"num\">2</td><td class=\"num\">20</td>\s*"
        r'<td class="num">0</td><td class="num">5</td><td class="num">25</td>',
        page,
    )
    assert f"alice (key_{alice.pk})" in page and "<td>m2</td>" in page
    # One scale for every chart: the peak (alice's 100 tokens on day 1) is 120 px high.
    assert bars(page, f"alice (key_{alice.pk})") == {
        "2026-01-01": ("120", "100"),
        "2026-01-02": ("60", "50"),
        "2026-01-03": ("0", "0"),
    }
    assert bars(page, f"bob (key_{bob.pk})") == {
        "2026-01-01": ("30", "25"),
        "2026-01-02": ("0", "0"),
        "2026-01-03": ("0", "0"),
    }
    assert bars(page, "m1") == {
        "2026-01-01": ("120", "125"),
        "2026-01-02": ("0", "0"),
        "2026-01-03": ("0", "0"),
    }
    assert bars(page, "m2")["2026-01-02"] == ("48", "50")
    # Drawn on the server: no script, nothing fetched from elsewhere.
    assert "<script" not in page.split('id="content"')[1]
    assert not re.search(r'(?:src|href)="https?://', page)


def test_the_report_shows_a_range_and_refuses_users_without_the_permission(
    ledger: tuple[ApiKey, ApiKey],
) -> None:
    alice, _ = ledger
    client = staff("view_usagerecord")
    later = client.get(REPORT, {"since": "2026-01-04", "until": "2026-01-04"}).content.decode()
    assert bars(later, f"alice (key_{alice.pk})") == {"2026-01-04": ("120", "1800")}
    assert "2026-01-01" not in re.sub(r'value="[^"]*"', "", later.split('id="content"')[1])
    for wrong in ({"since": "yesterday"}, {"until": "0001-01-02"}):
        assert "Dates are YYYY-MM-DD" in client.get(REPORT, wrong).content.decode()
    assert client.get(REPORT, {"since": "9999-12-30", "until": "9999-12-31"}).status_code == 200
    User.objects.filter(username="ops").delete()
    assert staff().get(REPORT).status_code == 403


# -- the API-key admin -----------------------------------------------------------------------------


def key_form(key: ApiKey, **changes: object) -> dict[str, object]:
    form: dict[str, object] = {"name": key.name, "is_active": "on"}
    form.update(changes)
    return {k: v for k, v in form.items() if v is not None}


def test_the_api_key_admin_edits_the_admin_flag_and_quota_overrides() -> None:
    key, _ = apikeys.apikey_create(name="ci")
    client = Client()
    client.force_login(User.objects.create_superuser("root", password="pw-for-tests-only"))
    url = f"/admin/gateway/apikey/{key.pk}/change/"
    form = client.get(url).content.decode()
    for name in ("is_admin", "requests_per_minute", "tokens_per_minute", "tokens_per_day", "max_concurrent"):
        assert f'name="{name}"' in form, name
    assert f"key_{key.pk}" in form  # how the Usage API names it
    saved = client.post(url, key_form(key, is_admin="on", requests_per_minute=60, tokens_per_day=100000))
    assert saved.status_code == 302
    key.refresh_from_db()
    assert key.is_admin and (key.requests_per_minute, key.tokens_per_day, key.max_concurrent) == (
        60,
        100000,
        None,
    )
    # The next request sees the change: the key snapshot was dropped.
    assert apikeys._snapshot is None


@pytest.mark.parametrize("value", ["-5", "0"])
def test_the_api_key_admin_refuses_negative_or_zero_limits(value: str) -> None:
    key, _ = apikeys.apikey_create(name="ci", max_concurrent=4)
    client = Client()
    client.force_login(User.objects.create_superuser("root", password="pw-for-tests-only"))
    refused = client.post(f"/admin/gateway/apikey/{key.pk}/change/", key_form(key, max_concurrent=value))
    assert refused.status_code == 200  # the form again, with the error
    assert "Max concurrent must be a positive whole number; leave it empty for the [quotas] default." in (
        refused.content.decode()
    )
    key.refresh_from_db()
    assert key.max_concurrent == 4


# -- manage.py apikey ------------------------------------------------------------------------------


def apikey(*args: str) -> str:
    out = io.StringIO()
    call_command("apikey", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def test_the_apikey_command_sets_and_clears_quota_overrides_and_the_admin_flag() -> None:
    apikey(
        "create",
        "ci",
        "--requests-per-minute",
        "60",
        "--tokens-per-minute",
        "1000",
        "--tokens-per-day",
        "50000",
    )
    key = ApiKey.objects.get(name="ci")
    assert (key.requests_per_minute, key.tokens_per_minute, key.tokens_per_day, key.max_concurrent) == (
        60,
        1000,
        50000,
        None,
    )
    assert not key.is_admin
    said = apikey("update", "ci", "--max-concurrent", "3", "--tokens-per-minute", "none", "--admin")
    assert "admin;" in said and "max-concurrent 3" in said
    key.refresh_from_db()
    assert (key.requests_per_minute, key.tokens_per_minute, key.max_concurrent, key.is_admin) == (
        60,
        None,
        3,
        True,
    )
    apikey("update", str(key.pk), "--no-admin")
    key.refresh_from_db()
    assert key.is_admin is False and key.max_concurrent == 3  # only what was given changes
    assert "requests-per-minute 60" in apikey("list")


@pytest.mark.parametrize("value", ["-1", "0", "1.5", "ten", ""])
def test_the_apikey_command_refuses_limits_that_are_not_positive_integers(value: str) -> None:
    apikey("create", "ci", "--tokens-per-day", "10")
    for action in (["create", "other"], ["update", "ci"]):
        with pytest.raises(
            CommandError, match=r"--tokens-per-day: must be a positive whole number, or 'none'"
        ):
            apikey(*action, "--tokens-per-day", value)
    assert list(ApiKey.objects.values_list("name", "tokens_per_day")) == [("ci", 10)]


def test_the_apikey_command_needs_something_to_update() -> None:
    apikey("create", "ci")
    with pytest.raises(CommandError, match="Nothing to update"):
        apikey("update", "ci")
    with pytest.raises(CommandError, match="No API key named 'nope'"):
        apikey("update", "nope", "--admin")


def test_limits_set_through_the_service_are_checked_too() -> None:
    from gateway.core import errors

    with pytest.raises(
        errors.BadRequest, match="Requests per minute must be a positive whole number"
    ) as refused:
        apikeys.apikey_create(name="ci", requests_per_minute=-3)
    assert refused.value.param == "requests_per_minute"
    assert not ApiKey.objects.exists()
