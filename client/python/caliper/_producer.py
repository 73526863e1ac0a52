"""One producer: a background thread feeding one Observe stream with exactly-once sequences.

Chunks are queued (bounded: `put` blocks while `queue_bytes` are waiting, so a model producing
faster than the network is slowed down, not buffered without limit), numbered 1, 2, 3, ... and
sent on one stream. The server acknowledges a stream (its ObserveSummary) only once every chunk
it accepted is durable, so the chunks of the open stream are retained until that summary
arrives; the stream is closed and a new one opened whenever `retain_bytes` are held or nothing
was queued for `idle_close_s`. After a dropped connection or a server restart the producer asks
Resume where to go on and re-sends only what the server lacks, as the CLI does.
"""
from __future__ import annotations

import collections
import dataclasses
import sys
import threading
import time
from typing import Deque, Dict, List, Optional, TextIO

import grpc

from . import _retry
from ._pb import caliper_pb2 as pb


@dataclasses.dataclass
class ChunkRejected:
    tensor: str      # what the chunk held, e.g. "layer 3 key rows 0..512"
    sequence: int
    code: str        # canonical status name, e.g. INVALID_ARGUMENT
    message: str     # the server's message, naming the field

    def __str__(self) -> str:
        return f"{self.tensor} (sequence {self.sequence}): {self.code}: {self.message}"


class RejectedChunksError(RuntimeError):
    """The server refused chunks in-band; the session kept everything else."""

    def __init__(self, producer: str, rejected: List[ChunkRejected], uncounted: int = 0):
        self.rejected = rejected
        lines = [f"{producer}: the server rejected {len(rejected) + uncounted} chunk(s):"]
        lines += [f"  {r}" for r in rejected]
        if uncounted:
            lines.append(f"  ... and {uncounted} more")
        super().__init__("\n".join(lines))


class StreamError(RuntimeError):
    """The stream ended with a status that retrying cannot fix (e.g. NOT_FOUND)."""

    def __init__(self, producer: str, code: grpc.StatusCode, details: str):
        self.code = code
        self.details = details
        super().__init__(f"{producer}: Observe failed: {code.name}: {details}")


@dataclasses.dataclass
class _Item:
    sequence: int
    tensor: str
    message: pb.TensorChunk
    nbytes: int


class Producer:
    def __init__(self, stub, channel: grpc.Channel, session_id: str, producer_id: str, *,
                 metadata, policy: _retry.RetryPolicy, who: str,
                 queue_bytes: int = 256 << 20, retain_bytes: int = 256 << 20,
                 idle_close_s: float = 1.0, log: Optional[TextIO] = None):
        self.session_id = session_id
        self.producer_id = producer_id
        self._stub = stub
        self._channel = channel
        self._metadata = metadata
        self._policy = policy
        self._who = who
        self._log = log if log is not None else sys.stderr
        self._queue_bytes = queue_bytes
        self._retain_bytes = retain_bytes
        self._idle_close_s = idle_close_s
        self._cv = threading.Condition()
        self._pending: Deque[_Item] = collections.deque()
        self._pending_bytes = 0
        self._retained: List[_Item] = []  # sent on the open (or broken) stream, not yet durable
        self._retained_bytes = 0
        self._in_flight = False
        self._closing = False
        self._flushing = 0
        self._fatal: Optional[BaseException] = None
        self._rejected: List[ChunkRejected] = []
        self._uncounted_rejections = 0
        self.summary = pb.ObserveSummary()  # summed over every stream that ended with one
        self.sent_bytes = 0        # bytes of the messages written (wire payload)
        self.tensor_bytes = 0      # bytes of the tensors they stand for
        self.skipped_resumed = 0   # chunks dropped because the server already had them
        # Where this producer starts: a restarted capture re-sends nothing the server counted.
        backoff = _retry.Backoff(policy, f"{who}: Resume", self._log, channel)
        response = _retry.call_with_retry(backoff, lambda t: stub.Resume(
            pb.ResumeRequest(session_id=session_id, producer_id=producer_id), timeout=t,
            metadata=metadata))
        self._start = max(1, response.next_sequence)
        self._next = 1
        self._thread = threading.Thread(target=self._run, name=f"caliper-producer {producer_id}",
                                        daemon=True)
        self._thread.start()

    # ---- caller side ---------------------------------------------------------------------
    def put(self, message: pb.TensorChunk, tensor: str, tensor_bytes: int) -> int:
        """Queues one chunk (blocks while the queue is full); returns its sequence."""
        nbytes = message.ByteSize()
        with self._cv:
            self._raise_fatal()
            if self._closing:
                raise RuntimeError(f"{self._who}: producer {self.producer_id} is closed")
            sequence = self._next
            self._next += 1
            if sequence < self._start:
                self.skipped_resumed += 1
                return sequence
            while self._pending and self._pending_bytes + nbytes > self._queue_bytes:
                self._cv.wait(0.1)
                self._raise_fatal()
            message.session_id = self.session_id
            message.producer_id = self.producer_id
            message.sequence = sequence
            self._pending.append(_Item(sequence, tensor, message, nbytes))
            self._pending_bytes += nbytes
            self.tensor_bytes += tensor_bytes
            self._cv.notify_all()
            return sequence

    def flush(self, raise_rejected: bool = True) -> None:
        """Waits until every queued chunk is durable on the server; raises what went wrong."""
        with self._cv:
            self._flushing += 1
            self._cv.notify_all()
            try:
                while (self._pending or self._retained or self._in_flight) and self._fatal is None:
                    self._cv.wait(0.1)
            finally:
                self._flushing -= 1
            self._raise_fatal()
            if raise_rejected and (self._rejected or self._uncounted_rejections):
                rejected, self._rejected = self._rejected, []
                uncounted, self._uncounted_rejections = self._uncounted_rejections, 0
                raise RejectedChunksError(self.producer_id, rejected, uncounted)

    def close(self) -> None:
        try:
            self.flush()
        finally:
            with self._cv:
                self._closing = True
                self._cv.notify_all()
            self._thread.join()

    @property
    def queued_bytes(self) -> int:
        return self._pending_bytes + self._retained_bytes

    def _raise_fatal(self) -> None:
        if self._fatal is not None:
            raise self._fatal

    # ---- worker side ---------------------------------------------------------------------
    def _requests(self, stream: dict):
        """The messages of one stream: the retained ones first (after a resume), then the queue."""
        with self._cv:
            resend = list(self._retained)
        for item in resend:
            self.sent_bytes += item.nbytes
            yield item.message
        idle_since = time.monotonic()
        while True:
            with self._cv:
                while not self._pending:
                    if (stream["done"] or self._closing or self._flushing or
                            time.monotonic() - idle_since > self._idle_close_s):
                        return
                    self._cv.wait(0.05)
                if self._retained_bytes >= self._retain_bytes or stream["done"]:
                    return  # close the stream: its summary makes the retained chunks durable
                item = self._pending.popleft()
                self._pending_bytes -= item.nbytes
                self._retained.append(item)
                self._retained_bytes += item.nbytes
                self._cv.notify_all()
            self.sent_bytes += item.nbytes
            yield item.message
            idle_since = time.monotonic()

    def _run(self) -> None:
        backoff = _retry.Backoff(self._policy, f"{self._who}: {self.producer_id}", self._log,
                                 self._channel)
        while True:
            with self._cv:
                while not self._pending and not self._retained:
                    if self._closing:
                        return
                    self._cv.wait(0.1)
                self._in_flight = True
            stream = {"done": False}
            try:
                summary = self._stub.Observe(self._requests(stream), metadata=self._metadata)
            except grpc.RpcError as err:
                stream["done"] = True
                if not self._recover(err, backoff):
                    return
                continue
            finally:
                stream["done"] = True
            self._stream_ended(summary)
            backoff.reset()

    def _stream_ended(self, summary: pb.ObserveSummary) -> None:
        with self._cv:
            names: Dict[int, str] = {item.sequence: item.tensor for item in self._retained}
            for e in summary.errors:
                self._rejected.append(ChunkRejected(names.get(e.sequence, "?"), e.sequence,
                                                    e.code, e.message))
            self._uncounted_rejections += max(0, summary.rejected_chunks - len(summary.errors))
            self._add(summary)
            self._retained.clear()
            self._retained_bytes = 0
            self._in_flight = False
            self._cv.notify_all()

    def _add(self, s: pb.ObserveSummary) -> None:
        t = self.summary
        t.accepted_chunks += s.accepted_chunks
        t.rejected_chunks += s.rejected_chunks
        t.accepted_bytes += s.accepted_bytes
        t.rejected_bytes += s.rejected_bytes
        t.skipped_warmup_chunks += s.skipped_warmup_chunks
        t.duplicate_chunks += s.duplicate_chunks

    def _fail(self, error: BaseException) -> bool:
        with self._cv:
            self._fatal = error
            self._in_flight = False
            self._cv.notify_all()
        return False

    def _recover(self, err: grpc.RpcError, backoff: _retry.Backoff) -> bool:
        if err.code() not in _retry.CONNECTION_LOSS or not backoff.wait("connection lost"):
            return self._fail(StreamError(self.producer_id, err.code(), err.details() or ""))
        try:
            response = _retry.call_with_retry(backoff, lambda t: self._stub.Resume(
                pb.ResumeRequest(session_id=self.session_id, producer_id=self.producer_id),
                timeout=t, metadata=self._metadata))
        except grpc.RpcError as resume_err:
            return self._fail(StreamError(self.producer_id, resume_err.code(),
                                          resume_err.details() or ""))
        nxt = max(1, response.next_sequence)
        with self._cv:
            first = self._retained[0].sequence if self._retained else None
            kept = [item for item in self._retained if item.sequence >= nxt]
            if first is not None and nxt > first:
                backoff.reset()  # the server counted more: a fresh budget
            self._retained = kept
            self._retained_bytes = sum(item.nbytes for item in kept)
            self._in_flight = False
            more = bool(kept or self._pending)
            self._cv.notify_all()
        if more:
            print(f"resuming {self.producer_id} from sequence {nxt}", file=self._log, flush=True)
        return True
