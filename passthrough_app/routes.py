"""The pass-through routes: Chat Completions, Completions, Embeddings, Audio, vLLM's own routes
(rerank, score, pooling, classify, tokenize, detokenize, speech) and ``[passthrough] extra_routes``.

These bodies belong to the upstream's contract, not ours: each is forwarded byte for byte
(:mod:`inference_app.upstream.forward`); audio uploads are streamed while the client still sends them."""

from __future__ import annotations

from inference_app.upstream.forward import Route

# vLLM's routes beyond the OpenAI API, relayed like the others (same path upstream). Their bodies
# are vLLM's contract, so they are not in the gateway's OpenAPI document (docs/passthrough.md).
VLLM_ROUTES = (
    "/v1/rerank",
    "/rerank",
    "/v1/score",
    "/score",
    "/pooling",
    "/classify",
    "/tokenize",
    "/detokenize",
    "/v1/audio/speech",
)


ROUTES: dict[str, Route] = {
    "/v1/chat/completions": Route("/v1/chat/completions"),
    "/v1/completions": Route("/v1/completions"),
    "/v1/embeddings": Route("/v1/embeddings"),
    "/v1/audio/transcriptions": Route("/v1/audio/transcriptions", stream_request_body=True),
    "/v1/audio/translations": Route("/v1/audio/translations", stream_request_body=True),
    **{path: Route(path) for path in VLLM_ROUTES},
}


def extra_routes(paths: tuple[str, ...]) -> dict[str, Route]:
    """The operator's ``[passthrough] extra_routes``: each relayed to the same path upstream (POST),
    with the rules of every pass-through route. A built-in route of the same path wins."""
    return {path: Route(path) for path in paths if path not in ROUTES}
