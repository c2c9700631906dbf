"""Retention purge bench: a million expired rows on PostgreSQL and SQLite, purged while a concurrent
loop of requests writes and reads the same tables.

Per store (a fresh database each) and kind:

* ``usage``: ``--rows`` expired ledger rows, and ``--kept`` recent ones;
* ``responses``: ``--rows`` expired stored responses with two items each, and ``--kept`` recent
  continuations of expired ones (their history lists the old items, which must survive);
* ``write_cost`` (PostgreSQL): what the GIN index the purge reads costs each stored response.

Rows go in by ``COPY`` (PostgreSQL) or ``executemany`` (SQLite). Then ``gateway.data.retention.purge``
runs with only that kind's age set, while a thread plays requests in a loop on the same tables:
insert a ledger row, store a response (an item and its row, through the response writers' queue on
SQLite) and read a kept response by id. Reported: rows deleted a second, batches, each request's
time before and during the purge (on SQLite the longest is the longest wait for the write lock,
plus the request's own work) and, on PostgreSQL, the longest lock wait seen in
``pg_stat_activity`` (sampled every 10 ms). It checks that everything expired went and everything
kept stayed, and prints the plan of each batch's pick.

    .venv/bin/python bench/purge.py [--stores sqlite,postgres] [--kinds usage,responses]
        [--rows 1000000] [--kept 10000] [--batch-size 1000]
        [--postgres postgres://postgres@127.0.0.1:5432/postgres]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

OLD = dt.datetime(2020, 1, 1, tzinfo=dt.UTC)


def _copy_rows(table: str, columns: list[str], rows: Any) -> None:
    """Bulk insert: COPY on PostgreSQL, executemany on SQLite (in chunks)."""
    from django.db import connection

    connection.ensure_connection()
    raw = connection.connection
    if connection.vendor == "postgresql":
        with raw.cursor() as cursor, cursor.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)
        raw.commit()
        return
    sql = f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"
    chunk: list[Any] = []
    for row in rows:
        chunk.append(row)
        if len(chunk) == 50_000:
            raw.executemany(sql, chunk)
            chunk.clear()
    if chunk:
        raw.executemany(sql, chunk)
    raw.commit()


def _iso(when: dt.datetime) -> Any:
    from django.db import connection

    return when if connection.vendor == "postgresql" else when.strftime("%Y-%m-%d %H:%M:%S.%f")


def fill_usage(rows: int, kept: int) -> None:
    now = dt.datetime.now(dt.UTC)
    columns = [
        "created_at",
        "owner",
        "route",
        "kind",
        "model",
        "response_id",
        "request_id",
        "status",
        "latency_ms",
    ]

    def gen() -> Any:
        for i in range(rows + kept):
            when = OLD + dt.timedelta(seconds=i) if i < rows else now
            yield (_iso(when), "key:1", "/v1/responses", "completions", "m", "", "", 200, 5)

    _copy_rows("usage_app_usagerecord", columns, gen())


def fill_responses(rows: int, kept: int) -> None:
    now = dt.datetime.now(dt.UTC)
    item_columns = ["id", "owner", "type", "data", "created_at"]
    data = json.dumps(
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello"}]}
    )

    def items() -> Any:
        for i in range(rows):
            for part in "ab":
                yield (f"msg_{i}{part}", "key:1", "message", data, _iso(OLD + dt.timedelta(seconds=i)))
        for k in range(kept):
            yield (f"msg_k{k}", "key:1", "message", data, _iso(now))

    columns = [
        "id", "owner", "status", "model", "background", "conversation_id", "request", "history_item_ids",
        "input_item_count", "created_at", "lease_owner",
    ]  # fmt: skip

    def responses() -> Any:
        for i in range(rows):
            history = json.dumps([f"msg_{i}a", f"msg_{i}b"])
            yield (
                f"resp_{i}",
                "key:1",
                "completed",
                "m",
                False,
                "",
                "{}",
                history,
                1,
                _iso(OLD + dt.timedelta(seconds=i)),
                "",
            )
        step = max(1, rows // max(kept, 1))
        for k in range(kept):
            parent = k * step % max(rows, 1)
            history = json.dumps([f"msg_{parent}a", f"msg_{parent}b", f"msg_k{k}"])
            yield (f"resp_k{k}", "key:1", "completed", "m", False, "", "{}", history, 1, _iso(now), "")

    _copy_rows("conversations_app_item", item_columns, items())
    _copy_rows("responses_app_response", columns, responses())
    from django.db import connection

    if connection.vendor == "postgresql":
        # As autovacuum leaves a table that has been there a while: statistics, and the GIN index's
        # pending list merged (a search reads the whole list otherwise).
        with connection.cursor() as cursor:  # Django's connection is in autocommit mode
            cursor.execute("VACUUM ANALYZE responses_app_response")
            cursor.execute("VACUUM ANALYZE conversations_app_item")


def write_cost(responses: int, history: int) -> dict[str, Any]:
    """PostgreSQL: what the GIN index over ``history_item_ids`` costs a stored response, µs each, with
    ``history`` item ids a checkpoint, one INSERT each, with and without the index (alternated, best
    of 3 each). In one transaction a mode, so the commit (an fsync, the same either way) is left out."""
    from django.db import connection, transaction

    index = "response_history_items_gin"
    sql = (
        "INSERT INTO responses_app_response (id, owner, status, model, background, conversation_id, request, "
        "history_item_ids, input_item_count, created_at, lease_owner) "
        "VALUES (%s, 'key:3', 'completed', 'm', false, '', '{}', %s, 1, now(), '')"
    )
    best: dict[str, float] = {"with": float("inf"), "without": float("inf")}
    with connection.cursor() as cursor:
        for round_ in range(3):
            for mode in ("with", "without"):
                if mode == "without":
                    cursor.execute(f"DROP INDEX {index}")
                started = time.perf_counter()
                with transaction.atomic():
                    for i in range(responses):
                        ids = json.dumps([f"msg_w{round_}{mode}{i}_{j}" for j in range(history)])
                        cursor.execute(sql, [f"resp_w{round_}{mode}{i}", ids])
                best[mode] = min(best[mode], (time.perf_counter() - started) / responses * 1e6)
                if mode == "without":
                    cursor.execute(
                        f"CREATE INDEX {index} ON responses_app_response USING gin (history_item_ids jsonb_path_ops)"
                    )
        cursor.execute("DELETE FROM responses_app_response WHERE owner = 'key:3'")
    return {
        "responses": responses,
        "history_ids": history,
        "us_with_index": round(best["with"], 1),
        "us_without_index": round(best["without"], 1),
        "checked": True,
    }


class LockWaits(threading.Thread):
    """PostgreSQL: samples ``pg_stat_activity`` every 10 ms; the longest wait for a lock it saw."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.longest_ms = 0.0
        self.stop = threading.Event()

    def run(self) -> None:
        from django.db import connection

        try:
            with connection.cursor() as cursor:
                while not self.stop.is_set():
                    cursor.execute(
                        "SELECT coalesce(max(extract(epoch FROM clock_timestamp() - state_change)), 0) "
                        "FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
                    )
                    self.longest_ms = max(self.longest_ms, float(cursor.fetchone()[0]) * 1000)
                    time.sleep(0.01)
        finally:
            connection.close()


class Requests(threading.Thread):
    """The concurrent requests: a ledger insert and a kept response read, timed, in a loop."""

    def __init__(self, kept_id: str, prefix: str) -> None:
        super().__init__(daemon=True)
        self.kept_id = kept_id
        self.prefix = prefix
        self.times: list[tuple[float, float]] = []  # (start, seconds)
        self.error = ""
        self.stop = threading.Event()

    def run(self) -> None:
        from django.db import connection
        from django.utils import timezone

        from conversations_app.models import Item
        from responses_app.models import Response
        from responses_app.storage import rawsql
        from usage_app.models import UsageRecord

        n = 0
        try:
            while not self.stop.is_set():
                n += 1
                start = time.perf_counter()
                with rawsql.writing():  # a model call's ledger row
                    UsageRecord.objects.create(
                        created_at=timezone.now(),
                        owner="key:2",
                        route="/v1/responses",
                        kind="completions",
                        status=200,
                        latency_ms=1,
                    )
                with rawsql.writing():  # a stored response: its item and its row
                    Item.objects.create(
                        id=f"msg_{self.prefix}{n}", owner="key:2", type="message", data={"n": n}
                    )
                    Response.objects.create(
                        id=f"resp_{self.prefix}{n}",
                        owner="key:2",
                        status="completed",
                        model="m",
                        history_item_ids=[f"msg_{self.prefix}{n}"],
                    )
                assert Response.objects.filter(id=self.kept_id).values_list("id", flat=True).first()
                self.times.append((start, time.perf_counter() - start))
                time.sleep(0.002)
        except Exception as exc:
            self.error = repr(exc)
            raise
        finally:
            connection.close()

    def between(self, start: float, end: float) -> list[float]:
        return [took for began, took in self.times if start <= began <= end]


def summary(times: list[float]) -> dict[str, float]:
    if not times:
        return {"n": 0}
    ordered = sorted(times)
    return {
        "n": len(ordered),
        "p50_ms": round(statistics.median(ordered) * 1000, 2),
        "p99_ms": round(ordered[int(len(ordered) * 0.99) - 1 if len(ordered) >= 100 else -1] * 1000, 2),
        "max_ms": round(ordered[-1] * 1000, 2),
    }


def one_store(args: argparse.Namespace) -> dict[str, Any]:
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from conversations_app.models import Item
    from gateway.core import config as config_module
    from gateway.data import retention
    from responses_app.models import Response
    from usage_app.models import UsageRecord

    call_command("migrate", verbosity=0)
    results: dict[str, Any] = {"store": connection.vendor}
    for kind in args.kinds.split(","):
        if kind == "write_cost":
            if connection.vendor == "postgresql":
                results[kind] = write_cost(2000, 50)
            continue
        started = time.perf_counter()
        if kind == "usage":
            fill_usage(args.rows, args.kept)
            kept_id = "resp_none"
        else:
            fill_responses(args.rows, args.kept)
            kept_id = "resp_k0" if args.kept else "resp_none"
        filled = time.perf_counter() - started
        base = config_module.get_config()
        config = config_module.replace(
            base,
            retention__usage_days=30 if kind == "usage" else None,
            retention__responses_days=30 if kind == "responses" else None,
            retention__batch_size=args.batch_size,
        )
        cutoff = dt.datetime.now(dt.UTC) - dt.timedelta(days=30)
        pick = (
            retention._expired_responses(cutoff).order_by("created_at").values_list("id")[: args.batch_size]
            if kind == "responses"
            else UsageRecord.objects.filter(created_at__lt=cutoff)
            .order_by("created_at")
            .values("pk")[: args.batch_size]
        )
        plan = [
            line.strip(" ->") for line in pick.explain().splitlines() if "Scan" in line or "SEARCH" in line
        ]
        Response.objects.get_or_create(
            id="resp_none", defaults={"owner": "key:2", "status": "completed", "model": "m"}
        )
        requests, waits = Requests(kept_id, f"live{kind}"), LockWaits()
        requests.start()
        if connection.vendor == "postgresql":
            waits.start()
        time.sleep(1.0)
        begin = time.perf_counter()
        report = retention.purge(config=config)
        end = time.perf_counter()
        time.sleep(0.5)
        requests.stop.set()
        waits.stop.set()
        requests.join()
        deleted = report.usage if kind == "usage" else report.responses
        results[kind] = {
            "rows": args.rows,
            "kept": args.kept,
            "fill_s": round(filled, 1),
            "purge_s": round(end - begin, 2),
            "deleted": deleted,
            "items_deleted": report.items,
            "rows_per_s": round(deleted / (end - begin)),
            "batches": report.batches,
            "requests_before": summary(requests.between(0, begin)),
            "requests_during": summary(requests.between(begin, end)),
            "longest_lock_wait_ms": round(waits.longest_ms, 1) if connection.vendor == "postgresql" else None,
            "pick_plan": "; ".join(plan),
        }
        ok = deleted == args.rows and not requests.error
        results[kind]["request_error"] = requests.error
        if kind == "usage":
            ok = ok and UsageRecord.objects.filter(owner="key:1").count() == args.kept
        else:
            # Survive: each kept response's own item, and both items of every parent one continues.
            step = max(1, args.rows // max(args.kept, 1))
            parents = {k * step % max(args.rows, 1) for k in range(args.kept)}
            ok = ok and Response.objects.filter(id__startswith="resp_k").count() == args.kept
            ok = ok and Item.objects.filter(owner="key:1").count() == args.kept + 2 * len(parents)
        results[kind]["checked"] = ok
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--stores", default="sqlite,postgres")
    parser.add_argument("--kinds", default="usage,responses,write_cost")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--kept", type=int, default=10_000)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--postgres", default="postgres://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--db-name", default="bench_purge")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_store(args)), flush=True)
        return
    failed = False
    for store in args.stores.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            env = {
                k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "LLM_API_BASE")
            }
            env.update(DJANGO_SETTINGS_MODULE="gateway.settings", GATEWAY_SERVER_DATA_DIR=tmp)
            if store == "postgres":
                from bench.responses import postgres_url

                env["DATABASE_URL"] = postgres_url(args.postgres, args.db_name)
            command = [sys.executable, __file__, "--one", *sys.argv[1:]]
            proc = subprocess.run(command, env=env, capture_output=True, text=True, cwd=ROOT)
            if proc.returncode:
                print(proc.stderr[-3000:], file=sys.stderr)
                failed = True
                continue
            result = json.loads(proc.stdout.strip().splitlines()[-1])
            for kind, row in result.items():
                if kind == "store":
                    continue
                print(f"{store:8} {kind:9} {json.dumps(row)}", flush=True)
                failed = failed or not row["checked"]
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
