"""`lucebox serve`: OpenAI- and Anthropic-compatible HTTP server over one Engine.

app.py (routes, errors, auth) -> worker.py (FIFO queue, one engine thread, cancellation) ->
prefix_cache.py (snapshots at message boundaries); openai_api.py / anthropic_api.py (shapes),
prompt.py (chat template), tool_calls.py (reasoning / tool-call parsing), options.py (sampling).
FastAPI and uvicorn are imported here only, never by `import lucebox`.
"""
from .app import create_app, serve

__all__ = ["create_app", "serve"]
