"""Run the pinned convert_hf_to_gguf.py on a tiny test model (argv as for the converter).

The converter names the BPE pre-tokenizer by hashing how the tokenizer splits a probe string; a
tokenizer trained at test time has an unknown hash, so the lookup fails. The tiny tokenizers use
Qwen3.5's own split regex, so this wrapper answers "qwen35" instead. Run with
vendor/src/llama.cpp/gguf-py and vendor/src/llama.cpp first on PYTHONPATH (tests/tiny_models.convert).
"""
import runpy
import sys
from pathlib import Path

LLAMA_DIR = Path(__file__).resolve().parent.parent / "vendor" / "src" / "llama.cpp"


def main() -> None:
    from conversion.base import TextModel

    TextModel.get_vocab_base_pre = lambda self, tokenizer: "qwen35"
    sys.argv[0] = str(LLAMA_DIR / "convert_hf_to_gguf.py")
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
