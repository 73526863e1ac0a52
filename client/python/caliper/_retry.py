"""Retries for calls to caliper-server, with the CLI's policy and messages (client/rpc_retry.h).

Idempotent unary calls (GetSession, Finalize, GetScales, Resume, ListSessions) are retried on
UNAVAILABLE and DEADLINE_EXCEEDED, `attempts` tries (default 8) with a backoff from 0.2 s doubling
to 5 s, cut short once the channel is connected again; each retry prints
"<who>: server unavailable, retrying in 400ms (attempt 3/8)" to the log. CreateSession is not
idempotent: it waits for a connection first and sends again only after the connection broke
before the reply, saying that the lost call may have left an empty session.
"""
from __future__ import annotations

import dataclasses
import sys
import time
from typing import Callable, Optional, TextIO, TypeVar

import grpc

T = TypeVar("T")

RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
# A stream that broke rather than being refused (the CLI's IsConnectionLoss).
CONNECTION_LOSS = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.ABORTED)


@dataclasses.dataclass
class RetryPolicy:
    max_attempts: int = 8          # the first try included
    initial_backoff_s: float = 0.2  # doubled after each retry ...
    max_backoff_s: float = 5.0      # ... up to this
    call_deadline_s: float = 30.0   # each unary attempt


class Backoff:
    """One retry budget; not thread-safe (one per call sequence or stream)."""

    def __init__(self, policy: RetryPolicy, who: str, log: Optional[TextIO] = None,
                 channel: Optional[grpc.Channel] = None):
        self.policy = policy
        self.who = who
        self.log = log if log is not None else sys.stderr
        self.channel = channel
        self.attempt = 1
        self.delay = policy.initial_backoff_s

    def wait(self, reason: str) -> bool:
        """Counts a failed attempt; False when the budget is spent, else logs and pauses."""
        if self.attempt >= self.policy.max_attempts:
            return False
        self.attempt += 1
        if self.log is not False:
            print(f"{self.who}: {reason}, retrying in {round(self.delay * 1000)}ms "
                  f"(attempt {self.attempt}/{self.policy.max_attempts})", file=self.log, flush=True)
        if self.channel is not None:
            try:  # ends early once the channel is connected again
                grpc.channel_ready_future(self.channel).result(timeout=self.delay)
            except grpc.FutureTimeoutError:
                pass
        else:
            time.sleep(self.delay)
        self.delay = min(self.delay * 2, self.policy.max_backoff_s)
        return True

    def reset(self) -> None:
        self.attempt = 1
        self.delay = self.policy.initial_backoff_s


def reason(err: grpc.RpcError, policy: RetryPolicy) -> str:
    if err.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"no answer within {round(policy.call_deadline_s * 1000)}ms"
    return "server unavailable"


def call_with_retry(backoff: Backoff, rpc: Callable[[float], T]) -> T:
    """Runs rpc(timeout) until it does not fail with a retryable code or the budget is spent."""
    while True:
        try:
            return rpc(backoff.policy.call_deadline_s)
        except grpc.RpcError as err:
            if err.code() not in RETRYABLE or not backoff.wait(reason(err, backoff.policy)):
                raise


def create_with_retry(backoff: Backoff, channel: grpc.Channel, rpc: Callable[[float], T]) -> T:
    """CreateSession under the rules above."""
    while True:
        try:
            grpc.channel_ready_future(channel).result(timeout=backoff.policy.initial_backoff_s)
        except grpc.FutureTimeoutError:
            if backoff.wait("server unavailable"):
                continue
            raise ConnectionError(
                f"{backoff.who}: no connection after {backoff.policy.max_attempts} attempts"
            ) from None
        try:
            return rpc(backoff.policy.call_deadline_s)
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            if not backoff.wait("connection lost before the reply (a session the server may have "
                                "made for that call stays empty; `caliper sessions` lists it)"):
                raise
