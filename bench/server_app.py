"""The gateway ASGI stack (middleware, Django, Channels) with benchmark routes added."""

import os

os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings_bench"

from channels.generic.websocket import AsyncWebsocketConsumer
from channels.routing import ProtocolTypeRouter, URLRouter
from django.urls import path

from gateway.asgi import HttpDispatch
from gateway.core.middleware import GatewayASGIMiddleware


class Echo(AsyncWebsocketConsumer):
    async def receive(self, text_data=None, bytes_data=None):  # type: ignore[no-untyped-def]
        await self.send(text_data=text_data)


application = GatewayASGIMiddleware(
    ProtocolTypeRouter({"http": HttpDispatch(), "websocket": URLRouter([path("bench/ws", Echo.as_asgi())])})
)
