"""The Django project package: config, ASGI app, errors, middleware, auth, pass-through views."""
