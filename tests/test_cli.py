"""lucebox.cli: options, errors and streaming, through click's runner and a real subprocess."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from lucebox import defaults, hub
from lucebox.cli import DEMO_NOTICE, main
from lucebox.config import EngineConfig, GenerationConfig, ServeConfig

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def no_models(tmp_path, monkeypatch):
    """No model anywhere: no env, empty HF cache and state, no embedded pair."""
    for name in (defaults.TARGET_ENV, defaults.DRAFT_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(hub.STATE_ENV, str(tmp_path / "state"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setenv(defaults.EMBEDDED_ENV, str(tmp_path / "no-embedded"))
    return tmp_path


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "LUCEBOX_"))}
    if "LUCEBOX_LIB" in os.environ:
        env["LUCEBOX_LIB"] = os.environ["LUCEBOX_LIB"]
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def _lucebox(args, *, env, stdin=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "lucebox", *args], env=env, input=stdin,
                          capture_output=True, text=True, timeout=timeout)


def _one_line_error(done: subprocess.CompletedProcess) -> str:
    """The command failed with exactly one `Error:` line and no traceback."""
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, done.stderr
    return errors[0]


# --- no model needed -------------------------------------------------------------------------
def test_help_lists_commands_and_is_lazy():
    # `lucebox --help` must not import numpy, the native library or huggingface_hub
    code = ("import sys\nfrom lucebox.cli import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit as e:\n    assert e.code == 0\n"
            "heavy = [m for m in ('numpy', 'lucebox.engine', 'lucebox._native', 'huggingface_hub', 'tqdm',"
            " 'fastapi', 'uvicorn')"
            " if m in sys.modules]\nprint('HEAVY', heavy)\n")
    out = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    for command in ("run", "chat", "serve", "bench", "pull"):
        assert f"  {command} " in out.stdout
    assert "HEAVY []" in out.stdout


@pytest.mark.parametrize("command", ["run", "chat", "serve", "bench", "pull"])
def test_command_help(command):
    result = CliRunner().invoke(main, [command, "--help"])
    assert result.exit_code == 0
    assert "Usage:" in result.output


# --- options 1:1 with the config dataclasses (one home for each default: config.py) -----------
# options named apart from the field they set (--no-chain-seed sets chain_seed to the flag's negation)
RENAMED = {"threads": "n_threads", "vram": "vram_gb", "n_gen": "max_new_tokens", "no_chain_seed": "chain_seed"}
# Per command: the dataclasses whose every field needs an option, and the options that set no field.
# --no-draft is draft=None; run's and chat's others say where the prompt comes from, how it is wrapped
# and what is printed. serve has no GenerationConfig options: each request carries its own
# (lucebox/server/options.py). bench sweeps decode settings of its own over one engine.
COMMAND_CONFIGS = {
    "run": ((EngineConfig, GenerationConfig),
            {"no_draft", "prompt_argument", "prompt", "prompt_file", "system", "raw", "stats"}),
    "chat": ((EngineConfig, GenerationConfig), {"no_draft", "system"}),
    "serve": ((EngineConfig, ServeConfig), {"no_draft"}),
    "bench": ((EngineConfig,), {"no_draft", "prompt_files", "n_prompts", "max_new_tokens", "budgets", "with_chain",
                                "draft_top_k", "temperature", "seed", "stop_at_eos", "json_path"}),
}
# option defaults that differ from the field's on purpose (an option defaulting to None lets the
# command decide at run time, e.g. --max-ctx fits the prompt, and is not compared)
OWN_DEFAULTS = {("chat", "max_new_tokens")}


@pytest.mark.parametrize("command", sorted(COMMAND_CONFIGS))
def test_options_are_one_to_one_with_the_config(command, monkeypatch):
    monkeypatch.delenv("LUCEBOX_API_KEY", raising=False)  # serve's --api-key default
    configs, not_fields = COMMAND_CONFIGS[command]
    fields = {f.name: f for config in configs for f in dataclasses.fields(config)}
    cmd = main.commands[command]
    # the values the command receives when no option is given
    defaults_given = {RENAMED.get(k, k): v for k, v in cmd.make_context(command, []).params.items()}
    assert sorted(set(fields) - set(defaults_given)) == [], f"{command}: config fields with no option"
    assert sorted(set(defaults_given) - set(fields)) == sorted(not_fields), \
        f"{command}: options that set no config field"
    for name, field in fields.items():
        given = defaults_given[name]
        if given is None or (command, name) in OWN_DEFAULTS:
            continue
        want = field.default_factory() if field.default_factory is not dataclasses.MISSING else field.default
        if name == "chain_seed":
            given = not given
        assert given == want, f"{command}: option for {name} defaults to {given!r}, the config to {want!r}"


def test_no_model_anywhere(no_models):
    result = CliRunner().invoke(main, ["run", "--prompt", "hi"])
    assert result.exit_code == 1
    assert result.output.strip() == f"Error: {defaults.MISSING_MESSAGE}"


def test_missing_target_path(no_models):
    result = CliRunner().invoke(main, ["run", "--prompt", "hi", "--target", str(no_models / "absent.gguf")])
    assert result.exit_code == 1
    assert "target GGUF not found" in result.output and "absent.gguf" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_n_gen_must_be_positive(no_models):
    for value in ("0", "-3"):
        result = CliRunner().invoke(main, ["run", "--prompt", "hi", "--n-gen", value])
        assert result.exit_code == 2
        assert "--n-gen" in result.output


def test_unreadable_prompt_file(no_models):
    missing = no_models / "missing.txt"
    result = CliRunner().invoke(main, ["run", "--prompt-file", str(missing)])
    assert result.exit_code == 1
    assert result.output.strip() == f"Error: cannot read prompt file {missing}: No such file or directory"
    binary = no_models / "binary.txt"
    binary.write_bytes(b"\xff\xfe\x00bad")
    result = CliRunner().invoke(main, ["run", "--prompt-file", str(binary)])
    assert result.exit_code == 1 and "cannot read prompt file" in result.output


def test_prompt_and_prompt_file_conflict(no_models):
    f = no_models / "p.txt"
    f.write_text("hi")
    result = CliRunner().invoke(main, ["run", "--prompt", "x", "--prompt-file", str(f)])
    assert result.exit_code == 2 and "not both" in result.output


def test_prompt_given_twice_is_a_usage_error(no_models):
    f = no_models / "p.txt"
    f.write_text("hi")
    for args in (["x", "--prompt", "y"], ["x", "--prompt-file", str(f)]):
        result = CliRunner().invoke(main, ["run", *args])
        assert result.exit_code == 2 and "PROMPT or --prompt" in result.output and "not both" in result.output
    result = CliRunner().invoke(main, ["run", "x", "-p", "y", "--prompt-file", str(f)])
    assert result.exit_code == 2 and "not all three" in result.output


def test_a_blank_prompt_is_a_usage_error_from_every_source(no_models):
    result = CliRunner().invoke(main, ["run"], input="  \n")
    assert result.exit_code == 2 and "the prompt read from stdin is empty" in result.output
    blank = no_models / "blank.txt"
    blank.write_text("\n\n")
    for args, words in ((["run", ""], "prompt argument is empty"),
                        (["run", "--prompt", "   "], "prompt given with --prompt is empty"),
                        (["run", "--prompt-file", str(blank)], f"prompt in {blank} is empty")):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2 and words in result.output, (args, result.output)


def test_bench_bad_inputs(no_models):
    runner = CliRunner()
    bad = runner.invoke(main, ["bench", "--budgets", "8,x"])
    assert bad.exit_code == 1 and "--budgets" in bad.output
    missing = runner.invoke(main, ["bench", "--prompts", str(no_models / "none.jsonl")])
    assert missing.exit_code == 1 and "cannot read prompt file" in missing.output
    broken = no_models / "broken.jsonl"
    broken.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n{not json\n')
    result = runner.invoke(main, ["bench", "--prompts", str(broken)])
    assert result.exit_code == 1 and f"{broken}:2" in result.output
    # checked before any model is looked for (there is none here): a long run must not end unable to save
    unsaved = runner.invoke(main, ["bench", "--json", str(no_models / "no-such-dir" / "b.json")])
    assert unsaved.exit_code == 1 and "cannot write it" in unsaved.output and "writable path" in unsaved.output
    assert not (no_models / "no-such-dir").exists()
    kept = no_models / "kept.json"
    later = runner.invoke(main, ["bench", "--json", str(kept), "--prompts", str(no_models / "none.jsonl")])
    assert later.exit_code == 1 and "cannot read prompt file" in later.output
    assert not kept.exists()  # the check's file is removed again
    no_draft = runner.invoke(main, ["bench", "--no-draft"])
    assert no_draft.exit_code == 1 and "needs a draft: drop --no-draft" in no_draft.output


def test_no_chat_template_suggests_raw():
    from lucebox import cli

    class NoTemplate:
        chat_template = None

    with pytest.raises(ValueError, match="no chat template; pass --raw"):
        cli._encode_prompt(NoTemplate(), "hi", None, raw=False)


def test_subprocess_errors_are_one_line(no_models):
    env = _env(**{hub.STATE_ENV: str(no_models / "state"), "HF_HUB_CACHE": str(no_models / "hf"),
                  defaults.EMBEDDED_ENV: str(no_models / "none")})
    line = _one_line_error(_lucebox(["run", "--prompt", "hi"], env=env))
    assert "embedded default is missing" in line
    line = _one_line_error(_lucebox(["run", "--target", str(no_models / "x.gguf")], env=env, stdin="hello"))
    assert "target GGUF not found" in line
    line = _one_line_error(_lucebox(["chat", "--target", str(no_models / "x.gguf")], env=env))
    assert "target GGUF not found" in line
    line = _one_line_error(_lucebox(["run", "--prompt", "hi", "-n", "0"], env=env))
    assert "--n-gen" in line
    line = _one_line_error(_lucebox(["serve", "--target", str(no_models / "x.gguf")], env=env))
    assert "target GGUF not found" in line
    line = _one_line_error(_lucebox(["serve", "--port", "70000"], env=env))
    assert "--port" in line


def test_serve_answers_on_loopback_with_the_embedded_pair():
    import socket

    import httpx

    with socket.socket() as s:  # a free loopback port (released just before the server binds it)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "lucebox", "serve", "--port", str(port), "--device", "cpu",
                             "--threads", "1", "--max-ctx", "512"], env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "lucebox serve did not come up"
            try:
                if httpx.get(url + "/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        r = httpx.post(url + "/v1/chat/completions", timeout=60, json={
            "messages": [{"role": "user", "content": "def fib(n):"}], "max_tokens": 5})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 5
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    log = proc.stderr.read()
    assert "lucebox serve: target.gguf, ddtree, context 512" in log
    assert DEMO_NOTICE in log
    assert "POST /v1/chat/completions 200 prompt=" in log and "Traceback" not in log


# --- on the tiny models ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def reference(tiny_pair):
    """The Python API's output for the prompts the CLI tests send (the oracle)."""
    from lucebox.engine import Engine

    target, draft = tiny_pair
    with Engine(target, draft=draft, max_ctx=512, device="cpu") as engine:
        chat_text = engine.generate([{"role": "user", "content": "Hello"}], 12, mode="ar").text
        sys_text = engine.generate([{"role": "system", "content": "Be brief."},
                                    {"role": "user", "content": "Hello"}], 12, mode="ar").text
        raw_text = engine.generate("def fib(n):", 12, mode="ar").text
    return {"chat": chat_text, "system": sys_text, "raw": raw_text}


def _models(tiny_pair) -> list[str]:
    return ["--target", str(tiny_pair[0]), "--draft", str(tiny_pair[1]), "--device", "cpu"]


@pytest.mark.parametrize("mode", ["ar", "chain", "ddtree"])
def test_run_streams_the_engine_output(tiny_pair, reference, mode):
    result = CliRunner().invoke(main, ["run", "--prompt", "Hello", "-n", "12", "--mode", mode, "--stats",
                                       *_models(tiny_pair)])
    assert result.exit_code == 0, result.output
    assert result.stdout.rstrip("\n") == reference["chat"].rstrip("\n")  # every mode is greedy-exact
    assert f"({mode})" in result.stderr and "tok/s" in result.stderr and "prefill" in result.stderr
    if mode != "ar":
        assert "AL " in result.stderr


def test_run_takes_the_prompt_as_an_argument(tiny_pair, reference):
    result = CliRunner().invoke(main, ["run", "Hello", "-n", "12", *_models(tiny_pair)])
    assert result.exit_code == 0, result.output
    assert result.stdout.rstrip("\n") == reference["chat"].rstrip("\n")


def test_run_tree_and_stop_options(tiny_pair, reference):
    runner = CliRunner()
    # tree shape, logging and kernel options change neither the text (greedy-exact; the CPU is always
    # batch invariant) nor stderr's one-line rule
    tuned = runner.invoke(main, ["run", "Hello", "-n", "12", "--no-chain-seed", "--max-tree", "32",
                                 "--log-level", "quiet", "--no-batch-invariant", *_models(tiny_pair)])
    assert tuned.exit_code == 0, tuned.output
    assert tuned.stdout.rstrip("\n") == reference["chat"].rstrip("\n")
    text = reference["chat"].rstrip("\n")
    stop = text[-3:]  # the reply stops where this first appears, and prints none of it
    cut = runner.invoke(main, ["run", "Hello", "-n", "12", "--stop", stop, *_models(tiny_pair)])
    assert cut.exit_code == 0, cut.output
    out = cut.stdout.rstrip("\n")
    assert text.startswith(out) and len(out) < len(text) and stop not in out, (out, text, stop)
    bad = runner.invoke(main, ["run", "Hello", "--max-tree", "1", *_models(tiny_pair)])
    assert bad.exit_code == 2 and "--max-tree" in bad.output


def test_run_system_and_raw(tiny_pair, reference):
    runner = CliRunner()
    sys_run = runner.invoke(main, ["run", "-p", "Hello", "-n", "12", "--system", "Be brief.", *_models(tiny_pair)])
    assert sys_run.exit_code == 0 and sys_run.stdout.rstrip("\n") == reference["system"].rstrip("\n")
    raw = runner.invoke(main, ["run", "-p", "def fib(n):", "-n", "12", "--raw", *_models(tiny_pair)])
    assert raw.exit_code == 0 and raw.stdout.rstrip("\n") == reference["raw"].rstrip("\n")
    both = runner.invoke(main, ["run", "-p", "x", "--raw", "--system", "s", *_models(tiny_pair)])
    assert both.exit_code == 1 and "--system needs the chat template" in both.output


def test_run_context_overflow_is_one_line(tiny_pair):
    result = CliRunner().invoke(main, ["run", "-p", "word " * 100, "--max-ctx", "32", *_models(tiny_pair)])
    assert result.exit_code == 1
    assert result.output.startswith("Error: prompt of ") and "--max-ctx 32" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_run_kv_types(tiny_pair, reference):
    for kv in ("q8_0", "q4_0"):
        result = CliRunner().invoke(main, ["run", "-p", "Hello", "-n", "4", "--kv", kv, *_models(tiny_pair)])
        assert result.exit_code == 0, result.output


def test_run_draft_window(tiny_pair, reference):
    # a draft window of 8 tokens changes what the draft proposes, not the text
    result = CliRunner().invoke(main, ["run", "-p", "Hello", "-n", "12", "--mode", "ddtree", "--draft-window", "8",
                                       "--threads", "1", *_models(tiny_pair)])
    assert result.exit_code == 0, result.output
    assert result.stdout.rstrip("\n") == reference["chat"].rstrip("\n")
    bad = CliRunner().invoke(main, ["run", "-p", "Hello", "--draft-window", "-1", *_models(tiny_pair)])
    assert bad.exit_code == 2 and "--draft-window" in bad.output


def test_run_subprocess_env_models_and_stdin(tiny_pair, reference, tmp_path):
    # no flags: $LUCEBOX_TARGET / $LUCEBOX_DRAFT, prompt on stdin, as a user's shell runs it
    env = _env(LUCEBOX_TARGET=str(tiny_pair[0]), LUCEBOX_DRAFT=str(tiny_pair[1]),
               **{hub.STATE_ENV: str(tmp_path / "state")})
    done = _lucebox(["run", "-n", "12", "--device", "cpu"], env=env, stdin="Hello")
    assert done.returncode == 0, done.stderr
    assert done.stdout.rstrip("\n") == reference["chat"].rstrip("\n")
    assert "Traceback" not in done.stderr


def test_embedded_default_pair_is_used_without_flags(tiny_pair, reference, tmp_path, monkeypatch):
    embedded = tmp_path / "embedded"
    embedded.mkdir()
    (embedded / "target.gguf").symlink_to(tiny_pair[0])
    (embedded / "draft").symlink_to(tiny_pair[1], target_is_directory=True)
    monkeypatch.setenv(defaults.EMBEDDED_ENV, str(embedded))
    for name in (defaults.TARGET_ENV, defaults.DRAFT_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(hub.STATE_ENV, str(tmp_path / "state"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    result = CliRunner().invoke(main, ["run", "--prompt", "Hello", "-n", "12", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    assert result.stdout.rstrip("\n") == reference["chat"].rstrip("\n")
    assert result.stderr.splitlines() == [DEMO_NOTICE]  # one line saying it is the demo pair
    chat = CliRunner().invoke(main, ["chat", "-n", "4", "--device", "cpu"], input="")
    assert chat.exit_code == 0, chat.output
    assert chat.stderr.splitlines()[0] == DEMO_NOTICE
    suite = tmp_path / "one.jsonl"
    suite.write_text('{"prompt": "def fib(n):"}\n')
    bench = CliRunner().invoke(main, ["bench", "--prompts", str(suite), "-n", "4", "--budgets", "4", "--device", "cpu",
                                      "--json", str(tmp_path / "bench.json")])
    assert bench.exit_code == 0, bench.output
    assert bench.stderr.splitlines()[0] == DEMO_NOTICE
    # a named target, or one from the environment, is no demo
    named = CliRunner().invoke(main, ["run", "-p", "Hello", "-n", "2", "--target", str(tiny_pair[0]), "--no-draft",
                                      "--device", "cpu"])
    assert named.exit_code == 0 and DEMO_NOTICE not in named.stderr
    monkeypatch.setenv(defaults.TARGET_ENV, str(tiny_pair[0]))
    from_env = CliRunner().invoke(main, ["run", "-p", "Hello", "-n", "2", "--no-draft", "--device", "cpu"])
    assert from_env.exit_code == 0 and DEMO_NOTICE not in from_env.stderr


def test_chat_reads_lines_from_a_pipe(tiny_pair):
    # not a terminal: one reply per line, then EOF ends the session cleanly
    done = _lucebox(["chat", "-n", "6", *_models(tiny_pair)], env=_env(), stdin="Hello\nBye\n/stats\n")
    assert done.returncode == 0, done.stderr
    assert "2 turns]" in done.stderr and "Traceback" not in done.stderr


def test_chunked_prefill_under_a_progress_bar_changes_nothing(tiny_pair, capsys, monkeypatch):
    from lucebox import cli
    from lucebox.engine import Engine

    monkeypatch.setattr(cli, "PREFILL_BAR_MIN", 10)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    with Engine(tiny_pair[0], draft=tiny_pair[1], max_ctx=512, device="cpu", n_threads=1, ubatch=16) as engine:
        ids = engine.encode_prompt("word " * 40)
        reference = engine.generate(ids, 12, mode="ddtree").tokens
        engine.reset()
        calls, bar = [], cli._PrefillBar()

        def progress(done: int, total: int) -> None:
            calls.append((done, total))
            bar(done, total)

        gen = engine.generate(ids, 12, mode="ddtree", progress=progress)
    assert gen.tokens == reference and gen.stats.prompt_tokens == len(ids)
    # one call per micro-batch fed, then the end
    assert calls == [(done, len(ids)) for done in range(0, len(ids), 16)] + [(len(ids), len(ids))]
    assert "prefill" in capsys.readouterr().err  # the bar was drawn (tqdm on stderr)


# --- hostile input (issue 15): one line, never a traceback -----------------------------------
@pytest.mark.parametrize("args, word", [
    (["--threads", "100000"], "n_threads"), (["--threads", "20000"], "n_threads"),
    (["--draft-top-k", "2000000000"], "--draft-top-k"), (["--budget", "999999"], "--budget"),
    (["-n", "99999999999"], "--n-gen"), (["--max-ctx", str(2**31)], "--max-ctx"),
])
def test_absurd_option_values(tiny_pair, args, word):
    target, draft = tiny_pair
    done = _lucebox(["run", "--target", str(target), "--draft", str(draft), "-p", "hi", "-n", "4", *args], env=_env())
    assert word in _one_line_error(done)


def test_invalid_utf8_prompt(tiny_pair):
    target, draft = tiny_pair
    cmd = [sys.executable, "-m", "lucebox", "run", "--target", str(target), "--no-draft", "-n", "2"]
    done = subprocess.run(cmd, input=b"hello \xff\xfe world", capture_output=True, env=_env(), timeout=300)
    assert "UTF-8" in _one_line_error(subprocess.CompletedProcess(cmd, done.returncode, "", done.stderr.decode()))
    argv = subprocess.run([*cmd, "-p", os.fsdecode(b"\xff\xfe")], capture_output=True, text=True, env=_env(),
                          timeout=300)
    assert "Unicode" in _one_line_error(argv)


def test_run_sampling_options_match_the_engine(tiny_pair):
    from lucebox.engine import Engine

    opts = dict(temperature=0.8, top_k=30, top_p=0.9, min_p=0.01, repeat_penalty=1.2, presence_penalty=0.3,
                frequency_penalty=0.1, seed=42)
    with Engine(tiny_pair[0], draft=tiny_pair[1], max_ctx=512, device="cpu") as engine:
        want = engine.generate([{"role": "user", "content": "Hello"}], 12, mode="ar", **opts).text
    flags = ["--temp", "0.8", "--top-k", "30", "--top-p", "0.9", "--min-p", "0.01", "--repeat-penalty", "1.2",
             "--presence-penalty", "0.3", "--frequency-penalty", "0.1", "--seed", "42"]
    for mode in ("ar", "ddtree"):
        result = CliRunner().invoke(main, ["run", "-p", "Hello", "-n", "12", "--mode", mode, *flags,
                                           "--draft-top-k", "4", *_models(tiny_pair)])
        assert result.exit_code == 0, result.output
        assert result.stdout.rstrip("\n") == want.rstrip("\n")
    bad = CliRunner().invoke(main, ["run", "-p", "Hello", "--top-p", "0", *_models(tiny_pair)])
    assert bad.exit_code == 2 and "--top-p" in bad.output
    old = CliRunner().invoke(main, ["run", "-p", "Hello", "--top-k", "-1", *_models(tiny_pair)])
    assert old.exit_code == 2 and "--top-k" in old.output


def test_chat_banner_shows_the_sampling(tiny_pair):
    done = _lucebox(["chat", "-n", "4", *_models(tiny_pair)], env=_env(), stdin="Hello\n/set temp 0\n/set\n")
    assert done.returncode == 0, done.stderr
    banner = done.stderr.splitlines()[0]
    assert "sampling temperature 0.6, top-k 20, top-p 0.95, min-p 0 (Qwen's recommended)" in banner
    assert "[sampling: greedy]" in done.stderr
    done = _lucebox(["chat", "-n", "4", "--temp", "1.1", "--seed", "3", *_models(tiny_pair)], env=_env(), stdin="")
    assert "sampling temperature 1.1, top-k 20, top-p 0.95, min-p 0, seed 3" in done.stderr.splitlines()[0]
