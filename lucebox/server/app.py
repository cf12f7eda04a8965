"""The FastAPI app: routes, authentication, errors in each API's JSON shape, one log line per request.

Routes validate and render the prompt, then hand a Job to the Worker (worker.py) and turn its
events into a response: one JSON object, or server-sent events that stop (and cancel the job)
when the client goes away.
"""
from __future__ import annotations

import asyncio
import hmac
import logging
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..config import ServeConfig
from . import anthropic_api as A
from . import openai_api as O
from . import streams
from .options import BadRequest
from .prompt import Prompt, check_fits, encode, max_new_tokens, render
from .tool_calls import ReplyParser, merge_events
from .worker import Job, QueueFull, Result, Worker

log = logging.getLogger("lucebox.server")
DISCONNECT_POLL_S = 0.1


class ApiError(Exception):
    def __init__(self, status: int, message: str, kind: str, param: str | None = None):
        super().__init__(message)
        self.status, self.kind, self.param = status, kind, param


def create_app(engine, config: ServeConfig | None = None) -> FastAPI:
    """The server for one loaded Engine (or any object with its generation interface)."""
    config = config or ServeConfig()
    state: dict = {}

    @asynccontextmanager
    async def lifespan(app):
        state["worker"] = Worker(engine, max_queue=config.max_queue, prefix_cache_bytes=config.prefix_cache_bytes)
        try:
            yield
        finally:
            await run_in_threadpool(state["worker"].close)

    app = FastAPI(title="lucebox", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.worker = None
    max_ctx, max_tree = engine.info["max_ctx"], engine.info["max_tree"]
    tok = engine.tokenizer
    # the served name, and the GGUF's file name (what a user may type)
    names = {config.model_name} | ({Path(engine.config.target).stem} if hasattr(engine, "config") else set())

    # --- errors ---------------------------------------------------------------------------
    def error_response(request: Request, status: int, message: str, kind: str, param: str | None = None,
                       logged: bool = False):
        message = " ".join(message.split())
        if not logged:  # the worker logged the failures it saw
            log.info("%s %s %d error: %s", request.method, request.url.path, status, message)
        if request.url.path.startswith("/v1/messages"):
            akind = {401: "authentication_error", 404: "not_found_error", 503: "overloaded_error",
                     500: "api_error"}.get(status, "invalid_request_error")
            return JSONResponse(A.error_body(message, akind), status_code=status)
        return JSONResponse(O.error_body(message, kind, param), status_code=status)

    @app.exception_handler(ApiError)
    async def _api_error(request, e: ApiError):
        return error_response(request, e.status, str(e), e.kind, e.param, getattr(e, "logged", False))

    @app.exception_handler(BadRequest)
    async def _bad_request(request, e: BadRequest):
        return error_response(request, 400, str(e), "invalid_request_error", e.param, getattr(e, "logged", False))

    @app.exception_handler(QueueFull)
    async def _queue_full(request, e: QueueFull):
        return error_response(request, 503, str(e), "server_overloaded")

    @app.exception_handler(RequestValidationError)
    async def _invalid(request, e: RequestValidationError):
        err = e.errors()[0] if e.errors() else {}
        where = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
        if err.get("type") == "json_invalid":
            message = f"the request body is not valid JSON ({err.get('ctx', {}).get('error', 'parse error')})"
            where = ""  # its loc is the character offset, not a parameter
        elif err.get("type") == "extra_forbidden":
            message = f"unknown field {where!r}"
        else:
            message = f"{where or 'body'}: {err.get('msg', 'invalid value')}"
        return error_response(request, 400, message, "invalid_request_error", where or None)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request, e: StarletteHTTPException):
        kind = "not_found_error" if e.status_code == 404 else "invalid_request_error"
        return error_response(request, e.status_code, f"{request.method} {request.url.path}: {e.detail}", kind)

    @app.exception_handler(Exception)
    async def _internal(request, e: Exception):
        log.debug("unhandled error", exc_info=True)
        return error_response(request, 500, f"internal error: {e}", "server_error")

    # --- helpers --------------------------------------------------------------------------
    async def authorize(request: Request) -> None:
        if config.api_key is None:
            return
        bearer = request.headers.get("authorization", "")
        given = bearer[7:].strip() if bearer.lower().startswith("bearer ") else request.headers.get("x-api-key")
        if not hmac.compare_digest((given or "").encode(), config.api_key.encode()):
            raise ApiError(401, "missing or wrong API key (send Authorization: Bearer KEY or x-api-key: KEY)",
                           "authentication_error")

    def check_model(model: str | None) -> None:
        if model and model not in names:
            raise ApiError(404, f"model {model!r} is not served here; this server serves {config.model_name!r}",
                           "not_found_error", "model")

    async def submit(request: Request, prompt_ids: list[int], options: dict) -> Job:
        job = Job(ids=prompt_ids, options=options, loop=asyncio.get_running_loop(),
                  label=f"{request.method} {request.url.path}")
        state["worker"].submit(job)
        return job

    async def collect(job: Job, request: Request) -> tuple[str, Result]:
        """Wait for a non-streamed job; a client that goes away cancels it."""
        async def watch():
            while not await request.is_disconnected():
                await asyncio.sleep(DISCONNECT_POLL_S)
            job.cancel()

        watcher = asyncio.create_task(watch())
        pieces = []
        try:
            while True:
                kind, value = await job.events.get()
                if kind == "text":
                    pieces.append(value)
                elif kind == "done":
                    return "".join(pieces), value
                elif kind == "error":
                    raise_engine_error(value)
        finally:
            watcher.cancel()
            job.cancel()  # no-op once done

    async def events_of(job: Job):
        try:
            while True:
                kind, value = await job.events.get()
                yield kind, value
                if kind in ("done", "error"):
                    return
        finally:
            job.cancel()

    def raise_engine_error(e: BaseException):
        if isinstance(e, asyncio.CancelledError):
            raise e
        error = (BadRequest(str(e)) if isinstance(e, ValueError)
                 else ApiError(500, f"the engine failed: {e}", "server_error"))
        error.logged = True
        raise error

    def stop_sequence(r: Result, stops: list[str]) -> str | None:
        if r.finish_reason != "stop":
            return None
        rest = tok.decode(r.tokens)[len(r.text):]
        return next((s for s in stops if rest.startswith(s)), None)

    def sse(lines):
        return StreamingResponse(lines, media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def start_chat(req, request: Request, limit: int | None):
        """Render, check and queue a chat request: (prompt, reply parser, job)."""
        check_model(req.model)
        prompt = await chat_prompt(req)
        options = req.options(max_new_tokens(limit, len(prompt.ids), max_ctx), max_tree)
        parser = ReplyParser(thinking=prompt.thinking, tools=prompt.tools)
        return prompt, parser, await submit(request, prompt.ids, options)

    async def chat_prompt(req, check: bool = True) -> Prompt:
        prompt = await run_in_threadpool(render, tok, req.chat_messages(), tools=req.active_tools(),
                                         template_kwargs=req.template_kwargs())
        if check:
            check_fits(len(prompt.ids), max_ctx)
        return prompt

    # --- routes: health, models -------------------------------------------------------------
    @app.get("/health")
    async def health(request: Request):
        w = state["worker"]
        return {"status": "ok", "model": config.model_name, "waiting": w.waiting, "max_queue": w.max_queue}

    @app.get("/v1/models", dependencies=[Depends(authorize)])
    async def models(request: Request):
        log.info("GET /v1/models 200")
        return {"object": "list", "data": [{"id": config.model_name, "object": "model", "created": 0,
                                            "owned_by": "lucebox", "max_model_len": max_ctx}]}

    # --- routes: OpenAI ---------------------------------------------------------------------
    @app.post("/v1/chat/completions", dependencies=[Depends(authorize)])
    async def chat_completions(req: O.ChatRequest, request: Request):
        req.check_supported()
        prompt, parser, job = await start_chat(req, request, req.token_limit)
        model = req.model or config.model_name
        if not req.stream:
            text, r = await collect(job, request)
            events = parser.feed(text) + parser.finish()
            finish = O.finish_reason(r.finish_reason, bool(parser.calls))
            return O.chat_completion(model, merge_events(events), finish,
                                     O.usage(r.prompt_tokens, len(r.tokens), r.cached_tokens))

        return sse(streams.openai_chat(events_of(job), parser, model, req.include_usage))

    @app.post("/v1/completions", dependencies=[Depends(authorize)])
    async def completions(req: O.CompletionRequest, request: Request):
        check_model(req.model)
        req.check_supported()
        if isinstance(req.prompt, str):
            ids = await run_in_threadpool(encode, tok, req.prompt, "prompt")
        else:
            ids = list(req.prompt)
            if any(not 0 <= t < tok.vocab_size for t in ids):
                raise BadRequest(f"prompt token ids must be in [0, {tok.vocab_size})", "prompt")
        if not ids:
            raise BadRequest("the prompt is empty", "prompt")
        check_fits(len(ids), max_ctx)
        options = req.options(max_new_tokens(req.max_tokens, len(ids), max_ctx), max_tree)
        job = await submit(request, ids, options)
        model = req.model or config.model_name
        if not req.stream:
            text, r = await collect(job, request)
            return O.completion(model, text, O.finish_reason(r.finish_reason, False),
                                O.usage(r.prompt_tokens, len(r.tokens), r.cached_tokens))

        return sse(streams.openai_completion(events_of(job), model, req.include_usage))

    # --- routes: Anthropic ------------------------------------------------------------------
    @app.post("/v1/messages/count_tokens", dependencies=[Depends(authorize)])
    async def count_tokens(req: A.CountRequest, request: Request):
        check_model(req.model)
        prompt = await chat_prompt(req, check=False)  # a client counts to learn whether the prompt fits
        log.info("POST /v1/messages/count_tokens 200 prompt=%d", len(prompt.ids))
        return {"input_tokens": len(prompt.ids)}

    @app.post("/v1/messages", dependencies=[Depends(authorize)])
    async def messages(req: A.MessagesRequest, request: Request):
        stops = req.stops()
        prompt, parser, job = await start_chat(req, request, req.max_tokens)
        model = req.model or config.model_name
        if not req.stream:
            text, r = await collect(job, request)
            events = merge_events(parser.feed(text) + parser.finish())
            return A.message(model, events, A.stop_reason(r.finish_reason, bool(parser.calls)),
                             stop_sequence(r, stops), A.usage(r.prompt_tokens, len(r.tokens), r.cached_tokens))

        return sse(streams.anthropic_messages(events_of(job), parser, model, len(prompt.ids),
                                              lambda r: stop_sequence(r, stops)))

    return app


def serve(engine, config: ServeConfig) -> None:
    """Run the server until Ctrl+C (uvicorn; loopback by default)."""
    import uvicorn

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    app = create_app(engine, config)
    uvicorn.run(app, host=config.host, port=config.port, log_level="warning", access_log=False)
