"""Per-generation statistics: acceptance lengths and where the time went."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class GenerationStats:
    mode: str = "ar"
    prompt_tokens: int = 0       # tokens prefilled for this request (after prefix reuse)
    prefill_s: float = 0.0
    new_tokens: int = 0          # tokens emitted
    decode_s: float = 0.0        # wall time of the decode loop
    steps: int = 0
    # tokens committed per step (accepted draft tokens + the bonus token): the acceptance length
    accept_lengths: list[int] = field(default_factory=list)
    draft_s: float = 0.0
    verify_s: float = 0.0
    commit_s: float = 0.0
    host_s: float = 0.0          # tree build, walk, bookkeeping, detokenizing

    def record_step(self, accept_length: int) -> None:
        self.steps += 1
        self.accept_lengths.append(accept_length)

    @property
    def al_mean(self) -> float:
        return float(np.mean(self.accept_lengths)) if self.accept_lengths else 0.0

    def al_histogram(self) -> list[int]:
        """Count of steps per acceptance length (index = length)."""
        if not self.accept_lengths:
            return []
        return np.bincount(np.asarray(self.accept_lengths)).tolist()

    @property
    def decode_tok_s(self) -> float:
        return self.new_tokens / self.decode_s if self.decode_s > 0 else 0.0

    @property
    def prefill_tok_s(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s > 0 else 0.0

    def per_step_ms(self) -> dict[str, float]:
        n = max(self.steps, 1)
        return {k: 1e3 * getattr(self, f"{k}_s") / n for k in ("draft", "verify", "commit", "host")}

    def as_dict(self) -> dict:
        return {
            "mode": self.mode, "prompt_tokens": self.prompt_tokens, "prefill_s": self.prefill_s,
            "new_tokens": self.new_tokens, "decode_s": self.decode_s, "decode_tok_s": self.decode_tok_s,
            "steps": self.steps, "al_mean": self.al_mean, "al_histogram": self.al_histogram(),
            "per_step_ms": self.per_step_ms(),
        }

    def summary(self) -> str:
        ms = self.per_step_ms()
        parts = [f"prefill {self.prompt_tokens} tok in {self.prefill_s * 1e3:.0f} ms",
                 f"decode {self.new_tokens} tok at {self.decode_tok_s:.1f} tok/s ({self.mode})"]
        if self.mode != "ar":
            parts.append(f"AL {self.al_mean:.2f} over {self.steps} steps")
            parts.append("per step ms: " + ", ".join(f"{k} {v:.2f}" for k, v in ms.items()))
        return "; ".join(parts)
