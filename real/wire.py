"""Length-prefixed pickle frames between the launcher and its workers.

Every frame is a 4-byte big-endian length and a pickled tuple whose first
item names the kind. The payloads are the core's own message dataclasses
(``rollcall.core.messages``) and history records (plain dicts); the wire adds
only what a process needs around them:

worker -> launcher
    ("hello", worker, incarnation, pid, spare)   first frame on a connection
    ("msg", ToKeeper)                            a protocol message for the keeper
    ("rec", dict)                                a history record to append
    ("commit", worker, incarnation, gen, step, record)
                                                 may step ``step`` of ``gen`` commit?
launcher -> worker
    ("welcome", store_port)                      where the per-generation stores live
    ("msg", ToWorker)                            the keeper's answer
    ("ack", gen, step, accepted)                 answer to a commit request
    ("activate",)                                a standby spare becomes a worker

Loopback only, between processes of one run that the launcher started, so
pickle is acceptable here; a multi-host store would carry JSON instead.
"""

from __future__ import annotations

import pickle
import struct
from typing import Any

_LEN = struct.Struct(">I")
MAX_FRAME = 64 << 20


def encode(obj: Any) -> bytes:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return _LEN.pack(len(data)) + data


class FrameReader:
    """Incremental decoder: feed bytes, take whole frames."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[Any]:
        self._buf += data
        out = []
        while len(self._buf) >= 4:
            (n,) = _LEN.unpack_from(self._buf, 0)
            if n > MAX_FRAME:
                raise ValueError(f"frame of {n} bytes is too large")
            if len(self._buf) < 4 + n:
                break
            out.append(pickle.loads(bytes(self._buf[4:4 + n])))
            del self._buf[:4 + n]
        return out

