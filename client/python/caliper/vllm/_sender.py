"""The worker's background thread: the window's session, the statistics stream, ReportInUse.

The engine thread only queues readouts (a device-to-host copy in flight); this thread waits
for each copy, turns it into chunks and streams them. Nothing here blocks a step.
"""
from __future__ import annotations

import math
import queue
import threading
import time
from typing import TYPE_CHECKING, Any

from ._settings import Every, Settings, logger, why

if TYPE_CHECKING:
    from ._sampling import Readout
    from ._worker import WorkerState


class Sender:
    CHECK_S = 2.0

    def __init__(self, state: WorkerState, base: str):
        self.state = state
        self.base = base
        self.settings: Settings = state.settings
        self.incarnation = 0
        self.producer_id = ""      # of the open window's stream: PREFIX/N/rankR
        # The engine's identity in ReportInUse, the same for every window of this process.
        self.engine_id = f"{base}/rank{state.tp_rank}"
        self.window_id = ""
        self.sent = 0
        self._session: Any = None
        self._stream: Any = None   # client for the stream (long retries)
        self._control: Any = None  # client for unary calls (no waiting: the engine never blocks)
        self._want = state.weight_version
        self._have = ""
        self._generation = 0
        self._report = threading.Event()
        self._log = Every(30.0)
        self._thread = threading.Thread(target=self._run, name="caliper-vllm-sender",
                                        daemon=True)
        self._thread.start()

    def wire_bytes(self) -> int:
        """Bytes of the messages written to the open window's stream."""
        session = self._session
        return int(session.wire_bytes) if session is not None else 0

    def unacknowledged(self) -> int:
        """Statistics the server has not yet acknowledged as durable (merged, queued, sent)."""
        session = self._session
        if session is None:
            return 0
        count = int(session._merger.pending)
        for p in list(session._producers.values()):
            count += len(p._pending) + len(p._retained) + int(p._in_flight)
        return count

    def report_soon(self) -> None:
        self._report.set()

    def switch(self, weight_version: str, wait: bool = True) -> str:
        """Moves the stream to the window of weight_version; the sampling budget starts again.
        wait: opens the window now (the caller learns its id); else this thread opens it."""
        session_id = ""
        if wait:
            from ..fleets import open_window
            client = self._control or self.settings.client(attempts=3)
            self._control = client
            session_id = open_window(client, self.settings.fleet, weight_version).session_id
        self._want = weight_version
        self._report.set()
        return session_id

    def _run(self) -> None:
        from ..fleets import open_window, report_in_use
        self._stream = self.settings.client(attempts=100)
        self._control = self._control or self.settings.client(attempts=1)
        last_check, last_report = -math.inf, time.monotonic()
        last_drain = last_report
        while True:
            item: Any
            try:
                item = self.state.queue.get(timeout=0.5)
            except queue.Empty:
                item = None
            try:
                now = time.monotonic()
                want = self._want
                if want != self._have or now - last_check > self.CHECK_S:
                    last_check = now
                    window = open_window(self._control, self.settings.fleet, want)
                    if window.session_id != self.window_id:
                        self._open(window.session_id, want)
                if item is not None and item.generation < self._generation:
                    self._discard(item)  # sampled under the weights before a refit
                    item = None
                if item is not None and self._session is not None:
                    self._put(item)
                    item = None
                if self._session is not None and now - last_drain > 1.0:
                    last_drain = now  # merged statistics wait at most a second
                    self._session._drain_merged()
                if self._report.is_set() or now - last_report > self.settings.report_s:
                    self._report.clear()
                    last_report = now
                    worst, _ = self.state.saturation()
                    report_in_use(self._control, self.settings.fleet, self.engine_id,
                                  self.state.version, min(1.0, worst),
                                  layer_saturation=self.state.layer_saturation(),
                                  dropped_statistics=self.state.dropped,
                                  sampled_tokens=self.state.take_unreported_tokens())
            except Exception as e:  # noqa: BLE001 - unreachable, refusing, closed: go on
                if self._log():
                    logger().warning("caliper: %s (statistics are dropped and counted until "
                                     "it answers)", why(e))
            if item is not None:
                self._discard(item)

    def _discard(self, item: Readout) -> None:
        if item.release is not None:
            item.wait()
            item.release()
        self.state.drop(1)

    def _open(self, session_id: str, weight_version: str) -> None:
        refit = weight_version != self._have
        old, self._session = self._session, None
        if old is not None:
            threading.Thread(target=self._retire, args=(old,), daemon=True).start()
        self.incarnation += 1
        # Stable for this window and process: a reconnect resumes exactly where it stopped.
        prefix = f"{self.base}/{self.incarnation}"
        session = self._stream.session(session_id, producer_prefix=prefix,
                                       queue_bytes=self.settings.queue_bytes)
        self.state.recipe = session.proto.recipe
        self._session = session
        self.window_id = session_id
        self.producer_id = f"{prefix}/rank{self.state.tp_rank}"
        self._have = weight_version
        if refit:
            self._generation = self.state.generation
        else:  # the window closed: a new budget for the next one
            self.state.sampled_tokens = 0

    def _retire(self, session: Any) -> None:
        """The old window's statistics: sent, or counted as dropped (the window closed)."""
        try:
            session.close()
        except Exception as e:  # noqa: BLE001
            self.state.drop(len(getattr(e, "rejected", [])) or 1)

    def _put(self, item: Readout) -> None:
        from .._pb import caliper_pb2 as pb
        from ._sampling import PartialStatistics
        try:
            layers = self.state.statistics_of(item)
        except PartialStatistics as e:
            layers = e.layers
            self.state.errors += 1
            if self._log():
                logger().warning("caliper: %s", e)
        except ValueError as e:
            self.state.errors += 1
            if self._log():
                logger().warning("caliper: %s", e)
            return
        self.state.note_sampled(item, layers)
        kinds = (pb.KEY, pb.VALUE, pb.QUERY)  # by _sampling's part index
        for layer in layers:
            fields = dict(layer=layer.index, tp_rank=self.state.tp_rank,
                          tp_size=self.state.tp_size, batch=item.batch)
            self._session._put([(where, kinds[part], chunk)
                                for where, part, chunk in layer.chunks], fields)
            self.sent += 1
