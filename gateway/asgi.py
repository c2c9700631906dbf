"""ASGI entry point: HTTP to Django, WebSocket to the Channels URL router.

Both go through ``GatewayASGIMiddleware`` (request id, body ceiling, metrics, access log).
"""

import gc
import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gateway.settings")

from django.core.asgi import get_asgi_application

django_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from gateway.fastpath import FastPathApp  # noqa: E402
from gateway.middleware import GatewayASGIMiddleware  # noqa: E402
from gateway.routing import websocket_urlpatterns  # noqa: E402

application = GatewayASGIMiddleware(
    ProtocolTypeRouter(
        {
            # The pure pass-through routes are served below Django (see gateway/fastpath.py).
            "http": FastPathApp(ASGIStaticFilesHandler(django_app)),
            "websocket": URLRouter(websocket_urlpatterns),
        }
    )
)

# Everything imported so far (Django, the apps, the URLconf) lives as long as the process: move it
# out of the garbage collector's reach, so full collections stay cheap under load.
gc.freeze()
