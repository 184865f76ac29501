"""The task token's heartbeats: a thread of the agent's clock that heartbeats the Run task's token every
`heartbeat_interval(...)` seconds (a quarter of the task's heartbeat timeout, unless configured) until the
agent reports, stops, or finds the token closed.

One concern of the worker agent (`spotrelay.agent.agent`: `Agent` starts the heartbeats once it has the
token and stops them before it reports); its siblings are `handover`, `background`, `output`, `startup`
and `settings`.
"""

from __future__ import annotations

from spotrelay.agent.logs import JobLogger
from spotrelay.agent.ports import TaskTokens
from spotrelay.clock import ClockEvent, ClockThread, WaitingClock

# Heartbeats within one Run task heartbeat timeout: three can fail in a row (a throttled or unreachable
# Step Functions endpoint) before the silence counts as the worker's death
HEARTBEATS_PER_TIMEOUT = 4
HEARTBEAT_SECONDS_UNKNOWN_TIMEOUT = 60.0  # an attempt record from a Launch that did not record the timeout


def heartbeat_interval(configured: float | None, timeout_seconds: int | None) -> float:
    """Seconds between heartbeats: as configured, else a quarter of the Run task's heartbeat timeout."""
    if configured is not None:
        return configured
    if timeout_seconds is None:
        return HEARTBEAT_SECONDS_UNKNOWN_TIMEOUT
    return timeout_seconds / HEARTBEATS_PER_TIMEOUT


class Heartbeats:
    """The heartbeat thread of `spotrelay.agent.agent.Agent` (a mixin: `Agent.__init__` sets the attributes)."""

    clock: WaitingClock
    tokens: TaskTokens
    log: JobLogger
    _heartbeat_every: float
    _heartbeat_stop: ClockEvent
    _heartbeats: ClockThread | None

    def _start_heartbeats(self, token: str) -> None:
        self._heartbeat_stop.clear()
        self._heartbeats = self.clock.start_thread("heartbeat", lambda: self._heartbeat_loop(token))

    def _stop_heartbeats(self) -> None:
        self._heartbeat_stop.set()
        if self._heartbeats is not None:
            self._heartbeats.join(timeout=30)

    def _heartbeat_loop(self, token: str) -> None:
        while not self._heartbeat_stop.is_set():
            try:
                open_token = self.tokens.heartbeat(token)
            except Exception as e:
                self.log.warning("heartbeat failed", extra={"error": str(e)})
                open_token = True
            if not open_token:
                self.log.info("the task token is closed: no more heartbeats")
                return
            if self._heartbeat_stop.wait(self._heartbeat_every):
                return
