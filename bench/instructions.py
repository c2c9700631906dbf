"""Instructions a stored response costs each gateway: this one and the reference (agentic-api 0.9.0),
counted by valgrind's callgrind, side by side in one run.

``bench/responses.py`` measures req/s and CPU time, which move by 10-30 % from machine to machine
and from run to run on a shared 2-core VM (``docs/performance.md``): the reference's CPU a stored
request differed by a third between two sessions' machines while ours stayed put. Instructions
retired do not depend on the machine's speed or on what else runs on it, so this script gives a
ratio that can be compared across sessions and machines, and an A/B of a small change that a
timed run cannot resolve (``--before``).

Each server runs under ``valgrind --tool=callgrind`` (all its threads and child processes counted)
in front of the same scripted upstream as ``bench/responses.py`` (which runs in this process, not
under valgrind), once serving ``--small`` and once ``--large`` stored responses after the same
warm-up; instructions a request = the difference of the two totals over the difference of the two
counts, so start-up, warm-up and shutdown cancel out. Our gateway runs as ``manage.py serve`` with
one server process (``make run`` starts one per core; each costs the same a request), the reference
as ``bench/responses.py`` starts it. Every request must end as a stored, completed response; any
error fails the run (exit 1).

    .venv/bin/python bench/instructions.py [--reference /work/ref-venv/bin/agentic-server]
        [--postgres postgres://postgres@127.0.0.1:5432/postgres] [--stores sqlite,postgres]
        [--modes json,sse] [--small 100] [--large 500] [--before <checkout>]

Needs valgrind (Debian's ``valgrind`` package). A gateway under callgrind starts in about a minute:
a full run takes 10-15 minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import responses as bench_responses  # noqa: E402  (bench/responses.py: upstream, load, databases)

START_TIMEOUT_S = 600  # Django's start-up under callgrind takes about a minute on a 2-core VM


def _totals(pattern: str) -> int:
    """The instructions in every callgrind output file matching ``pattern`` (one per process)."""
    total = 0
    for path in glob.glob(pattern):
        with open(path) as out:
            for line in out:
                if line.startswith(("totals:", "summary:")):
                    total += int(line.split()[1])
                    break
    return total


def _instructions(
    target: str, root: Path, upstream: str, store_url: str, body: dict[str, Any], served: int, work: str
) -> tuple[int, int]:
    """(instructions, errors) of one server's whole life under callgrind, serving ``served``
    measured requests (after the warm-up of ``bench/responses.load``); ``root``: our checkout, or
    the reference's binary. Started by ``bench/responses.py``'s own starters, under valgrind."""
    home = tempfile.mkdtemp(prefix=f"{target}-", dir=work)
    out = f"{home}/callgrind.%p.out"
    valgrind = ["valgrind", "--tool=callgrind", "--trace-children=yes", f"--callgrind-out-file={out}"]
    if target == "reference":
        proc, url = bench_responses.start_reference(
            str(root), upstream, home, store_url, wrapper=valgrind, start_timeout=START_TIMEOUT_S
        )
    else:  # one server process: each of make run's costs the same a request
        proc, url = bench_responses.start_gateway(
            upstream, store_url, home, 1, root, wrapper=valgrind, start_timeout=START_TIMEOUT_S
        )
    try:
        stats = asyncio.run(bench_responses.load(url, body, 4, served))
    finally:
        proc.terminate()
        proc.wait(120)  # under callgrind the shutdown takes seconds; a killed process leaves no counts
    if stats["errors"]:
        print(f"  {target}: first error: {stats['first_error']}", flush=True)
    return _totals(out.replace("%p", "*")), stats["errors"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reference", default="/work/ref-venv/bin/agentic-server")
    parser.add_argument("--postgres", default="postgres://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--stores", default="sqlite,postgres")
    parser.add_argument("--modes", default="json,sse")
    parser.add_argument("--small", type=int, default=100, help="measured requests of the first run")
    parser.add_argument("--large", type=int, default=500, help="measured requests of the second run")
    parser.add_argument("--before", default="", help="another checkout of this gateway, counted beside")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (Debian: apt-get install valgrind)")
    if args.large <= args.small:
        raise SystemExit("--large must be more than --small")

    upstream = bench_responses.start_upstream()
    work = tempfile.mkdtemp(prefix="bench-instructions-")
    targets: dict[str, Path] = {"gateway": ROOT}
    if args.before:
        targets["before"] = Path(args.before).resolve()
    if Path(args.reference).exists():
        targets["reference"] = Path(args.reference)
    else:
        print(f"(no reference at {args.reference!r}: ours only)")
    errors = 0
    print("| store | mode | target | instructions a stored request | / reference |")
    print("|---|---|---|---|---|")
    for store in args.stores.split(","):
        for mode in args.modes.split(","):
            body = {"model": "test-model", "input": "Hello there", "stream": mode == "sse", "store": True}
            per_request: dict[str, float] = {}
            for name, root in targets.items():
                counts = []
                for served in (args.small, args.large):
                    url = ""
                    if store == "postgres":
                        url = bench_responses.postgres_url(args.postgres, f"instructions_{name}")
                    total, failed = _instructions(
                        "reference" if name == "reference" else "gateway",
                        root,
                        upstream,
                        url,
                        body,
                        served,
                        work,
                    )
                    errors += failed
                    counts.append(total)
                per_request[name] = (counts[1] - counts[0]) / (args.large - args.small)
            reference = per_request.get("reference")
            for name, value in per_request.items():
                ratio = f"{value / reference:.2f}" if reference else "-"
                print(f"| {store} | {mode.upper()} | {name} | {value / 1e6:.3f} M | {ratio} |", flush=True)
    shutil.rmtree(work, ignore_errors=True)
    print()
    print(f"total errors: {errors}" + ("  (a failing result)" if errors else ""))
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
