"""`lucebox run | chat | serve | bench | pull`: the command line.

Only click is imported up front; numpy, the native library and huggingface_hub load inside the
commands, so `lucebox --help` is instant. Errors leave as one line on stderr and a non-zero exit
(set LUCEBOX_DEBUG=1 for the traceback).
"""
from __future__ import annotations

import functools
import os
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

import click

from . import __version__
from .defaults import demo_notice
from .config import (DEFAULT_BUDGET, DEFAULT_DRAFT_TOP_K, DEFAULT_HOST, DEFAULT_MAX_QUEUE, DEFAULT_PORT,
                     DEFAULT_PREFIX_CACHE_GB, DRAFT_WEIGHTS, KV_TYPES, MAX_BUDGET, MAX_CTX_LIMIT, MAX_DRAFT_TOP_K,
                     MAX_NEW_TOKENS, MAX_TREE, MAX_TREE_LIMIT, MAX_UBATCH, MAX_VRAM_GB, LOG_LEVELS,
                     EngineConfig, GenerationConfig, ServeConfig)

PREFILL_BAR_MIN = 2048   # prompts at least this long get a progress bar
CTX_ROUND = 256
DEMO_NOTICE = demo_notice("pass --target/--draft")


def _friendly_errors(fn):
    """Turn the errors a user can cause into `Error: <one line>` and exit status 1."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from .hub import HubError

        try:
            return fn(*args, **kwargs)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except ModuleNotFoundError as e:
            if os.environ.get("LUCEBOX_DEBUG") or not e.name:
                raise
            raise click.ClickException(f"the Python package {e.name!r} is missing; "
                                       "reinstall lucebox (`pip install .`) to get its dependencies") from None
        except (FileNotFoundError, ValueError, HubError, RuntimeError, OSError) as e:
            if os.environ.get("LUCEBOX_DEBUG"):
                raise
            raise click.ClickException(" ".join(str(e).split()) or type(e).__name__) from None
    return wrapper


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, message="lucebox %(version)s")
def main():
    """Fast local LLM inference: Qwen3.5 GGUF target + DFlash draft + DDTree verification.

    With no model named, commands use $LUCEBOX_TARGET / $LUCEBOX_DRAFT, then the model fetched by
    `lucebox pull`, then the small pair embedded in the package.
    """


# --- shared options ------------------------------------------------------------------------
def _options(*options):
    """One decorator applying click options in the order listed (as --help shows them)."""
    def decorate(fn):
        for option in reversed(options):
            fn = option(fn)
        return fn
    return decorate


# options that go to EngineConfig as they are (option name -> field), gathered into `engine_opts`;
# tests/test_cli.py checks every config field has an option (and its default)
_ENGINE_FIELDS = {"kv": "kv", "cache_type_k": "cache_type_k", "cache_type_v": "cache_type_v", "device": "device",
                  "threads": "n_threads", "draft_window": "draft_window", "vram": "vram_gb", "ubatch": "ubatch",
                  "max_tree": "max_tree", "log_level": "log_level", "batch_invariant": "batch_invariant",
                  "draft_weights": "draft_weights"}
AUTO_CTX_HELP = ("auto: the largest that fits the GPU's free memory or --vram, up to the trained length "
                 "(on the CPU without --vram: 8192)")


class _ContextSize(click.ParamType):
    """--max-ctx: a token count or "auto"."""
    name = "INTEGER|auto"

    def convert(self, value, param, ctx):
        if isinstance(value, int) or value == "auto":
            return value
        try:
            n = int(value)
        except ValueError:
            self.fail(f"{value!r} is neither a number of tokens nor auto", param, ctx)
        if not 16 <= n <= MAX_CTX_LIMIT:
            self.fail(f"{n} is not in the range 16<=x<={MAX_CTX_LIMIT} (or auto)", param, ctx)
        return n


def _model_options(max_ctx_help: str):
    """--target, --draft, --no-draft, --max-ctx, and the EngineConfig options (passed on as `engine_opts`)."""
    add_options = _options(
        click.option("--target", type=click.Path(dir_okay=False),
                     help="Target GGUF (else $LUCEBOX_TARGET, the pulled model, the embedded default)."),
        click.option("--draft", type=click.Path(), help="DFlash draft folder (else $LUCEBOX_DRAFT or the pulled draft)."),
        click.option("--no-draft", is_flag=True, help="Load no draft (AR decoding only)."),
        click.option("--max-ctx", type=_ContextSize(), default=None, help=max_ctx_help),
        click.option("--vram", type=click.FloatRange(0, MAX_VRAM_GB, min_open=True), default=None,
                     help="Memory budget in GiB to plan the context and KV type against (default: the GPU's "
                          "free memory); prints the plan."),
        click.option("--kv", type=click.Choice(KV_TYPES), default=None,
                     help="KV cache type of K and V (default f16; with a memory budget and an auto context, "
                          "f16, else q8_0, else q4_0)."),
        click.option("-ctk", "--cache-type-k", type=click.Choice(KV_TYPES), default=None,
                     help="K cache type (as llama.cpp's), overriding --kv."),
        click.option("-ctv", "--cache-type-v", type=click.Choice(KV_TYPES), default=None,
                     help="V cache type (as llama.cpp's), overriding --kv."),
        click.option("--device", default=EngineConfig.device, show_default=True, help="auto, cpu, cuda or cuda:N."),
        click.option("--threads", type=click.IntRange(min=0), default=EngineConfig.n_threads,
                     help="CPU threads (0 = all)."),
        click.option("--ubatch", type=click.IntRange(1, MAX_UBATCH), default=None,
                     help="Prefill micro-batch in tokens (default 512, larger when the memory plan has room)."),
        click.option("--draft-window", type=click.IntRange(0, MAX_CTX_LIMIT), default=EngineConfig.draft_window,
                     help="The draft sees the last W tokens only (0 = its config's sliding_window, else 4096); "
                          "changes acceptance, never the output."),
        click.option("--draft-weights", type=click.Choice(DRAFT_WEIGHTS), default=EngineConfig.draft_weights,
                     show_default=True,
                     help="Store the draft's matrices as in the checkpoint or as Q8_0 (~half the memory of BF16); "
                          "changes acceptance, never the output."),
        click.option("--max-tree", type=click.IntRange(2, MAX_TREE_LIMIT), default=MAX_TREE, show_default=True,
                     help="Most nodes one verify holds, root included (sizes the tree scratch)."),
        click.option("--log-level", type=click.Choice(LOG_LEVELS), default=EngineConfig.log_level, show_default=True,
                     help="Native (ggml) log messages to show."),
        click.option("--batch-invariant/--no-batch-invariant", default=EngineConfig.batch_invariant, show_default=True,
                     help="Every token computes to the same bits in any batch, so speculative output equals AR "
                          "bit for bit; --no-batch-invariant lets CUDA pick faster batch-dependent kernels "
                          "(outputs may part at near-ties; the CPU is always invariant)."),
    )

    def decorate(fn):
        fn = add_options(fn)

        @functools.wraps(fn)
        def gather(**kwargs):
            kwargs["engine_opts"] = {field: kwargs.pop(name) for name, field in _ENGINE_FIELDS.items()}
            return fn(**kwargs)
        return gather
    return decorate


def _decode_options(n_gen_default: int):
    return _options(
        click.option("-n", "--n-gen", type=click.IntRange(1, MAX_NEW_TOKENS), default=n_gen_default, show_default=True,
                     help="Most tokens to generate."),
        click.option("--mode", type=click.Choice(["ar", "chain", "ddtree"]), default=None,
                     help="Decoding: ddtree when a draft is loaded, else ar."),
        click.option("--budget", type=click.IntRange(1, MAX_BUDGET), default=DEFAULT_BUDGET, show_default=True,
                     help="DDTree draft nodes per step."),
        click.option("--draft-top-k", type=click.IntRange(1, MAX_DRAFT_TOP_K), default=DEFAULT_DRAFT_TOP_K,
                     show_default=True, help="Draft candidates per block position (DDTree)."),
        click.option("--system", default=None, help="System message (chat template)."),
        click.option("--stop", multiple=True, help="Stop when the reply produces this text (repeatable)."),
        click.option("--no-chain-seed", is_flag=True,
                     help="Build the DDTree without first placing the draft's top-1 chain in it."),
    )


def _sampling_options(defaults_from: str):
    """--temperature/--temp ... --seed; unset options are None (the command fills in its defaults)."""
    return _options(
        click.option("--temperature", "--temp", "temperature", type=click.FloatRange(min=0.0), default=None,
                     help=f"Sampling temperature; 0 = greedy (default: {defaults_from})."),
        click.option("--top-k", "top_k", type=click.IntRange(min=0), default=None,
                     help="Sample among the k most likely tokens; 0 = off."),
        click.option("--top-p", type=click.FloatRange(min=0.0, max=1.0, min_open=True), default=None,
                     help="Nucleus sampling: the smallest set with this much probability; 1 = off."),
        click.option("--min-p", type=click.FloatRange(min=0.0, max=1.0), default=None,
                     help="Drop tokens below min_p x the top token's probability; 0 = off."),
        click.option("--repeat-penalty", type=click.FloatRange(min=0.0, min_open=True), default=None,
                     help="Penalise tokens of the last 64 (llama.cpp's rule); 1 = off."),
        click.option("--presence-penalty", type=float, default=None, help="Subtract from seen tokens' logits."),
        click.option("--frequency-penalty", type=float, default=None, help="Subtract count x this from logits."),
        click.option("--seed", type=click.IntRange(min=0, max=2 ** 64 - 1), default=None,
                     help="Sampling seed: one seed gives the same text in every mode (default: random)."),
    )


def _given(**values) -> dict:
    """The sampling options the user set (None = not given)."""
    return {k: v for k, v in values.items() if v is not None}


# --- helpers -------------------------------------------------------------------------------
def _resolve(target, draft, no_draft, mode):
    from .defaults import DRAFT_ENV, resolve

    # AR needs no draft: skip loading it (memory, time), unless asked for explicitly
    use_draft = not no_draft and (mode != "ar" or draft is not None)
    models = resolve(target, draft, use_draft=use_draft)
    if models.source == "embedded":
        click.echo(DEMO_NOTICE, err=True)
    if mode in ("chain", "ddtree") and models.draft is None:
        raise ValueError(f"--mode {mode} needs a draft: pass --draft DIR (or set ${DRAFT_ENV})"
                         + (" and drop --no-draft" if no_draft else ""))
    return models


def _load_tokenizer(models):
    from .tokenizer import Tokenizer

    return Tokenizer.from_gguf(models.target)


def _check_writable(path: Path, option: str) -> None:
    """ValueError unless `path` can be written now (tried: permissions alone do not say so for root or /proc);
    a file this creates is removed again."""
    existed = path.exists()
    try:
        with open(path, "a"):
            pass
    except OSError as e:
        raise ValueError(f"{option} {path}: cannot write it ({e.strerror or e}); name a writable path") from None
    if not existed:
        path.unlink()


def _fit_ctx(n_tokens: int, n_gen: int) -> int:
    need = n_tokens + n_gen + MAX_TREE
    return max(CTX_ROUND, -(-need // CTX_ROUND) * CTX_ROUND)


@contextmanager
def _spinner(desc: str):
    """An elapsed-time line on a terminal while a blocking native call runs (it releases the GIL)."""
    from tqdm import tqdm

    bar = tqdm(total=None, desc=desc, bar_format="{desc} {elapsed}", disable=None, file=sys.stderr, leave=False)
    done = threading.Event()

    def tick():
        while not done.wait(0.25):
            bar.refresh()

    thread = threading.Thread(target=tick, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        bar.close()


def _load_engine(models, tokenizer, *, max_ctx, engine_opts: dict):
    from .engine import Engine

    size_gb = models.target.stat().st_size / 1e9
    what = models.target.name + (f" + {models.draft.name}" if models.draft else "")
    with _spinner(f"loading {what} ({size_gb:.1f} GB)"):
        engine = Engine(models.target, draft=models.draft, max_ctx=max_ctx, tokenizer=tokenizer, **engine_opts)
    if engine.memory_plan is not None:
        click.echo(engine.memory_plan.table(), err=True)
    return engine


class _PrefillBar:
    """Engine.prefill's progress callback: a tqdm bar on stderr (a terminal) while a prompt of
    PREFILL_BAR_MIN tokens or more is prefilled, one micro-batch at a time."""

    def __init__(self):
        self._bar = None

    def __call__(self, done: int, total: int) -> None:
        if self._bar is None:
            if done or total < PREFILL_BAR_MIN or not sys.stderr.isatty():
                return
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc="prefill", unit="tok", file=sys.stderr, leave=False)
        self._bar.update(done - self._bar.n)
        if done >= total:
            self._bar.close()
            self._bar = None


def _encode_prompt(tokenizer, text: str, system: str | None, raw: bool) -> list[int]:
    if raw:
        if system:
            raise ValueError("--system needs the chat template; drop --raw")
        return tokenizer.encode(text)
    if not tokenizer.chat_template:
        raise ValueError("this GGUF has no chat template; pass --raw to send the prompt as is")
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
    return tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True))


def _read_prompt(argument, prompt, prompt_file) -> str:
    """The prompt from the PROMPT argument, --prompt, --prompt-file or stdin (exactly one of them); not blank
    (the chat template would wrap an empty message and the model would answer nothing in particular)."""
    text, source = _prompt_and_source(argument, prompt, prompt_file)
    if not text.strip():
        raise click.UsageError(f"the prompt {source} is empty; give some text")
    return text


def _prompt_and_source(argument, prompt, prompt_file) -> tuple[str, str]:
    given = [name for name, value in (("PROMPT", argument), ("--prompt", prompt), ("--prompt-file", prompt_file))
             if value is not None]
    if len(given) > 1:
        raise click.UsageError(f"give {' or '.join(given)}, not {'both' if len(given) == 2 else 'all three'}")
    prompt = argument if argument is not None else prompt
    if prompt_file is not None:
        try:
            with open(prompt_file, encoding="utf-8") as f:
                return f.read(), f"in {prompt_file}"
        except (OSError, UnicodeDecodeError) as e:
            raise click.ClickException(f"cannot read prompt file {prompt_file}: "
                                       f"{getattr(e, 'strerror', None) or e}") from None
    if prompt is not None:
        return prompt, "given with --prompt" if argument is None else "argument"
    if sys.stdin is None or sys.stdin.isatty():
        raise click.UsageError("no prompt: pass it as an argument (or --prompt TEXT), --prompt-file FILE, "
                               "or pipe text on stdin")
    data = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read().encode()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise click.ClickException(f"the prompt read from stdin is not UTF-8 (byte 0x{data[e.start]:02x} at "
                                   f"offset {e.start}); convert it, e.g. with iconv -t UTF-8") from None
    return text, "read from stdin"


# --- commands ------------------------------------------------------------------------------
@main.command()
@click.argument("prompt_argument", metavar="[PROMPT]", required=False, default=None)
@click.option("-p", "--prompt", default=None,
              help="Prompt text, as the PROMPT argument (else --prompt-file, else stdin).")
@click.option("--prompt-file", type=click.Path(dir_okay=False), default=None, help="Read the prompt from a file.")
@_decode_options(n_gen_default=GenerationConfig.max_new_tokens)
@_sampling_options("greedy")
@click.option("--raw", is_flag=True, help="Send the prompt as is, without the chat template.")
@click.option("--ignore-eos", is_flag=True, help="Keep generating past end-of-sequence.")
@click.option("--stats", is_flag=True, help="Print AL, decode tok/s and prefill time to stderr.")
@_model_options("Context tokens, or auto (default: fit the prompt + n_gen).")
@_friendly_errors
def run(prompt_argument, prompt, prompt_file, n_gen, mode, budget, draft_top_k, system, stop, no_chain_seed,
        temperature, top_k, top_p,
        min_p, repeat_penalty, presence_penalty, frequency_penalty, seed, raw, ignore_eos, stats,
        target, draft, no_draft, max_ctx, engine_opts):
    """Generate a reply to PROMPT (or --prompt, --prompt-file, stdin), streaming text as tokens commit."""
    text = _read_prompt(prompt_argument, prompt, prompt_file)
    models = _resolve(target, draft, no_draft, mode)
    tokenizer = _load_tokenizer(models)
    ids = _encode_prompt(tokenizer, text, system, raw)
    if max_ctx is None:
        max_ctx = _fit_ctx(len(ids), n_gen)
    elif max_ctx != "auto" and len(ids) >= max_ctx:
        raise ValueError(f"prompt of {len(ids)} tokens does not fit --max-ctx {max_ctx}; "
                         "raise --max-ctx or shorten the prompt")
    with _load_engine(models, tokenizer, max_ctx=max_ctx, engine_opts=engine_opts) as engine:
        last = ""
        sampling = _given(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                          repeat_penalty=repeat_penalty, presence_penalty=presence_penalty,
                          frequency_penalty=frequency_penalty, seed=seed)
        for piece in engine.stream(ids, n_gen, mode=mode or "auto", budget=budget, draft_top_k=draft_top_k,
                                   stop=tuple(stop), chain_seed=not no_chain_seed, ignore_eos=ignore_eos,
                                   progress=_PrefillBar(), **sampling):
            sys.stdout.write(piece)
            sys.stdout.flush()
            last = piece or last
        if not last.endswith("\n"):
            sys.stdout.write("\n")
        sys.stdout.flush()
        gen = engine.last_generation
        if gen.finish_reason == "context":
            click.echo(f"warning: the context is full after {len(gen.tokens)} new tokens "
                       f"(max_ctx {engine.info['max_ctx']}); raise --max-ctx for longer replies", err=True)
        if stats:
            s = gen.stats
            click.echo(f"[{s.summary()}; finish: {gen.finish_reason}]", err=True)


@main.command()
@_decode_options(n_gen_default=1024)  # per chat reply (run takes GenerationConfig.max_new_tokens)
@_sampling_options("the model's recommended settings")
@click.option("--ignore-eos", is_flag=True, hidden=True, help="Replies always run to --n-gen (tests, demos).")
@_model_options(f"Context tokens for the whole conversation (default {AUTO_CTX_HELP}).")
@_friendly_errors
def chat(n_gen, mode, budget, draft_top_k, system, stop, no_chain_seed, temperature, top_k, top_p, min_p,
         repeat_penalty,
         presence_penalty, frequency_penalty, seed, ignore_eos, target, draft, no_draft, max_ctx, engine_opts):
    """Multi-turn chat (/set, /reset, /stats; Ctrl+C stops a reply, Ctrl+D exits)."""
    from .chat import HELP, ChatSession, describe_sampling, recommended_sampling, repl

    models = _resolve(target, draft, no_draft, mode)
    tokenizer = _load_tokenizer(models)
    if not tokenizer.chat_template:
        raise ValueError(f"{models.target.name} has no chat template, which chat needs; use `lucebox run --raw`")
    with _load_engine(models, tokenizer, max_ctx=max_ctx or "auto", engine_opts=engine_opts) as engine:
        sampling, source = recommended_sampling(models.target)
        sampling.update(_given(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                               repeat_penalty=repeat_penalty, presence_penalty=presence_penalty,
                               frequency_penalty=frequency_penalty, seed=seed))
        session = ChatSession(engine, system=system, progress=_PrefillBar(), max_new_tokens=n_gen,
                              mode=mode or "auto", budget=budget, draft_top_k=draft_top_k, stop=tuple(stop),
                              chain_seed=not no_chain_seed, ignore_eos=ignore_eos, **sampling)
        used = mode or ("ddtree" if engine.has_draft else "ar")
        banner = (f"lucebox chat: {models.target.name}, {used}, context {engine.info['max_ctx']}; "
                  f"sampling {describe_sampling(session.options)} ({source}). {HELP}")
        repl(session, banner=banner)


@main.command()
@click.option("--prompts", "prompt_files", multiple=True, type=click.Path(dir_okay=False),
              help="JSONL suite (chat messages per line); repeatable. Default: HumanEval, Math500, GSM8K.")
@click.option("--n-prompts", type=click.IntRange(min=1), default=10, show_default=True, help="Prompts per suite.")
@click.option("-n", "--n-gen", type=click.IntRange(1, MAX_NEW_TOKENS), default=256, show_default=True)
@click.option("--budgets", default=str(DEFAULT_BUDGET), show_default=True,
              help="DDTree budgets, comma-separated (a sweep: 1,8,16,22,32).")
@click.option("--chain", "with_chain", is_flag=True, help="Also run chain mode (linear verify) per budget.")
@click.option("--draft-top-k", type=click.IntRange(1, MAX_DRAFT_TOP_K), default=DEFAULT_DRAFT_TOP_K,
              show_default=True,
              help="Draft candidates per block position (DDTree).")
@click.option("--temperature", "--temp", "temperature", type=click.FloatRange(min=0.0), default=0.0,
              show_default=True, help="Sampling temperature for every run (0 = greedy).")
@click.option("--seed", type=click.IntRange(min=0, max=2 ** 64 - 1), default=0, show_default=True,
              help="Sampling seed (one seed per prompt: AR and speculative runs then match token for token).")
@click.option("--stop-at-eos", is_flag=True, help="End a run at end-of-sequence (default: always n_gen tokens).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default="lucebox-bench.json",
              show_default=True, help="Where to save the results; the table (.md) and plot (.png) go next to it.")
@_model_options("Context tokens, or auto (default: fit the longest prompt + n_gen).")
@_friendly_errors
def bench(prompt_files, n_prompts, n_gen, budgets, with_chain, draft_top_k, temperature, seed, stop_at_eos, json_path,
          target, draft, no_draft, max_ctx, engine_opts):
    """Benchmark AR vs DFlash + DDTree: markdown table on stdout; JSON, table and plot saved."""
    from . import bench as B

    budget_list = B.parse_budgets(budgets)
    if Path(json_path).suffix.lower() in (".md", ".png"):
        raise ValueError(f"--json {json_path}: name a .json file; the table (.md) and plot (.png) are saved next to it")
    for path in (Path(json_path), Path(json_path).with_suffix(".md")):
        _check_writable(path, "--json")  # before the run: a long benchmark must not end unable to save
    suites = [B.load_suite(p, n_prompts) for p in (prompt_files or B.default_prompt_files())]
    if no_draft:
        raise ValueError("bench compares AR with speculative decoding and needs a draft: drop --no-draft")
    models = _resolve(target, draft, no_draft, "ddtree")
    if models.draft is None:
        raise ValueError("bench compares AR with speculative decoding and needs a draft: "
                         "pass --draft, set $LUCEBOX_DRAFT or run `lucebox pull`")
    tokenizer = _load_tokenizer(models)
    longest = max(len(B.encode(tokenizer, p)) for s in suites for p in s.prompts)
    if max_ctx is None:
        max_ctx = _fit_ctx(longest, n_gen)
    elif max_ctx != "auto" and longest >= max_ctx:
        raise ValueError(f"the longest prompt has {longest} tokens and does not fit --max-ctx {max_ctx}")
    specs = [B.RunSpec("ddtree", b) for b in budget_list]
    if with_chain:
        specs += [B.RunSpec("chain", b) for b in budget_list]
    with _load_engine(models, tokenizer, max_ctx=max_ctx, engine_opts=engine_opts) as engine:
        result = B.run(engine, suites, specs, n_gen=n_gen, draft_top_k=draft_top_k, ignore_eos=not stop_at_eos,
                       temperature=temperature, seed=seed)
        device_used = "cpu" if engine.info["device"] < 0 else f"cuda:{engine.info['device']}"
        result = B.stamp(result, target=str(models.target), draft=str(models.draft),
                         max_ctx=engine.info["max_ctx"], type_k=engine.info["type_k"], type_v=engine.info["type_v"],
                         device=device_used, draft_window=engine.info["draft_window"])
    from .bench_plot import INSTALL_HINT, save_plot

    table = B.to_markdown(result)
    click.echo(table)
    json_path = Path(json_path)
    saved = [json_path, json_path.with_suffix(".md"), json_path.with_suffix(".png")]
    B.save_json(result, saved[0])
    saved[1].write_text(table + "\n")
    if not save_plot(result, saved[2]):
        click.echo(f"lucebox bench: plot skipped: matplotlib is not installed; {INSTALL_HINT}", err=True)
        saved.pop()
    click.echo(f"saved {', '.join(map(str, saved))}", err=True)


@main.command()
@click.option("--host", default=DEFAULT_HOST, show_default=True, help="Address to listen on (0.0.0.0: every interface).")
@click.option("--port", type=click.IntRange(0, 65535), default=DEFAULT_PORT, show_default=True)
@click.option("--max-queue", type=click.IntRange(min=0), default=DEFAULT_MAX_QUEUE, show_default=True,
              help="Requests that may wait behind the running one; more get 503.")
@click.option("--prefix-cache-gb", type=click.FloatRange(min=0), default=DEFAULT_PREFIX_CACHE_GB, show_default=True,
              help="Host memory for prefix snapshots (0 = off).")
@click.option("--api-key", envvar="LUCEBOX_API_KEY", default=None,
              help="Require this key (Authorization: Bearer or x-api-key); else $LUCEBOX_API_KEY.")
@click.option("--model-name", default=ServeConfig.model_name, show_default=True,
              help="Model id the server reports and accepts.")
@_model_options(f"Context tokens per request, prompt + reply (default {AUTO_CTX_HELP}).")
@_friendly_errors
def serve(host, port, max_queue, prefix_cache_gb, api_key, model_name, target, draft, no_draft, max_ctx,
          engine_opts):
    """OpenAI- and Anthropic-compatible HTTP server (/v1/chat/completions, /v1/messages, ...)."""
    config = ServeConfig(host=host, port=port, max_queue=max_queue, prefix_cache_gb=prefix_cache_gb,
                         api_key=api_key, model_name=model_name)
    from .server import serve as run_server  # FastAPI + uvicorn: imported only for this command

    models = _resolve(target, draft, no_draft, None)
    tokenizer = _load_tokenizer(models)
    with _load_engine(models, tokenizer, max_ctx=max_ctx or "auto", engine_opts=engine_opts) as engine:
        used = "ddtree" if engine.has_draft else "ar"
        click.echo(f"lucebox serve: {models.target.name}, {used}, context {engine.info['max_ctx']}, "
                   f"http://{host}:{port}/v1 (model {model_name!r})", err=True)
        run_server(engine, config)


@main.command()
@click.argument("model", required=False, default=None)
@click.argument("file", required=False, default=None)
@click.option("--draft-repo", default=None, help="DFlash draft repo to fetch with a REPO FILE target.")
@_friendly_errors
def pull(model, file, draft_repo):
    """Download a target GGUF and its draft into the Hugging Face cache.

    MODEL is qwen3.5-27b (default) or qwen3.6-27b, or give REPO FILE for any GGUF on the Hub.
    Gated repos need their terms accepted on huggingface.co and HF_TOKEN set.
    """
    from . import hub

    spec = hub.spec_for(model or hub.DEFAULT_MODEL, file, draft_repo)
    click.echo(f"pulling {spec.target_repo}/{spec.target_file}"
               + (f" and {spec.draft_repo}" if spec.draft_repo else ""), err=True)
    files = hub.pull(spec)
    click.echo(f"target: {files.target}")
    if files.draft is not None:
        click.echo(f"draft:  {files.draft}")
    click.echo("run / chat / bench now use these by default", err=True)
