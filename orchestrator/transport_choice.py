"""Which transport a model's requests take: litellm, or straight over HTTP.

Why two: litellm reaches every provider, but its per-call work (request
mapping, cost lookups, response rebuilding, a fresh connection per call) costs
8-10 ms of CPU a call, more than the rest of a night's work per call. The
servers overnight is for — llama-server, vLLM, Ollama's /v1, LM Studio — speak
the OpenAI chat API already, and for them kept-alive http.client connections do
the same job in about a millisecond (bench/concurrency.py). `auto` picks the
direct route for those ("openai/<name>" with an `api_base`, no proxy in the way)
and litellm for everything else.
"""

from __future__ import annotations

import urllib.request
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from orchestrator.direct_http import DirectHTTP
from orchestrator.litellm_transport import LiteLLMTransport, litellm_module
from orchestrator.transports import OPENAI_PREFIX, event_byte_limit

if TYPE_CHECKING:
    from orchestrator.config import ModelConfig


def uses_direct_http(config: ModelConfig) -> bool:
    """Whether `config` is answered over plain OpenAI-compatible HTTP rather than litellm."""
    if config.transport == "direct":
        return True
    if config.transport == "litellm":
        return False
    return bool(config.api_base) and config.name.startswith(OPENAI_PREFIX) and not behind_proxy(config.api_base or "")


def behind_proxy(url: str) -> bool:
    """Whether HTTP(S)_PROXY applies to `url` (and NO_PROXY does not exempt it): litellm honours those, http.client does not."""
    parts = urlsplit(url)
    return bool(urllib.request.getproxies().get(parts.scheme)) and not urllib.request.proxy_bypass(parts.hostname or "")


def routing_problem(config: ModelConfig) -> str | None:
    """Why litellm cannot route `config.name` to any provider (checked before a night, without a request); None if it can."""
    if uses_direct_http(config):
        return None
    litellm = litellm_module()
    try:
        litellm.get_llm_provider(model=config.name, api_base=config.api_base)
    except Exception as exc:  # litellm.BadRequestError: "LLM Provider NOT provided"
        return " ".join(str(exc).split())[:200]
    return None


def transport_for(config: ModelConfig, *, max_output_chars: int = 20000) -> "DirectHTTP | LiteLLMTransport":
    if uses_direct_http(config):
        return DirectHTTP(config, max_event_bytes=event_byte_limit(max_output_chars))
    return LiteLLMTransport(config)
