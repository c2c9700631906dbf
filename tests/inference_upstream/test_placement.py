"""KV-cache-affine placement on real Celery inference workers over the real Redis (db 5).

Two (or more) ``celery … worker -Q inference -P threads`` processes run the real worker machinery
(own queues, heartbeat, claim, streams) with an engine host that relays to the scripted upstream
(``relay_worker``), which names the serving worker in ``x-served-by``. Rounds go through
``WorkerUpstream.send`` inside ``lineage.bind``, as the features send them.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis
from aiohttp import web

from gateway.core.config import Config, load_config
from gateway.core.metrics import REGISTRY
from inference_app.upstream import lineage, streams
from inference_app.upstream.worker import WorkerUpstream
from tests.faults import CeleryWorker
from tests.servers import ROOT, child_env
from tests.upstream import MODEL, Gate, Recorded, ScriptedUpstream

pytestmark = [pytest.mark.process, pytest.mark.timeout(300)]

REDIS_URL = "redis://127.0.0.1:6379/5"
CHAT = "/v1/chat/completions"
# Celery's keys carry the xdist worker's id in this process (tests/conftest.py); the workers match it.
KEYPREFIX = f"{os.environ['PYTEST_XDIST_WORKER']}:" if os.environ.get("PYTEST_XDIST_WORKER") else ""
TIMING = {
    "GATEWAY_INFERENCE_HEARTBEAT_INTERVAL_S": "0.3",
    "GATEWAY_INFERENCE_WORKER_LOST_AFTER_S": "2.0",
    "GATEWAY_INFERENCE_CANCEL_POLL_INTERVAL_S": "0.1",
}


def gateway_config(**env: str) -> Config:
    return load_config({"REDIS_URL": REDIS_URL, "GATEWAY_UPSTREAM_READ_TIMEOUT_S": "30", **TIMING, **env})


def worker_id(worker: CeleryWorker) -> str:
    return f"{socket.gethostname()}:{worker.pid}"


class Pool:
    """The relay workers of this module, restarted when a test killed one."""

    def __init__(self, scripted: ScriptedUpstream) -> None:
        self.scripted = scripted
        self.workers: list[CeleryWorker] = []

    def start(self, **env: str) -> CeleryWorker:
        worker = CeleryWorker(
            {
                "REDIS_URL": REDIS_URL,
                "RELAY_UPSTREAM": self.scripted.url,
                "RELAY_KEYPREFIX": KEYPREFIX,
                "GATEWAY_INFERENCE_SERVED_MODEL_NAME": MODEL,
                **TIMING,
                **env,
            },
            queues="inference",
            app="tests.inference_upstream.relay_worker",
            pool="threads",
            # Two threads (and the inference worker's prefetch of 4 per thread): a few held rounds
            # show every kind of load, running, prefetched and queued.
            concurrency=2,
        )
        self.workers.append(worker)
        worker.wait_ready()
        wait_until(lambda: live_info(worker_id(worker)) is not None, 10, "the worker's first heartbeat")
        return worker

    def ensure(self, count: int) -> list[CeleryWorker]:
        for worker in [w for w in self.workers if w.proc.poll() is not None]:
            worker.stop()
            self.workers.remove(worker)
        while len(self.workers) < count:
            self.start()
        return list(self.workers)

    @property
    def ids(self) -> list[str]:
        return [worker_id(w) for w in self.workers]

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop()


def wait_until(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"{what}: not within {timeout} s")


def live_info(worker: str) -> dict[str, Any] | None:
    client = redis.Redis.from_url(REDIS_URL)
    try:
        raw = client.get(streams.worker_key(worker))
        return None if raw is None else dict(orjson.loads(raw))
    finally:
        client.close()


def placement_of(key: str) -> str | None:
    client = redis.Redis.from_url(REDIS_URL)
    try:
        raw = client.get(streams.placement_key(key))
        return None if raw is None else raw.decode()
    finally:
        client.close()


@pytest.fixture(scope="module")
def pool() -> Iterator[Pool]:
    # One module at a time on db 5 (pytest-xdist may run this module's tests in two processes).
    with open(Path(tempfile.gettempdir()) / "gateway-test-redis-db5.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        redis.Redis.from_url(REDIS_URL).flushdb()
        scripted = ScriptedUpstream().start()
        workers = Pool(scripted)
        try:
            yield workers
        finally:
            workers.stop()
            scripted.stop()
            redis.Redis.from_url(REDIS_URL).flushdb()


@pytest.fixture
def cluster(pool: Pool) -> Pool:
    """Two live relay workers, no placement records, no leftover scripts."""
    pool.scripted.scripts.clear()
    client = redis.Redis.from_url(REDIS_URL)
    for pattern in ("inference:placement:*", "inference:lineages:*"):
        for key in client.scan_iter(pattern):
            client.delete(key)
    client.close()
    pool.ensure(2)
    since = time.time()

    def idle() -> bool:
        infos = [live_info(worker) for worker in pool.ids]
        return all(i and i["at"] > since and i["in_flight"] == i["queued"] == 0 for i in infos)

    wait_until(idle, 10, "idle workers")  # no load left over from an earlier test
    return pool


async def round_(upstream: WorkerUpstream, key: str | None, text: str = "hi") -> str:
    """One model round of lineage ``key``: the id of the worker that served it."""
    body = orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": text}]})
    with lineage.bind(key):
        response = await upstream.send("POST", CHAT, body=body, headers={"content-type": "application/json"})
    payload = await response.read()
    assert response.status == 200, payload
    served = response.header("x-served-by")
    assert served is not None
    return served


def placements(outcome: str) -> float:
    value = REGISTRY.get_sample_value("gateway_inference_placements_total", {"outcome": outcome})
    return value or 0.0


def gateway_upstream(**env: str) -> WorkerUpstream:
    """A gateway process's upstream (its own registry cache and placement counts)."""
    upstream = WorkerUpstream(gateway_config(**env))
    if KEYPREFIX:  # a process without tests/conftest.py (the second gateway) sets it itself
        options = upstream.celery.conf.broker_transport_options
        upstream.celery.conf.broker_transport_options = {**options, "global_keyprefix": KEYPREFIX}
    return upstream


def record(key: str, value: str | bytes) -> None:
    client = redis.Redis.from_url(REDIS_URL)
    client.set(streams.placement_key(key), value)
    client.close()


def hold_marked(scripted: ScriptedUpstream, gate: Gate, count: int = 64) -> None:
    """The next ``count`` chat rounds: one whose prompt says "hold" waits for ``gate`` before it is
    answered; the others are answered at once (whatever order the workers send them in)."""

    async def handler(request: web.Request, rec: Recorded) -> web.StreamResponse:
        if b"hold" in rec.body:
            await gate.wait()
        return await scripted.default(request, rec)

    for _ in range(count):
        scripted.script(CHAT, handler)


async def test_the_heartbeat_advertises_the_own_queue_and_the_load(cluster: Pool) -> None:
    worker = cluster.ids[0]
    info = live_info(worker)
    assert info is not None
    assert info["queue"] == streams.worker_queue(worker)
    assert info["queue"] in info["queues"] and streams.DEFAULT_QUEUE in info["queues"]
    assert (info["running"], info["in_flight"], info["queued"], info["max_load"]) == (0, 0, 0, 8)
    assert abs(info["at"] - time.time()) < 5


async def test_the_heartbeat_counts_running_prefetched_and_queued_rounds(cluster: Pool) -> None:
    """Twelve held rounds on a worker of two threads: two run, six more are prefetched (taken, in
    flight), four wait in its own queue; its load is all twelve."""
    upstream = gateway_upstream(GATEWAY_ROUTING_MAX_WORKER_LOAD="100")
    worker = cluster.ids[0]
    gate = Gate()
    hold_marked(cluster.scripted, gate)
    keys = [lineage.key("owner", f"queued-{n}") for n in range(12)]
    for key in keys:
        record(key, worker)
    rounds = [asyncio.create_task(round_(upstream, key, "hold")) for key in keys]
    try:

        def loaded() -> dict[str, Any] | None:
            info = live_info(worker)
            return (
                info if info and info["running"] == 2 and info["in_flight"] + info["queued"] == 12 else None
            )

        info = await asyncio.to_thread(wait_until, loaded, 10, "twelve rounds in the heartbeat")
        assert (info["in_flight"], info["queued"]) == (8, 4)
        assert upstream.placement.load(info) == 12
    finally:
        gate.open()
        assert set(await asyncio.gather(*rounds)) == {worker}


async def test_a_lineage_stays_on_its_worker_across_rounds(cluster: Pool) -> None:
    upstream = gateway_upstream()
    hits, new = placements("hit"), placements("new")
    keys = [lineage.key("owner", f"conversation-{n}") for n in range(4)]
    served: dict[str, set[str]] = {key: set() for key in keys}
    for turn in range(6):
        for key in keys:
            served[key].add(await round_(upstream, key, f"turn {turn}"))
    for key in keys:
        assert len(served[key]) == 1, served
        assert placement_of(key) == next(iter(served[key]))
    assert (placements("new") - new, placements("hit") - hits) == (4, 20)


async def test_new_lineages_even_out_the_lineages_each_worker_holds(cluster: Pool) -> None:
    """A new lineage goes to the worker holding the fewest active lineages, whatever the load says:
    with three on A, the next three new ones go to B, then they alternate."""
    upstream = gateway_upstream()
    first, second = cluster.ids

    async def settle() -> None:
        """Until fresh heartbeats show no load (load alone would then choose at random)."""
        since = time.time()

        def idle() -> bool:
            infos = [live_info(worker) for worker in cluster.ids]
            return all(i and i["at"] > since and i["in_flight"] == i["queued"] == 0 for i in infos)

        await asyncio.to_thread(wait_until, idle, 10, "idle workers")
        await upstream.workers(fresh=True)

    for n in range(3):
        key = lineage.key("owner", f"held-{n}")
        record(key, first)
        assert await round_(upstream, key) == first  # a hit: now counted on A
    served = []
    for n in range(5):
        await settle()
        served.append(await round_(upstream, lineage.key("owner", f"fresh-{n}")))
    assert served[:3] == [second] * 3, served
    assert set(served[3:]) == {first, second}, served


async def test_affinity_off_places_nothing(cluster: Pool) -> None:
    upstream = gateway_upstream(GATEWAY_ROUTING_AFFINITY="false")
    key = lineage.key("owner", "unplaced")
    served = {await round_(upstream, key) for _ in range(3)}
    assert served <= set(cluster.ids)
    assert placement_of(key) is None


async def test_a_burst_of_new_lineages_spreads_by_load(cluster: Pool) -> None:
    """Four held rounds load worker A; eight new lineages at once then fill B first: the rounds this
    gateway has just sent count, not only the heartbeat it read before the burst."""
    upstream = gateway_upstream()
    first, second = cluster.ids
    gate = Gate()
    hold_marked(cluster.scripted, gate)
    loaders = [lineage.key("owner", f"loader-{n}") for n in range(4)]
    for key in loaders:
        record(key, first)
    background = [asyncio.create_task(round_(upstream, key, "hold")) for key in loaders]
    try:
        await asyncio.to_thread(
            wait_until, lambda: (live_info(first) or {}).get("in_flight") == 4, 10, "A's heartbeat shows 4"
        )
        await upstream.workers(fresh=True)
        new = placements("new")
        tasks = [asyncio.create_task(round_(upstream, lineage.key("owner", f"new-{n}"))) for n in range(8)]
        while placements("new") - new < 8:  # every one placed; A's then wait behind its held rounds
            await asyncio.sleep(0.01)
    finally:
        gate.open()
    burst = await asyncio.gather(*tasks)
    assert set(await asyncio.gather(*background)) == {first}
    # B (0 running) takes rounds until it has as many as A (4), then they alternate: 6 and 2.
    assert 5 <= burst.count(second) <= 7, burst


async def test_an_overloaded_workers_lineage_moves(cluster: Pool) -> None:
    upstream = gateway_upstream(GATEWAY_ROUTING_MAX_WORKER_LOAD="2")
    first, second = cluster.ids
    key = lineage.key("owner", "busy")
    record(key, first)
    assert await round_(upstream, key) == first
    gate = Gate()
    hold_marked(cluster.scripted, gate)
    others = [lineage.key("owner", f"other-{n}") for n in range(2)]
    for other in others:
        record(other, first)
    background = [asyncio.create_task(round_(upstream, other, "hold")) for other in others]
    moved = placements("moved")
    try:
        await asyncio.to_thread(wait_until, lambda: cluster.scripted.in_flight == 2, 10, "two held rounds")
        assert await round_(upstream, key) == second  # A holds 2 = the bound
    finally:
        gate.open()
        assert set(await asyncio.gather(*background)) == {first}
    assert placement_of(key) == second
    assert placements("moved") - moved == 1
    assert await round_(upstream, key) == second  # the lineage stays where it moved


async def test_a_dead_workers_lineages_move_and_nothing_fails(cluster: Pool) -> None:
    upstream = gateway_upstream()
    keys = [lineage.key("owner", f"agent-{n}") for n in range(6)]
    first_round = {key: await round_(upstream, key) for key in keys}
    victim = cluster.workers[0]
    victim_id = worker_id(victim)
    survivor = cluster.ids[1]
    assert victim_id in first_round.values()
    victim.kill()
    await asyncio.to_thread(wait_until, lambda: live_info(victim_id) is None, 10, "the heartbeat expires")
    await upstream.workers(fresh=True)
    for key in keys:
        assert await round_(upstream, key) == survivor
        assert placement_of(key) == survivor


async def test_a_round_stranded_on_a_dead_workers_queue_is_sent_again(cluster: Pool) -> None:
    """The worker dies after the gateway read it as live and before it took the round: the round is
    sent once more to the shared queue and the client gets its answer, not a read timeout."""
    upstream = gateway_upstream()
    victim = cluster.workers[0]
    victim_id, survivor = worker_id(victim), cluster.ids[1]
    key = lineage.key("owner", "stranded")
    record(key, victim_id)
    await upstream.workers(fresh=True)
    victim.kill()
    started = time.monotonic()
    assert await round_(upstream, key) == survivor
    assert time.monotonic() - started < 10  # the heartbeat expires within 2 s; the read timeout is 30 s


async def test_a_record_pointing_at_a_gone_worker_or_garbage_never_fails(cluster: Pool) -> None:
    upstream = gateway_upstream()
    gone = lineage.key("owner", "gone")
    garbage = lineage.key("owner", "garbage")
    wrong_type = lineage.key("owner", "wrong-type")
    record(gone, f"{socket.gethostname()}:1")  # listed nowhere
    record(garbage, b"\xff\xfe not a worker")
    client = redis.Redis.from_url(REDIS_URL)
    client.sadd(streams.WORKERS_SET, "ghost:1")  # in the set, its heartbeat long gone
    client.hset(streams.placement_key(wrong_type), "x", "y")
    client.close()
    for key in (gone, garbage, wrong_type):
        served = await round_(upstream, key)
        assert served in cluster.ids
        assert placement_of(key) == served
        assert await round_(upstream, key) == served


async def test_two_gateway_processes_agree_on_placement(cluster: Pool) -> None:
    """Placements made by one gateway are followed by a fresh one (a restart) and another process."""
    keys = [lineage.key("owner", f"shared-{n}") for n in range(6)]
    first = gateway_upstream()
    placed = [await round_(first, key) for key in keys]
    assert set(placed) <= set(cluster.ids)
    restarted = gateway_upstream()
    assert [await round_(restarted, key) for key in keys] == placed
    code = (
        "import asyncio, sys\n"
        "from tests.inference_upstream.test_placement import gateway_upstream, round_\n"
        "async def main():\n"
        "    upstream = gateway_upstream()\n"
        "    for key in sys.argv[1:]:\n"
        "        print(await round_(upstream, key))\n"
        "asyncio.run(main())\n"
    )
    env = {**child_env({}), "DJANGO_SETTINGS_MODULE": "gateway.settings"}
    if KEYPREFIX:
        env["PYTEST_XDIST_WORKER"] = KEYPREFIX[:-1]
    out = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", code, *keys],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == placed


async def test_a_burst_of_new_lineages_at_once_evens_out_the_lineages() -> None:
    """Eight new lineages placed at once, with A holding four: each counts the ones placed before it
    that are not yet in Redis, so B takes four and then they alternate, not all eight."""
    import redis.asyncio as aioredis

    from inference_app.upstream.placement import Placement

    placement = Placement(gateway_config())
    live = [
        {"worker": name, "queue": f"q-{name}", "models": [MODEL], "running": 0, "in_flight": 0, "queued": 0}
        for name in ("burst-a", "burst-b")
    ]
    client = aioredis.Redis.from_url(REDIS_URL)
    try:
        await client.delete(*(streams.worker_lineages_key(w["worker"]) for w in live))
        held = {lineage.key("owner", f"burst-held-{n}"): time.time() for n in range(4)}
        await client.zadd(streams.worker_lineages_key("burst-a"), held)
        keys = [lineage.key("owner", f"burst-new-{n}") for n in range(8)]
        await client.delete(*(streams.placement_key(key) for key in keys))
        placed = await asyncio.gather(
            *(placement.place(client, key, live, MODEL, f"request-{n}") for n, key in enumerate(keys))
        )
        workers = [p.worker for p in placed if p is not None]
        assert len(workers) == 8 and 5 <= workers.count("burst-b") <= 7, workers
        counts = [await client.zcard(streams.worker_lineages_key(w["worker"])) for w in live]
        assert counts[0] + counts[1] == 12 and abs(counts[0] - counts[1]) <= 2, counts
    finally:
        await client.delete(*(streams.worker_lineages_key(w["worker"]) for w in live))
        await client.aclose()


def test_a_chain_of_responses_stays_on_one_worker_through_the_gateway(
    cluster: Pool, live_gateway: Any, gateway_config: Any
) -> None:
    """End to end through ``POST /v1/responses``: a client-tool round and two ``previous_response_id``
    continuations of one chain reach one worker; a second chain, new, goes to the other one (the
    worker holding fewer lineages)."""
    import httpx

    from tests.responses.scripts import Script, call, handler, text

    gateway_config(llm_api_base="", redis_url=REDIS_URL, upstream_api="chat_completions")
    scripted = cluster.scripted
    scripted.requests.clear()
    tool = {"type": "function", "name": "lookup", "parameters": {"type": "object", "properties": {}}}

    def create(body: dict[str, Any], *parts: Any) -> dict[str, Any]:
        scripted.script(CHAT, handler(Script(list(parts)), "chat_completions"))
        r = httpx.post(f"{live_gateway.url}/v1/responses", json={"model": MODEL, **body}, timeout=60)
        assert r.status_code == 200, r.text
        return dict(r.json())

    for n in range(2):
        first = create({"input": f"chain {n}", "tools": [tool]}, call("lookup", "{}"))
        call_id = first["output"][-1]["call_id"]
        output = [{"type": "function_call_output", "call_id": call_id, "output": "42"}]
        second = create({"previous_response_id": first["id"], "input": output, "tools": [tool]}, text("42"))
        create({"previous_response_id": second["id"], "input": "and then?"}, text("done"))
    served = [r.headers.get("x-relayed-by") for r in scripted.requests if r.path == CHAT]
    assert len(served) == 6 and all(served), served
    assert len(set(served[:3])) == 1 and len(set(served[3:])) == 1, served
    assert {served[0], served[3]} == set(cluster.ids), served


def test_a_dead_workers_unfinished_rounds_are_not_kept() -> None:
    """Rounds sent to a worker that died are forgotten once it leaves the registry (no growth)."""
    from inference_app.upstream.placement import Placement

    placement = Placement(gateway_config())
    live = [{"worker": "alive", "queue": "q-alive", "models": [MODEL]}]
    placement.sent("dead", "request-1")
    placement.sent("alive", "request-2")
    assert placement.choose(None, live, MODEL) is not None
    assert set(placement._sent) == {"alive"}
