"""The serving replay's step model: token budget, seats, step cost, preemption mode (TRACE-1032..TRACE-1036).

A scheduler step runs a token budget of prefill chunks and one decode token per running request,
as vLLM's scheduler does; what it costs in time is a linear model whose defaults are stated here
and in spec chapter 10, so that two implementations of the replay give the same times.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvref.contract.errors import InvalidValueError

__all__ = ["MAX_COST_MS", "PREEMPTION_MODES", "StepModel"]

#: How a running request that cannot get its next block is handled (TRACE-1035, TRACE-1036).
PREEMPTION_MODES = ("recompute", "pause")
#: The largest step cost taken, in ms (about 11.6 days): no server takes longer for a step or a token,
#: and a larger one overflows the clock's arithmetic (TRACE-1033).
MAX_COST_MS = 1e9


@dataclass(frozen=True)
class StepModel:
    """What one scheduler step may run and what it costs (TRACE-1032, TRACE-1033).

    ``max_num_batched_tokens`` (vLLM's name) is the step's token budget, ``max_num_seqs`` the
    most requests running at once, ``max_model_len`` the most tokens a request may have
    (TRACE-1037). A step lasts ``step_ms + prefill_ms_per_token * prefill tokens +
    decode_ms_per_token * decode tokens``, each cost in whole nanoseconds, rounded half up to whole
    microseconds and at least one. The
    defaults stand for one H100 serving an 8B model (about 50,000 prefill tokens a second, a
    decode step of 64 requests in about 11 ms); they are a model, not a measurement of an engine.
    ``preemption`` is ``"recompute"`` (vLLM, TRACE-1035) or ``"pause"`` (Megatron-Core, TRACE-1036).
    ``reserve_full_sequence``: a waiting request is admitted only when blocks for all its tokens fit,
    not only for its first chunk (vLLM's ``scheduler_reserve_full_isl``, on by default, TRACE-1032).
    ``chunked_prefill=False``: a waiting request is admitted only when all the tokens it has left to
    compute fit the step's budget (vLLM's ``enable_chunked_prefill``; the budget must then be at
    least ``max_model_len``, as vLLM requires).
    """

    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    max_model_len: int = 1 << 20
    step_ms: float = 5.0
    prefill_ms_per_token: float = 0.02
    decode_ms_per_token: float = 0.1
    preemption: str = "recompute"
    reserve_full_sequence: bool = True
    chunked_prefill: bool = True

    def __post_init__(self) -> None:
        for name in ("max_num_batched_tokens", "max_num_seqs", "max_model_len"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise InvalidValueError("TRACE-1032", f"StepModel: {name} must be an integer >= 1, got {value!r}")
        for name in ("step_ms", "prefill_ms_per_token", "decode_ms_per_token"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= MAX_COST_MS:
                raise InvalidValueError(
                    "TRACE-1033", f"StepModel: {name} must be a number in [0, {MAX_COST_MS:.0e}] ms, got {value!r}"
                )
        for name in ("reserve_full_sequence", "chunked_prefill"):
            if type(getattr(self, name)) is not bool:
                raise InvalidValueError(
                    "TRACE-1032", f"StepModel: {name} must be True or False, got {getattr(self, name)!r}"
                )
        if not self.chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise InvalidValueError(
                "TRACE-1032",
                f"StepModel: without chunked prefill the token budget ({self.max_num_batched_tokens:,}) must be at "
                f"least max_model_len ({self.max_model_len:,}), or a long prompt could never be admitted",
            )
        if self.preemption not in PREEMPTION_MODES:
            raise InvalidValueError(
                "TRACE-1035", f"StepModel: preemption must be one of {list(PREEMPTION_MODES)}, got {self.preemption!r}"
            )

    def duration_us(self, prefill_tokens: int, decode_tokens: int) -> int:
        """A step's length in whole microseconds, at least 1 (TRACE-1033).

        Each cost is taken in whole nanoseconds, the sum in integers, rounded half up: the same
        on every machine, whatever floating point would make of the products.
        """
        step, prefill, decode = self._costs_ns
        ns = step + prefill * prefill_tokens + decode * decode_tokens
        return max(1, (ns + 500) // 1000)

    @property
    def _costs_ns(self) -> tuple[int, int, int]:
        return (
            round(self.step_ms * 1_000_000),
            round(self.prefill_ms_per_token * 1_000_000),
            round(self.decode_ms_per_token * 1_000_000),
        )

    def describe(self) -> str:
        """One line for reports."""
        return (
            f"budget {self.max_num_batched_tokens:,} tokens and {self.max_num_seqs} requests a step; a step costs "
            f"{self.step_ms:g} ms + {self.prefill_ms_per_token:g} ms per prefill token + "
            f"{self.decode_ms_per_token:g} ms per decode token; preemption by {self.preemption}; "
            + ("admission reserves the whole sequence" if self.reserve_full_sequence else "admission reserves a chunk")
            + ("" if self.chunked_prefill else "; no chunked prefill")
        )
