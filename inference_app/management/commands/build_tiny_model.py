"""``manage.py build_tiny_model [--out DIR]``: build the offline demo model (random weights)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser


class Command(BaseCommand):
    help = (
        "Build a tiny random-weight Llama with a locally trained tokenizer and a ChatML template "
        "(Hermes tool calls). Offline, a few seconds. Output is gibberish: it is a demo/test model."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--out", default=None, help="directory (default: <data_dir>/models/tiny-chat)")
        parser.add_argument("--force", action="store_true", help="rebuild even if the directory exists")

    def handle(self, *args: Any, **options: Any) -> None:
        from inference_app.engine.host import default_model_dir

        out = Path(options["out"]) if options["out"] else default_model_dir()
        if (out / "config.json").exists() and not options["force"]:
            self.stdout.write(f"{out} already holds a model (use --force to rebuild)")
            return
        try:
            from inference_app.engine.tiny_model import build_tiny_model
        except ImportError as exc:  # pragma: no cover - depends on the venv
            raise CommandError(f"needs the inference dependencies (make install-inference): {exc}") from exc
        build_tiny_model(out)
        self.stdout.write(f"built the tiny demo model in {out}")
