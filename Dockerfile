# syntax=docker/dockerfile:1.7
# Multi-stage build. Targets:
#   web    - the gateway (uvicorn + uvloop/httptools), `docker build --target web -t gateway-web .`
#   worker - a Celery worker (inference on GPU hosts vLLM; tools), `docker build --target worker -t gateway-worker .`

ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim AS base
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN groupadd --system --gid 10001 gateway \
 && useradd --system --uid 10001 --gid gateway --home-dir /app --shell /usr/sbin/nologin gateway
WORKDIR /app

FROM base AS build
RUN apt-get update && apt-get install -y --no-install-recommends build-essential \
 && rm -rf /var/lib/apt/lists/*
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
COPY requirements.txt .
RUN pip install -r requirements.txt

FROM base AS web
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH HOST=0.0.0.0 PORT=8000 GATEWAY_SERVER_DATA_DIR=/app/var
COPY --chown=gateway:gateway . /app
RUN mkdir -p /app/var && chown gateway:gateway /app/var
USER gateway
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=3s CMD python -c "import urllib.request,os;urllib.request.urlopen(f'http://127.0.0.1:{os.environ.get(\"PORT\",\"8000\")}/health',timeout=2)"
ENTRYPOINT ["/app/docker/entrypoint.sh"]
CMD ["python", "manage.py", "serve"]

FROM build AS worker-build
COPY requirements-inference-gpu.txt ./
RUN pip install -r requirements-inference-gpu.txt

FROM base AS worker
# bubblewrap: the code-interpreter sandbox of `-Q tools` workers (needs user namespaces; Docker's
# default seccomp profile blocks them, so tool workers run with a profile that allows clone/unshare).
RUN apt-get update && apt-get install -y --no-install-recommends bubblewrap && rm -rf /var/lib/apt/lists/*
COPY --from=worker-build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH GATEWAY_SERVER_DATA_DIR=/app/var VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 \
    VLLM_WORKER_MULTIPROC_METHOD=spawn GATEWAY_SKIP_MIGRATE=1
COPY --chown=gateway:gateway . /app
RUN mkdir -p /app/var && chown gateway:gateway /app/var
USER gateway
ENTRYPOINT ["/app/docker/entrypoint.sh"]
# One container per GPU (CUDA_VISIBLE_DEVICES). vLLM spawns processes, so the inference worker uses
# the threads pool (not prefork). Tool workers: `celery -A gateway worker -Q tools -c 16`;
# background responses: `celery -A gateway worker -Q responses -c 8`.
CMD ["celery", "-A", "gateway", "worker", "-Q", "inference", "-P", "threads", "-c", "64", "--loglevel", "INFO"]
