"""The plugin's configuration (CALIPER_* environment variables) and its logging."""
from __future__ import annotations

import dataclasses
import logging
import math
import time
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, TypeVar

if TYPE_CHECKING:
    from ..client import Client

ENV_FLEET = "CALIPER_FLEET"
ENV_SERVER = "CALIPER_SERVER"
DEFAULT_SAMPLE_TOKENS = 65536
DEFAULT_SAMPLE_FRACTION = 0.1
DEFAULT_SILENT_STEPS = 200

N = TypeVar("N", int, float)


@dataclasses.dataclass(frozen=True)
class Settings:
    """The plugin's configuration, from CALIPER_* environment variables."""

    fleet: str
    server: str
    weight_version: str = "initial"
    sample_tokens: int = DEFAULT_SAMPLE_TOKENS
    sample_fraction: float = DEFAULT_SAMPLE_FRACTION
    queue_items: int = 1024
    queue_bytes: int = 4 << 20
    producer: str = ""
    switch_grace_s: float = 2.0
    report_s: float = 10.0
    # Sampled steps in a row that saw no token of any layer before the engine says so.
    silent_steps: int = DEFAULT_SILENT_STEPS
    token: Optional[str] = None
    tls_ca: Optional[str] = None
    tls_cert: Optional[str] = None
    tls_key: Optional[str] = None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Optional[Settings]:
        """None when the plugin stays inert; ValueError naming the variable when one is bad."""
        fleet, server = env.get(ENV_FLEET, "").strip(), env.get(ENV_SERVER, "").strip()
        if not fleet or not server:
            return None

        def number(name: str, kind: Callable[[str], N], default: N, low: N,
                   high: Optional[N] = None) -> N:
            text = env.get(name, "").strip()
            if not text:
                return default
            try:
                value = kind(text)
            except ValueError:
                raise ValueError(f"{name}: expected a number, got {text!r}") from None
            if not (value >= low) or (high is not None and value > high):
                raise ValueError(f"{name}: expected {low}..{high if high is not None else ''}, "
                                 f"got {text}")
            return value
        return cls(
            fleet=fleet, server=server,
            weight_version=env.get("CALIPER_WEIGHT_VERSION", "").strip() or "initial",
            sample_tokens=number("CALIPER_SAMPLE_TOKENS", int, DEFAULT_SAMPLE_TOKENS, 0),
            sample_fraction=number("CALIPER_SAMPLE_FRACTION", float, DEFAULT_SAMPLE_FRACTION,
                                   0.0, 1.0),
            queue_items=number("CALIPER_QUEUE_ITEMS", int, 1024, 1),
            queue_bytes=number("CALIPER_QUEUE_BYTES", int, 4 << 20, 1024),
            producer=env.get("CALIPER_PRODUCER", "").strip(),
            switch_grace_s=number("CALIPER_SWITCH_GRACE_S", float, 2.0, 0.0),
            report_s=number("CALIPER_REPORT_S", float, 10.0, 0.1),
            silent_steps=number("CALIPER_SILENT_STEPS", int, DEFAULT_SILENT_STEPS, 1),
            token=env.get("CALIPER_TOKEN") or None,
            tls_ca=env.get("CALIPER_TLS_CA") or None,
            tls_cert=env.get("CALIPER_TLS_CERT") or None,
            tls_key=env.get("CALIPER_TLS_KEY") or None)

    def client(self, attempts: int) -> Client:
        from ..client import Client
        return Client(self.server, token=self.token, tls_ca=self.tls_ca, tls_cert=self.tls_cert,
                      tls_key=self.tls_key, attempts=attempts, who="caliper: vllm",
                      log=LogStream())  # type: ignore[arg-type]


def logger() -> logging.Logger:
    try:
        from vllm.logger import init_logger
        return init_logger("vllm.caliper")  # type: ignore[no-any-return]  # vLLM's format
    except Exception:  # noqa: BLE001 - outside vLLM (unit tests)
        return logging.getLogger("caliper.vllm")


class LogStream:
    """The client's retry lines, as rate-limited log lines."""

    def __init__(self) -> None:
        self._every = Every(10.0)

    def write(self, text: str) -> None:
        text = text.strip()
        if text and self._every():
            logger().warning("caliper: %s", text)

    def flush(self) -> None:
        pass


class Every:
    """True at most once per `seconds` (rate-limited log lines)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._last = -math.inf

    def __call__(self) -> bool:
        now = time.monotonic()
        if now - self._last < self.seconds:
            return False
        self._last = now
        return True


def why(e: BaseException) -> str:
    """One line: a gRPC error's code and details, else the exception's first line."""
    code: Any = getattr(e, "code", None)
    if callable(code):
        try:
            return f"{code().name}: {e.details()}"  # type: ignore[attr-defined]
        except Exception:  # noqa: BLE001 - not a gRPC call error after all
            pass
    text = str(e).splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"
