"""lucebox: fast local LLM inference by speculative decoding (DFlash draft + DDTree verify).

    from lucebox import Engine
    with Engine("Qwen3.5-27B-Q4_K_M.gguf", draft="Qwen3.5-27B-DFlash") as engine:
        print(engine.generate("def fib(n):", max_new_tokens=128).text)
"""
__version__ = "0.1.0"
__all__ = ["Engine", "EngineConfig", "GenerationConfig", "__version__"]


def __getattr__(name):
    # Heavy imports (numpy, the native library) wait until first use, so `lucebox --help` is instant.
    if name == "Engine":
        from .engine import Engine
        return Engine
    if name in ("EngineConfig", "GenerationConfig"):
        from . import config
        return getattr(config, name)
    raise AttributeError(f"module 'lucebox' has no attribute {name!r}")
