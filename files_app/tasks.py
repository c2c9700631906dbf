"""Celery tasks of file search: ``files.ingest`` on the ``tools`` queue (files_app.ingest)."""

from __future__ import annotations

import asyncio

from celery import shared_task


@shared_task(name="files.ingest", ignore_result=True)
def ingest_task(pk: int) -> None:
    """Ingest one attachment (its lease makes a duplicate delivery a no-op)."""
    asyncio.run(_ingest_and_close(pk))


async def _ingest_and_close(pk: int) -> None:
    from files_app.ingest import ingest_one
    from inference_app.upstream.http import close_upstreams

    try:
        await ingest_one(pk)
    finally:
        # This task's event loop ends here: its upstream connections end with it.
        await close_upstreams()
