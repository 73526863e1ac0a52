"""The Handle both capture hooks return (caliper.hooks for transformers, caliper.vllm_hooks for
vLLM): what was installed, the batch counter, and detach()."""
from __future__ import annotations

from types import TracebackType
from typing import Callable, List, Optional, Type


class Handle:
    """What attach() installed. detach() removes all of it (idempotent); as a context manager it
    detaches on exit. `batch` is the forward pass being captured, `forwards` how many were
    captured; set `enabled` False to run forwards without capture."""

    def __init__(self, first_batch: int = 0) -> None:
        self._removers: List[Callable[[], None]] = []
        self.batch = first_batch
        self.forwards = 0
        self.enabled = True
        self.kv_layers: List[int] = []
        self.query = False  # the query is streamed too (recipe attention q)
        self.input_modules: List[str] = []   # checkpoint names
        self.weight_modules: List[str] = []
        self.errors: List[BaseException] = []

    def detach(self) -> None:
        while self._removers:
            self._removers.pop()()

    def __enter__(self) -> Handle:
        return self

    def __exit__(self, exc_type: Optional[Type[BaseException]],
                 exc: Optional[BaseException], tb: Optional[TracebackType]) -> None:
        self.detach()
