"""Deprecations of Django, Channels, uvicorn, Celery and pydantic fail the tests (pytest.ini)."""

from __future__ import annotations

import warnings

import pytest
from celery.exceptions import CDeprecationWarning, CPendingDeprecationWarning
from django.utils.deprecation import RemovedInDjango60Warning, RemovedInDjango61Warning
from pydantic.warnings import PydanticDeprecatedSince20
from uvicorn.config import UvicornDeprecationWarning


@pytest.mark.parametrize(
    "category",
    [
        RemovedInDjango60Warning,
        RemovedInDjango61Warning,
        CDeprecationWarning,
        CPendingDeprecationWarning,
        UvicornDeprecationWarning,
    ],
)
def test_a_librarys_own_deprecation_category_is_an_error(category: type[Warning]) -> None:
    with pytest.raises(category):
        warnings.warn("going away", category, stacklevel=1)


def test_a_pydantic_deprecated_api_is_an_error() -> None:
    from pydantic import BaseModel

    class M(BaseModel):
        x: int = 1

    with pytest.raises(PydanticDeprecatedSince20):
        M().dict()  # the v1 spelling of model_dump


@pytest.mark.parametrize(
    "module", ["channels.layers", "uvicorn.main", "celery.app.task", "django.db", "gateway.views"]
)
def test_a_plain_deprecation_warning_from_any_of_them_is_an_error(module: str) -> None:
    with pytest.raises(DeprecationWarning):
        warnings.warn_explicit("going away", DeprecationWarning, f"{module}.py", 1, module=module)


def test_each_task_has_its_queue_by_route_not_by_the_deprecated_task_attribute() -> None:
    from celery import Celery

    from gateway.celery import app
    from gateway.core.config import load_config
    from inference_app.upstream.celery_config import configure

    client = configure(Celery("routes-test", set_as_current=False), load_config({}))
    for name, queue in [
        ("gateway.ping", "tools"),
        ("inference_app.run_gateway_tool", "tools"),
        ("inference.generate", "inference"),
        ("responses.run_background", "responses"),
    ]:
        assert client.amqp.router.route({}, name)["queue"].name == queue, name
        task = app.tasks.get(name)
        if task is not None:
            assert "queue" not in type(task).__dict__, name  # Celery 6 drops the attribute
