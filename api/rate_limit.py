"""Per-token rate limits: a token bucket per caller, in each replica's memory.

A caller is its bearer token (by digest, never kept in clear) or, without one, "anonymous". Each
bucket holds up to a minute's allowance and refills continuously; a request finding it empty is
answered 429 with the seconds until a request would pass. Buckets are per replica: behind a load
balancer of N replicas a caller may reach N times the rate, which the limit's purpose (no caller
starves the others of one replica's workers) allows.
"""

from __future__ import annotations

import hashlib
import threading
import time


def caller_of(token: str | None) -> str:
    """Who is asking: a digest of the token, or `anonymous`."""
    return "anonymous" if not token else "token:" + hashlib.sha256(token.encode()).hexdigest()[:16]


class RateLimit:
    def __init__(self, per_minute: int, clock: object = time.monotonic) -> None:
        self.capacity = float(per_minute)
        self.per_second = per_minute / 60.0
        self.clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # caller -> (tokens, at)
        self._lock = threading.Lock()

    def take(self, caller: str) -> float | None:
        """Takes one request from `caller`'s bucket: None when it passes, else the seconds to wait."""
        now = self.clock()  # type: ignore[operator]
        with self._lock:
            tokens, at = self._buckets.get(caller, (self.capacity, now))
            tokens = min(self.capacity, tokens + (now - at) * self.per_second)
            if tokens >= 1:
                self._buckets[caller] = (tokens - 1, now)
                return None
            self._buckets[caller] = (tokens, now)
            return (1 - tokens) / self.per_second
