"""The gateway ASGI stack (middleware, Django, Channels) with benchmark routes added."""

import os

os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings_bench"

from django.core.asgi import get_asgi_application  # noqa: E402

django_app = get_asgi_application()

from channels.generic.websocket import AsyncWebsocketConsumer  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.urls import path  # noqa: E402

from gateway.middleware import GatewayASGIMiddleware  # noqa: E402


class Echo(AsyncWebsocketConsumer):
    async def receive(self, text_data=None, bytes_data=None):  # type: ignore[no-untyped-def]
        await self.send(text_data=text_data)


application = GatewayASGIMiddleware(
    ProtocolTypeRouter({"http": django_app, "websocket": URLRouter([path("bench/ws", Echo.as_asgi())])})
)
