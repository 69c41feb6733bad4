"""The record-keeper's record in etcd v3: leadership, term, decided generations.

Keys under ``prefix`` (values JSON, never pickle):
  {prefix}/leader        {"term", "candidate", "address", "lease"} on the holder's lease
  {prefix}/term          the last term ever won (an int), written only by a campaign
  {prefix}/generation    the latest decided generation: {"generation", "term", "record"}
  {prefix}/gen/<g:020d>  one marker per decided generation: {"term", "digest"} of its record
Term: a campaign is one transaction (leader key absent, term key unchanged since read)
putting the leader key and term + 1, so terms won strictly increase (until delete_prefix).
Fencing: a commit's transaction holds only while the leader key is on the committer's
lease, so etcd itself refuses a deposed keeper however late its write; it also needs the
latest stored to be generation - 1 (or none) and no marker for this generation yet.
Retries: each operation tries the endpoints in turn within its timeout; a repeated write
recognises its own earlier success (its lease in the leader key; the marker's term and
digest), so a write whose answer was lost is not misread as refused. One thread per store.
Client: etcd3gw (OpenStack's; pure Python over etcd's /v3/ JSON gateway, no grpcio build).
It has no auth: the token from /v3/auth/authenticate (user root with the run's secret on the
run's own cluster; on the user's, keeper.etcd_user with the password in
keeper.etcd_password_file) goes in its session's Authorization header. Its watch runs an unjoined thread with no bound:
wait_leader_change streams /v3/watch itself under a read timeout instead.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence, TypeVar
from urllib.parse import urlsplit

import requests
from etcd3gw import exceptions as gw_errors
from etcd3gw.client import Etcd3Client

from rollcall.scenario import NotARegularFile, read_regular

T = TypeVar("T")
POLL_S = 0.05  # after every endpoint failed once, before the next round
MIN_ATTEMPT_S = 0.25  # the least time one attempt on one endpoint gets


class StoreUnavailable(Exception):
    """etcd could not be reached (or answered nonsense) within the timeout."""


class StoreDenied(StoreUnavailable):
    """etcd refused the credentials: no secret, a wrong one, or auth off."""


@dataclass(frozen=True)
class Leadership:
    """A won campaign. ``ttl_s``: the lease's TTL as etcd granted it (whole
    seconds, at least the server's minimum, so never shorter than asked)."""

    term: int
    lease_id: int
    candidate: str
    address: str
    ttl_s: int = 0


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _value(kv: Optional[dict[str, Any]]) -> Any:
    return None if kv is None else json.loads(base64.b64decode(kv.get("value", "")))


def _first_kv(response: dict[str, Any]) -> Optional[dict[str, Any]]:
    kvs = response.get("kvs") or []
    return kvs[0] if kvs else None


def _grpc(exc: gw_errors.Etcd3Exception) -> tuple[int, str]:
    """The gRPC code and message inside a gateway error (0, text if none)."""
    try:
        doc = json.loads(exc.detail_text or "")
        return int(doc.get("code", 0)), str(doc.get("message") or doc.get("error") or "")
    except (ValueError, TypeError, AttributeError):
        return 0, str(exc.detail_text or exc)


def _holder(doc: Optional[dict[str, Any]]) -> Optional[tuple[int, str, str]]:
    """(term, candidate, address) of a leader key's value."""
    return None if doc is None else (int(doc["term"]), str(doc["candidate"]), str(doc["address"]))


def _digest(record_json: str) -> str:
    return hashlib.sha256(record_json.encode()).hexdigest()[:32]


class KeeperStore:
    """The keeper's record under ``prefix`` in the etcd cluster at ``endpoints``
    (client URLs). ``secret``: the password of etcd user ``user`` (auth on:
    the run's own cluster's root password is the run's secret); None: auth
    off. ``timeout_s`` bounds every operation, retries over the endpoints
    included."""

    def __init__(self, endpoints: Sequence[str], prefix: str, secret: Optional[str] = None,
                 timeout_s: float = 5.0, user: str = "root") -> None:
        if isinstance(endpoints, str) or not endpoints:
            raise ValueError(f"endpoints: a non-empty list of etcd client URLs, got {endpoints!r}")
        if not isinstance(prefix, str) or not prefix.strip("/"):
            raise ValueError(f"prefix: a non-empty key prefix, got {prefix!r}")
        if secret is not None and (not isinstance(secret, str) or not secret):
            raise ValueError("secret: a non-empty str (a password) or None")
        if not isinstance(user, str) or not user:
            raise ValueError(f"user: a non-empty etcd user name, got {user!r}")
        self.user = user
        if not isinstance(timeout_s, (int, float)) or not 0 < timeout_s < math.inf:
            raise ValueError(f"timeout_s: a positive number of seconds, got {timeout_s!r}")
        self.endpoints = list(endpoints)
        self.prefix = prefix.rstrip("/")
        self.timeout_s = float(timeout_s)
        self._secret = secret
        self._token: Optional[str] = None
        self._session = requests.Session()
        self._clients = [self._client(url) for url in self.endpoints]
        self._at = 0  # the endpoint that answered last
        self._until: Optional[float] = None  # time.monotonic() no call waits past (None: none)

    def _client(self, url: str) -> Etcd3Client:
        parts = urlsplit(url)
        try:
            port = parts.port
        except ValueError:
            port = None
        if parts.scheme not in ("http", "https") or not parts.hostname or port is None:
            raise ValueError(f"endpoints: not an etcd client URL (http://HOST:PORT): {url!r}")
        return Etcd3Client(host=parts.hostname, port=port, protocol=parts.scheme,
                           api_path="/v3/", session=self._session)

    def key(self, name: str) -> str:
        return f"{self.prefix}/{name}"

    @contextmanager
    def until(self, deadline: float) -> Iterator[None]:
        """Within the block no operation waits past ``deadline`` (on
        ``time.monotonic()``), less than ``timeout_s`` where it comes first:
        a keeper's lease ends then, and an answer after it is worth nothing."""
        if not isinstance(deadline, (int, float)) or isinstance(deadline, bool) \
                or math.isnan(deadline):
            raise ValueError(f"deadline: a time.monotonic() instant, got {deadline!r}")
        before, self._until = self._until, deadline
        try:
            yield
        finally:
            self._until = before

    def close(self) -> None:
        self._session.close()

    # --- transport: endpoints in turn, auth, one exception --------------------------------

    def _call(self, what: str, op: Callable[[Etcd3Client], T]) -> T:
        """``op`` on the endpoints in turn until one answers, within ``timeout_s``
        (and before the deadline of :meth:`until`)."""
        start = time.monotonic()
        deadline = start + self.timeout_s
        if self._until is not None:
            deadline = min(deadline, self._until)
        failures, last, reauthed = 0, "no attempt", False
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise StoreUnavailable(f"etcd {what}: no answer from {', '.join(self.endpoints)} "
                                       f"within {max(0.0, deadline - start):.3g} s ({last})")
            client = self._clients[self._at]
            # a hung member must leave time for the next one; a dead one refuses at once
            last_try = len(self._clients) - failures % len(self._clients) == 1
            client.timeout = left if last_try else min(left, max(MIN_ATTEMPT_S, left / 2))
            try:
                if self._secret is not None and self._token is None:
                    self._authenticate(client)
                return op(client)
            except gw_errors.Etcd3Exception as exc:
                code, message = _grpc(exc)
                if code == 16 and self._secret is not None and not reauthed:
                    # the token expired, or this member never saw it: a new one, once
                    self._token, last, reauthed = None, message, True
                    self._session.headers.pop("Authorization", None)
                    continue
                if code in (3, 7, 9, 16) and ("auth" in message or "user" in message
                                             or "permission" in message):
                    raise StoreDenied(f"etcd {what}: refused at {client.base_url}: {message}")
                if not isinstance(exc, (gw_errors.ConnectionFailedError,
                                        gw_errors.ConnectionTimeoutError,
                                        gw_errors.InternalServerError)):
                    raise StoreUnavailable(f"etcd {what}: {message or exc}") from exc
                last = f"{client.base_url}: {message or type(exc).__name__}"
            except (requests.RequestException, ValueError, KeyError) as exc:
                last = f"{client.base_url}: {type(exc).__name__}"
            failures += 1
            self._at = (self._at + 1) % len(self._clients)
            if failures % len(self._clients) == 0:
                # a bounded pause before the next round, not a synchronising sleep
                time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))

    def _authenticate(self, client: Etcd3Client) -> None:
        self._session.headers.pop("Authorization", None)
        got = client.post(client.get_url("/auth/authenticate"),
                          json={"name": self.user, "password": self._secret})
        self._token = str(got["token"])
        self._session.headers["Authorization"] = self._token

    def _txn(self, what: str, compare: list[dict[str, Any]], success: list[dict[str, Any]],
             failure: list[dict[str, Any]]) -> tuple[bool, list[dict[str, Any]]]:
        """One transaction: (succeeded, the responses of the branch taken)."""
        body = {"compare": compare, "success": success, "failure": failure}
        got: dict[str, Any] = self._call(what, lambda c: dict(c.transaction(body)))
        responses: list[dict[str, Any]] = [next(iter(r.values()), {})
                                           for r in got.get("responses") or []]
        return bool(got.get("succeeded")), responses

    def _range(self, *names: str) -> list[Optional[dict[str, Any]]]:
        """The kv of each key (None if absent), all read at one revision."""
        _, responses = self._txn("read", [], [{"request_range": {"key": _b64(self.key(n))}}
                                             for n in names], [])
        return [_first_kv(r) for r in responses]

    # --- leadership ----------------------------------------------------------------------

    def campaign(self, candidate: str, address: str, ttl_s: float) -> Optional[Leadership]:
        """One non-blocking attempt to become the active keeper: the leadership
        (and term + 1) on a fresh lease of ``ttl_s``, or None while another holds it."""
        for name, v in (("candidate", candidate), ("address", address)):
            if not isinstance(v, str) or not v:
                raise ValueError(f"{name}: a non-empty str, got {v!r}")
        if isinstance(ttl_s, bool) or not isinstance(ttl_s, (int, float)) or not 0 < ttl_s < 1e9:
            raise ValueError(f"ttl_s: a positive number of seconds, got {ttl_s!r}")
        held, term_kv = self._range("leader", "term")
        if held is not None:
            return None
        grant = self._call("lease grant", lambda c: c.post(
            c.get_url("/lease/grant"), json={"TTL": max(1, math.ceil(ttl_s)), "ID": 0}))
        lease, granted = int(grant["ID"]), int(grant["TTL"])
        term = (_value(term_kv) or 0) + 1
        leader = self.key("leader")
        doc = {"term": term, "candidate": candidate, "address": address, "lease": lease}
        won, responses = self._txn(
            "campaign",
            [{"key": _b64(leader), "target": "CREATE", "result": "EQUAL", "create_revision": "0"},
             {"key": _b64(self.key("term")), "target": "MOD", "result": "EQUAL",
              "mod_revision": str(0 if term_kv is None else term_kv["mod_revision"])}],
            [{"request_put": {"key": _b64(leader), "value": _b64(json.dumps(doc)),
                              "lease": str(lease)}},
             {"request_put": {"key": _b64(self.key("term")), "value": _b64(json.dumps(term))}}],
            [{"request_range": {"key": _b64(leader)}}])
        if not won:
            now = _value(_first_kv(responses[0])) if responses else None
            if not (isinstance(now, dict) and now.get("lease") == lease):
                try:
                    self._revoke(lease)  # lost: the unused lease goes now, not at its TTL
                except StoreUnavailable:
                    pass  # it expires on its own
                return None
            term = int(now["term"])  # our own earlier attempt won; its answer was lost
        return Leadership(term, lease, candidate, address, granted)

    def keep_alive(self, leadership: Leadership) -> bool:
        """Refresh the lease: False when it is gone (expired or revoked: deposed)."""
        got = self._call("lease keep-alive", lambda c: c.post(
            c.get_url("/lease/keepalive"), json={"ID": str(leadership.lease_id)}))
        return int(got.get("result", {}).get("TTL", -1)) > 0

    def resign(self, leadership: Leadership) -> None:
        """Give the leadership up now (revoke the lease: the key goes with it)."""
        self._revoke(leadership.lease_id)

    def _revoke(self, lease: int) -> None:
        def op(c: Etcd3Client) -> None:
            try:
                c.post(c.get_url("/kv/lease/revoke"), json={"ID": str(lease)})
            except gw_errors.Etcd3Exception as exc:
                if _grpc(exc)[0] != 5:  # NotFound: expired or revoked already
                    raise
        self._call("lease revoke", op)

    def leader(self) -> Optional[tuple[int, str, str]]:
        """(term, candidate, address) of the active keeper, or None: vacant."""
        return _holder(_value(self._range("leader")[0]))

    def wait_leader_change(self, timeout_s: float) -> Optional[tuple[int, str, str]]:
        """Wait at most ``timeout_s`` (plus one read) while the leadership stays
        as it is, and return it then (None: vacant, campaign). A watch on the
        leader key, not a poll: a standby hears of an expired lease at once."""
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or timeout_s < 0:
            raise ValueError(f"timeout_s: a non-negative number of seconds, got {timeout_s!r}")
        deadline = time.monotonic() + timeout_s
        kv = self._range("leader")[0]
        if kv is None:
            return None
        if self._watch(self.key("leader"), int(kv["mod_revision"]) + 1, deadline):
            return self.leader()
        return _holder(_value(kv))

    def _watch(self, key: str, revision: int, deadline: float) -> bool:
        """Whether ``key`` changed at or after ``revision`` before ``deadline``:
        /v3/watch streamed with a read timeout, no thread."""
        body = {"create_request": {"key": _b64(key), "start_revision": str(revision)}}
        failures = 0
        while (left := deadline - time.monotonic()) > 0:
            if self._secret is not None and self._token is None:
                self._range("leader")  # re-authenticates
            url = self._clients[self._at].get_url("/watch")
            try:
                with self._session.post(url, json=body, stream=True,
                                        timeout=(min(left, 1.0), left)) as resp:
                    for line in resp.iter_lines():
                        result = json.loads(line).get("result", {}) if line.strip() else {}
                        if result.get("events"):
                            return True
                        if result.get("canceled"):
                            return self._watch_canceled(str(result.get("cancel_reason", "")))
                    return True  # the stream ended: look again
            except (requests.RequestException, ValueError):
                failures += 1  # a read timeout (deadline) or a dead member (next one)
                self._at = (self._at + 1) % len(self._clients)
                if failures % len(self._clients) == 0:
                    time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))
        return False

    def _watch_canceled(self, reason: str) -> bool:
        if "auth token" in reason:  # expired: the caller's read re-authenticates
            self._token = None
            self._session.headers.pop("Authorization", None)
            return True
        if "user name is empty" in reason or "permission denied" in reason:
            raise StoreDenied(f"etcd watch: refused: {reason}")
        return True  # compacted or the like: look again

    # --- generations ----------------------------------------------------------------------

    def commit_generation(self, leadership: Leadership, generation: int,
                          record: dict[str, Any], again: bool = False) -> bool:
        """The compare-and-set of decided ``generation``: True once stored,
        False when refused (deposed, a skipped or an already decided
        generation). ``again``: the leader writes its latest generation's
        record again (a restart's budget, :class:`rollcall.core.keeper.Persist`);
        refused unless ``generation`` is the latest."""
        if isinstance(generation, bool) or not isinstance(generation, int) or generation < 0:
            raise ValueError(f"generation: a non-negative int, got {generation!r}")
        if not isinstance(record, dict):
            raise ValueError(f"record: a JSON object (dict), got {type(record).__name__}")
        try:
            record_json = json.dumps(record, sort_keys=True, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"record: not JSON-serialisable: {exc}") from None
        latest_key, marker_key = self.key("generation"), self.key(f"gen/{generation:020d}")
        latest = self._range("generation")[0]
        held = None if latest is None else _value(latest).get("generation")
        if again and held != generation:
            return False
        if not again and held is not None and held != generation - 1:
            return self._mine(leadership, self._range(f"gen/{generation:020d}")[0], record_json)
        doc = {"generation": generation, "term": leadership.term, "record": record}
        marker = {"term": leadership.term, "digest": _digest(record_json)}
        # a new generation's marker must not exist yet; the latest one's is replaced
        fresh = [] if again else [
            {"key": _b64(marker_key), "target": "CREATE", "result": "EQUAL",
             "create_revision": "0"}]
        ok, responses = self._txn(
            "commit",
            [{"key": _b64(self.key("leader")), "target": "LEASE", "result": "EQUAL",
              "lease": str(leadership.lease_id)},
             {"key": _b64(latest_key), "target": "MOD", "result": "EQUAL",
              "mod_revision": str(0 if latest is None else latest["mod_revision"])},
             *fresh],
            [{"request_put": {"key": _b64(latest_key), "value": _b64(json.dumps(doc))}},
             {"request_put": {"key": _b64(marker_key), "value": _b64(json.dumps(marker))}}],
            [{"request_range": {"key": _b64(marker_key)}}])
        marker_now = _first_kv(responses[0]) if responses else None
        return ok or self._mine(leadership, marker_now, record_json)

    @staticmethod
    def _mine(leadership: Leadership, marker_kv: Optional[dict[str, Any]],
              record_json: str) -> bool:
        """Whether this generation's marker is this very decision (the same
        term and record): a repeat whose first answer was lost, not a refusal."""
        marker = _value(marker_kv)
        return (isinstance(marker, dict) and marker.get("term") == leadership.term
                and marker.get("digest") == _digest(record_json))

    def last_generation(self) -> Optional[dict[str, Any]]:
        """The latest committed {"generation", "term", "record"}, or None."""
        doc = _value(self._range("generation")[0])
        return None if doc is None else dict(doc)

    def probe(self) -> None:
        """Write and delete one key under the prefix: the credentials may do
        what a keeper does (raises :class:`StoreDenied`, :class:`StoreUnavailable`)."""
        key = _b64(self.key("probe"))
        self._txn("probe", [], [{"request_put": {"key": key, "value": _b64("{}")}}], [])
        self._txn("probe", [], [{"request_delete_range": {"key": key}}], [])

    def delete_prefix(self) -> None:
        """Delete every key of this store (``prefix`` + "/..."), leadership included."""
        start = self.prefix + "/"
        end = self.prefix + "0"  # "/" + 1: the end of the range of keys under start
        self._call("delete", lambda c: c.post(c.get_url("/kv/deleterange"),
                                             json={"key": _b64(start), "range_end": _b64(end)}))


PASSWORD_MAX_BYTES = 1024


def read_password(path: str | Path) -> str:
    """The etcd password in file ``path`` (one line; a trailing newline is
    dropped). Raises ValueError saying what is wrong, in one line."""
    p = Path(path).expanduser()
    try:
        raw = read_regular(p, PASSWORD_MAX_BYTES)
    except NotARegularFile as exc:
        raise ValueError(f"{p}: not an etcd password file ({exc})") from None
    except OSError as exc:
        raise ValueError(f"{p}: cannot read the etcd password file ({exc.strerror})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{p}: the etcd password is not UTF-8 text") from None
    password = text[:-1] if text.endswith("\n") else text
    password = password[:-1] if password.endswith("\r") else password
    if not password or "\n" in password:
        raise ValueError(f"{p}: the etcd password file must hold one non-empty line")
    return password


def cluster_problem(endpoints: Sequence[str], user: Optional[str], password_file: Optional[str],
                    timeout_s: float = 5.0) -> Optional[str]:
    """Why a run cannot keep its record in the user's etcd cluster at
    ``endpoints`` with these credentials (one line), or None: the password
    file is read and the cluster must let the user write and delete a key
    under ``/rollcall/``, as a keeper will."""
    try:
        password = None if password_file is None else read_password(password_file)
    except ValueError as exc:
        return str(exc)
    store = KeeperStore(list(endpoints), f"/rollcall/.probe-{os.getpid()}", secret=password,
                        timeout_s=timeout_s, user=user or "root")
    try:
        store.probe()
    except StoreDenied as exc:
        return f"keeper.etcd_endpoints: {exc} (check keeper.etcd_user and etcd_password_file)"
    except StoreUnavailable as exc:
        return f"keeper.etcd_endpoints: {exc}"
    finally:
        store.close()
    return None
