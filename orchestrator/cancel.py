"""Stopping a night on purpose: SIGTERM, Ctrl-C, a closed terminal, the deadline, a token budget.

One token is shared by everything that can block for long (the model stream,
shell commands, the agent loop); each checks it at its own safe points and
raises `Cancelled`, so the iteration in flight is rolled back, not abandoned.
"""

from __future__ import annotations

import calendar
import os
import re
import signal
import threading
import time
from datetime import datetime, timedelta, timezone, tzinfo
from typing import Callable

from orchestrator.errors import Cancelled


def stopping_signals() -> tuple[signal.Signals, ...]:
    """The signals that stop `run` and `serve`, as SIGTERM does: SIGHUP (a closed terminal) only where not ignored (nohup)."""
    hangup = () if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN else (signal.SIGHUP,)
    return (signal.SIGTERM, signal.SIGINT, *hangup)


# The signals that stop a night, by the names a CancelToken's `why` gives them.
SIGNAL_NAMES = frozenset({"SIGHUP", "SIGINT", "SIGTERM"})


class StopNoted:
    """A stopping signal that came before a handler could act on it (`serve` still loading its config
    and scheduler): noted, by name, for that handler to find. Installed by `note_stops`. A second one
    exits at once, with 0: nothing has started, and a store slow to answer must not hold the process."""

    def __init__(self) -> None:
        self.signal: str | None = None

    def note_stops(self) -> StopNoted:
        for number in stopping_signals():
            signal.signal(number, self._note)
        return self

    def _note(self, signum: int, frame: object) -> None:
        if self.signal is not None:
            os._exit(0)
        self.signal = signal.Signals(signum).name


class CancelToken:
    def __init__(self) -> None:
        self._event = threading.Event()
        # Reentrant: `cancel` runs in signal handlers, and a second signal can land inside the first's.
        self._lock = threading.RLock()
        self._hooks: list[Callable[[], None]] = []
        # Tokens made by `child`, cancelled (and restated) with this one until each is released.
        self._children: list[CancelToken] = []
        self._parent: CancelToken | None = None
        self._holders = 0  # of a child: who still needs its parent's cancel (see `child`, `hold`, `release`)
        self._why_is_parents = False  # cancelled by its parent: a restated reason is followed
        self.why = ""

    def cancel(self, why: str, *, restate: bool = False) -> None:
        """Cancel, saying why; once cancelled, `why` stays, unless `restate` (a signal that
        comes while the deadline winds the night down: the night then ends as that signal says,
        and so do its children that its cancel cancelled, not one that stopped on its own)."""
        self._cancel(why, restate=restate, by_parent=False)

    def _cancel(self, why: str, *, restate: bool, by_parent: bool) -> None:
        with self._lock:
            if self._event.is_set():
                if not restate or (by_parent and not self._why_is_parents):
                    return
                self.why, hooks = why, []
            else:
                self.why, self._why_is_parents = why, by_parent
                self._event.set()
                hooks = list(self._hooks)
            children = list(self._children)
        for hook in hooks:
            hook()
        for child in children:
            child._cancel(why, restate=restate, by_parent=True)

    def child(self) -> "CancelToken":
        """A token cancelled with this one, and also on its own: one task stopped, not the night. It stays hooked
        to this one until released (`release`): a night of `serve` runs many tasks, each child holding its task's
        model client."""
        child = CancelToken()
        child._parent, child._holders = self, 1
        with self._lock:
            self._children.append(child)
            if self._event.is_set():
                child._cancel(self.why, restate=False, by_parent=True)  # new: no hook or child of its own to call
        return child

    def hold(self) -> None:
        """One more user of this child that needs its parent's cancel: a call that outlives its task (ahead.py)."""
        with self._lock:
            self._holders += 1

    def release(self) -> None:
        """One user of this child is done with it; once the last is, it is unhooked from its parent (which then
        no longer holds it, nor what its hooks hold). It can still be cancelled by itself."""
        with self._lock:
            self._holders -= 1
            parent = self._parent if self._holders <= 0 else None
            if parent is not None:
                self._parent = None
        if parent is not None:
            with parent._lock:
                parent._children.remove(self)

    def on_cancel(self, hook: Callable[[], None]) -> None:
        """Call `hook` (from the cancelling thread) when cancelled; at once if already.

        For waits that cannot poll the token, such as a read blocked on a silent socket.
        """
        with self._lock:
            if not self._event.is_set():
                self._hooks.append(hook)
                return
        hook()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def raise_if_cancelled(self) -> None:
        if self._event.is_set():
            raise Cancelled(self.why)

    def wait(self, seconds: float) -> bool:
        """Sleep up to `seconds`; True if cancelled meanwhile."""
        return self._event.wait(seconds)


class TokenBudget:
    """Tokens a task or a night may spend; thread-safe, shared by parallel tasks.

    Spending never stops anything by itself: the agent asks `raise_if_spent` before each
    model call, so a response that crosses the budget is still acted on (its tokens are
    spent either way, and it may be the `submit` of finished work).
    """

    def __init__(self, limit: int | None, scope: str) -> None:
        self.limit = limit
        self.scope = scope
        self.spent = 0
        self._lock = threading.Lock()

    def spend(self, tokens: int) -> None:
        with self._lock:
            self.spent += tokens

    @property
    def exhausted(self) -> bool:
        return self.limit is not None and self.spent >= self.limit

    @property
    def why(self) -> str:
        return f"{self.scope} token budget of {self.limit} spent"

    def raise_if_spent(self) -> None:
        if self.exhausted:
            raise Cancelled(self.why)


def local_now() -> datetime:
    """Now in this host's time zone with its daylight-saving rules, not a fixed offset: a
    deadline's HH:MM then lands on the right hour on the nights the clocks change."""
    try:
        import tzlocal  # APScheduler's own dependency

        return datetime.now(tzlocal.get_localzone())
    except Exception:  # a zone tzlocal cannot name (a POSIX TZ rule such as CET-1CEST,M3.5.0,M10.5.0/3)
        # Or a TZ unreadable_tz finds: UTC, which the C library keeps for one it cannot read, and for an offset of a day
        # (TZ=EST24), which datetime cannot hold (a deadline's first comparison was a traceback, the run left `running`).
        return datetime.now(timezone.utc if unreadable_tz() is not None else SYSTEM_LOCAL_TIME)


def named_zone(setting: str) -> tzinfo | None:
    """The zone `[schedule] timezone` names, or None for "local" (this host's clock): the clock a deadline is read
    on, and the morning report's times shown on. None too for a name this host cannot read (refused with the config)."""
    if setting == "local":
        return None
    from zoneinfo import ZoneInfo

    try:
        return ZoneInfo(setting)
    except (LookupError, ValueError):
        return None


def unreadable_tz() -> str | None:
    """The TZ setting when the C library cannot read it: glibc then keeps UTC's time under whatever name TZ began with
    (TZ=Not/AZone read 06:00 UTC as `06:00 Not`). None when TZ is unset or empty, names a zone file (as glibc looks
    for one, under $TZDIR), or is a POSIX rule (a name of three letters or more, or <quoted>, then its offset).
    Also the setting of a rule whose offset is a day or more (TZ=EST24, POSIX's hours go to 24): no datetime holds it."""
    setting = os.environ.get("TZ")
    name = (setting or "").removeprefix(":")
    if not name or _is_zone_file(name):
        return None
    if _POSIX_TZ_RULE.match(name):
        return setting if max(abs(time.timezone), abs(time.altzone)) >= _DAY_S else None
    return setting


_DAY_S = 86400
# glibc reads the offset's hours with sscanf's %hu, which after the rule's own sign takes white space and a second sign:
# TZ="EST+ 5" and "EST++5" are UTC-5 to `date`, and were shown as UTC.
_POSIX_TZ_RULE = re.compile(r"(?:[A-Za-z]{3,}|<[A-Za-z0-9+-]{3,}>)(?:[+-][ \t\n\v\f\r]*[+-]?)?[0-9]")


def _is_zone_file(name: str) -> bool:
    try:
        with open(os.path.join(os.environ.get("TZDIR") or "/usr/share/zoneinfo", name), "rb") as zone:
            return zone.read(4) == b"TZif"
    except OSError:
        return False


class _SystemLocalTime(tzinfo):
    """The C library's local time, rules and all (it reads any TZ the system does).

    `datetime.now().astimezone()` gives this moment's offset, fixed: on the night the clocks
    go forward, 06:30 came an hour late.
    """

    def utcoffset(self, moment: datetime | None) -> timedelta:
        return timedelta(seconds=self._local(moment).tm_gmtoff)

    def dst(self, moment: datetime | None) -> timedelta:
        # The standard offset is not known here; only whether summer time is on matters to callers.
        return timedelta(hours=1) if self._local(moment).tm_isdst > 0 else timedelta(0)

    def tzname(self, moment: datetime | None) -> str:
        return self._local(moment).tm_zone

    def fromutc(self, moment: datetime) -> datetime:
        instant = calendar.timegm(moment.replace(tzinfo=None).timetuple())  # its fields are UTC here
        local = datetime(*time.localtime(instant)[:6], moment.microsecond, tzinfo=self)
        # In the hour the clocks repeat, the second pass is fold 1: without it, reading the
        # offset back took the first pass's, and times there were an hour off.
        instants = self._instants(local)
        return local.replace(fold=1) if len(instants) == 2 and instant == instants[1] else local

    @classmethod
    def _local(cls, moment: datetime | None) -> time.struct_time:
        if moment is None:
            return time.localtime()
        instants = cls._instants(moment)
        if instants:  # a repeated wall time: its fold says which pass
            return time.localtime(instants[min(moment.fold, len(instants) - 1)])
        # A wall time the clocks skip: fold 0 is read with the offset before the change, fold 1 with
        # the one after (PEP 495, as zoneinfo does: 02:30 in a skipped hour is 03:30 of the new time).
        # The C library's own reading (tm_isdst = -1) is an instant near it; hours on either side,
        # the offsets are those of the two sides.
        wall = (moment.year, moment.month, moment.day, moment.hour, moment.minute, moment.second, 0, 0, -1)
        near = time.mktime(wall)
        return time.localtime(near + (_SIDE_S if moment.fold else -_SIDE_S))

    @staticmethod
    def _instants(moment: datetime) -> list[int]:
        """The seconds since the epoch whose local time reads as `moment`'s wall clock, earliest first:
        one, two in the hour the clocks repeat, none in the hour they skip."""
        fields = (moment.year, moment.month, moment.day, moment.hour, moment.minute, moment.second)
        found = set()
        for isdst in (0, 1):
            try:
                instant = int(time.mktime((*fields, 0, 0, isdst)))
            except (OverflowError, ValueError):
                continue
            if tuple(time.localtime(instant)[:6]) == fields:
                found.add(instant)
        return sorted(found)


# Far enough from a skipped hour to be past it (gaps are an hour, at most two), near enough to be on its
# side of the change (changes are months apart).
_SIDE_S = 3 * 3600

SYSTEM_LOCAL_TIME = _SystemLocalTime()


def seconds_between(earlier: datetime, later: datetime) -> float:
    """Elapsed seconds, through UTC: two times in one zone subtract as wall clocks in Python,
    an hour off across a change of the clocks."""
    return (later.astimezone(timezone.utc) - earlier.astimezone(timezone.utc)).total_seconds()


def deadline_after(start: datetime, clock: str) -> datetime:
    """The first `HH:MM` (in `start`'s time zone) after `start`: 06:30 after 01:30 is the same morning."""
    hour, minute = (int(part) for part in clock.split(":"))
    today = start.replace(hour=hour, minute=minute, second=0, microsecond=0)
    # On the night the clocks go back, an HH:MM in the repeated hour comes twice: the second
    # (fold 1) may still be ahead when the first has passed. Elsewhere both folds are one instant.
    for candidate in (today.replace(fold=0), today.replace(fold=1)):
        if seconds_between(start, candidate) > 0:
            return _as_the_clock_shows(candidate)
    return _as_the_clock_shows((today + timedelta(days=1)).replace(fold=0))


def _as_the_clock_shows(moment: datetime) -> datetime:
    """The same instant, as its zone's clock shows it: on the night the clocks go forward an HH:MM in the skipped
    hour names the instant an hour later, and was logged (`night_started`'s `deadline`) as a time the clock never
    showed (02:30+01:00 in Paris, 03:30+02:00 there)."""
    return moment.astimezone(timezone.utc).astimezone(moment.tzinfo)


class Deadline:
    """No iteration starts that cannot finish by the deadline; at the deadline, cancel."""

    # The deadline is watched against the wall clock, a little at a time, not by one long
    # timer: a monotonic timer does not count a host's sleep, and would cancel hours late.
    POLL_S = 1.0

    def __init__(self, at: datetime | None, token: CancelToken, now: Callable[[], datetime]) -> None:
        self.at = at
        self._now = now
        self._stopped = threading.Event()
        if at is not None:
            threading.Thread(target=self._watch, args=(token,), name="deadline", daemon=True).start()

    def allows(self, expected_s: float) -> bool:
        if self.at is None:
            return True
        return seconds_between(self._now(), self.at) > expected_s

    def stop(self) -> None:
        self._stopped.set()

    def _watch(self, token: CancelToken) -> None:
        assert self.at is not None
        while (left := seconds_between(self._now(), self.at)) > 0:
            if self._stopped.wait(min(left, self.POLL_S)):
                return
        token.cancel("deadline")
