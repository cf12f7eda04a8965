"""Stage 6: the trained target to GGUF with the pinned converter, then read back with gguf-py.

The converter identifies a BPE pre-tokenizer by hashing how it splits a fixed text; a tokenizer we
trained ourselves has no entry there, so an unknown hash is mapped to "qwen35" (our tokenizer uses
Qwen3.5's split regex, which is what llama.cpp's "qwen35" pre-tokenizer implements). Known hashes
keep their answer. The converter runs in a child process with the sdist's own gguf-py first on
PYTHONPATH (PyPI's gguf is older); this file is that child's entry point too.

    python benchmarks/tiny_pair/convert.py HF_DIR OUT.gguf [--outtype q8_0]   (child; PYTHONPATH set)
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

PRE_TOKENIZER = "qwen35"
MODEL_NAME = "lucebox-tiny-qwen35"
SUMMARY_MARK = "TINY_PAIR_GGUF_SUMMARY "


def convert(hf_dir: Path, out_file: Path, llama_dir: Path, outtype: str = "q8_0") -> dict:
    """Run the pinned converter on hf_dir; returns the read-back summary (arch, tensors, vocab, bytes)."""
    llama_dir = llama_dir.resolve()
    if not (llama_dir / "convert_hf_to_gguf.py").is_file():
        raise FileNotFoundError(f"no convert_hf_to_gguf.py in {llama_dir}; run `python3 vendor/materialize.py`")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(llama_dir / "gguf-py"), str(llama_dir)]
                                        + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    cmd = [sys.executable, str(Path(__file__).resolve()), str(hf_dir), str(out_file), "--outtype", outtype]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"GGUF conversion failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    for line in proc.stdout.splitlines():
        if line.startswith(SUMMARY_MARK):
            return json.loads(line[len(SUMMARY_MARK):])
    raise RuntimeError(f"converter printed no summary:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")


def _read_back(path: Path) -> dict:
    from gguf import GGUFReader

    reader = GGUFReader(str(path))

    def field(name):
        f = reader.fields.get(name)
        if f is None:
            return None
        value = f.contents()
        return value

    arch = field("general.architecture")
    types = {}
    for t in reader.tensors:
        types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
    return {"path": str(path), "bytes": path.stat().st_size, "architecture": arch,
            "n_tensors": len(reader.tensors), "tensor_types": types,
            "n_tokens": len(field("tokenizer.ggml.tokens") or []),
            "pre_tokenizer": field("tokenizer.ggml.pre"),
            "eos_token_id": field("tokenizer.ggml.eos_token_id"),
            "block_count": field(f"{arch}.block_count"),
            "embedding_length": field(f"{arch}.embedding_length"),
            "rope_dimension_count": field(f"{arch}.rope.dimension_count"),
            "rope_dimension_sections": field(f"{arch}.rope.dimension_sections"),
            "has_chat_template": field("tokenizer.chat_template") is not None}


def _child(argv: list[str]) -> None:
    hf_dir, out_file = argv[0], argv[1]
    outtype = argv[argv.index("--outtype") + 1] if "--outtype" in argv else "q8_0"
    import conversion.base as base  # the sdist's converter package, on PYTHONPATH

    known = base.TextModel.get_vocab_base_pre

    def vocab_base_pre(self, tokenizer):
        try:
            return known(self, tokenizer)
        except NotImplementedError:
            return PRE_TOKENIZER

    base.TextModel.get_vocab_base_pre = vocab_base_pre
    import convert_hf_to_gguf

    sys.argv = ["convert_hf_to_gguf.py", hf_dir, "--outfile", out_file, "--outtype", outtype, "--no-mtp",
                "--model-name", MODEL_NAME]
    convert_hf_to_gguf.main()
    print(SUMMARY_MARK + json.dumps(_read_back(Path(out_file)), default=str), flush=True)


if __name__ == "__main__":
    _child(sys.argv[1:])
