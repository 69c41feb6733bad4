"""The sim's network: one link per host, and the ``delay`` and ``loss`` faults.

The model
---------
Every host (``cluster.workers_per_host``) has one link to the rest of the
cluster. With every link healthy, a message between a worker and the
keeper takes ``network.latency_s`` one way (the scenario's end-to-end
figure: both hosts' links and the switch; the keeper's own link is never
degraded), and the sim prices everything exactly as it always has: the
driver asks this module nothing per message unless some link is degraded
(:attr:`Links.degraded`), so a run without network faults pays nothing
(``scenarios/llama3-54d.yaml``, ``gpu100k-30d.yaml``) and writes the same
bytes as before.

A degraded link changes every message that crosses it:

* ``delay: H, latency_s: X``: X more seconds one way.
* ``loss: H, rate: P``: every transport is TCP (the keeper link is JSON
  frames over TCP, gloo is TCP), so a dropped packet is retransmitted, not
  lost: loss shows as delay. Each transmission of a message over the link
  is dropped with probability P (a draw of a named stream, below) and sent
  again when the retransmission timer expires. The first timeout is
  ``RTT + TCP_RTO_MIN``: Linux sets ``RTO = SRTT + max(4 RTTVAR,
  TCP_RTO_MIN)`` (``tcp_set_rto``, RFC 6298 section 2 with Linux's floor
  of ``TCP_RTO_MIN = HZ/5 = 200 ms``, include/net/tcp.h), and an idle
  cluster link's RTTVAR is far below 50 ms. Each expiry doubles it (RFC 6298
  section 5.5, "back off the timer"), up to ``TCP_RTO_MAX = 120 s``; after
  ``tcp_retries2 = 15`` retransmissions Linux would reset the connection,
  and the sim stops drawing there (the message arrives after the 15th).
* ``partition`` and ``isolate_keeper`` cut the host off (:meth:`Links.cut`:
  from everyone, or from the keeper only); what that does to the workers is
  :meth:`sim.nemesis.Nemesis._cut_hosts`, which records it here.

Randomness: the k-th transmission on a connection is dropped when
``uniform(seed, "network/<connection>", k) <= P`` (SHA-256 of the seed, the
stream's name and k, as :mod:`rollcall.core.failures` draws lifetimes), one
counter per connection: the draws depend on the seed and on what crossed
that connection, never on the order in which the driver asks for other
connections, so the same scenario and seed give the same history.

Where the links are priced (:class:`NetFaults`, the driver's hooks)
------------------------------------------------------------------
* **Heartbeats**, beat by beat, for each worker of the degraded host while
  the fault lasts and until its backlog drains: a beat sent at ``s`` arrives
  at ``max(s + latency + extra + retransmissions, previous arrival)`` (TCP
  delivers in order). A gap between two arrivals that can change a verdict
  (``Detector.gap_that_counts_s``: a timeout's silence; for phi any gap
  beyond the cadence, which enters its window) is what the keeper sees on
  real: from the earlier arrival the worker is silent to the keeper (the
  driver's cut from the keeper only: its peers still reach it, and its
  votes and answers only come late, so the job does not stall) until the
  late beat arrives, and the core's detector decides. A shorter gap changes
  no verdict, so nothing is cut.
* **The exchange**: a step's all-reduce waits for its slowest member link,
  so while a member's host is degraded every step costs that link's extra
  latency more (the largest over the members' degraded hosts), plus, on a
  lossy link, that step's retransmissions (the sim then runs steps one
  segment each, each with its own draws). The exchange is a bulk transfer:
  the gradient's bytes twice (a ring all-reduce's two passes, float32) in
  MSS-sized segments (:data:`MSS_BYTES`), and an attempt gets through only
  when every segment does, so a link that drops 30% of its packets holds a
  20k-parameter model's exchange (111 segments) until the loss ends: each
  failed attempt waits the current RTO (doubling), and an attempt made
  after the fault's end gets through (measured on real, ``real-loss-host``:
  the step in flight when a 1 s, 30% loss began took 1.49 s; this model
  gives 0.2 + 0.4 + 0.8 s of RTOs). A bulk flow's fast retransmit (three
  duplicate ACKs, about one RTT instead of an RTO), which saves a transfer
  at a low loss rate, is not modelled.
* **Single messages** between the keeper and a worker of a degraded host
  (the keeper's replies and refusals, a fenced worker's rejoin, the answers
  of a worker the driver holds on its own): its link's extra latency and
  retransmissions.

Not priced through the links (a documented approximation): the keeper's
broadcasts (roll calls, memberships) and the bulk answers to them, which
the driver handles for whole groups of workers at once; commit votes (the
keeper commits on the first vote to arrive, which comes from a member on a
healthy link when one exists); a killed process's exit notice
(``detector.exit_notice_s``); state copies (``bandwidth_Bps``); and the
beats of a process started on the host while its link is degraded (a
relaunch, a repair: the beats are priced for the processes running when the
fault starts).
"""

from __future__ import annotations

import hashlib
import math
from typing import Any, Callable, Iterable, Optional

from rollcall.core import NEMESIS, rec

from sim.world import World

__all__ = ["Links", "MSS_BYTES", "NetFaults", "RTO_MAX_S", "RTO_MIN_S", "RETRIES_MAX",
           "uniform"]

RTO_MIN_S = 0.2    # Linux TCP_RTO_MIN (HZ/5)
RTO_MAX_S = 120.0  # Linux TCP_RTO_MAX
RETRIES_MAX = 15   # Linux net.ipv4.tcp_retries2: then the connection would be reset
MSS_BYTES = 1448   # a TCP segment's payload on a 1500-byte MTU with timestamps


def uniform(seed: int, name: str, k: int) -> float:
    """The k-th draw of the stream ``name``, uniform on (0, 1]."""
    digest = hashlib.sha256(f"{seed}/{name}/{k}".encode()).digest()
    return ((int.from_bytes(digest[:8], "big") >> 11) + 1) * 2.0 ** -53


class Links:
    """Every host's link: its extra latency, loss rate and cut, and the draws.

    Pure arithmetic over explicit times (no clock): the driver says when a
    fault starts and ends, and asks what a message or a beat costs.
    """

    def __init__(self, seed: int, latency_s: float) -> None:
        assert latency_s >= 0, latency_s
        self.seed = seed
        self.latency_s = latency_s  # one way, worker to keeper, healthy links
        # host -> its active faults: (extra_s, rate, when it is due to end)
        self._faults: dict[int, list[tuple[float, float, float]]] = {}
        self._cut: dict[int, str] = {}  # host -> "partition" | "isolate_keeper"
        self._k: dict[str, int] = {}    # stream -> draws made

    # -- state ---------------------------------------------------------------

    @property
    def degraded(self) -> bool:
        """Whether any link has extra latency or loss now (else: the fast path)."""
        return bool(self._faults)

    def degraded_hosts(self) -> list[int]:
        return sorted(self._faults)

    def degrade(self, host: int, extra_s: float = 0.0, rate: float = 0.0,
                until: float = math.inf) -> None:
        """A delay (``extra_s``) or loss (``rate``) fault starts on ``host``'s
        link; ``until``: when it is due to end (a transfer's retransmissions
        know that an attempt after it gets through)."""
        assert extra_s >= 0 and 0 <= rate < 1, (extra_s, rate)
        self._faults.setdefault(host, []).append((extra_s, rate, until))

    def restore(self, host: int, extra_s: float = 0.0, rate: float = 0.0) -> None:
        """That fault ends (faults on one link stack: the others stay)."""
        active = self._faults[host]
        active.remove(next(f for f in active if f[:2] == (extra_s, rate)))
        if not active:
            del self._faults[host]

    def extra_s(self, host: int) -> float:
        """Extra one-way latency on ``host``'s link (the active delays, summed)."""
        return sum(x for x, _, _ in self._faults.get(host, ()))

    def loss_rate(self, host: int) -> float:
        """The fraction of packets ``host``'s link drops (independent losses combined)."""
        return self.loss_rate_at(host, -math.inf)

    def cut(self, hosts: Iterable[int], kind: str) -> None:
        """``partition`` (from everyone) or ``isolate_keeper`` (from the keeper only)."""
        assert kind in ("partition", "isolate_keeper"), kind
        for h in hosts:
            self._cut[h] = kind

    def heal(self, hosts: Iterable[int]) -> None:
        for h in hosts:
            self._cut.pop(h, None)

    def reaches_keeper(self, host: int) -> bool:
        return host not in self._cut

    def reaches_peers(self, host: int) -> bool:
        return self._cut.get(host) != "partition"

    # -- prices --------------------------------------------------------------

    def rto_s(self, host: int) -> float:
        """The first retransmission timeout on ``host``'s link: RTT + TCP_RTO_MIN."""
        return 2.0 * (self.latency_s + self.extra_s(host)) + RTO_MIN_S

    def draw(self, stream: str) -> float:
        """The next draw of ``network/<stream>``."""
        k = self._k.get(stream, 0)
        self._k[stream] = k + 1
        return uniform(self.seed, f"network/{stream}", k)

    def retransmit_s(self, host: int, stream: str) -> float:
        """Seconds one message over ``host``'s link waits for retransmissions:
        each transmission is dropped with the link's loss rate (as long as
        the link is lossy, whenever its faults are due to end); every drop
        costs the current RTO, which doubles (RFC 6298 5.5) up to RTO_MAX_S."""
        return self.bulk_retransmit_s(host, stream, -math.inf, 1)

    def loss_rate_at(self, host: int, t: float) -> float:
        """The fraction ``host``'s link drops at ``t``, counting only the loss
        faults not due to end by then."""
        keep = 1.0
        for _, p, until in self._faults.get(host, ()):
            if until > t:
                keep *= 1.0 - p
        return 1.0 - keep

    def bulk_retransmit_s(self, host: int, stream: str, now: float, segments: int) -> float:
        """Seconds a transfer of ``segments`` segments started at ``now`` over
        ``host``'s link waits for retransmissions: an attempt gets through
        when every segment does (probability ``(1 - P) ** segments``), a
        failed one costs the current RTO, which doubles, and an attempt made
        once the loss is due to end gets through."""
        assert segments >= 1, segments
        wait, rto = 0.0, self.rto_s(host)
        for _ in range(RETRIES_MAX):
            p = self.loss_rate_at(host, now + wait)
            fails = p if segments == 1 else 1.0 - (1.0 - p) ** segments
            if p == 0.0 or self.draw(stream) > fails:
                break  # this attempt got through
            wait += rto
            rto = min(2.0 * rto, RTO_MAX_S)
        return wait

    def one_way_s(self, host: Optional[int], stream: str) -> float:
        """One message between the keeper and a worker of ``host``."""
        if host is None or host not in self._faults:
            return self.latency_s
        return self.latency_s + self.extra_s(host) + self.retransmit_s(host, stream)

    def exchange_extra_s(self, hosts: Iterable[int], now: float = 0.0,
                         segments: int = 1) -> float:
        """What a step's exchange, started at ``now``, costs beyond its healthy
        time: its slowest member link's extra latency and this step's
        retransmissions of its ``segments`` segments."""
        return max((self.extra_s(h) + self.bulk_retransmit_s(h, f"exchange/{h}", now, segments)
                    for h in hosts if h in self._faults), default=0.0)

    def beat_gaps(self, worker: int, host: int, phase_s: float, heartbeat_s: float,
                  t0: float, t1: float, timeout_s: float) -> list[tuple[float, float]]:
        """The silences longer than ``timeout_s`` the keeper sees in ``worker``'s
        beats when its link is as now from ``t0`` to ``t1``: (last arrival, next
        arrival) pairs. Beats leave at ``phase_s + k * heartbeat_s``; those sent
        from ``t0`` on pay the link, in order (TCP), until the backlog drains."""
        return held_beat_gaps(phase_s, heartbeat_s, self.latency_s, t0, t1, timeout_s,
                              lambda: self.one_way_s(host, f"beat/{worker}"))


def held_beat_gaps(phase_s: float, heartbeat_s: float, latency_s: float, t0: float, t1: float,
                   silence_s: float, cost: Callable[[], float]) -> list[tuple[float, float]]:
    """The silences longer than ``silence_s`` the keeper sees in one worker's
    beats, (last arrival, next arrival) pairs, when each beat it sends from
    ``t0`` to ``t1`` takes ``cost()`` one way (asked once per beat, in order)
    instead of ``latency_s``: they leave at ``phase_s + k * heartbeat_s`` and
    arrive in order (TCP, or the worker holding them), until the backlog drains."""
    assert heartbeat_s > 0 and t1 >= t0, (heartbeat_s, t0, t1)
    lat = latency_s
    k = max(0, int((t0 - phase_s) // heartbeat_s))
    while phase_s + k * heartbeat_s < t0:
        k += 1  # the first beat sent inside the fault
    prev = phase_s + (k - 1) * heartbeat_s + lat if k > 0 else t0  # its predecessor's arrival
    gaps = []
    while True:
        sent = phase_s + k * heartbeat_s
        if sent >= t1 and sent + lat >= prev:
            return gaps  # healthy again and nothing held back
        arrival = max(sent + (cost() if sent < t1 else lat), prev)
        if arrival - prev > silence_s:
            gaps.append((prev, arrival))
        prev = arrival
        k += 1


class NetFaults:
    """The ``delay`` and ``loss`` faults of one simulation (:class:`sim.world.World`),
    and its links: the driver's hooks call these (see the module docstring)."""

    def __init__(self, sim: World) -> None:
        self.sim = sim
        self.links = Links(sim.seed, sim.lat)
        # whether a link fault ever started: until then no hook does anything
        self.touched = False
        self._pinned: set[int] = set()  # workers whose next message left already priced
        # the exchange's segments: the float32 gradient twice (a ring's two passes)
        grad_bytes = 2 * 4 * sim.sc.workload.model_params
        self.segments = max(1, math.ceil(grad_bytes / MSS_BYTES))

    # -- hooks ---------------------------------------------------------------

    def one_way_s(self, w: int) -> float:
        """One message between the keeper and worker ``w`` (the driver's single sends)."""
        if w in self._pinned:  # a late beat released at its priced instant
            self._pinned.discard(w)
            return self.links.latency_s
        return self.links.one_way_s(self.sim.sc.host_of(w), f"msg/{w}")

    def segment(self, now: float, stop: int, base_s: float, step_s: float,
                seg_t0: float) -> tuple[int, float, float]:
        """Price the segment about to start at ``now`` (its step time without
        the links ``base_s``, with slow members; the running price
        ``step_s`` and start ``seg_t0``): the step time with the exchange
        over the members' links (back to the plan's once no link is
        degraded); on a lossy member link one step per segment, each with
        its own draw. A partial step carried in keeps its fraction, not its
        seconds, when the price changed (on a lossy link the fraction of its
        healthy time: the retransmissions come whole, at the exchange).
        Returns the segment's last step, its step time and its start."""
        sim = self.sim
        hosts = [h for h in self.links.degraded_hosts()
                 if any(w in sim.job.members for w in sim.sc.host_workers(h))]
        old, carry = step_s, now - seg_t0
        lossy = any(self.links.loss_rate(h) > 0 for h in hosts)
        step_s = base_s + self.links.exchange_extra_s(hosts, now, self.segments)
        if carry > 0 and old > 0 and step_s != old:
            # the step in flight keeps the fraction it has done; a loss's wait
            # comes whole at its exchange, after the compute (only the rest scales)
            seg_t0 = now - carry / old * (base_s if lossy else step_s)
        if lossy:
            stop = min(stop, sim.job.cursor.step + 1)
        return stop, step_s, seg_t0

    def start(self, now: float, f: Any) -> None:
        """A ``delay`` or ``loss`` fault fires: degrade the link for ``for_s``."""
        sim = self.sim
        host = self._host(f.link)
        if host is None:
            return
        extra, rate = (float(f.latency_s), 0.0) if f.action == "delay" else (0.0, float(f.rate))
        workers = [w for w in sim.sc.host_workers(host) if sim.alive(w)]
        param = {"latency_s": extra} if f.action == "delay" else {"rate": rate}
        for_s = float(f.for_s)
        sim.write(rec(now, "info", "fault", NEMESIS, kind=f.action, host=host, workers=workers,
                       for_s=for_s, **param))
        self.touched = True
        self.links.degrade(host, extra, rate, now + for_s)
        for w in workers:
            self._price_beats(w, host, now, now + for_s)
        self._relink(now)
        sim.at(now + for_s, self._end, host, extra, rate, workers)

    def _host(self, link: Any) -> Optional[int]:
        """The fault's host; ``"random"`` as for ``lose_host``: a draw of the run's
        ``schedule`` stream among the hosts holding a live member (None: none)."""
        sim = self.sim
        if link != "random":
            return int(link)
        return sim.draws.pick(sorted({sim.sc.host_of(w) for w in sim.job.members if sim.alive(w)}))

    def _price_beats(self, w: int, host: int, t0: float, t1: float) -> None:
        """Schedule the silences the link's beats from ``t0`` to ``t1`` leave at the keeper."""
        sim = self.sim
        phase = float(sim.nodes.started_at[w])
        hb, counts = sim.detector.heartbeat_s, sim.detector.gap_that_counts_s()
        for last, arrival in self.links.beat_gaps(w, host, phase, hb, t0, t1, counts):
            # silent to the keeper from the gap's last beat to the next one's
            # arrival; its peers still reach it
            self.sim.at(last, self._silent, w, phase, last, arrival)

    # -- effects -------------------------------------------------------------

    def _silent(self, w: int, phase: float, last: float, arrival: float) -> None:
        """Worker ``w``'s beat that arrived at ``last`` is its last for a while: it is
        silent to the keeper (its peers still reach it) until ``arrival``."""
        sim = self.sim
        now = sim.env.now
        if sim.finished or float(sim.nodes.started_at[w]) != phase:
            return  # the run ended, or another process runs there now (its own beats)
        if not sim.silences.cut_off(now, w, peers=True):
            return  # no live process (or already silent: its own verdict runs)
        sim.keeper.observe_silent(last, (w,))  # the keeper's clock: when it saw the beat
        sim.port.rearm(now)
        epoch = int(sim.nodes.pause_epoch[w])
        sim.at(arrival - self.links.latency_s, self._release, w, epoch)

    def _release(self, w: int, epoch: int) -> None:
        """The late beat leaves (priced already: it reaches the keeper at its arrival)."""
        self._pinned.add(w)
        self.sim.silences.resume(w, epoch, record=False)
        self._pinned.discard(w)

    def _end(self, host: int, extra: float, rate: float, workers: list[int]) -> None:
        sim = self.sim
        if sim.finished:
            return
        self.links.restore(host, extra, rate)
        sim.write(rec(sim.env.now, "info", "fault", NEMESIS, kind="heal", hosts=[host],
                       workers=workers))
        if extra > 0:  # a shorter latency from now on: the running step is repriced
            self._relink(sim.env.now)
        # a loss's end is no new price for the step in flight: its retransmissions
        # were priced knowing the end (the attempt after it gets through, when its
        # timer fires), and each later step is priced when it starts

    def reprice(self, now: float) -> None:
        """A price changed elsewhere (a member slowed or sped up: :mod:`sim.gray`)."""
        self._relink(now)

    def _relink(self, now: float) -> None:
        """The links changed: a running segment is closed where it stands and
        started again at the new price (the partial step carried over)."""
        self.sim.job.restart_segment(now)
