"""When nights fire: `[schedule] cron` and `timezone`, read as crontab(5) reads them, as APScheduler 3 triggers.

crontab and APScheduler 3 disagree in four places, each a night started on the wrong day,
twice or not at all: weekday numbers (crontab counts from Sunday = 0, APScheduler from Monday),
a day of month and a weekday both restricted (crontab runs on either, APScheduler on both),
the hour repeated when the clocks go back (crontab runs once, APScheduler twice), and the day
after the clocks go forward (APScheduler skips a night due early in it). Every trigger carries
its zone (a CronTrigger ignores the scheduler's), one the job store can pickle.
"""

from __future__ import annotations

import itertools
import os
import pickle
import re
import unicodedata
from datetime import datetime, timedelta, timezone, tzinfo
from typing import Iterator

from apscheduler.triggers.base import BaseTrigger
from apscheduler.triggers.combining import OrTrigger
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.cron.expressions import RangeExpression

from orchestrator.config import Config
from orchestrator.errors import ConfigError
from orchestrator.printable import shortened


def latest_fire_time(trigger: BaseTrigger, since: datetime, now: datetime) -> datetime | None:
    """The trigger's last fire time in [since, now] (compared as instants, whatever their zones)."""
    latest = None
    for upcoming in fire_times(trigger, since):
        if upcoming.astimezone(timezone.utc) > now.astimezone(timezone.utc):
            break
        latest = upcoming
    return latest


def fire_times(trigger: BaseTrigger, since: datetime) -> Iterator[datetime]:
    """The trigger's fire times from `since` on, in order."""
    previous: datetime | None = None
    moment = since
    while (upcoming := trigger.get_next_fire_time(previous, moment)) is not None:
        yield upcoming
        previous, moment = upcoming, upcoming.astimezone(timezone.utc) + timedelta(seconds=1)


def next_fire_times(config: Config, count: int = 3, *, now: datetime | None = None) -> list[datetime]:
    """The next `count` night starts after `now`, in the schedule's time zone."""
    zone = schedule_timezone(config)
    return list(itertools.islice(fire_times(night_trigger(config, zone), now or datetime.now(zone)), count))


def schedule_timezone(config: Config) -> tzinfo:
    """`[schedule] timezone`: an IANA name, or "local" for the host's zone."""
    name = config.schedule.timezone
    if name == "local":
        return _local_zone(config)
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ConfigError(f"{config.source}: [schedule] timezone: unknown time zone {name!r}") from None


def _local_zone(config: Config) -> tzinfo:
    """The host's zone, as one the job store can pickle: a zone read from a file is rebuilt from its IANA name.

    tzlocal reads the zone from the file itself when TZ names a file (TZ=:/etc/localtime,
    TZ=/usr/share/zoneinfo/Europe/Berlin) or /etc/localtime is a copy, not a link; such a
    zone cannot be pickled, and the job store pickles the trigger that carries it.
    """
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    from tzlocal import get_localzone, get_localzone_name

    def unreadable(why: str) -> ConfigError:
        return ConfigError(
            f'{config.source}: [schedule] timezone: "local" cannot be read from this host ({why}); '
            'set an IANA name such as "Europe/Berlin"'
        )

    try:
        zone = get_localzone()
        if _pickles(zone):
            return zone
        name = get_localzone_name()
    except Exception as exc:  # TZ=UTC0, a POSIX rule or a name tzlocal cannot map to a zone
        raise unreadable(_first_line(exc)) from None
    # tzlocal keys a zone read from a file by its name when it finds one; otherwise the name it
    # returns comes from elsewhere (/etc/timezone) and may be another zone than the one in use.
    if not name or name != getattr(zone, "key", None):
        raise unreadable(f"the zone from {_zone_source()} has no IANA name")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise unreadable(f"no time zone {name!r} in the zone database") from None


def _zone_source() -> str:
    """Where the host's zone was read from, for the error that says it has no name."""
    setting = os.environ.get("TZ")
    return f"TZ={setting}" if setting else "/etc/localtime"


def _pickles(zone: tzinfo) -> bool:
    try:
        pickle.dumps(zone)
    except Exception:  # PicklingError, or a TypeError from a zone that refuses any other way
        return False
    return True


# Its fields, in crontab(5)'s order.
_FIELD_NAMES = ("minute", "hour", "day", "month", "weekday")
# More digits than any number in a field can use (each is at most 59, a step a few more). A number of
# thousands was quoted whole in the error line, with Python's "Exceeds the limit (4300 digits)" after it.
_MOST_DIGITS = 18
# As much of the expression as an error line quotes, and of the reason APScheduler gives.
_SHOWN_CHARS = 120
_REASON_CHARS = 200


def night_trigger(config: Config, zone: tzinfo) -> BaseTrigger:
    """The cron trigger, read as crontab(5) reads it (`@daily` as its 5 fields), in `zone`; ConfigError if bad or never fires."""
    expression = config.schedule.cron
    refused = f"{config.source}: [schedule] cron: {shortened(expression, _SHOWN_CHARS)!r}"
    fields = _five_fields(expression, refused)
    too_large = _number_too_large(fields)
    if too_large:
        raise ConfigError(f"{refused}: {too_large}")
    try:
        trigger = crontab_trigger(*fields, zone=zone)
    except ValueError as exc:
        raise ConfigError(f"{refused}: {shortened(_first_line(exc), _REASON_CHARS)}") from None
    if trigger.get_next_fire_time(None, datetime.now(zone)) is None:
        raise ConfigError(f"{refused} never fires (no such day)")
    return trigger


# cron's shorthands for the 5 fields (crontab(5), cronie's and Vixie cron's entry.c), each as the fields it stands for.
# Read as the fields: the trigger, and so the stored job, is the same as the 5-field line's (a restart keeps its night).
_SHORTHANDS = {
    "@hourly": "0 * * * *",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *",
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
}


def _five_fields(expression: str, refused: str) -> list[str]:
    """The line's 5 fields, a shorthand (`@daily`) read as those it stands for; ConfigError if it has not 5."""
    fields = expression.split()
    if not fields or not fields[0].startswith("@"):
        if len(fields) != 5:
            count = f"needs 5 fields (minute hour day month weekday) or @daily and such, got {len(fields)}"
            raise ConfigError(f"{refused} {count}{_not_ascii(expression)}")
        for name, field in zip(_FIELD_NAMES, fields):
            if field.startswith("@"):  # APScheduler's own line, `Unrecognized expression "@daily"`, said no more
                misplaced = f"{name} {shortened(field, 24)!r}"
                raise ConfigError(f"{refused}: {misplaced}: @ starts a shorthand, which stands for all 5 fields alone")
        return fields
    shorthand = fields[0]
    if shorthand.lower() == "@reboot":
        # Not a time of day: serve, started at boot itself, is the one running when the host starts.
        raise ConfigError(
            f"{refused}: @reboot is when the host starts, not a time serve can schedule: write the night's time "
            '("30 1 * * *", @daily); to start serve at boot, see "A systemd unit for serve" in docs/scheduling.md'
        )
    if shorthand not in _SHORTHANDS:
        # cronie and Vixie cron compare the word as written: `@Daily` is their "bad time specifier", and a line one
        # of them refuses is not run here either (the same crontab line may still be pasted into both).
        if shorthand.lower() in _SHORTHANDS:
            raise ConfigError(f"{refused}: cron reads its shorthands in lower case only: write {shorthand.lower()}")
        known = ", ".join(_SHORTHANDS)
        unknown = f"no such shorthand{_not_ascii(shorthand)}"
        raise ConfigError(f"{refused}: {unknown}; write 5 fields (minute hour day month weekday) or one of {known}")
    if len(fields) > 1:  # a crontab line pasted whole: its command is the night serve starts
        raise ConfigError(f"{refused}: {shorthand} stands for all 5 fields and takes nothing after it (serve starts the night)")
    return _SHORTHANDS[shorthand].split()


def _not_ascii(text: str) -> str:
    """Its first character that is not ASCII, named, or "": a look-alike (Cyrillic `а`, a fullwidth `＠`) quoted as it is
    reads as the shorthand it copies, in a line saying there is no such shorthand."""
    odd = next((char for char in text if not char.isascii() and not char.isspace()), None)
    if odd is None:
        return ""
    name = unicodedata.name(odd, "")
    return f" ({odd!r} is U+{ord(odd):04X}{' ' + name if name else ''}, not ASCII)"


def _number_too_large(fields: list[str]) -> str:
    """What is wrong with the first field holding a number of more than _MOST_DIGITS digits, or ""."""
    for name, field in zip(_FIELD_NAMES, fields):
        longest = max((len(digits) for digits in re.findall(r"\d+", field)), default=0)
        if longest > _MOST_DIGITS:
            return f"{name} {shortened(field, 24)!r} holds a number too large ({longest} digits)"
    return ""


def crontab_trigger(minute: str, hour: str, day: str, month: str, weekday: str, *, zone: tzinfo) -> BaseTrigger:
    """A trigger that fires when crontab would; each CronTrigger carries `zone` (it ignores the scheduler's).

    crontab(5): when both day of month and weekday are restricted (not `*`), a day matching
    either runs; APScheduler 3 requires both. Picklable, for the persistent job store.
    """
    months = crontab_months(month)
    weekday_names = crontab_weekdays(weekday)

    def cron(day: str, weekday: str) -> _CrontabTrigger:
        return _CrontabTrigger(minute=minute, hour=hour, day=day, month=months, day_of_week=weekday, timezone=zone)

    if day.startswith("*") or weekday.startswith("*"):
        return cron(day, weekday_names)
    return OrTrigger([cron(day, "*"), cron("*", weekday_names)])


class _CrontabTrigger(CronTrigger):
    """A CronTrigger matched on the zone's wall clock, as cron matches it.

    APScheduler 3 steps to the next day by adding 24 hours: across the night the clocks go forward
    it lands an hour into the next day, and a night due before that hour is skipped (`30 0 * * *`
    in America/New_York or Europe/Berlin, every spring; any hour where the change is at midnight,
    America/Santiago's). When the clocks go back it fires twice in the repeated hour; cron once.
    So the fields are matched on naive local times, never shifted, and each match is then put in
    the zone: a time that comes twice, at its first pass; one that does not exist (the hour the
    clocks skip), on its offset from before the change: later by the clock by as much as the clocks went forward.
    """

    __slots__ = ()

    def get_next_fire_time(self, previous_fire_time: datetime | None, now: datetime) -> datetime | None:
        # As CronTrigger: the first fire at or after `now`, or after the previous fire if that is earlier; never the previous one.
        start = now.astimezone(timezone.utc)
        if previous_fire_time is not None:
            previous = previous_fire_time.astimezone(timezone.utc)
            start = min(start, previous + timedelta(microseconds=1))
            if start == previous:
                start += timedelta(microseconds=1)
        wall_clock = self._on_the_wall_clock()
        # A time in the hour the clocks just skipped is placed after that hour began: matched from earlier on.
        moment = _wall_time(start, self.timezone) - _forward_within_a_day(start, self.timezone)
        earliest: datetime | None = None
        while (matched := wall_clock.get_next_fire_time(None, moment.replace(tzinfo=timezone.utc))) is not None:
            moment = matched.replace(tzinfo=None)
            # Fold 0: a time that comes twice, at its first pass; one the clocks skipped, on the offset before the change.
            fire = moment.replace(tzinfo=self.timezone).astimezone(timezone.utc)
            if fire >= start and (earliest is None or fire < earliest):
                earliest = fire
            # A skipped time runs later by the clock than it matches, so a time matched after it may run first: Chatham's
            # skipped 03:00 runs at 04:00, after a 03:45 that exists (Lord Howe's 02:20 at 02:50, after 02:40).
            if earliest is not None and moment >= _wall_time(earliest, self.timezone):
                return earliest.astimezone(self.timezone)  # a skipped 02:30 shown as the 03:30 it runs at
            moment += timedelta(seconds=1)
        return None if earliest is None else earliest.astimezone(self.timezone)

    def _on_the_wall_clock(self) -> CronTrigger:
        """The same fields in UTC, which has no clock changes: naive local times stand in for its own."""
        wall_clock = CronTrigger.__new__(CronTrigger)
        wall_clock.__setstate__({**self.__getstate__(), "timezone": timezone.utc})
        return wall_clock


def _wall_time(moment: datetime, zone: tzinfo) -> datetime:
    """`moment` as the zone's clock shows it, without the zone."""
    return moment.astimezone(zone).replace(tzinfo=None)


def _forward_within_a_day(moment: datetime, zone: tzinfo) -> timedelta:
    """How far the zone's clocks went forward in the day before `moment` (none when they did not)."""
    before = (moment - timedelta(days=1)).astimezone(zone).utcoffset() or timedelta(0)
    return max((moment.astimezone(zone).utcoffset() or timedelta(0)) - before, timedelta(0))


def crontab_months(field: str) -> str:
    """Month names as crontab(5) reads them, for APScheduler 3: a range of names may take a step (`jan-dec/3`).

    APScheduler 3 reads no step after names; crontab runs `jan-dec/3` in January, April, July and October.
    Such a range becomes numbers; every other part passes as written (the stored job's trigger stays the same).
    """
    parts = []
    for part in field.split(","):
        named = _NAMED_RANGE.match(part)
        if named is not None and all(name.lower() in _MONTH_NAMES for name in named.group(1, 2)):
            first, last = (_MONTH_NAMES.index(name.lower()) + 1 for name in named.group(1, 2))
            if first > last:
                raise ValueError(f"month {part!r} ends before it starts (the year starts on jan)")
            if named.group(3):
                # Checked here, as written: APScheduler's reason would quote the numbers (`'1-12/13'`) and not the field.
                try:
                    RangeExpression(first, last, named.group(3)).validate_range("month")
                except ValueError as exc:
                    raise ValueError(f"month {part!r}: {_first_line(exc)}") from None
                part = f"{first}-{last}/{named.group(3)}"
        parts.append(part)
    _names_alone(",".join(parts), "month", "jan-mar", "1-3")
    return ",".join(parts)


_MONTH_NAMES = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")


def crontab_weekdays(field: str) -> str:
    """Crontab weekday numbers (0 or 7 = Sunday) as names, for APScheduler 3.x (0 = Monday).

    APScheduler 3's `from_crontab` reads "1-5" as Tuesday to Saturday. A name alone means the same
    to both and passes through; a range of names is read as crontab reads it (`sun-thu`).
    """
    names = ",".join(_weekday_part(part) for part in field.split(","))
    return ",".join(dict.fromkeys(names.split(",")))


_WEEKDAY_NAMES = ("sun", "mon", "tue", "wed", "thu", "fri", "sat", "sun")


_NUMERIC_PART = re.compile(r"^(\*|\d+(?:-\d+)?)(?:/(\d+))?$")


_NAMES_PART = re.compile(r"^[a-z]+(?:-[a-z]+)?$", re.IGNORECASE)


_NAMED_RANGE = re.compile(r"^([a-z]+)-([a-z]+)(?:/(\d+))?$", re.IGNORECASE)


def _weekday_part(written: str) -> str:
    part = written
    named = _NAMED_RANGE.match(part)
    if named is not None and all(name.lower() in _WEEKDAY_NAMES for name in named.group(1, 2)):
        # APScheduler 3 counts `sun` last (6), crontab first (0): `sun-thu` is refused there as a range
        # that ends before it starts. As numbers, it means what crontab means.
        first, last = (_WEEKDAY_NAMES.index(name.lower()) for name in named.group(1, 2))
        last = 7 if last == 0 and first > 0 else last  # `sat-sun`: Sunday as the week's end, 7
        if first > last:
            raise ValueError(f"weekday {written!r} ends before it starts (the week starts on sun)")
        part = f"{first}-{last}" + (f"/{named.group(3)}" if named.group(3) else "")
    match = _NUMERIC_PART.match(part)
    if match is None or part == "*":
        _names_alone(part, "weekday", "mon-fri", "1-5")
        return part
    span, step_text = match.groups()
    step = int(step_text) if step_text else 1
    if span == "*":
        first, last = 0, 6
    elif "-" in span:
        first, last = (int(value) for value in span.split("-"))
    else:
        first = last = int(span)
        if step_text:  # "5/2" means 5 to the end, stepping 2
            last = 6
    if not (0 <= first <= 7 and 0 <= last <= 7):
        raise ValueError(f"weekday {written!r} is not within 0-7 (0 and 7 are Sunday)")
    if step < 1:
        raise ValueError(f"weekday {written!r} steps by 0 (a step is 1 or more)")
    if first > last and "-" not in span:  # "7/2": crontab refuses any step from a single day; this one's names none
        raise ValueError(f"weekday {written!r} steps from {first}, past the week's last day (6): write {first} alone, or a range")
    if first > last:
        raise ValueError(f"weekday {written!r} ends before it starts (the week starts on 0, Sunday)")
    return ",".join(_WEEKDAY_NAMES[day] for day in range(first, last + 1, step))


def _names_alone(field: str, kind: str, names: str, numbers: str) -> None:
    """Reject parts that mix names and numbers ("mon-5"): APScheduler 3 reads the name and drops the rest."""
    for part in field.split(","):
        if re.search("[a-z]", part, re.IGNORECASE) and not _NAMES_PART.match(part):
            raise ValueError(f"{kind} {part!r}: names and numbers do not mix (write {names} or {numbers})")


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__
