"""`[state] keep_notes_days`: each `overnight run` removes notes.md's entries headed longer ago, and nothing else."""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from orchestrator.config import load_config
from orchestrator.fake_server import ScriptedServer
from orchestrator.notes import NotesBook
from tests.conftest import write_config
from tests.test_cli import assert_one_line_error
from tests.test_cli import overnight as overnight_process
from tests.test_logs import _json_run, _one
from tests.test_night import FIX

NOW = datetime.now(timezone.utc)
PREAMBLE = "# overnight notes\n\nMY PREAMBLE: read the newest first.\n"


def notes_with(path: Path, *days_ago: float) -> NotesBook:
    """notes.md with a person's preamble and one entry of task `t` per age, iteration numbers from 1, oldest first."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(PREAMBLE)
    book = NotesBook(path)
    for number, days in enumerate(days_ago, start=1):
        when = NOW - timedelta(days=days)
        book.append(task="t", iteration=number, reason="check_failed", correction=f"LESSON-{number}", evidence="E", when=when)
    return book


def under_entry(path: Path, lesson: str, text: str) -> None:
    """`text` saved as a person's paragraph at the end of the entry whose correction is `lesson`."""
    whole = path.read_text()
    following = whole.find("\n## ", whole.index(lesson))
    end = len(whole) if following < 0 else following
    path.write_text(whole[:end].rstrip("\n") + f"\n\n{text}\n" + whole[end:])


class TestRemoveEntriesBefore:
    def test_old_entries_go_with_a_persons_text_in_them_and_the_rest_stays(self, tmp_path: Path):
        """Entries headed before the cutoff go with a hint written into them; newer entries, the preamble and a
        person's own `## ` section after an old entry stay as they were."""
        book = notes_with(tmp_path / "notes.md", 40, 30, 2)
        under_entry(book.path, "LESSON-1", "OLD-HINT: run make first.\n\n## My own plan\n\nMY-SECTION stays.")
        under_entry(book.path, "LESSON-3", "NEW-HINT: kept.")
        assert book.remove_entries_before(NOW - timedelta(days=7)) == 2
        text = book.path.read_text()
        assert [entry.iteration for entry in book.entries()] == [3]
        assert text.startswith(PREAMBLE) and "## My own plan\n\nMY-SECTION stays.\n" in text and "NEW-HINT: kept." in text
        assert "LESSON-1" not in text and "OLD-HINT" not in text and "LESSON-2" not in text and text.endswith("NEW-HINT: kept.\n")

    def test_an_entry_whose_header_time_cannot_be_read_is_kept(self, tmp_path: Path):
        """A header whose time a person changed ("last week") keeps its entry; an old one after it still goes."""
        book = notes_with(tmp_path / "notes.md", 40, 40)
        old_stamp = (NOW - timedelta(days=40)).strftime("%Y-%m-%d %H:%M UTC")
        book.path.write_text(book.path.read_text().replace(old_stamp, "last week", 1))
        assert book.remove_entries_before(NOW - timedelta(days=7)) == 1
        [kept] = book.entries()
        assert (kept.when, kept.iteration) == ("last week", 1) and "LESSON-1" in kept.text

    def test_the_bytes_around_what_goes_are_kept_exactly(self, tmp_path: Path):
        """A byte order mark, CRLF line ends and bytes that are not UTF-8, all a person's editor's, stay byte for byte."""
        book = notes_with(tmp_path / "notes.md", 40, 2)
        data = book.path.read_bytes().replace(b"\n", b"\r\n").replace(b"MY PREAMBLE", b"caf\xe9 PREAMBLE")
        book.path.write_bytes(b"\xef\xbb\xbf" + data)
        assert book.remove_entries_before(NOW - timedelta(days=7)) == 1
        first, second = data.index(b"## "), data.index(b"## ", data.index(b"LESSON-1"))
        assert book.path.read_bytes() == b"\xef\xbb\xbf" + data[:first] + data[second:]
        assert [entry.iteration for entry in book.entries()] == [2]

    def test_a_crlf_file_whose_every_entry_goes_keeps_crlf_to_its_last_line(self, tmp_path: Path):
        """The last entry gone, the preamble's blank lines after it go too, and its last line still ends in CRLF."""
        book = notes_with(tmp_path / "notes.md", 40)
        book.path.write_bytes(book.path.read_bytes().replace(b"\n", b"\r\n"))
        assert book.remove_entries_before(NOW - timedelta(days=7)) == 1
        assert book.path.read_bytes() == PREAMBLE.replace("\n", "\r\n").encode()

    def test_nothing_to_remove_leaves_the_file_untouched(self, tmp_path: Path):
        """No entry old enough: the file is not rewritten (same inode), and no notes.md is made where there is none."""
        book = notes_with(tmp_path / "notes.md", 2)
        inode = book.path.stat().st_ino
        assert book.remove_entries_before(NOW - timedelta(days=7)) == 0 and book.path.stat().st_ino == inode
        assert NotesBook(tmp_path / "none" / "notes.md").remove_entries_before(NOW) == 0 and not (tmp_path / "none").exists()

    @pytest.mark.parametrize("quoted_in", ["a person's fenced block", "the evidence, unindented as before 1d8a553"])
    def test_an_old_header_quoted_in_a_newer_entrys_fence_keeps_that_entry_whole(self, tmp_path: Path, quoted_in: str):
        """A header-shaped line of 2020 in a fenced block of a newer entry is no old entry: nothing goes, not the
        person's lines after it nor its closing fence."""
        book = notes_with(tmp_path / "notes.md", 2)
        quoted = "## 2020-01-01 00:00 UTC · task `t` · iteration 9 · `check_failed`"
        if quoted_in == "a person's fenced block":
            under_entry(book.path, "LESSON-1", f"Same as:\n\n```\n{quoted}\n```\n\nMY-CONCLUSION: run make first.")
        else:
            evidence = f"```\nE\n{quoted}\n```\n\nMY-CONCLUSION: run make first."
            book.path.write_text(book.path.read_text().replace("```\nE\n```", evidence))
        before = book.path.read_bytes()
        assert book.remove_entries_before(NOW - timedelta(days=7)) == 0 and book.path.read_bytes() == before


# A real editor's save at the moment the trim has read notes.md and opens its new file beside it: the interpreter's
# audit hook on that open is the one point in between that a test can reach without a mock.
EDITOR_SAVES_WHILE_NOTES_ARE_TRIMMED = """
import os, sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from orchestrator.notes import NotesBook

path, save = Path(sys.argv[1]), sys.argv[2]
saves = []

def editor(event, args):
    opens_the_new_file = event == "open" and isinstance(args[0], str) and os.path.basename(args[0]).startswith(".notes.md.")
    if opens_the_new_file and (save == "at every try" or not saves):
        saves.append(True)
        path.write_bytes(path.read_bytes() + b"\\nHINT %d: saved by the editor.\\n" % len(saves))

sys.addaudithook(editor)
print(NotesBook(path).remove_entries_before(datetime.now(timezone.utc) - timedelta(days=7)), len(saves))
"""


class TestAPersonsEditDuringTheTrim:
    @pytest.mark.parametrize(("save", "printed"), [("once", "1 1"), ("at every try", "None 5")])
    def test_a_save_made_while_the_trim_writes_survives(self, tmp_path: Path, save: str, printed: str):
        """An editor's save between the trim's read and its rename is kept: once, the trim goes again from it;
        during every try, the trim gives up (None) rather than write over it, and the old entry waits."""
        book = notes_with(tmp_path / "notes.md", 40, 2)
        done = subprocess.run(
            [sys.executable, "-c", EDITOR_SAVES_WHILE_NOTES_ARE_TRIMMED, str(book.path), save],
            capture_output=True, text=True, timeout=60, cwd=Path(__file__).parent.parent,
        )
        assert done.returncode == 0 and done.stdout.split() == printed.split(), done.stderr
        text = book.path.read_text()
        assert "HINT 1: saved by the editor." in text
        assert ("LESSON-1" in text) == (save == "at every try") and "LESSON-2" in text


def run_config(folder: Path, repo: Path, server: ScriptedServer, **state: float) -> Path:
    return write_config(folder / "overnight.toml", api_base=server.url, repo=repo, state=state)


class TestBeforeEachNight:
    def test_entries_older_than_kept_days_are_removed_before_the_night(self, tmp_path: Path, repo: Path):
        """A real `overnight run` with keep_notes_days = 7 removes the entries headed 40 and 8 days ago
        (`note_entries_removed`), keeps the one of 6 days ago and the preamble, and the night goes on."""
        with ScriptedServer(list(FIX)) as server:
            config = run_config(tmp_path, repo, server, keep_notes_days=7)
            book = notes_with(load_config(config).notes_path, 40, 8, 6)
            night = _json_run(config)
        assert night.exit_code == 0, night.events
        removed = _one(night.events, "note_entries_removed")
        assert (removed["count"], removed["older_than_days"]) == (2, 7) and "run_id" not in removed
        assert [entry.iteration for entry in book.entries()] == [3] and book.path.read_text().startswith(PREAMBLE)

    def test_a_scheduled_nights_entries_since_its_fire_stay(self, tmp_path: Path, repo: Path):
        """A night `serve` fired 10 days ago and begins again now (within a long grace) keeps its fire's entries,
        which its prompts read, though older than keep_notes_days; the entry headed before the fire goes."""
        with ScriptedServer(list(FIX)) as server:
            config = run_config(tmp_path, repo, server, keep_notes_days=7)
            book = notes_with(load_config(config).notes_path, 11, 9.9)
            fire = (NOW - timedelta(days=10)).isoformat(timespec="seconds")
            night = _json_run(config, args=("--scheduled-for", fire))
        assert night.exit_code == 0, night.events
        assert _one(night.events, "note_entries_removed")["count"] == 1
        assert [entry.iteration for entry in book.entries()] == [2]

    def test_by_default_every_entry_is_kept(self, tmp_path: Path, repo: Path):
        """keep_notes_days = 0 (the default): a night leaves notes.md's entries of years ago, and the file, as they were."""
        with ScriptedServer(list(FIX)) as server:
            config = run_config(tmp_path, repo, server, keep_notes_days=0)
            book = notes_with(load_config(config).notes_path, 3650, 400)
            before = book.path.read_bytes()
            night = _json_run(config)
        assert night.exit_code == 0, night.events
        assert book.path.read_bytes() == before and "note_entries_removed" not in [e["event"] for e in night.events]

    def test_a_notes_file_that_cannot_be_rewritten_is_logged_and_the_night_goes_on(self, tmp_path: Path, repo: Path):
        """notes.md's lock a folder (the trim cannot take it): `note_entries_not_removed` with its error, the old entry
        stays, and the night still commits."""
        with ScriptedServer(list(FIX)) as server:
            config = run_config(tmp_path, repo, server, keep_notes_days=7)
            book = notes_with(load_config(config).notes_path, 40)
            lock = book.path.with_name("notes.md.lock")
            lock.unlink()
            lock.mkdir()
            night = _json_run(config)
        assert night.exit_code == 0, night.events
        assert "cannot trim" in _one(night.events, "note_entries_not_removed")["error"] and "LESSON-1" in book.path.read_text()


class TestConfig:
    @pytest.mark.parametrize("days", [0, 1, 7.5, 36500])
    def test_zero_or_a_day_or_more_is_taken(self, tmp_path: Path, repo: Path, days: float):
        """0 (keep all) and 1 day to 100 years are accepted as they are."""
        config = write_config(tmp_path / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=repo, state={"keep_notes_days": days})
        assert load_config(config).state.keep_notes_days == days

    @pytest.mark.parametrize(
        ("value", "fragments"),
        [
            (0.5, ("[state] keep_notes_days", "0.5 is under a day", "tonight's earlier runs", "or 0")),
            (-1, ("[state] keep_notes_days", "greater than or equal to 0")),
            (36501, ("[state] keep_notes_days", "less than or equal to 36500")),
            ("a week", ("[state] keep_notes_days", "valid number")),
            (True, ("[state] keep_notes_days", "must be a number, not true")),
        ],
    )
    def test_a_bad_value_exits_2_with_one_line(self, tmp_path: Path, repo: Path, value: object, fragments: tuple[str, ...]):
        """Below a day (but not 0), negative, past 100 years or not a number: exit 2, one line naming the key, nothing made."""
        config = write_config(tmp_path / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=repo, state={"keep_notes_days": value})
        assert_one_line_error(overnight_process("run", "--config", str(config)), 2, *fragments)
        assert not (tmp_path / "state").exists()
