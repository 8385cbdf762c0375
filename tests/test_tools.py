"""The agent's tools in a real git worktree, and the shell runner under them."""

from __future__ import annotations

import json
import os
import re
import subprocess
import textwrap
import threading
import time
from pathlib import Path

import pytest

from orchestrator.command_output import cap_text
from orchestrator.commands import TIMEOUT_EXIT_CODE, run_shell
from orchestrator.records import ModelResponse, RawToolCall, ToolCall, ToolResult
from orchestrator import search
from orchestrator.search_tool import MAX_SEARCH_MATCHES
from orchestrator.tool_names import ALL_TOOLS, DEFAULT_TOOLS
from orchestrator.tool_paths import ToolPaths
from orchestrator.tools import DEFAULT_OUTPUT_CHARS, Toolbox, output_cap_for
from orchestrator.scripted import call
from tests.conftest import SAMPLE_FILES, git, make_repo, write_config
from tests.test_hostile_git import as_an_ordinary_user


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    (root / "app.py").write_text("def add(a, b):\n    return a - b\n")
    (root / "src").mkdir()
    (root / "src" / "util.py").write_text("X = 1\nY = 2\n")
    return root


def toolbox(root: Path, allowed=DEFAULT_TOOLS, **options) -> Toolbox:
    return Toolbox(root, allowed, check_command=options.pop("check_command", "true"), **options)


def run(box: Toolbox, name: str, **arguments):
    return box.execute(ToolCall(name, arguments))


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie nobody reaped yet is dead for our purposes.
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(")")[-1].split()[0] == "Z")


class TestRunShell:
    def test_output_and_exit_code(self, tmp_path):
        """stdout and stderr come back merged, with the exit code."""
        result = run_shell("echo out; echo err >&2; exit 3", tmp_path, 10, 1000)
        assert (result.exit_code, result.timed_out) == (3, False)
        assert "out" in result.output and "err" in result.output

    def test_stdin_is_closed(self, tmp_path):
        """A command that reads input gets end-of-file at once instead of waiting, also when overnight's own
        stdin is open and silent (a terminal, a pipe nobody writes): pytest's is /dev/null, which would hide it."""
        reader, writer = os.pipe()
        saved = os.dup(0)
        os.dup2(reader, 0)
        try:
            started = time.monotonic()
            result = run_shell("read x; echo got:$x", tmp_path, 3, 1000)
        finally:
            os.dup2(saved, 0)
            for fd in (saved, reader, writer):
                os.close(fd)
        assert result.output == "got:\n" and time.monotonic() - started < 2

    def test_timeout_kills_grandchildren(self, tmp_path):
        """On timeout the whole process group dies, background children included, and exit is 124."""
        started = time.monotonic()
        result = run_shell("sleep 30 & echo $! > bg.pid; sleep 30", tmp_path, 0.5, 1000)
        assert time.monotonic() - started < 5
        assert (result.exit_code, result.timed_out) == (TIMEOUT_EXIT_CODE, True)
        assert "timed out" in result.output
        pid = int((tmp_path / "bg.pid").read_text())
        deadline = time.monotonic() + 3
        while process_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not process_alive(pid)

    def test_git_never_prompts(self, tmp_path):
        """The environment tells git not to prompt or page."""
        result = run_shell("echo $GIT_TERMINAL_PROMPT $GIT_PAGER $PAGER", tmp_path, 10, 1000)
        assert result.output.split() == ["0", "cat", "cat"]

    @pytest.mark.parametrize("askpass", ["GIT_ASKPASS", "SSH_ASKPASS", "core.askPass"])
    def test_git_asks_no_askpass_program_for_credentials(self, tmp_path, monkeypatch, askpass):
        """git asks an askpass program (VS Code's terminal and KDE set one) before it looks at
        GIT_TERMINAL_PROMPT: a fetch needing credentials sat in it until command_timeout_s, its
        output a bare timeout (found by a review). It fails at once now."""
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        class WantsCredentials(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - stdlib naming
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Basic realm="x"')
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        asked = tmp_path / "asked"
        slow = tmp_path / "slowask.sh"
        slow.write_text(f"#!/bin/sh\necho asked >> {asked}\nsleep 30\n")
        slow.chmod(0o755)
        server = ThreadingHTTPServer(("127.0.0.1", 0), WantsCredentials)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        remote = f"http://127.0.0.1:{server.server_address[1]}/x.git"
        try:
            if askpass == "core.askPass":
                command = f"git -c core.askPass={slow} ls-remote {remote}"
            else:
                monkeypatch.setenv(askpass, str(slow))
                command = f"git ls-remote {remote}"
            result = run_shell(command, tmp_path, 10, 1000)
        finally:
            server.shutdown()
            server.server_close()
        assert result.exit_code != 0 and not result.timed_out and result.duration_s < 5, result.output
        assert "terminal prompts disabled" in result.output and not asked.exists()

    def test_an_interactive_rebase_does_not_wait_for_the_users_editor(self, tmp_path, monkeypatch):
        """A user's `sequence.editor` outranks GIT_EDITOR; an agent's `git rebase -i` must not sit in it until the timeout."""
        home = tmp_path / "home"
        home.mkdir()
        (home / ".gitconfig").write_text("[sequence]\n\teditor = sleep 30\n[core]\n\teditor = sleep 30\n")
        monkeypatch.setenv("HOME", str(home))
        repo = tmp_path / "repo"
        repo.mkdir()
        script = "git init -q && git -c user.name=a -c user.email=a@b commit -q --allow-empty -m one && "
        script += "git -c user.name=a -c user.email=a@b commit -q --allow-empty -m two && git rebase -i HEAD~1 && echo rebased"
        result = run_shell(script, repo, 10, 1000)
        assert result.exit_code == 0 and "rebased" in result.output and result.duration_s < 5, result.output

    def test_flood_is_capped_head_and_tail(self, tmp_path):
        """A flood of output keeps its start and end within the cap and says how much was cut."""
        result = run_shell("echo START; yes | head -c 3000000; echo END", tmp_path, 20, 500)
        assert len(result.output) <= 500
        assert result.output.startswith("START") and result.output.rstrip().endswith("END")
        assert "chars cut ...]" in result.output

    def test_terminal_escapes_are_taken_out(self, tmp_path):
        """Colours, cursor moves and window titles (a tool forced to colour) reach neither the model nor notes.md."""
        result = run_shell(r"printf '\033[1;31mFAILED\033[0m t1 \033]0;title\007\033[2K\033[1Gok\n'", tmp_path, 10, 1000)
        assert result.output == "FAILED t1 ok\n"

    def test_cap_text_keeps_short_text(self):
        """Text within the cap is returned unchanged."""
        assert cap_text("hello", 10) == "hello"


class TestPaths:
    @pytest.mark.parametrize("path", ["../outside.txt", "src/../../outside.txt", "/etc/passwd", "~/x"])
    def test_escapes_are_refused(self, repo, path):
        """Paths that leave the worktree are refused for reading and writing."""
        (repo.parent / "outside.txt").write_text("secret")
        box = toolbox(repo)
        assert not run(box, "read_file", path=path).ok
        assert not run(box, "write_file", path=path, content="x").ok
        assert (repo.parent / "outside.txt").read_text() == "secret"

    def test_symlink_out_of_the_root_is_refused(self, repo):
        """A symlink in the worktree pointing to /etc cannot be read or written through."""
        (repo / "etc").symlink_to("/etc")
        box = toolbox(repo)
        result = run(box, "read_file", path="etc/passwd")
        assert not result.ok and "outside the project" in result.output
        assert not run(box, "list_dir", path="etc").ok

    @pytest.mark.parametrize("path", [".git/config", ".git", "src/../.git/HEAD", ".GIT/config", ".Git", "src/../.gIt/HEAD"])
    def test_git_dir_is_refused(self, repo, path):
        """Nothing inside .git can be read, listed or written."""
        box = toolbox(repo)
        assert not run(box, "read_file", path=path).ok
        assert not run(box, "write_file", path=path, content="x").ok
        assert "[core]" in (repo / ".git" / "config").read_text()

    def test_git_in_any_letter_case_is_refused_and_not_listed(self, repo):
        """A name that is .git on a case-insensitive file system (.GIT), or a link to .git, is refused and not listed, as .git is."""
        (repo / "meta").symlink_to(repo / ".git")
        (repo / ".GIT").mkdir()
        box = toolbox(repo)
        for path in ("meta/config", ".GIT", ".GIT/x"):
            assert "inside .git" in run(box, "write_file", path=path, content="x").output
        assert ".GIT" not in run(box, "list_dir", path=".").output

    def test_worktree_git_file_is_refused(self, tmp_path):
        """In a worktree .git is a file, and it is refused too."""
        (tmp_path / ".git").write_text("gitdir: /somewhere/else\n")
        result = run(toolbox(tmp_path), "read_file", path=".git")
        assert not result.ok and ".git" in result.output

    def test_inner_dot_dot_that_stays_inside_is_fine(self, repo):
        """A path with .. that stays inside the root is allowed."""
        assert run(toolbox(repo), "read_file", path="src/../app.py").ok

    def test_links_below_the_root_are_followed_and_judged(self, repo, tmp_path):
        """A link anywhere along the path is followed: inside the root it works, out of it or into .git it is refused."""
        outside = tmp_path / "outside"
        outside.mkdir()
        (repo / "src" / "app_link.py").symlink_to(repo / "app.py")
        (repo / "src" / "away").symlink_to(outside)
        (repo / "dangling.txt").symlink_to(outside / "new.txt")
        (repo / "gitlink").symlink_to(repo / ".git")
        box = toolbox(repo)
        assert run(box, "write_file", path="src/app_link.py", content="linked\n").ok
        assert (repo / "app.py").read_text() == "linked\n"
        for path in ("src/away/x.txt", "src/away/deeper/x.txt", "dangling.txt"):
            result = run(box, "write_file", path=path, content="x")
            assert not result.ok and "outside the project" in result.output
        assert not run(box, "read_file", path="gitlink/config").ok
        assert list(outside.iterdir()) == []

    @pytest.mark.parametrize(
        "path",
        ["app.py", "src/util.py", "./src//util.py", "src/new/deep/file.txt", "app.py/not_a_folder", "src/", "link/util.py", "src/../app.py"],
    )
    def test_paths_resolve_as_resolve_does(self, repo, path):
        """The short way to a path inside the root gives exactly what Path.resolve() gives."""
        (repo / "link").symlink_to(repo / "src")
        assert ToolPaths(repo).resolve(path) == (repo / path).resolve()

    def test_a_file_operation_that_fails_names_the_path_as_the_model_gave_it(self, repo):
        """An error of the file system (a name too long) is one line naming the path in the project, without the worktree's absolute path that the tools would refuse."""
        box = toolbox(repo)
        for name, arguments in (
            ("read_file", {"path": "n" * 300}),
            ("write_file", {"path": f"src/{'n' * 300}.py", "content": "x"}),
            ("list_dir", {"path": "n" * 300}),
        ):
            result = run(box, name, **arguments)
            assert not result.ok and re.search(r"File name too long: '(src/)?nnn", result.output), result.output
            assert str(repo) not in result.output and "\n" not in result.output

    def test_nul_character_is_refused_in_a_line(self, repo):
        """A path or command with a NUL in it (a model can write \\u0000) is refused, not raised."""
        box = toolbox(repo, allowed=ALL_TOOLS)
        for name, arguments in (
            ("read_file", {"path": "app\0.py"}),
            ("write_file", {"path": "a\0b", "content": "x"}),
            ("list_dir", {"path": "src\0"}),
            ("run_command", {"command": "echo a\0b"}),
        ):
            result = run(box, name, **arguments)
            assert not result.ok and "NUL" in result.output and "\n" not in result.output


class TestFileTools:
    def test_read_file(self, repo):
        """read_file returns the file's text."""
        result = run(toolbox(repo), "read_file", path="app.py")
        assert result.ok and result.output == "def add(a, b):\n    return a - b\n"

    def test_read_missing_file_says_what_to_do(self, repo):
        """A missing file is a failure that points to list_dir or search."""
        result = run(toolbox(repo), "read_file", path="nope.py")
        assert not result.ok and "not found" in result.output and "list_dir" in result.output

    def test_read_big_file_is_capped_with_a_note(self, repo):
        """A file bigger than the cap shows its start and a note saying it was cut."""
        (repo / "big.txt").write_text("line\n" * 5000)
        result = run(toolbox(repo, max_output_chars=1000), "read_file", path="big.txt")
        assert result.ok and len(result.output) <= 1000
        assert result.output.startswith("line\n") and "25000 bytes" in result.output

    def test_read_file_reads_no_more_than_it_can_show(self, repo):
        """A huge file is not read whole: what is shown is its start, and the note gives its size."""
        big = repo / "huge.log"
        with open(big, "wb") as handle:
            handle.write(b"start\n")
            handle.truncate(3 * 1024**3)  # 3 GiB, sparse: reading it whole would take seconds and the memory
        started = time.monotonic()
        result = run(toolbox(repo, max_output_chars=1000), "read_file", path="huge.log")
        assert time.monotonic() - started < 2
        assert not result.ok and "binary" in result.output and str(3 * 1024**3) in result.output
        assert "more than edit_file takes" in run(toolbox(repo), "edit_file", path="huge.log", old="start", new="x").output
        (repo / "text.log").write_text("é" * 300)  # 300 chars, 600 bytes: fits whole
        assert run(toolbox(repo, max_output_chars=1000), "read_file", path="text.log").output == "é" * 300

    def test_read_file_shows_a_range_of_lines(self, repo):
        """start_line and end_line (from 1, inclusive) show those lines exactly; either may be left out."""
        (repo / "ten.txt").write_text("".join(f"line {n}\n" for n in range(1, 11)))
        box = toolbox(repo)
        assert run(box, "read_file", path="ten.txt", start_line=3, end_line=5).output == "line 3\nline 4\nline 5\n"
        assert run(box, "read_file", path="ten.txt", start_line=9).output == "line 9\nline 10\n"
        assert run(box, "read_file", path="ten.txt", end_line=1).output == "line 1\n"
        assert run(box, "read_file", path="ten.txt", start_line=10, end_line=99).output == "line 10\n"

    @pytest.mark.parametrize("lines, says", [({"start_line": 11}, "ends at line 10"), ({"start_line": 0}, "from 1"), ({"start_line": 5, "end_line": 4}, "below")])
    def test_read_file_refuses_a_range_outside_the_file(self, repo, lines, says):
        """A range that shows nothing fails with one line saying which lines there are."""
        (repo / "ten.txt").write_text("x\n" * 10)
        result = run(toolbox(repo), "read_file", path="ten.txt", **lines)
        assert not result.ok and says in result.output and "\n" not in result.output

    @pytest.mark.parametrize("path", ["big.py", "src/a_rather_long_package_name/and_a_module_with_a_long_name_too.py"])
    def test_a_file_longer_than_the_cap_can_be_read_to_its_end(self, repo, path):
        """Following the cut-off note's start_line from read to read shows every line, the last one too, exactly;
        a long path in the note does not push the output past the cap (its middle was then cut away)."""
        body = "".join(f"def helper_{i}(x):\n  return x - {i}\n\n" for i in range(300)) + "def target(x):\n  return x + 1\n"
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(body)
        box = toolbox(repo, max_output_chars=1000)
        result, seen = run(box, "read_file", path=path), ""
        while (more := re.search(r"start_line=(\d+)", result.output)) is not None:
            assert len(result.output) <= 1000 and "chars cut" not in result.output
            seen += result.output[: result.output.index("[...")]
            result = run(box, "read_file", path=path, start_line=int(more.group(1)))
        assert seen + result.output == body

    def test_write_file_creates_parent_folders(self, repo):
        """write_file creates missing folders and the file."""
        result = run(toolbox(repo), "write_file", path="new/deep/mod.py", content="A = 1\n")
        assert result.ok and (repo / "new" / "deep" / "mod.py").read_text() == "A = 1\n"

    @pytest.mark.parametrize("path", ["tests/", "tests/.", "tests/./"])
    def test_write_file_to_a_path_ending_in_a_slash_makes_no_file(self, repo, path):
        """A path ending in / (or /.) names a folder: refused, so no file of the folder's name blocks the files written into it later."""
        box = toolbox(repo)
        result = run(box, "write_file", path=path, content="")
        assert not result.ok and "tests/new_file.py" in result.output and "\n" not in result.output, result.output
        assert not (repo / "tests").exists()
        assert run(box, "write_file", path="tests/test_app.py", content="x = 1\n").ok

    def test_write_file_under_a_file_names_that_file(self, repo):
        """A path through a file (app.py/x.py) is refused naming the file in the project, not with an error showing the worktree's absolute path."""
        os.mkfifo(repo / "pipe")
        for path in ("app.py/inner.py", "src/util.py/deep/inner.py", "pipe/inner.py"):
            result = run(toolbox(repo), "write_file", path=path, content="x")
            assert not result.ok and "is a file, not a folder" in result.output, result.output
            assert str(repo) not in result.output
        assert (repo / "app.py").read_text() == "def add(a, b):\n    return a - b\n"

    def test_write_file_with_a_windows_path_makes_no_file_of_that_name(self, repo):
        """A path with backslashes (src\\new.py) is refused instead of made as one file of that name at the top; a file that has such a name is still written."""
        box = toolbox(repo)
        result = run(box, "write_file", path="src\\new.py", content="x = 1\n")
        assert not result.ok and "separate folders with /" in result.output
        assert sorted(path.name for path in repo.iterdir()) == [".git", "app.py", "src"]
        assert "like 'src/util.py'" in run(box, "read_file", path="src\\util.py").output
        (repo / "odd\\name.txt").write_text("old\n")
        assert run(box, "write_file", path="odd\\name.txt", content="new\n").ok

    def test_write_file_makes_no_new_file_whose_name_starts_or_ends_with_a_space(self, repo):
        """A space or line break slipped into a new path (`app.py\\n`, `src/ util.py`) is refused instead of making a second file that no import finds; a file so named already is still written."""
        box = toolbox(repo)
        for path in ("app.py\n", "src/ util.py", "new .py ", " src/x.py"):
            result = run(box, "write_file", path=path, content="x\n")
            assert not result.ok and "at the start or end of a name" in result.output, path
        assert sorted(path.name for path in repo.rglob("*") if ".git" not in path.parts) == ["app.py", "src", "util.py"]
        assert "like 'src/util.py'" in run(box, "write_file", path="src/ util.py", content="x\n").output
        (repo / "odd ").write_text("old\n")
        assert run(box, "write_file", path="odd ", content="new\n").ok

    def test_write_file_keeps_a_windows_files_line_ends_and_byte_order_mark(self, repo):
        """A CRLF file with a byte order mark, written whole in plain newlines, keeps both (only the changed line differs); a new file and an LF file get the text as given."""
        (repo / "Form.cs").write_bytes(b"\xef\xbb\xbfclass A\r\n{\r\n    int x = 1;\r\n}\r\n")
        box = toolbox(repo)
        assert run(box, "write_file", path="Form.cs", content="class A\n{\n    int x = 2;\n}\n").ok
        assert (repo / "Form.cs").read_bytes() == b"\xef\xbb\xbfclass A\r\n{\r\n    int x = 2;\r\n}\r\n"
        assert run(box, "write_file", path="new.cs", content="a\nb\n").ok
        assert run(box, "write_file", path="app.py", content="a\nb\n").ok
        assert (repo / "new.cs").read_bytes() == (repo / "app.py").read_bytes() == b"a\nb\n"

    def test_write_file_replaces_a_longer_file_exactly(self, repo):
        """Over a longer file, a file that is written holds only the new text, with no tail of the old."""
        (repo / "long.txt").write_text("0123456789\n" * 100)
        os.chmod(repo / "long.txt", 0o640)
        result = run(toolbox(repo), "write_file", path="long.txt", content="short\n")
        assert result.ok and "replaced long.txt" in result.output
        assert (repo / "long.txt").read_bytes() == b"short\n"
        assert (repo / "long.txt").stat().st_mode & 0o777 == 0o640
        assert run(toolbox(repo), "write_file", path="long.txt", content="").ok
        assert (repo / "long.txt").read_bytes() == b""

    def test_a_file_hard_linked_from_outside_is_changed_in_the_worktree_only(self, repo, tmp_path):
        """uv and pnpm link packages to their cache: an edit or write there must not change the cached file."""
        cache = tmp_path / "cache"
        cache.mkdir()
        # A name near the file system's limit too: the spare file's name must not be longer.
        long_name = "m" * 240 + ".py"
        for name in ("api.py", "models.py", long_name):
            (cache / name).write_text(f"# {name}, cached\nVALUE = 1\n")
            os.chmod(cache / name, 0o755)
            os.link(cache / name, repo / name)
        assert run(toolbox(repo), "edit_file", path="api.py", old="VALUE = 1", new="VALUE = 2").ok
        assert run(toolbox(repo), "write_file", path="models.py", content="broken\n").ok
        assert run(toolbox(repo), "edit_file", path=long_name, old="VALUE = 1", new="VALUE = 3").ok
        assert (repo / "api.py").read_text() == "# api.py, cached\nVALUE = 2\n" and (repo / "models.py").read_text() == "broken\n"
        for name in ("api.py", "models.py", long_name):
            assert (cache / name).read_text() == f"# {name}, cached\nVALUE = 1\n"
            assert (repo / name).stat().st_nlink == 1 and (repo / name).stat().st_mode & 0o777 == 0o755
        assert sorted(path.name for path in repo.iterdir() if "overnight" in path.name) == []

    def test_write_file_that_cannot_be_encoded_leaves_the_file_alone(self, repo):
        """A text with a lone surrogate fails as a tool result, and the file keeps its old bytes."""
        result = run(toolbox(repo), "write_file", path="app.py", content="x = '\ud800'\n")
        assert not result.ok and "UnicodeEncodeError" in result.output
        assert (repo / "app.py").read_text() == "def add(a, b):\n    return a - b\n"

    def test_edit_file_to_a_shorter_text(self, repo):
        """An edit that shortens a file leaves no tail of the old text."""
        (repo / "cfg.txt").write_text("keep\n" + "drop this line\n" * 50 + "end\n")
        result = run(toolbox(repo), "edit_file", path="cfg.txt", old="drop this line\n" * 50, new="")
        assert result.ok and (repo / "cfg.txt").read_text() == "keep\nend\n"

    def test_edit_file_replaces_one_occurrence(self, repo):
        """edit_file replaces the one exact occurrence of `old`."""
        result = run(toolbox(repo), "edit_file", path="app.py", old="a - b", new="a + b")
        assert result.ok and (repo / "app.py").read_text() == "def add(a, b):\n    return a + b\n"

    def test_edit_file_with_new_the_same_as_old_is_refused(self, repo):
        """An edit that would change nothing is a failed call saying so, not an "edited" the model takes for progress."""
        result = run(toolbox(repo), "edit_file", path="app.py", old="a - b", new="a - b")
        assert not result.ok and "the same" in result.output and "\n" not in result.output
        assert (repo / "app.py").read_text() == "def add(a, b):\n    return a - b\n"

    def test_edit_file_old_not_found(self, repo):
        """An `old` that is not in the file fails and leaves the file alone."""
        result = run(toolbox(repo), "edit_file", path="app.py", old="a * b", new="a + b")
        assert not result.ok and "not found" in result.output
        assert "a - b" in (repo / "app.py").read_text()

    def test_edit_file_says_to_leave_out_a_search_label_copied_into_old(self, repo):
        """An `old` copied from search's output with its `file:line: ` label is refused saying to leave the label out."""
        box = toolbox(repo)
        label = run(box, "search", pattern="return", path="app.py").output
        result = run(box, "edit_file", path="app.py", old=label, new="    return a + b")
        assert not result.ok and "'app.py:2: '" in result.output and "leave that out" in result.output

    def test_edit_file_hints_at_whitespace(self, repo):
        """An `old` that differs only in indentation gets a hint to copy it exactly."""
        result = run(toolbox(repo), "edit_file", path="src/util.py", old="X = 1\n  Y = 2", new="Z")
        assert not result.ok and "indentation" in result.output

    def test_edit_file_quotes_the_lines_that_differ_only_in_spaces(self, repo):
        """The hint quotes the file's own lines, with their indentation, so the model can copy them exactly."""
        (repo / "two.py").write_text("def f(x):\n  if x:\n\n    return x + 1\n  return 0\n")
        result = run(toolbox(repo), "edit_file", path="two.py", old="if x:\n        return x + 1", new="if x:\n  return 2")
        assert not result.ok and result.output.endswith("at lines 2-4; copy `old` exactly from these lines:\n  if x:\n\n    return x + 1")

    def test_a_refusal_quoting_the_file_is_capped_and_redacted_as_any_output(self, repo):
        """edit_file's quote of the lines alike (a long block re-indented) keeps to the output cap, and a secret in them is redacted."""
        from orchestrator.redactor import Redactor

        secret = "sk-proj-4f9a8b7c6d5e4f3a2b1c"
        body = "".join(f"    value_{index} = {index}\n" for index in range(400))
        (repo / "conf.py").write_text(f"def settings():\n    key = '{secret}'\n{body}")
        box = toolbox(repo, max_output_chars=1500, redact=Redactor([secret]))
        result = run(box, "edit_file", path="conf.py", old=f"key = '{secret}'\n" + body.replace("    ", "  "), new="pass\n")
        assert not result.ok and "copy `old` exactly" in result.output
        assert len(result.output) <= 1500 and secret not in result.output and "***" in result.output

    def test_edit_file_old_found_several_times(self, repo):
        """An `old` found more than once fails and says how many times."""
        (repo / "dup.py").write_text("x = 1\nx = 1\nx = 1\n")
        result = run(toolbox(repo), "edit_file", path="dup.py", old="x = 1", new="x = 2")
        assert not result.ok and "3 times" in result.output
        assert (repo / "dup.py").read_text() == "x = 1\nx = 1\nx = 1\n"

    def test_edit_file_counts_overlapping_occurrences(self, repo):
        """An `old` whose occurrences overlap is not unique: str.count saw one, and the first was replaced."""
        (repo / "dup.py").write_text("x = 1\nx = 1\nx = 1\n")
        result = run(toolbox(repo), "edit_file", path="dup.py", old="x = 1\nx = 1\n", new="x = 2\nx = 2\n")
        assert not result.ok and "2 times" in result.output
        assert (repo / "dup.py").read_text() == "x = 1\nx = 1\nx = 1\n"

    def test_edit_file_keeps_windows_line_endings(self, repo):
        """A CRLF file is edited with a plain-newline `old`, keeping its CRLF endings."""
        (repo / "win.txt").write_bytes(b"a\r\nb\r\n")
        result = run(toolbox(repo), "edit_file", path="win.txt", old="a\nb", new="a\nc")
        assert result.ok and (repo / "win.txt").read_bytes() == b"a\r\nc\r\n"

    def test_an_edit_of_line_ends_only_in_a_crlf_file_is_not_said_to_be_made(self, repo):
        """`new` that differs from `old` in line ends only is written with the file's CRLF: the file would not change, and the result says so instead of "edited"."""
        (repo / "win.txt").write_bytes(b"one\r\ntwo\r\n")
        result = run(toolbox(repo), "edit_file", path="win.txt", old="one\r\ntwo", new="one\ntwo")
        assert not result.ok and "nothing would change" in result.output
        assert (repo / "win.txt").read_bytes() == b"one\r\ntwo\r\n"

    def test_edit_file_in_a_file_with_both_line_endings(self, repo):
        """In a file with CRLF and LF lines, a plain-newline `old` edits the LF part as given, and the CRLF part converted."""
        (repo / "mixed.py").write_bytes(b"# from windows\r\nimport os\r\n\ndef f():\n    return 1\n")
        box = toolbox(repo)
        assert run(box, "edit_file", path="mixed.py", old="def f():\n    return 1", new="def f():\n    return 2").ok
        assert run(box, "edit_file", path="mixed.py", old="import os\n", new="import os\nimport re\n").ok
        assert (repo / "mixed.py").read_bytes() == b"# from windows\r\nimport os\r\nimport re\r\n\ndef f():\n    return 2\n"

    def test_lines_added_to_a_crlf_file_end_with_crlf(self, repo):
        """One line replaced by several: the new lines end as the file's do (a single-line `old` matched as given
        gave bare LF lines in a CRLF file); in a file with both kinds, as the lines around the match."""
        (repo / "win.py").write_bytes(b"def f():\r\n    return 1\r\n")
        box = toolbox(repo)
        assert run(box, "edit_file", path="win.py", old="    return 1", new="    x = 1\n    return x").ok
        assert (repo / "win.py").read_bytes() == b"def f():\r\n    x = 1\r\n    return x\r\n"
        (repo / "mixed.py").write_bytes(b"a = 1\r\nb = 2\n")
        assert run(box, "edit_file", path="mixed.py", old="b = 2", new="b = 2\nc = 3").ok
        assert run(box, "edit_file", path="mixed.py", old="a = 1", new="a = 1\nz = 0").ok
        assert (repo / "mixed.py").read_bytes() == b"a = 1\r\nz = 0\r\nb = 2\nc = 3\n"

    def test_a_file_that_is_not_utf8_is_edited_keeping_its_other_bytes(self, repo):
        """edit_file on a Latin-1 file changes `old` and leaves every other byte as it was (it failed with a UnicodeDecodeError)."""
        (repo / "legacy.py").write_bytes("# Société Générale\nNAME = 'café'\nx = 1\n".encode("latin-1"))
        result = run(toolbox(repo), "edit_file", path="legacy.py", old="x = 1", new="x = 2")
        assert result.ok and (repo / "legacy.py").read_bytes() == "# Société Générale\nNAME = 'café'\nx = 2\n".encode("latin-1")

    def test_read_file_says_a_file_is_not_utf8_and_the_tools_keep_its_bytes(self, repo):
        """read_file says the file is not UTF-8; an `old`, or a write_file, holding what it showed as \ufffd is refused in one line."""
        latin = "NAME = 'café'\nx = 1\n".encode("latin-1")
        (repo / "legacy.py").write_bytes(latin)
        box = toolbox(repo)
        shown = run(box, "read_file", path="legacy.py").output
        assert shown.startswith("NAME = 'caf\ufffd'\nx = 1\n[legacy.py is not UTF-8 text")
        assert run(box, "read_file", path="legacy.py", start_line=2).output == "x = 1\n"
        assert "[legacy.py is not UTF-8 text" in run(box, "read_file", path="legacy.py", end_line=1).output
        for name, arguments in (
            ("edit_file", {"old": "NAME = 'caf\ufffd'", "new": "NAME = 'cafe'"}),
            ("write_file", {"content": "NAME = 'caf\ufffd'\nx = 2\n"}),
        ):
            result = run(box, name, path="legacy.py", **arguments)
            assert not result.ok and "not UTF-8" in result.output and "\n" not in result.output
        assert (repo / "legacy.py").read_bytes() == latin

    def test_list_dir(self, repo):
        """list_dir shows folders with a slash, hides .git, and defaults to the root."""
        result = run(toolbox(repo), "list_dir")
        assert result.ok and result.output.splitlines() == ["app.py", "src/"]

    def test_an_empty_path_is_the_project_for_list_dir_and_search(self, repo):
        """A path given empty (as many small models give it) lists or searches the project, as when it is left out."""
        box = toolbox(repo)
        assert run(box, "list_dir", path="").output == run(box, "list_dir").output == "app.py\nsrc/"
        found = run(box, "search", pattern="X = 1", path=" ")
        assert found.ok and found.output == "src/util.py:1: X = 1"

    def test_list_dir_of_a_file_fails(self, repo):
        """list_dir on a file fails and points to read_file."""
        result = run(toolbox(repo), "list_dir", path="app.py")
        assert not result.ok and "read_file" in result.output


def mixed_project(repo: Path, outside: Path) -> Path:
    """A project holding every kind of file search decides about: tracked, untracked, ignored, kept
    (.venv), binary, too big, linked in and out, a pipe, Windows line ends, bytes that are not UTF-8."""
    (repo / ".gitignore").write_text("build/\n*.log\n")
    (repo / "kept.log").write_text("needle tracked though ignored\n")
    git(repo, "add", "-A")
    git(repo, "add", "-f", "kept.log")
    git(repo, "commit", "-q", "-m", "base")
    (repo / "build").mkdir()
    (repo / "build" / "gen.py").write_text("needle generated\n")
    (repo / "run.log").write_text("needle in a log\n")
    for skipped in (".venv/lib", "node_modules/m", "src/__pycache__"):
        (repo / skipped).mkdir(parents=True)
        (repo / skipped / "x.py").write_text("needle skipped\n")
    (repo / "a").mkdir()
    (repo / "a" / "z.py").write_text("needle in a/\n")
    (repo / "a.py").write_text("x = 1\nneedle = 'a.py'\n  needle.attr  \n")
    (repo / "B.py").write_text("NEEDLE upper\nneedle lower\n")
    (repo / "blob.bin").write_bytes(b"needle\0\1\2")
    (repo / "late_nul.txt").write_bytes(b"needle before\n" + b"x" * 9000 + b"\0\nneedle after\n")
    (repo / "big.txt").write_text("needle\n" + "hay\n" * 600_000)
    (repo / "crlf.txt").write_bytes(b"first\r\nneedle here\r\n\r\nneedle\r\nlone\rneedle\r\n")
    (repo / "latin1.txt").write_bytes(b"caf\xe9 needle\nplain\n\xff\xfe needle\n")
    (repo / "long.txt").write_text("needle " + "y" * 300 + "\n")
    (repo / "ff.txt").write_text("a\x0cneedle\u2028b\nneedle\n")
    (repo / "empty.txt").write_text("")
    (repo / "sub").mkdir()
    (repo / "sub" / ".git").write_text("gitdir: ../.git/modules/sub needle\n")
    (repo / "sub" / "s.py").write_text("needle in a submodule\n")
    (outside / "secret.txt").write_text("needle outside\n")
    (repo / "out_link.txt").symlink_to(outside / "secret.txt")
    (repo / "in_link.txt").symlink_to(repo / "a.py")
    (repo / "git_link").symlink_to(".git/config")
    (repo / "dangling.txt").symlink_to(repo / "gone.txt")
    (repo / "loop.txt").symlink_to(repo / "loop.txt")
    (repo / "dir_link").symlink_to(repo / "a")
    os.mkfifo(repo / "pipe")
    return repo


# What a search of mixed_project for "needle" found before search was made faster (paths as strings,
# one stat a file, plain text looked for in the bytes first): it must go on finding exactly these.
MIXED_PROJECT_NEEDLES = [
    "B.py:2: needle lower", "a.py:2: needle = 'a.py'", "a.py:3:   needle.attr", "crlf.txt:2: needle here", "crlf.txt:4: needle",
    "crlf.txt:5: lone\rneedle", "ff.txt:1: a\x0cneedle\u2028b", "ff.txt:2: needle", "in_link.txt:2: needle = 'a.py'",
    "in_link.txt:3:   needle.attr", "kept.log:1: needle tracked though ignored", "late_nul.txt:1: needle before",
    "late_nul.txt:3: needle after", "latin1.txt:1: caf\ufffd needle", "latin1.txt:3: \ufffd\ufffd needle",
    "long.txt:1: needle " + "y" * 193, "a/z.py:1: needle in a/", "sub/s.py:1: needle in a submodule",
]


class TestSearch:
    def test_regex_matches_as_file_line_text(self, repo):
        """search reports matches as file:line: text, skipping .git."""
        result = run(toolbox(repo), "search", pattern=r"[XY] = \d")
        assert result.ok and result.output.splitlines() == ["src/util.py:1: X = 1", "src/util.py:2: Y = 2"]

    def test_invalid_regex_is_plain_text(self, repo):
        """A pattern that is not a valid regex is searched as plain text."""
        (repo / "p.py").write_text("call(a, b\n")
        result = run(toolbox(repo), "search", pattern="call(a", path="p.py")
        assert result.ok and result.output == "p.py:1: call(a, b"

    def test_a_pattern_regex_fails_to_parse_otherwise_is_plain_text_too(self, repo):
        """Text the regex library fails on with a ValueError instead of its own error (`{9s<`, read as fuzzy matching) is searched as plain text, not raised out of the tool."""
        (repo / "odd.txt").write_text("x = {9s<~~W\n")
        result = run(toolbox(repo), "search", pattern="{9s<~~W")
        assert result.ok and result.output == "odd.txt:1: x = {9s<~~W"

    def test_no_match_says_so(self, repo):
        """A search without matches succeeds and says nothing matched."""
        result = run(toolbox(repo), "search", pattern="nothing-like-this")
        assert result.ok and "no matches" in result.output

    def test_matches_are_capped(self, repo):
        """Too many matches stop at the cap with a note to narrow the search."""
        (repo / "many.txt").write_text("hit\n" * (MAX_SEARCH_MATCHES + 50))
        result = run(toolbox(repo), "search", pattern="hit")
        assert result.ok and len(result.output.splitlines()) == MAX_SEARCH_MATCHES + 1
        assert "narrower" in result.output

    def test_backtracking_pattern_stops_without_freezing_the_night(self, repo, monkeypatch):
        """A pattern that backtracks forever is stopped at the search's time limit with a note,
        and the other threads (the other tasks, the watchdog, the signal handler) go on meanwhile."""
        monkeypatch.setattr(search, "SEARCH_TIMEOUT_S", 1.0)
        (repo / "long.txt").write_text("a" * 5000 + "!\n")
        ticks: list[float] = []
        stop = threading.Event()

        def tick() -> None:
            while not stop.is_set():
                ticks.append(time.monotonic())
                time.sleep(0.05)

        ticker = threading.Thread(target=tick)
        ticker.start()
        started = time.monotonic()
        try:
            result = run(toolbox(repo), "search", pattern=r"(a+)+$", path="long.txt")
        finally:
            stop.set()
            ticker.join()
        took = time.monotonic() - started
        assert not result.ok and "backtracks" in result.output and "\n" not in result.output
        assert 0.9 < took < 5
        assert sum(started < t < started + took for t in ticks) >= 10  # ~20 if never blocked

    def test_a_search_of_many_files_out_of_time_shows_what_it_found(self, repo, monkeypatch):
        """A large project searched from its top runs out of time between files: the matches found so far,
        and to search a narrower path (it was a refusal blaming the pattern, which was plain text)."""
        monkeypatch.setattr(search, "SEARCH_TIMEOUT_S", 0.005)  # 2000 files take longer than this
        (repo / "many").mkdir()
        for index in range(2000):
            (repo / "many" / f"m{index:04}.txt").write_text("needle\n" if index % 100 == 0 else "hay\n")
        result = run(toolbox(repo), "search", pattern="needle", path="many")
        assert result.ok and "many/m0000.txt:1: needle" in result.output and "backtracks" not in result.output
        assert "files searched; give a narrower path" in result.output and "m1900.txt" not in result.output

    def test_search_leaves_out_what_git_ignores_unless_asked_for_it(self, repo):
        """Generated output (an ignored build/) crowded the project's own lines out of a search of the
        whole project; searched by name, it is searched. A tracked file is searched whatever .gitignore says."""
        (repo / ".gitignore").write_text("build/\n*.log\n")
        (repo / "build" / "gen").mkdir(parents=True)
        (repo / "build" / "gen" / "out.py").write_text("def add(): pass\n")
        (repo / "run.log").write_text("add failed\n")
        found = run(toolbox(repo), "search", pattern="add", path=".").output
        assert "app.py:1:" in found and "build/" not in found and "run.log" not in found
        assert "build/gen/out.py:1:" in run(toolbox(repo), "search", pattern="add", path="build").output
        assert "build/gen/out.py:1:" in run(toolbox(repo), "search", pattern="add", path="build/gen").output

    def test_search_keeps_the_indentation(self, repo):
        """A matching line is shown with its leading spaces and tabs, so it can be copied into edit_file's `old`."""
        (repo / "ind.py").write_text("def f():\n    if x:\n\treturn 1   \n")
        output = run(toolbox(repo), "search", pattern="if x|return", path="ind.py").output
        assert output == "ind.py:2:     if x:\nind.py:3: \treturn 1"

    def test_search_skips_the_git_file_of_a_worktree_or_submodule(self, repo):
        """A `.git` file (a worktree's, a submodule's) is not searched: the tools may not touch .git."""
        (repo / "sub").mkdir()
        (repo / "sub" / ".git").write_text("gitdir: ../.git/modules/sub\n")
        (repo / "sub" / "a.py").write_text("gitdir = 1\n")
        assert run(toolbox(repo), "search", pattern="gitdir").output == "sub/a.py:1: gitdir = 1"

    def test_search_line_numbers_are_those_of_read_file(self, repo):
        """A form feed or \\u2028 inside a line does not shift the line numbers that read_file's start_line takes."""
        (repo / "ff.py").write_text("a = 1\n\x0cdef target():\n    s = 'x\u2028y'\ntarget()\n")
        box = toolbox(repo)
        assert run(box, "search", pattern="^target", path="ff.py").output == "ff.py:4: target()"
        assert run(box, "read_file", path="ff.py", start_line=4).output == "target()\n"

    def test_search_from_above_skips_a_file_that_links_out_of_the_project(self, repo, tmp_path):
        """A file link to somewhere outside the worktree (a key in ~/.ssh) is not searched through, as
        read_file refuses it; a file link to a file inside is searched."""
        (tmp_path / "outside.txt").write_text("PRIVATE KEY line\n")
        (repo / "leak.txt").symlink_to(tmp_path / "outside.txt")
        (repo / "inside.txt").write_text("PRIVATE KEY of a fixture\n")
        (repo / "src" / "inside_link.txt").symlink_to(repo / "inside.txt")
        found = run(toolbox(repo), "search", pattern="PRIVATE KEY")
        assert found.ok and found.output == "inside.txt:1: PRIVATE KEY of a fixture\nsrc/inside_link.txt:1: PRIVATE KEY of a fixture"

    def test_a_file_search_skips_is_said_to_be_skipped_when_asked_for_by_name(self, repo):
        """A file named as the path that search does not read (over 2 MB, binary) is said to be so, not to hold no matches."""
        (repo / "big.log").write_text("needle\n" + "hay\n" * 600_000)
        (repo / "blob.bin").write_bytes(b"needle\0\1\2")
        box = toolbox(repo)
        big = run(box, "search", pattern="needle", path="big.log")
        assert not big.ok and "more than search reads" in big.output and "read_file" in big.output
        blob = run(box, "search", pattern="needle", path="blob.bin")
        assert not blob.ok and "binary" in blob.output
        assert "no matches" in run(box, "search", pattern="needle", path=".").output

    def test_a_skipped_file_asked_for_by_name_is_said_to_be_skipped_in_these_words(self, repo):
        """Each reason search skips a file it is given by name (a pipe, over 2 MB, binary) reads exactly so."""
        os.mkfifo(repo / "pipe")
        (repo / "big.log").write_text("needle\n" + "hay\n" * 600_000)
        (repo / "blob.bin").write_bytes(b"needle\0\1\2")
        box = toolbox(repo)
        assert [run(box, "search", pattern="needle", path=name) for name in ("pipe", "big.log", "blob.bin")] == [
            ToolResult(False, "'pipe' is not a regular file (a pipe, socket or device); search looks in files only"),
            ToolResult(False, "'big.log' has 2400007 bytes, more than search reads (2000000); read the part you need with read_file, start_line and end_line"),
            ToolResult(False, "'blob.bin' is a binary file; search looks in text files only"),
        ]

    def test_a_file_of_exactly_2_mb_is_searched_and_one_byte_more_is_not(self, repo):
        """A file of 2,000,000 bytes is searched, named or from above; one of 2,000,001 is skipped from above and refused by name."""
        head = b"needle\n"
        (repo / "edge.txt").write_bytes(head + b"x" * (2_000_000 - len(head) - 1) + b"\n")
        (repo / "over.txt").write_bytes(head + b"x" * (2_000_000 - len(head)) + b"\n")
        box = toolbox(repo)
        assert run(box, "search", pattern="needle", path="edge.txt") == ToolResult(True, "edge.txt:1: needle")
        assert run(box, "search", pattern="needle", path=".") == ToolResult(True, "edge.txt:1: needle")
        over = run(box, "search", pattern="needle", path="over.txt")
        assert not over.ok and over.output.startswith("'over.txt' has 2000001 bytes, more than search reads (2000000)")

    def test_a_nul_past_the_first_8192_bytes_leaves_a_named_file_text(self, repo):
        """Only the first 8192 bytes tell a binary file: a file named with a NUL after them is searched, as from above."""
        (repo / "late_nul.txt").write_bytes(b"needle before\n" + b"x" * 8178 + b"\0\nneedle after\n")
        (repo / "early_nul.txt").write_bytes(b"needle before\n" + b"x" * 8177 + b"\0\nneedle after\n")
        box = toolbox(repo)
        assert run(box, "search", pattern="needle", path="late_nul.txt") == ToolResult(True, "late_nul.txt:1: needle before\nlate_nul.txt:3: needle after")
        assert run(box, "search", pattern="needle", path="early_nul.txt") == ToolResult(False, "'early_nul.txt' is a binary file; search looks in text files only")

    def test_a_link_to_a_folder_named_is_searched_as_that_folder_and_skipped_from_above(self, repo):
        """A folder link given as the path searches the folder it links to (named as it is); from above the link is not followed, so nothing is found twice."""
        (repo / "linked").symlink_to(repo / "src")
        box = toolbox(repo)
        assert run(box, "search", pattern="X = 1", path="linked") == ToolResult(True, "src/util.py:1: X = 1")
        assert run(box, "search", pattern="X = 1", path=".") == ToolResult(True, "src/util.py:1: X = 1")

    def test_an_unreadable_file_is_said_so_by_name_and_skipped_from_above(self):
        """A file search may not open is refused by name with the system's reason, and skipped in a search of its folder."""
        ran = as_an_ordinary_user(textwrap.dedent("""
            import json, os, sys
            from pathlib import Path
            from orchestrator.records import ToolCall
            from orchestrator.tools import Toolbox
            root = Path(sys.argv[1])
            (root / "open.txt").write_text("needle open\\n")
            (root / "shut.txt").write_text("needle shut\\n")
            os.chmod(root / "shut.txt", 0)
            box = Toolbox(root, ["search"], check_command="true")
            found = [box.execute(ToolCall("search", {"pattern": "needle", "path": path})) for path in ("shut.txt", ".")]
            print(json.dumps([[result.ok, result.output] for result in found]))
        """))
        assert ran.returncode == 0, ran.stderr
        assert json.loads(ran.stdout) == [
            [False, "'shut.txt' cannot be read (Permission denied); give another path"], [True, "open.txt:1: needle open"],
        ]

    def test_search_from_above_skips_a_file_that_links_into_git(self, repo):
        """A file link to .git/config is not searched through, as read_file refuses it and search skips .git."""
        (repo / "cfg").symlink_to(repo / ".git" / "config")
        (repo / "rel_cfg").symlink_to(".git/config")
        found = run(toolbox(repo), "search", pattern="repositoryformatversion")
        assert found.ok and "no matches" in found.output, found.output

    def test_a_pattern_of_several_lines_is_told_to_search_for_one(self, repo):
        """Several lines copied from a file (as text or with \\n) match nothing line by line: the result says to search for one line, not only that nothing matched."""
        box = toolbox(repo)
        for pattern in ("def add(a, b):\n    return a - b", r"def add\(a, b\):\n"):
            found = run(box, "search", pattern=pattern)
            assert found.ok and "no matches" in found.output and "search for one line of it" in found.output
        assert "one line" not in run(box, "search", pattern="def sub").output

    def test_search_is_line_by_line(self, repo):
        """^ and $ hold at each line, and a match never spans two lines."""
        (repo / "lines.txt").write_text("alpha\nbeta gamma\ngamma\n")
        box = toolbox(repo)
        assert run(box, "search", pattern="^gamma$", path="lines.txt").output == "lines.txt:3: gamma"
        assert "no matches" in run(box, "search", pattern=r"alpha\sbeta", path="lines.txt").output


    @pytest.mark.parametrize(
        ("pattern", "expected"),
        [
            ("needle", MIXED_PROJECT_NEEDLES),
            (r"need\w+", MIXED_PROJECT_NEEDLES),
            ("(?i)NEEDLE", ["B.py:1: NEEDLE upper", *MIXED_PROJECT_NEEDLES]),
            ("^needle$", ["crlf.txt:4: needle", "ff.txt:2: needle"]),
            (r"needle\.", ["a.py:3:   needle.attr", "in_link.txt:3:   needle.attr"]),
            ("\ufffd", ["latin1.txt:1: caf\ufffd needle", "latin1.txt:3: \ufffd\ufffd needle"]),
            ("lone\r", ["crlf.txt:5: lone\rneedle"]),
            (r"\s+needle", [MIXED_PROJECT_NEEDLES[i] for i in (2, 5, 6, 9, 13, 14)]),
        ],
    )
    def test_a_search_of_a_project_of_every_kind_of_file_finds_what_it_found_before(self, repo, tmp_path, pattern, expected):
        """A whole-project search (tracked, untracked, ignored, kept, binary, too big, linked files, a pipe, CRLF, bytes not UTF-8) finds the same lines, in the same order, as before it was made faster."""
        outside = tmp_path / "outside"
        outside.mkdir()
        result = run(toolbox(mixed_project(repo, outside)), "search", pattern=pattern)
        assert result.ok and result.output.split("\n") == expected

    def test_a_pattern_too_big_to_compile_is_refused_with_a_note_to_search_plain_text(self, repo):
        """A pattern whose counted repeats unroll to millions of copies, which took seconds and gigabytes to compile before any time limit, is refused at once in one line."""
        started = time.monotonic()
        result = run(toolbox(repo), "search", pattern="((a{100}){100}){100}")
        assert not result.ok and "plain text" in result.output and "\n" not in result.output
        assert time.monotonic() - started < 0.3

    def test_a_pattern_with_a_large_range_of_repeats_is_still_searched(self, repo):
        """A repeat's range is not unrolled by the compiler, so a large one is searched, not refused."""
        result = run(toolbox(repo), "search", pattern=r"a{1,100000}dd\(")
        assert result.ok and result.output == "app.py:1: def add(a, b):"


class TestCommands:
    def test_run_check_passes_on_exit_zero(self, repo):
        """run_check runs the check command in the root and is ok on exit 0."""
        result = run(toolbox(repo, check_command="test -f app.py && echo fine"), "run_check")
        assert result.ok and "fine" in result.output

    def test_run_check_fails_with_exit_code_and_output(self, repo):
        """A failing check is not ok and shows the exit code and output."""
        result = run(toolbox(repo, check_command="echo broken; exit 2"), "run_check")
        assert not result.ok and "exit code 2" in result.output and "broken" in result.output

    def test_a_command_or_check_killed_by_a_signal_says_so(self, repo):
        """A crash (SIGSEGV) reads as the signal that killed it, not as `exit code -11`."""
        (repo / "crash.py").write_text("import os, signal\nprint('running tests', flush=True)\nos.kill(os.getpid(), signal.SIGSEGV)\n")
        box = toolbox(repo, ["run_command", "run_check"], check_command="python3 crash.py")
        command, check = run(box, "run_command", command="python3 crash.py"), run(box, "run_check")
        assert not command.ok and command.output == "killed by signal 11 (SIGSEGV)\nrunning tests"
        assert not check.ok and check.output == "the check failed: killed by signal 11 (SIGSEGV)\nrunning tests"

    @pytest.mark.parametrize(
        ("command", "named"),
        [("./no_such_script.sh", "127 (command not found)"), ("./not_executable.sh", "126 (the command is not executable)")],
    )
    def test_a_command_or_check_the_shell_could_not_start_says_why(self, repo, command, named):
        """A program that is not there (127) or not executable (126) is named so in run_command's and run_check's results,
        as the morning's `check failed: exit 127 (command not found)` names it."""
        (repo / "not_executable.sh").write_text("echo never\n")
        box = toolbox(repo, ["run_command", "run_check"], check_command=command)
        ran, check = run(box, "run_command", command=command), run(box, "run_check")
        assert not ran.ok and ran.output.startswith(f"exit code {named}\n"), ran.output
        assert not check.ok and check.output.startswith(f"the check failed: exit code {named}\n"), check.output

    def test_run_check_output_is_capped(self, repo):
        """The check's output is capped at max_output_chars."""
        box = toolbox(repo, check_command="seq 1 100000; exit 1", max_output_chars=600)
        result = run(box, "run_check")
        assert not result.ok and len(result.output) <= 600 and "100000" in result.output

    def test_run_command_timeout(self, repo):
        """run_command stops at its timeout and is not ok."""
        box = toolbox(repo, allowed=ALL_TOOLS, command_timeout_s=0.5)
        started = time.monotonic()
        result = run(box, "run_command", command="sleep 30")
        assert not result.ok and "timed out" in result.output and time.monotonic() - started < 5

    def test_run_command_runs_in_the_root(self, repo):
        """run_command runs in the worktree and reports its exit code."""
        result = run(toolbox(repo, allowed=ALL_TOOLS), "run_command", command="ls src")
        assert result.ok and result.output == "exit code 0\nutil.py"

    def test_submit(self, repo):
        """submit marks the result as submitted."""
        result = run(toolbox(repo), "submit", summary="fixed add")
        assert (result.ok, result.output, result.submitted) == (True, "submitted", True)


class TestOutputCap:
    @pytest.mark.parametrize(
        "window, cap",
        [(None, DEFAULT_OUTPUT_CHARS), (4096, 1843), (8192, 3686), (1000, 1500), (1_000_000, DEFAULT_OUTPUT_CHARS)],
    )
    def test_the_cap_is_a_share_of_the_context_window(self, window, cap):
        """A tool result may fill about 15% of a known window (3 chars a token), never less than 1500 or more than 8000 chars."""
        assert output_cap_for(window) == cap

    def test_a_night_caps_tool_output_for_the_models_window(self, tmp_path, server):
        """With a 4096-token window, one read_file shows 1843 chars, not 8000 that would fill half the window."""
        from tests.test_night import overnight

        repo = make_repo(tmp_path / "repo", {**SAMPLE_FILES, "big.py": "x = 1  # a long file\n" * 2000})
        config = write_config(
            tmp_path / "overnight.toml", api_base=server.url, repo=repo,
            model={"context_window": 4096}, night={"max_iterations": 1},
        )
        server.enqueue(call("read_file", {"path": "big.py"}), call("submit", {"summary": "read it"}))
        overnight("run", "--config", str(config))
        shown = next(m["content"] for m in server.requests[1]["messages"] if m["role"] == "tool")
        assert shown.startswith("x = 1") and len(shown) <= output_cap_for(4096)


class TestAllowlist:
    def test_run_command_absent_by_default(self, repo):
        """Without run_command allowed it is not named, has no schema and cannot run."""
        box = toolbox(repo)
        assert box.names() == list(DEFAULT_TOOLS)
        assert "run_command" not in [s["function"]["name"] for s in box.schemas()]
        result = run(box, "run_command", command="touch pwned")
        assert not result.ok and not (repo / "pwned").exists()

    def test_parse_reports_disallowed_tool_as_unknown(self, repo):
        """A call to a tool that is not allowed parses as unknown_tool."""
        response = ModelResponse(text="", tool_calls=(RawToolCall("run_command", '{"command": "ls"}'),))
        (call,) = toolbox(repo, allowed=["read_file", "submit"]).parse(response)
        assert call.problem == "unknown_tool"

    def test_names_follow_the_fixed_order(self, repo):
        """names() follows the order of ALL_TOOLS whatever order they were allowed in."""
        assert toolbox(repo, allowed=["submit", "run_command", "read_file"]).names() == [
            "read_file",
            "submit",
            "run_command",
        ]

    def test_every_schema_has_a_description(self, repo):
        """Each schema is an OpenAI function with a description and an object of parameters."""
        for schema in toolbox(repo, allowed=ALL_TOOLS).schemas():
            function = schema["function"]
            assert schema["type"] == "function" and function["description"]
            assert function["parameters"]["type"] == "object"

    def test_execute_checks_arguments(self, repo):
        """execute refuses arguments that do not fit, even when called directly."""
        box = toolbox(repo)
        misnamed = run(box, "read_file", file="app.py")
        assert not misnamed.ok and "unknown parameter 'file' (takes: path" in misnamed.output
        missing = run(box, "read_file", start_line=1)
        assert not missing.ok and "missing required parameter 'path'" in missing.output


class TestSpecialFiles:
    def test_a_symlink_loop_is_refused_or_skipped(self, repo):
        """Links that point at each other (a test fixture can hold some) are a refusal for the path, and
        skipped by search; they raised RuntimeError, which ended the iteration as iteration_error."""
        (repo / "a").symlink_to("b")
        (repo / "b").symlink_to("a")
        (repo / "src" / "self").symlink_to("self")
        box = toolbox(repo)
        for name, arguments in (
            ("read_file", {"path": "a"}),
            ("write_file", {"path": "src/self/x.py", "content": "x"}),
            ("list_dir", {"path": "src/self"}),
            ("edit_file", {"path": "b", "old": "x", "new": "y"}),
        ):
            result = run(box, name, **arguments)
            assert not result.ok and "loops back on itself" in result.output, (name, result)
        found = run(box, "search", pattern="X = 1")
        assert found.ok and found.output == "src/util.py:1: X = 1"

    def test_a_file_name_that_is_not_utf8_is_shown_as_an_escape(self, repo):
        """Linux names are bytes; one that is not UTF-8 reaches Python as lone surrogates, which no
        transcript or database can write. Tools show it as an escape."""
        with open(os.fsencode(repo / "src") + b"/caf\xe9.py", "w") as handle:
            handle.write("X = 3\n")
        box = toolbox(repo)
        listed = run(box, "list_dir", path="src").output
        found = run(box, "search", pattern="X = 3").output
        assert "caf\\udce9.py" in listed and found == "src/caf\\udce9.py:1: X = 3"
        assert (listed + found).encode("utf-8")

    def test_a_file_name_shown_as_an_escape_can_be_used(self, repo):
        """The escaped name that list_dir and search show opens the file: read, edited, searched, listed."""
        folder = os.fsencode(repo / "src") + b"/caf\xe9"
        os.mkdir(folder)
        with open(folder + b"/caf\xe9.py", "w") as handle:
            handle.write("X = 3\n")
        box = toolbox(repo)
        shown = "src/caf\\udce9/" + run(box, "list_dir", path="src/caf\\udce9").output
        assert shown == "src/caf\\udce9/caf\\udce9.py"
        assert run(box, "read_file", path=shown).output == "X = 3\n"
        assert run(box, "edit_file", path=shown, old="X = 3", new="X = 4").ok
        assert run(box, "search", pattern="X", path=shown).output == f"{shown}:1: X = 4"
        with open(folder + b"/caf\xe9.py") as handle:
            assert handle.read() == "X = 4\n"

    def test_a_pipe_given_to_read_edit_or_search_is_said_to_be_no_regular_file(self, repo):
        """A pipe that list_dir shows is said to be no regular file when named, not "file not found" nor "no matches"."""
        os.mkfifo(repo / "src" / "pipe")
        box = toolbox(repo)
        assert run(box, "list_dir", path="src").output.splitlines() == ["pipe", "util.py"]
        for name, arguments in (
            ("read_file", {"path": "src/pipe"}),
            ("edit_file", {"path": "src/pipe", "old": "a", "new": "b"}),
            ("search", {"pattern": "a", "path": "src/pipe"}),
        ):
            result = run(box, name, **arguments)
            assert not result.ok and "not a regular file" in result.output, (name, result)

    def test_a_pipe_in_the_worktree_never_blocks_a_tool(self, repo):
        """A named pipe (a command the model ran can make one) is refused or skipped; no tool waits on it."""
        os.mkfifo(repo / "src" / "pipe")
        box = toolbox(repo)
        started = time.monotonic()
        written = run(box, "write_file", path="src/pipe", content="x")
        assert not written.ok and "not a regular file" in written.output
        assert not run(box, "read_file", path="src/pipe").ok
        assert not run(box, "edit_file", path="src/pipe", old="a", new="b").ok
        found = run(box, "search", pattern="X = 1", path="src")
        assert found.ok and found.output == "src/util.py:1: X = 1"
        assert time.monotonic() - started < 5


class TestAToolFailingOnTheModelsInput:
    def test_input_nested_past_pythons_recursion_limit_fails_the_call_and_keeps_the_work(self, tmp_path, capsys):
        """A write_file under a thousand new folders (a RecursionError) is a failed call the model goes on from, logged
        `tool_error` with its traceback; it ended the iteration as iteration_error and rolled the model's edit back."""
        import json

        from orchestrator.fake_server import ScriptedServer
        from tests.test_night import FIX, overnight, report_json

        repo = make_repo(tmp_path / "repo", SAMPLE_FILES)
        deep = "e/" * 1100 + "x.txt"
        with ScriptedServer([FIX[2], call("write_file", {"path": deep, "content": "x"}), *FIX[3:]]) as server:
            config = write_config(tmp_path / "overnight.toml", api_base=server.url, repo=repo)
            assert overnight("run", "--config", str(config), "--log-format", "json") == 0
        events = [json.loads(line) for line in capsys.readouterr().err.splitlines() if line.startswith("{")]
        [failed] = [e for e in events if e["event"] == "tool_error"]
        assert failed["tool"] == "write_file" and "RecursionError" in failed["error"] and "Traceback" in failed["exception"]
        assert failed["task"] == "fix-greet" and failed["iteration"] == 1
        [task] = report_json(config, capsys)["tasks"]
        assert task["outcome"] == "succeeded" and [it["outcome"] for it in task["iterations"]] == ["committed"]

    def test_a_secret_in_the_failed_tools_traceback_shows_stars_in_the_log(self, tmp_path, capsys, monkeypatch):
        """A write_file nested too deeply under a folder named after a token: tool_error's traceback (the OSError it
        was raised in quotes the path) shows *** instead."""
        import json

        from orchestrator.fake_server import ScriptedServer
        from tests.test_night import FIX, overnight

        token = "deploy-tok-0123456789abc"
        monkeypatch.setenv("DEPLOY_TOKEN", token)
        repo = make_repo(tmp_path / "repo", SAMPLE_FILES)
        deep = f"{token}/" + "e/" * 1100 + "x.txt"
        with ScriptedServer([FIX[2], call("write_file", {"path": deep, "content": "x"}), *FIX[3:]]) as server:
            config = write_config(tmp_path / "overnight.toml", api_base=server.url, repo=repo)
            capsys.readouterr()
            assert overnight("run", "--config", str(config), "--log-format", "json") == 0
        said = capsys.readouterr()
        [failed] = [json.loads(line) for line in said.err.splitlines() if line.startswith("{") and '"tool_error"' in line]
        assert "RecursionError" in failed["error"] and "/fix-greet/***/e/e/" in failed["exception"]
        assert token not in json.dumps(failed)
