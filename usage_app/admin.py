"""Admin: the usage ledger, read-only, and a report of usage per principal, key and model with a
daily chart per key and per model (inline SVG drawn on the server: no script, no CDN)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import path, reverse

from gateway.core.models import ApiKey
from usage_app import schemas, selectors
from usage_app.models import UsageRecord

REPORT_DAYS = 14  # the report's default range: the last two weeks
MAX_REPORT_DAYS = 366
LAST_DAY = date.max - timedelta(days=1)  # the range's end (the next midnight) must exist
CHART_HEIGHT = 120  # px of the tallest bar
BAR_WIDTH, BAR_GAP = 14, 4


@admin.register(UsageRecord)
class UsageRecordAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = (
        "created_at",
        "owner",
        "api_key_id",
        "route",
        "kind",
        "model",
        "input_tokens",
        "output_tokens",
        "cached_tokens",
        "reasoning_tokens",
        "status",
        "latency_ms",
    )
    list_filter = ("kind", "status", "model", "owner", "api_key_id")
    search_fields = ("response_id", "request_id", "model", "owner")
    date_hierarchy = "created_at"
    ordering = ("-created_at",)
    readonly_fields = [f.name for f in UsageRecord._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_urls(self) -> list[Any]:
        report = path(
            "report/",
            self.admin_site.admin_view(self.report_view),
            name="usage_app_usagerecord_report",
        )
        return [report, *super().get_urls()]

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> Any:
        extra = {"report_url": reverse("admin:usage_app_usagerecord_report"), **(extra_context or {})}
        return super().changelist_view(request, extra)

    def report_view(self, request: HttpRequest) -> HttpResponse:
        """Usage per principal, key and model for a range of UTC days, and a daily chart of tokens
        per key and per model (``?since=YYYY-MM-DD&until=YYYY-MM-DD``, both included)."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        first, last, problem = _range(request.GET)
        since = datetime.combine(first, datetime.min.time(), UTC)
        until = datetime.combine(last + timedelta(days=1), datetime.min.time(), UTC)
        days = [first + timedelta(days=n) for n in range((last - first).days + 1)]
        names = dict(ApiKey.objects.values_list("pk", "name"))

        def label(by: str, value: Any) -> str:
            if by == "api_key_id":
                return (
                    "no key"
                    if value is None
                    else f"{names.get(value, 'deleted key')} ({schemas.api_key_public_id(value)})"
                )
            return str(value) if value else "(none)"

        tables = {
            by: [
                {**row, "label": label(by, row[by]), "tokens": row["input_tokens"] + row["output_tokens"]}
                for row in selectors.usage_totals(since=since, until=until, by=by)
            ]
            for by in selectors.REPORT_GROUPS
        }
        charts = {
            by: bar_charts(
                selectors.usage_daily(since=since, until=until, by=by), days, by, lambda v, b=by: label(b, v)
            )
            for by in ("api_key_id", "model")
        }
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": "Usage report",
            "since": first.isoformat(),
            "until": last.isoformat(),
            "problem": problem,
            "days": days,
            "tables": [
                ("Per principal", tables["owner"]),
                ("Per API key", tables["api_key_id"]),
                ("Per model", tables["model"]),
            ],
            "charts": [
                ("Tokens a day per API key", charts["api_key_id"]),
                ("Tokens a day per model", charts["model"]),
            ],
            "chart_height": CHART_HEIGHT,
            "bar_width": BAR_WIDTH,
        }
        return TemplateResponse(request, "admin/usage_app/usagerecord/report.html", context)


def _range(query: Any) -> tuple[date, date, str]:
    """The report's first and last day (UTC) from ``since`` / ``until``, and what was wrong with them."""
    today = datetime.now(UTC).date()
    last, first = today, today - timedelta(days=REPORT_DAYS - 1)
    problem = ""
    try:
        if query.get("until"):
            last = min(date.fromisoformat(query["until"]), LAST_DAY)
        first = (
            date.fromisoformat(query["since"])
            if query.get("since")
            else last - timedelta(days=REPORT_DAYS - 1)
        )
    except (ValueError, OverflowError):
        problem = "Dates are YYYY-MM-DD; showing the last two weeks."
        last, first = today, today - timedelta(days=REPORT_DAYS - 1)
    if first > last:
        problem, first = "The first day is after the last; showing the last day only.", last
    if (last - first).days >= MAX_REPORT_DAYS:
        problem, first = (
            f"At most {MAX_REPORT_DAYS} days; showing the last {MAX_REPORT_DAYS}.",
            last - timedelta(days=MAX_REPORT_DAYS - 1),
        )
    return first, last, problem


@dataclass
class Bar:
    x: int
    y: float
    height: float
    value: int
    day: date


@dataclass
class Chart:
    label: str
    total: int
    bars: list[Bar] = field(default_factory=list)
    width: int = 0


def bar_charts(rows: list[dict[str, Any]], days: list[date], by: str, label: Any) -> list[Chart]:
    """One bar chart per key (or model): a bar a day, heights on one scale for every chart, so
    charts compare at a glance."""
    series: dict[Any, dict[date, int]] = {}
    for row in rows:
        series.setdefault(row[by], {})[row["day"].date()] = row["input_tokens"] + row["output_tokens"]
    peak = max((v for values in series.values() for v in values.values()), default=0) or 1
    charts = []
    for value, per_day in series.items():
        chart = Chart(
            label=label(value), total=sum(per_day.values()), width=len(days) * (BAR_WIDTH + BAR_GAP)
        )
        for n, day in enumerate(days):
            tokens = per_day.get(day, 0)
            height = round(tokens / peak * CHART_HEIGHT, 1)
            chart.bars.append(
                Bar(n * (BAR_WIDTH + BAR_GAP), round(CHART_HEIGHT - height, 1), height, tokens, day)
            )
        charts.append(chart)
    return sorted(charts, key=lambda c: (-c.total, c.label))
