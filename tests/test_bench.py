"""lucebox.bench: prompt suites, the table and the JSON, and a run on the tiny models."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from lucebox import bench, bench_plot

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_default_suites_ship_inside_the_package(monkeypatch, tmp_path):
    # package data: `pip install .` ships everything under lucebox/, so an install finds them without
    # the source tree
    package_dir = Path(bench.__file__).resolve().parent
    files = bench.default_prompt_files()
    assert [f.name for f in files] == ["humaneval.jsonl", "math500.jsonl", "gsm8k.jsonl"]
    for f in files:
        assert f.is_file() and f.resolve().is_relative_to(package_dir)
    monkeypatch.setattr(bench, "PROMPT_DIR", tmp_path)
    with pytest.raises(FileNotFoundError, match=r"humaneval.jsonl.*pass --prompts"):
        bench.default_prompt_files()


def test_shipped_suites_are_the_public_ten_prompt_sets():
    files = bench.default_prompt_files()
    suites = [bench.load_suite(f) for f in files]
    assert [s.name for s in suites] == ["HumanEval", "Math500", "GSM8K"]
    for suite in suites:
        assert len(suite.prompts) == 10
        assert all(p[-1]["role"] == "user" and p[-1]["content"].strip() for p in suite.prompts)
    assert len(bench.load_suite(files[0], limit=3).prompts) == 3


def test_suite_file_errors_name_file_and_line(tmp_path):
    f = tmp_path / "mine.jsonl"
    f.write_text('{"prompt": "raw text"}\n\n{"messages": [{"role": "user"}]}\n')
    with pytest.raises(ValueError, match=rf"{f}:3: expected"):
        bench.load_suite(f)
    f.write_text('{"prompt": "raw text"}\n{"messages": [{"role": "user", "content": "hi"}], "suite": "gsm"}\n')
    suite = bench.load_suite(f)
    assert suite.prompts == ["raw text", [{"role": "user", "content": "hi"}]]
    assert suite.name == "GSM8K"  # from the suite field when the file name says nothing
    f.write_text("\n")
    with pytest.raises(ValueError, match="holds no prompts"):
        bench.load_suite(f)
    with pytest.raises(FileNotFoundError, match="cannot read prompt file"):
        bench.load_suite(tmp_path / "absent.jsonl")


def test_parse_budgets():
    assert bench.parse_budgets("1,8, 16,22,32") == [1, 8, 16, 22, 32]
    for bad in ("", "0", "8,x", "-1"):
        with pytest.raises(ValueError):
            bench.parse_budgets(bad)


def bench_plot_available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _fake_result(runs_per_suite):
    def agg(tok_s, al):
        return {"tok_s": tok_s, "al": al, "new_tokens": 10, "decode_s": 10 / tok_s}
    suites = []
    for name, ar_tok_s in (("HumanEval", 10.0), ("GSM8K", 20.0)):
        runs = [dict(agg(ar_tok_s * (i + 2), 3.0 + i), mode=m, budget=b, speedup=float(i + 2),
                     identical=2) for i, (m, b) in enumerate(runs_per_suite)]
        suites.append({"name": name, "n_prompts": 2, "ar": agg(ar_tok_s, 1.0), "runs": runs})
    return {"suites": suites}


def test_markdown_public_layout_and_sweep_layout():
    table = bench.to_markdown(_fake_result([("ddtree", 22)])).splitlines()
    assert table[0] == "| Suite | AR tok/s | DFlash+DDTree tok/s | AL | Speedup |"
    assert table[2] == "| HumanEval | 10.0 | 20.0 | 3.00 | 2.00x |"
    assert len(table) == 4
    sweep = bench.to_markdown(_fake_result([("ddtree", 8), ("ddtree", 16), ("chain", 8)])).splitlines()
    assert sweep[0] == "| Suite | Mode | Budget | tok/s | AL | Speedup |"
    assert len(sweep) == 2 + 2 * 4
    assert "| GSM8K | DFlash chain | 8 | 80.0 | 5.00 | 4.00x |" in sweep


def test_markdown_reports_any_difference_from_ar_as_an_error():
    result = _fake_result([("ddtree", 22)])
    assert "error" not in bench.to_markdown(result)
    result["suites"][1]["runs"][0]["identical"] = 1
    for gap in (0.5, 0.003):  # a near-tie is no excuse: the kernels are batch-invariant
        result["suites"][1]["runs"][0]["divergence_gaps"] = [gap]
        text = bench.to_markdown(result)
        assert "error: 1 speculative run(s) produced tokens different from AR" in text and f"{gap:.4f}" in text


def test_divergence_gap_is_ar_lead_at_first_difference():
    class FakeEngine:
        def next_logits(self, ids):
            self.asked = list(ids)
            row = np.zeros(10, np.float32)
            row[3], row[7] = 2.0, 1.5
            return row

    e = FakeEngine()
    assert bench.divergence_gap(e, [9, 9], [1, 2, 3, 4], [1, 2, 7, 4]) == pytest.approx(0.5)
    assert e.asked == [9, 9, 1, 2]
    assert bench.divergence_gap(e, [9], [1, 2], [1, 2, 5]) == 0.0


def test_save_json_round_trips(tmp_path):
    result = bench.stamp(_fake_result([("ddtree", 22)]), target="t.gguf")
    path = tmp_path / "sub" / "out.json"
    bench.save_json(result, path)
    loaded = json.loads(path.read_text())
    assert loaded["meta"]["target"] == "t.gguf" and loaded["meta"]["lucebox"]
    assert loaded["suites"] == result["suites"]


def _with_histograms(result):
    for suite, hists in zip(result["suites"], ([[0, 2, 1], [0, 0, 3]], [[0, 1], [0, 4, 0, 1]])):
        for run, hist in zip(suite["runs"], hists):
            run["al_histogram"] = hist
    return result


def test_accept_length_shares_pool_suites_per_run():
    shares = bench_plot.accept_length_shares(_with_histograms(_fake_result([("ddtree", 22), ("chain", 22)])))
    assert shares == {"DFlash+DDTree b22": [0.0, 3 / 4, 1 / 4],
                      "DFlash chain b22": [0.0, 4 / 8, 3 / 8, 1 / 8]}


def test_plot_is_a_png_of_both_panels(tmp_path):
    pytest.importorskip("matplotlib")  # tests/run.sh installs it (the `plot` extra)
    import matplotlib.image

    path = tmp_path / "bench.png"
    assert bench_plot.save_plot(_with_histograms(_fake_result([("ddtree", 22), ("chain", 22)])), path)
    assert path.read_bytes().startswith(PNG_MAGIC)
    assert matplotlib.image.imread(path).shape[:2] == (450, 1200)  # figsize 12 x 4.5 at 100 dpi


def test_plot_without_matplotlib_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    path = tmp_path / "bench.png"
    assert bench_plot.save_plot(_fake_result([("ddtree", 22)]), path) is False
    assert not path.exists()


# --- on the tiny models ----------------------------------------------------------------------
def test_bench_cli_on_tiny_models(tiny_pair, tmp_path):
    from click.testing import CliRunner

    from lucebox.cli import main

    out = tmp_path / "bench.json"
    result = CliRunner().invoke(main, ["bench", "--target", str(tiny_pair[0]), "--draft", str(tiny_pair[1]),
                                       "--device", "cpu", "--n-prompts", "2", "-n", "16", "--json", str(out)])
    assert result.exit_code == 0, result.output
    table = result.stdout.strip().splitlines()
    assert table[0] == "| Suite | AR tok/s | DFlash+DDTree tok/s | AL | Speedup |"
    assert [row.split("|")[1].strip() for row in table[2:]] == ["HumanEval", "Math500", "GSM8K"]
    data = json.loads(out.read_text())
    assert data["settings"]["n_gen"] == 16 and data["meta"]["draft"] == str(tiny_pair[1])
    # the table and the plot next to the JSON
    assert out.with_suffix(".md").read_text() == result.stdout
    if bench_plot_available():
        assert out.with_suffix(".png").read_bytes().startswith(PNG_MAGIC)
        assert result.stderr.strip().splitlines()[-1] == f"saved {out}, {out.with_suffix('.md')}, {out.with_suffix('.png')}"
    for suite in data["suites"]:
        assert suite["n_prompts"] == 2 and suite["ar"]["tok_s"] > 0
        assert suite["ar"]["new_tokens"] == 2 * 16  # ignore_eos: exactly n_gen per prompt
        (run,) = suite["runs"]
        assert run["mode"] == "ddtree" and run["budget"] == 22
        assert run["al"] >= 1 and run["tok_s"] > 0
        assert run["identical"] == 2  # lossless: the same tokens as AR
        assert sum(run["al_histogram"]) > 0


def test_bench_sweep_with_chain_and_own_prompts(tiny_pair, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from lucebox.cli import main

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # this run: as without the `plot` extra

    prompts = tmp_path / "mine.jsonl"
    prompts.write_text(json.dumps({"messages": [{"role": "user", "content": "Count: one two"}]}) + "\n"
                       + json.dumps({"prompt": "def add(a, b):"}) + "\n")
    out = tmp_path / "sweep.json"
    result = CliRunner().invoke(main, ["bench", "--target", str(tiny_pair[0]), "--draft", str(tiny_pair[1]),
                                       "--device", "cpu", "--prompts", str(prompts), "-n", "12",
                                       "--budgets", "1,4", "--chain", "--json", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    (suite,) = data["suites"]
    assert suite["name"] == "mine" and suite["n_prompts"] == 2
    assert [(r["mode"], r["budget"]) for r in suite["runs"]] == [("ddtree", 1), ("ddtree", 4), ("chain", 1), ("chain", 4)]
    assert all(r["al"] >= 1 and r["identical"] == 2 for r in suite["runs"])
    assert len(result.stdout.strip().splitlines()) == 2 + 5
    skipped = [line for line in result.stderr.splitlines() if "plot skipped" in line]
    assert skipped == ["lucebox bench: plot skipped: matplotlib is not installed; pip install 'lucebox[plot]' (matplotlib)"]
    assert not out.with_suffix(".png").exists() and out.with_suffix(".md").is_file()


def test_bench_refuses_a_json_path_that_the_table_would_overwrite(tmp_path):
    from click.testing import CliRunner

    from lucebox.cli import main

    result = CliRunner().invoke(main, ["bench", "--json", str(tmp_path / "out.md")])
    assert result.exit_code != 0 and "name a .json file" in result.output


def test_bench_samples_at_a_temperature(tiny_pair, tmp_path):
    from click.testing import CliRunner

    from lucebox.cli import main

    prompts = tmp_path / "two.jsonl"
    prompts.write_text(json.dumps({"prompt": "def add(a, b):"}) + "\n" + json.dumps({"prompt": "Count: one"}) + "\n")
    out = tmp_path / "t.json"
    args = ["bench", "--target", str(tiny_pair[0]), "--draft", str(tiny_pair[1]), "--device", "cpu",
            "--prompts", str(prompts), "-n", "16", "--budgets", "4,22", "--chain"]
    result = CliRunner().invoke(main, [*args, "--temperature", "1.0", "--seed", "5", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("Sampled at temperature 1 (seed 5")
    data = json.loads(out.read_text())
    assert data["settings"]["temperature"] == 1.0 and data["settings"]["seed"] == 5
    (suite,) = data["suites"]
    assert all(r["identical"] == 2 for r in suite["runs"])  # one seed: every mode samples AR's tokens
    greedy = CliRunner().invoke(main, [*args, "--json", str(tmp_path / "g.json")])
    assert greedy.exit_code == 0 and not greedy.stdout.startswith("Sampled")
