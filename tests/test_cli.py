"""The CLI as cron and CI see it: a real subprocess, exit codes, one-line errors, no tracebacks."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import git, write_config


def overnight(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=60,
        env={**os.environ, "NO_COLOR": "1"},
    )


def assert_one_line_error(result: subprocess.CompletedProcess[str], code: int, *fragments: str) -> None:
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("overnight: error: ")
    for fragment in fragments:
        assert fragment in lines[0]


class TestHelp:
    def test_help_does_not_import_heavy_libraries(self):
        """`overnight --help` imports neither litellm, SQLAlchemy nor GitPython, so it answers at once."""
        probe = (
            "import sys, runpy; sys.argv=['overnight','--help']\n"
            "try:\n    runpy.run_module('orchestrator.cli', run_name='__main__')\n"
            "except SystemExit: pass\n"
            "print(sorted(m for m in ('litellm','sqlalchemy','git') if m in sys.modules))"
        )
        result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
        assert result.stdout.strip().splitlines()[-1] == "[]"
        assert "run" in result.stdout and "report" in result.stdout

    def test_help_keeps_config_table_names(self):
        """Help texts that name a config table show it: `[schedule]` is not swallowed as rich markup."""
        result = overnight("serve", "--help")
        assert result.returncode == 0
        assert "[schedule] cron" in " ".join(result.stdout.split())

    def test_help_is_fast(self):
        """`overnight --help` answers well inside a second even on a busy machine."""
        started = time.perf_counter()
        result = overnight("--help")
        assert result.returncode == 0
        assert time.perf_counter() - started < 2.0


class TestInit:
    def test_init_writes_the_commented_example(self, tmp_path):
        """`overnight init` writes a config that loads, with every section commented."""
        result = overnight("init", cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        text = (tmp_path / "overnight.toml").read_text()
        assert "[model]" in text and "[guards]" in text and "request_timeout_s" in text

    def test_inits_config_has_no_task_to_work_until_you_write_one(self, tmp_path):
        """The example's own task was live: a night from init's file worked `fix-flaky-test` on a repository
        without its test, and README's first task, added as told, repeated its name (exit 2). An outside review."""
        import subprocess as sp

        from orchestrator.config import load_config

        sp.run(["git", "init", "-q", str(tmp_path)], check=True)
        assert overnight("init", cwd=tmp_path).returncode == 0
        assert_one_line_error(overnight("run", cwd=tmp_path), 2, "no tasks defined")
        with (tmp_path / "overnight.toml").open("a") as config:  # README's first task, as README shows it
            config.write('\n[[task]]\nname = "fix-flaky-test"\nprompt = "p"\ncheck = "python -m pytest -q tests/test_clock.py"\n')
        assert [task.name for task in load_config(tmp_path / "overnight.toml").task] == ["fix-flaky-test"]

    def test_the_example_names_every_key_and_shows_its_default(self):
        """Every key of every section is in the example (set, or commented out when it has no default)."""
        import re
        import tomllib

        from orchestrator.config import Config
        from orchestrator.config_writing import example_config_text

        text = example_config_text()
        written = tomllib.loads(text)
        for section, field in Config.model_fields.items():
            if field.exclude:
                continue
            model = field.annotation.__args__[0] if section == "task" else field.annotation
            for key, spec in model.model_fields.items():
                assert re.search(rf"^(# )?{key} = ", text, re.MULTILINE), f"[{section}] {key} is not in the example"
                shown = written.get(section, {}).get(key) if section != "task" else None
                if shown is not None:  # set in the example: to its default (a TOML list for a tuple, a string for a Path)
                    assert type(spec.default)(shown) == spec.default, f"[{section}] {key}: {shown!r} is not the default"

    def test_the_reference_names_every_key_with_its_default(self):
        """docs/reference.md's config tables are the contract outside tests read: each key the code takes
        has a row, each row's key is one the code takes, and the row's default is the code's."""
        import re
        import tomllib

        from orchestrator.config import Config

        reference = (Path(__file__).parent.parent / "docs" / "reference.md").read_text(encoding="utf-8")
        models = {
            section: (field.annotation.__args__[0] if section == "task" else field.annotation)
            for section, field in Config.model_fields.items()
            if not field.exclude
        }
        rows: dict[tuple[str, str], str] = {}
        section = None
        for line in reference.splitlines():
            if heading := re.match(r"#+ `\[+(\w+)\]+`", line):
                section = heading.group(1)
            elif line.startswith("## ") or (line.startswith("#") and not heading):
                section = None
            elif section and line.startswith("| `"):
                cells = [cell.strip() for cell in line.split("|")[1:-1]]
                keys = re.findall(r"`(?:\[(\w+)\] )?(\w+)`", cells[0])
                defaults = re.findall(r"`([^`]+)`", cells[1].split("(")[0]) if section != "task" else []
                for index, (named, key) in enumerate(keys):
                    where = (named or section, key)
                    assert key in models[where[0]].model_fields, f"reference.md: [{where[0]}] {key} is no key the code takes"
                    rows[where] = defaults[index] if index < len(defaults) else ""
        for section, model in models.items():
            for key, spec in model.model_fields.items():
                assert (section, key) in rows, f"[{section}] {key} has no row in reference.md"
                shown = rows[(section, key)]
                if section == "task" or spec.default is None or not shown:
                    continue  # required, "none", or words ("sqlite under `state.dir`")
                value = tomllib.loads(f"v = {shown}")["v"]
                assert type(spec.default)(value) == spec.default, f"reference.md: [{section}] {key} default {shown} is not {spec.default!r}"

    def test_the_embedded_model_runs_at_its_own_temperature_from_inits_config(self, tmp_path):
        """The example set `temperature = 0.2`, which cancelled the embedded model's documented 0 for every
        config `overnight init` wrote (an outside review): a key set in the example is a key the user set."""
        from orchestrator.config import load_config
        from orchestrator.config_writing import example_config_text

        (tmp_path / "overnight.toml").write_text(example_config_text())
        model = load_config(tmp_path / "overnight.toml", require_tasks=False).model
        assert model.name == "local" and "temperature" not in model.model_fields_set

    @pytest.mark.parametrize("where", ["no-such-folder/overnight.toml", "a-folder"])
    def test_init_that_cannot_write_says_why_in_one_line(self, tmp_path, where):
        (tmp_path / "a-folder").mkdir()
        assert_one_line_error(overnight("init", "--force", "--config", where, cwd=tmp_path), 2, "cannot write", where)

    @pytest.mark.parametrize("where", ["newdir/", "newdir/.", "a-folder/"])
    def test_init_given_a_path_that_names_a_folder_writes_nothing(self, tmp_path, where):
        """`-c newdir/` wrote a file named `newdir` (the slash lost on the way to a Path): one line, exit 2, nothing made."""
        (tmp_path / "a-folder").mkdir()
        assert_one_line_error(overnight("init", "-c", where, cwd=tmp_path), 2, f"cannot write {where}: it names a folder")
        assert sorted(p.name for p in tmp_path.iterdir()) == ["a-folder"] and not any((tmp_path / "a-folder").iterdir())

    @pytest.mark.parametrize("mine", ["overnight.toml", "notes.txt"])
    def test_demo_leaves_a_folder_with_anything_in_it_alone(self, tmp_path, mine):
        """`demo --dir` writes overnight.toml and state/ there: a folder already holding files is refused, untouched."""
        (tmp_path / "d").mkdir()
        (tmp_path / "d" / mine).write_text("# mine\n")
        assert_one_line_error(overnight("demo", "--dir", "d", cwd=tmp_path), 2, "not an empty folder")
        assert [p.name for p in (tmp_path / "d").iterdir()] == [mine] and (tmp_path / "d" / mine).read_text() == "# mine\n"

    @pytest.mark.parametrize("where", [".git/demo", ".git/new/demo", ".git/refs", "bare.git/demo"])
    def test_demo_dir_inside_a_git_folder_is_refused_and_writes_nothing(self, tmp_path, where):
        """`demo --dir` inside a git folder (a checkout's .git, a bare repository), made there or not yet, writes no
        sample, config or state among git's files: one line naming the git folder, exit 2, as `init` refuses there."""
        top = tmp_path / "repo"
        top.mkdir()
        git(top, "init", "-q")
        git(top, "commit", "-q", "--allow-empty", "-m", "start")
        git(top, "clone", "-q", "--bare", str(top), str(top / "bare.git"))
        git_folder = top / where.partition("/")[0]
        before = sorted(top.rglob("*"))
        refused = overnight("demo", "--dir", str(top / where), cwd=tmp_path)
        assert_one_line_error(refused, 2, f"--dir {top / where} is inside the git folder {git_folder}")
        assert sorted(top.rglob("*")) == before and refused.stdout == ""

    @pytest.mark.parametrize(("args", "fragment"), [(("init",), "cannot write overnight.toml"), (("demo", "--dir", "d"), "--dir d")])
    def test_a_relative_path_in_a_removed_current_folder_is_one_line(self, tmp_path, args, fragment):
        """`init` or `demo --dir` given a relative path in a shell whose folder was removed since is one line, exit 2, not a traceback."""
        gone = tmp_path / "gone"
        gone.mkdir()
        result = subprocess.run(
            ["sh", "-c", 'cd "$1" && rmdir "$1" && shift && exec "$@"', "sh", str(gone), sys.executable, "-m", "orchestrator.cli", *args],
            capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60, env={**os.environ, "NO_COLOR": "1"},
        )
        assert_one_line_error(result, 2, fragment, "the current folder no longer exists")
        assert list(tmp_path.iterdir()) == []

    def test_demo_dir_that_is_a_file_is_one_line(self, tmp_path):
        (tmp_path / "f").write_text("x")
        assert_one_line_error(overnight("demo", "--dir", "f", cwd=tmp_path), 2, "not an empty folder")

    def test_the_demos_morning_shows_notes_md_as_overnight_notes_does(self, tmp_path):
        """notes.md holding bytes that are not UTF-8 and an escape sequence, as the sample's code the check ran may leave
        it: the demo's morning prints them as `overnight notes` does (U+FFFD, `\\x1b`), not a traceback."""
        import io

        from orchestrator.demo import _print_morning, prepare_sample

        config = prepare_sample(tmp_path / "demo")
        config.notes_path.parent.mkdir(parents=True, exist_ok=True)
        config.notes_path.write_bytes(b"# overnight notes\n\nthe check wrote \xff and \x1b[2J\n")
        out = io.StringIO()
        _print_morning(config, out)
        assert out.getvalue().endswith("the check wrote \ufffd and \\x1b[2J\n"), out.getvalue()

    def test_init_in_a_folder_inside_a_repository_is_refused_as_run_refuses_it(self, tmp_path):
        """`overnight init` in a subfolder of a checkout, whose `[repo] path = "."` `run` refuses, writes nothing and
        says where to run it in one line, exit 2 as `run` exits there; at the checkout's top it writes the example as ever."""
        from orchestrator.config_writing import example_config_text

        top = tmp_path / "repo"
        (top / "sub").mkdir(parents=True)
        git(top, "init", "-q")
        git(top, "commit", "-q", "--allow-empty", "-m", "start")
        refused = overnight("init", cwd=top / "sub")
        assert_one_line_error(refused, 2, f"inside the git repository at {top}", "run `overnight init` there")
        assert list((top / "sub").iterdir()) == [] and refused.stdout == ""
        (top / "sub" / "overnight.toml").write_text('[[task]]\nname = "t"\nprompt = "p"\ncheck = "true"\n')
        assert_one_line_error(overnight("init", "--force", "-c", "sub/overnight.toml", cwd=top), 2, f"at {top}")
        assert (top / "sub" / "overnight.toml").read_text().startswith("[[task]]")
        assert_one_line_error(overnight("run", cwd=top / "sub"), 2, f"a folder inside the one at {top}")
        written = overnight("init", cwd=top)
        assert written.returncode == 0 and written.stderr == ""
        assert written.stdout == "wrote overnight.toml: add your tasks, point [model] at a server, then `overnight run`\n"
        assert (top / "overnight.toml").read_text() == example_config_text()

    @pytest.mark.parametrize("where", [".git", ".git/refs/heads", ".git/worktrees/wt", "bare.git", "bare.git/refs"])
    def test_init_inside_a_git_folder_is_refused_and_writes_nothing(self, tmp_path, where):
        """`overnight init` run in a git folder (a checkout's .git, a worktree's folder in it, a bare repository), or
        given a config there, writes nothing among git's files and says so in one line, exit 2."""
        top = tmp_path / "repo"
        top.mkdir()
        git(top, "init", "-q")
        git(top, "commit", "-q", "--allow-empty", "-m", "start")
        git(top, "worktree", "add", "-q", str(tmp_path / "wt"))
        git(top, "clone", "-q", "--bare", str(top), str(top / "bare.git"))
        folder = top / where
        git_folder = top / (".git/worktrees/wt" if where == ".git/worktrees/wt" else where.partition("/")[0])
        before = sorted(folder.iterdir())
        refused = overnight("init", cwd=folder)
        assert_one_line_error(refused, 2, f"{folder} is inside the git folder {git_folder}", "at the top of a checkout")
        given = overnight("init", "--force", "-c", str(folder / "overnight.toml"), cwd=tmp_path)
        assert_one_line_error(given, 2, f"inside the git folder {git_folder}")
        assert sorted(folder.iterdir()) == before and refused.stdout == given.stdout == ""

    def test_init_in_a_submodules_git_folder_is_refused_as_a_git_folder(self, tmp_path):
        """`overnight init` in a submodule's git folder (.git/modules/sm, whose core.worktree names the submodule's
        checkout) is refused as inside that git folder, not as a folder inside the submodule's checkout it is not in."""
        source = tmp_path / "source"
        source.mkdir()
        git(source, "init", "-q")
        git(source, "commit", "-q", "--allow-empty", "-m", "start")
        top = tmp_path / "repo"
        top.mkdir()
        git(top, "init", "-q")
        git(top, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(source), "sm")
        git_folder = top / ".git" / "modules" / "sm"
        before = sorted(git_folder.iterdir())
        refused = overnight("init", cwd=git_folder)
        assert_one_line_error(refused, 2, f"{git_folder} is inside the git folder {git_folder}", "at the top of a checkout")
        assert sorted(git_folder.iterdir()) == before

    def test_init_does_not_import_gitpython(self, tmp_path):
        """`overnight init` judges the folder with git itself: it imports none of GitPython, whose import runs `git version`."""
        probe = (
            "import sys, runpy; sys.argv=['overnight','init']\n"
            "try:\n    runpy.run_module('orchestrator.cli', run_name='__main__')\n"
            "except SystemExit: pass\n"
            "print('git' in sys.modules)"
        )
        result = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert result.stdout.splitlines()[-1] == "False", result.stderr
        assert (tmp_path / "overnight.toml").is_file()

    def test_init_where_git_is_broken_writes_the_example(self, tmp_path):
        """With a git on PATH that fails every command, `overnight init` cannot judge the folder and writes the example as ever."""
        from orchestrator.config_writing import example_config_text

        broken = tmp_path / "bin"
        broken.mkdir()
        (broken / "git").write_text("#!/bin/sh\necho 'git: broken' >&2\nexit 1\n")
        (broken / "git").chmod(0o755)
        (tmp_path / "project").mkdir()
        result = subprocess.run(
            [sys.executable, "-m", "orchestrator.cli", "init"], cwd=tmp_path / "project", capture_output=True, text=True,
            stdin=subprocess.DEVNULL, timeout=60, env={**os.environ, "NO_COLOR": "1", "PATH": f"{broken}{os.pathsep}{os.environ['PATH']}"},
        )
        assert (result.returncode, result.stderr) == (0, "")
        assert (tmp_path / "project" / "overnight.toml").read_text() == example_config_text()

    def test_init_refuses_to_overwrite(self, tmp_path):
        """A second `overnight init` leaves the user's config alone and says so in one line."""
        (tmp_path / "overnight.toml").write_text("mine")
        assert_one_line_error(overnight("init", cwd=tmp_path), 2, "already exists")
        assert (tmp_path / "overnight.toml").read_text() == "mine"


REPOSITORY = Path(__file__).parent.parent


def reference_section(heading: str, up_to: str) -> str:
    """The text of docs/reference.md from `heading` to the next `up_to` heading."""
    reference = (REPOSITORY / "docs" / "reference.md").read_text(encoding="utf-8")
    return reference.split(heading, 1)[1].split(up_to, 1)[0]


def exit_codes_in_the_code() -> dict[int, str]:
    """Every exit code the code names (an `EXIT_*` constant, an error's `exit_code`, a signal's code) or
    passes as a number to whatever exits (`sys.exit(130)`, `fail("aborted", 1)`), with where it was found."""
    import ast
    import importlib
    import pkgutil

    import orchestrator

    codes: dict[int, str] = {}
    for module_info in pkgutil.iter_modules(orchestrator.__path__):
        module = importlib.import_module(f"orchestrator.{module_info.name}")
        for name, value in vars(module).items():
            if name.startswith("EXIT_") and type(value) is int:
                codes.setdefault(value, f"{module.__name__}.{name}")
            elif name.endswith("EXIT_CODES") and isinstance(value, dict):
                codes.update({code: f"{module.__name__}.{name}" for code in value.values() if code not in codes})
            elif isinstance(value, type) and value.__module__ == module.__name__ and type(getattr(value, "exit_code", None)) is int:
                codes.setdefault(value.exit_code, f"{module.__name__}.{name}.exit_code")
        tree = ast.parse(Path(module.__file__).read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            callee = node.func.attr if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) else getattr(getattr(node, "func", None), "id", "")
            if callee in ("exit", "_exit", "Exit", "fail", "_leave_now") and node.args:
                last = node.args[-1]
                if isinstance(last, ast.Constant) and type(last.value) is int:
                    codes.setdefault(last.value, f"{module.__name__}: {callee}({last.value}), line {node.lineno}")
    return codes


def reason_codes_in_the_code() -> dict[str, str]:
    """Every reason code the code writes, with the file it was found in: what a guard stops with
    (`QualityError`) or reports (`ctx.report`), a cancel's or an ending's `reason`, a guard's kinds and
    a task's reasons (module constants of guards/, orchestrator/night.py, night_state.py, task_night.py, ended_without_work.py
    and task_work.py); a name is read as the string constant it names in any of the product's modules."""
    import ast
    import re

    code = re.compile(r"[a-z]+(_[a-z]+)*")
    task_reason_modules = ("night.py", "night_state.py", "task_night.py", "ended_without_work.py", "task_work.py")
    sources = sorted([*REPOSITORY.glob("orchestrator/*.py"), *REPOSITORY.glob("guards/*.py"), *REPOSITORY.glob("runs/*.py")])
    trees = {source: ast.parse(source.read_text(encoding="utf-8")) for source in sources}
    constants: dict[str, str] = {}
    found: dict[str, str] = {}
    for source, tree in trees.items():
        for node in tree.body:
            if not isinstance(node, ast.Assign):
                continue
            target = node.targets[0]
            pairs = zip(target.elts, node.value.elts) if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple) else [(target, node.value)]
            for name, value in pairs:
                if isinstance(name, ast.Name) and isinstance(value, ast.Constant) and isinstance(value.value, str):
                    constants[name.id] = value.value
                    if code.fullmatch(value.value) and (source.parent.name == "guards" or source.name in task_reason_modules):
                        found.setdefault(value.value, source.name)

    def written(expression: ast.expr) -> str | None:
        if isinstance(expression, ast.Constant) and isinstance(expression.value, str):
            return expression.value
        return constants.get(expression.id) if isinstance(expression, ast.Name) else None

    for source, tree in trees.items():
        for node in ast.walk(tree):
            spots: list[ast.expr] = []
            if isinstance(node, ast.Call):
                callee = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                if callee in ("QualityError", "Cancelled", "cancel") and node.args:
                    spots.append(node.args[0])
                if callee == "report" and len(node.args) >= 2:
                    spots.append(node.args[1])
                spots += [keyword.value for keyword in node.keywords if keyword.arg in ("reason", "never_begun_reason")]
            elif isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Tuple) and isinstance(node.value, ast.Tuple):
                spots += [value for name, value in zip(node.targets[0].elts, node.value.elts) if getattr(name, "id", "") == "reason"]
            elif isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "reason":
                spots.append(node.value)
            for spot in spots:
                value = written(spot)
                if value and code.fullmatch(value):
                    found.setdefault(value, source.name)
    return found


class TestTheReferenceListsWhatTheCodeDoes:
    def test_every_exit_code_is_a_row_of_the_exit_code_table(self):
        """Each exit code the code can end with has a row in reference.md's exit-code table, and each row is one it can."""
        import re

        table = reference_section("## Exit codes", "\n## ")
        rows = {int(code) for line in table.splitlines() if (first := re.match(r"\| ([\d /]+) \|", line)) for code in first.group(1).split("/")}
        codes = exit_codes_in_the_code()
        assert {0, 1, 2, 3, 4, 75, 129, 130, 141, 143} <= set(codes)  # the scan finds them
        assert {code: where for code, where in codes.items() if code not in rows} == {}
        assert sorted(rows - set(codes)) == []

    def test_the_commands_table_names_each_command_and_option_overnight_takes(self):
        """reference.md's "Commands" table has a row per command `overnight --help` lists, with each option its `--help`
        shows and none it does not take; the hidden `--scheduled-for` is described under the table instead."""
        import re

        import typer.main

        from orchestrator.cli import app

        commands = typer.main.get_command(app).commands
        shown = {name: {o for p in c.params if not p.hidden for o in p.opts if o.startswith("--")} - {"--help"}
                 for name, c in commands.items()}
        table = reference_section("## Commands", "\n\n`--config` defaults")
        rows = {row.group(1): set(re.findall(r"--[a-z-]+", row.group(2)))
                for row in re.finditer(r"^\| `overnight (\w+)([^`]*)`", table, re.MULTILINE)}
        assert rows == shown
        hidden = {o for c in commands.values() for p in c.params if p.hidden for o in p.opts}
        assert hidden == {"--scheduled-for"} and "`--scheduled-for TIME`" in reference_section("### `overnight run`", "\n### ")

    def test_every_reason_code_the_code_writes_is_in_the_reference(self):
        """Each reason code a guard, an iteration or a task can end with is named in reference.md's "Reason codes" or "Outcomes"."""
        listed = reference_section("## Reason codes", "## `overnight report --json`")
        codes = reason_codes_in_the_code()
        # The scan finds each way a reason is written: a guard's stop, a problem's kind, a cancel, a task's reason, recovery's.
        assert {"repeated_tool_call", "unknown_tool", "empty_tool_name", "many_calls", "max_turns", "lease_lost", "deadline",
                "leased", "failed_earlier_tonight", "night_crashed", "interrupted"} <= set(codes)
        assert {code: where for code, where in codes.items() if f"`{code}`" not in listed} == {}

    def test_the_outcomes_are_exactly_the_references(self):
        """reference.md's "Outcomes" lists each iteration and task outcome the code has, and none it has not."""
        import re

        from orchestrator.records import IterationOutcome, TaskOutcome

        section = reference_section("## Outcomes", "A task's `reason`")
        iterations, tasks = section.split("Iteration:", 1)[1].split("Task:", 1)
        assert set(re.findall(r"`(\w+)`", iterations)) == {outcome.value for outcome in IterationOutcome}
        assert set(re.findall(r"`(\w+)`", tasks)) == {outcome.value for outcome in TaskOutcome}

    def test_each_name_architecture_md_cites_is_in_the_code(self):
        """Each file docs/architecture.md cites exists, each `module.name` or `Class.name` it cites is defined there, and
        each `snake_case` name it cites is one the code has (a function, attribute or argument, or a word of a string: a reason or event),
        and each `CamelCase` name it cites is a class of ours or a name the code uses."""
        import ast
        import re

        text = (REPOSITORY / "docs" / "architecture.md").read_text(encoding="utf-8")
        sources = [*REPOSITORY.glob("orchestrator/*.py"), *REPOSITORY.glob("runs/*.py"), *REPOSITORY.glob("guards/*.py")]
        defined_in: dict[str, set[str]] = {}  # a module's or a class's name: everything defined in it, attributes included
        known: set[str] = set()  # every name the code uses, and every word of its strings
        for source in sources:
            tree = ast.parse(source.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    known.update(re.findall(r"\w+", node.value))
                else:
                    known.update(str(value) for field in ("name", "id", "attr", "arg") if isinstance(value := getattr(node, field, None), str))
            scopes = [(source.stem, tree)] + [(node.name, node) for node in ast.walk(tree) if isinstance(node, ast.ClassDef)]
            for scope, root in scopes:
                names = defined_in.setdefault(scope, set())
                for node in ast.walk(root):
                    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                        names.add(node.name)
                    elif isinstance(node, (ast.Name, ast.Attribute)) and isinstance(node.ctx, ast.Store):
                        names.add(node.id if isinstance(node, ast.Name) else node.attr)
                    elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                        names.add(node.target.id)
        cited_files = set(re.findall(r"`((?:orchestrator|runs|guards|bench|docs|tests|scripts)/[\w./-]*\w)`", text))
        cited_files |= {f"orchestrator/{name}" for name in re.findall(r"`(\w+\.py)`", text)
                        if not (REPOSITORY / "runs" / name).exists() and not (REPOSITORY / "guards" / name).exists()}
        assert sorted(path for path in cited_files if not (REPOSITORY / path).exists()) == []
        cited_names = [(scope, name) for scope, name in re.findall(r"`(\w+)\.(\w+)(?:\([^`]*\))?`", text) if name not in ("py", "md")]
        assert ("trimming", "trim_transcripts") in cited_names  # the pattern finds them
        assert sorted(f"{scope}.{name}" for scope, name in cited_names if scope in defined_in and name not in defined_in[scope]) == []
        # A class renamed or moved leaves its citations (`_TaskRun.cancel`, `_Finisher`) naming nothing: each CamelCase
        # name cited, alone or as a scope, is a class of ours or one the code uses (a library's: `ThreadPoolExecutor`).
        classes = {name for names in defined_in.values() for name in names if name[:1].isupper() or name[1:2].isupper()}
        cited_classes = set(re.findall(r"`(_?[A-Z][a-z0-9]+\w*)(?:[.(`])", text))
        test_classes = {name for test in REPOSITORY.glob("tests/*.py") for name in re.findall(r"^class (Test\w+)", test.read_text(encoding="utf-8"), re.M)}
        assert sorted(name for name in cited_classes if name not in classes | test_classes and name not in known) == []
        assert sorted(name for name in set(re.findall(r"`([a-z_][a-z0-9_]*_[a-z0-9_]*)`", text)) if name not in known) == []


class TestBadConfig:
    @pytest.mark.parametrize(
        ("extra", "fragments"),
        [
            ("[store]\nnmae = 'x'\n", ("unknown key [store] nmae",)),
            ("[guards]\nrepeat_stop_at = 'four'\n", ("[guards] repeat_stop_at",)),
            ("[guards]\nbroken_stop_at = 0\n", ("[guards] broken_stop_at",)),
            ("[guards]\nrepeat_remind_at = 5\n", ("[guards]", "repeat_remind_at")),
            ("[guards]\nfailing_streak_stop_at = 2\n", ("[guards]", "failing_streak_stop_at")),
            ("[guards]\ndead_loop_distinct = 4\n", ("[guards]", "dead_loop_distinct must be below dead_loop_recent")),
            ("[[task]]\nname = 'a b'\nprompt = 'p'\ncheck = 'true'\n", ("[[task]] #2 name",)),
            ("[[task]]\nname = 'fix-greet'\nprompt = 'p'\ncheck = 'true'\n", ("appears twice",)),
            ("[[task]]\nname = 'Fix-Greet'\nprompt = 'p'\ncheck = 'true'\n", ("'fix-greet' and 'Fix-Greet' differ only in case",)),
            ("[[task]]\nname = 'x'\nprompt = 'p'\ncheck = 'true'\ntools = ['sudo']\n", ("[[task]] #2 tools", "sudo")),
            ("[[task]]\nname = 'y'\nprompt = 'p'\n", ("[[task]] #2 check", "missing")),
            ("[[task]]\nname = 'z'\npromt = 'p'\ncheck = 'true'\n", ("unknown key [[task]] #2 promt (did you mean prompt?)",)),
            ("[schedule]\nmisfire_grace = 60\n", ("unknown key [schedule] misfire_grace (did you mean misfire_grace_s?)",)),
            ("[[task]]\nname = 'z'\nprompt = 'p'\ncheck = 'true'\npass_envs = ['A']\n", ("pass_envs (did you mean pass_env?)",)),
            ("this is = = not toml\n", ("not valid TOML",)),
            ("[[task]]\nname = 'x'\nprompt = 'p'\ncheck = 'true'\ntools = 'run_command'\n", ("[[task]] #2 tools: must be a list",)),
        ],
    )
    def test_bad_config_exits_2_with_one_line(self, tmp_path, repo, extra, fragments):
        """Each broken config exits 2 with one stderr line naming the key, and no traceback."""
        config = write_config(tmp_path / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=repo, extra=extra)
        assert_one_line_error(overnight("run", "--config", str(config)), 2, *fragments)

    @pytest.mark.parametrize(
        ("sections", "fragments"),
        [
            ({"night": {"check_timeout_s": float("inf")}}, ("[night] check_timeout_s", "finite")),
            ({"night": {"command_timeout_s": 1e300}}, ("[night] command_timeout_s",)),
            ({"model": {"request_timeout_s": float("nan")}}, ("[model] request_timeout_s",)),
            ({"model": {"retry_backoff_s": float("inf")}}, ("[model] retry_backoff_s",)),
            ({"model": {"api_base": "http://127.0.0.1:99999/v1"}}, ("[model] api_base", "Port out of range")),
            ({"model": {"api_base": "127.0.0.1:8080/v1"}}, ("[model] api_base", "http://")),
            ({"extra": "[store]\nurl = 'nonsense'\n"}, ("[store] url", "not a SQLAlchemy URL")),
            ({"extra": "[store]\nurl = 'sqlite:///:memory:'\n"}, ("[store] url", "in-memory")),
            ({"tasks": [{"name": "foo.", "prompt": "p", "check": "true"}]}, ("[[task]] #1 name", "not ending in '.'")),
            ({"tasks": [{"name": "foo\n", "prompt": "p", "check": "true"}]}, ("[[task]] #1 name", "letters, digits")),
            # "must be letters" refused "größe", whose letters are letters: the rule the line gives is the one applied.
            ({"tasks": [{"name": "größe", "prompt": "p", "check": "true"}]}, ("[[task]] #1 name", "ASCII letters")),
            ({"tasks": [{"name": "x" * 65, "prompt": "p", "check": "true"}]}, ("[[task]] #1 name", "1 to 64")),
            ({"tasks": [{"name": "foo", "prompt": "p", "check": "true\u0000"}]}, ("[[task]] #1 check", "NUL")),
            ({"extra": "[store]\nurl = 'mysql://u@localhost/db'\n"}, ("[store] url", "'mysql'", "sqlite or postgresql")),
            ({"model": {"retries": 1000}}, ("[model] retries",)),
            ({"guards": {"progress_tools": ["write-file"]}}, ("[guards] progress_tools", "write-file")),
            # cron's PATH without the virtualenv: every iteration would fail with exit 127, blamed on the model.
            ({"tasks": [{"name": "t", "prompt": "p", "check": "CI=1 no-such-checker --all"}]}, ("[[task]] 't'", "'no-such-checker'", "not on PATH")),
        ],
    )
    def test_values_that_would_fail_the_night_later_are_refused_at_load(self, tmp_path, repo, sections, fragments):
        """Infinite timeouts, a port past 65535, an in-memory store, a name git refuses: exit 2 before anything starts."""
        config = write_config(tmp_path / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=repo, **sections)
        assert_one_line_error(overnight("run", "--config", str(config)), 2, *fragments)
        assert not (tmp_path / "state" / "runs.db").exists()

    def test_checks_the_shell_finds_are_accepted(self, tmp_path, repo, capsys):
        """Builtins, keywords, paths of the repository's own and compound commands are the shell's to find: no refusal."""
        from orchestrator.build import check_inputs
        from orchestrator.config import load_config

        checks = [
            "cd . && python check_greet.py", "test -f greet.py", "if true; then python check_greet.py; fi", "./not-yet-written.sh", "(cd . && true)",
            # A check that sets its own PATH finds what overnight's PATH may not have.
            f"PATH={tmp_path}/bin:$PATH own-checker", f"export PATH={tmp_path}/bin:$PATH; own-checker",
        ]
        (tmp_path / "bin").mkdir()
        (tmp_path / "bin" / "own-checker").write_text("#!/bin/sh\nexit 0\n")
        (tmp_path / "bin" / "own-checker").chmod(0o755)
        tasks = [{"name": f"t{index}", "prompt": "p", "check": check} for index, check in enumerate(checks)]
        config = write_config(tmp_path / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=repo, tasks=tasks)
        check_inputs(load_config(config))

    @pytest.mark.parametrize(
        ("args", "fragment"),
        [
            (("run", "--bogus"), "No such option: --bogus"),
            (("run", "--config"), "'--config' requires an argument"),
            (("nosuchcmd",), "No such command 'nosuchcmd'"),
            (("report", "--json=1"), "'--json' does not take a value"),
        ],
    )
    def test_a_command_line_mistake_exits_2_with_one_line(self, tmp_path, args, fragment):
        """Usage errors are one line and exit 2, whichever copy of click typer raises them from."""
        assert_one_line_error(overnight(*args, cwd=tmp_path), 2, fragment)

    def test_no_command_prints_the_help(self, tmp_path):
        result = overnight(cwd=tmp_path)
        assert result.returncode == 0 and "Traceback" not in result.stderr
        assert "run" in result.stdout and "report" in result.stdout

    @pytest.mark.parametrize("command", [("report",), ("report", "--json")])
    def test_a_state_dir_that_is_a_file_is_one_line_exit_4(self, tmp_path, repo, command):
        config = write_config(tmp_path / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=repo)
        (tmp_path / "state").write_text("not a folder")
        assert_one_line_error(overnight(*command, "--config", str(config)), 4, "a file is in the way")

    @pytest.mark.parametrize(
        ("key", "command"), [("state", "run"), ("state", "report"), ("state", "notes"), ("state", "gc"), ("repo", "run"), ("repo", "gc")]
    )
    def test_a_symlink_loop_in_a_path_is_one_line(self, tmp_path, repo, command, key):
        (tmp_path / "loop").symlink_to("loop")
        config = write_config(tmp_path / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=repo)
        text = config.read_text()
        text = text.replace('dir = "state"', 'dir = "loop/state"') if key == "state" else text.replace(f'path = {json.dumps(str(repo))}', 'path = "loop"')
        config.write_text(text)
        assert_one_line_error(overnight(command, "--config", str(config)), 4 if key == "state" else 2, f"[{key}]", "cannot be resolved")

    def test_a_relative_sqlite_store_is_in_the_configs_folder_whatever_the_working_folder(self, tmp_path, repo):
        config = write_config(tmp_path / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=repo, extra="[store]\nurl = 'sqlite:///runs-here.db'\n")
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        overnight("run", "--config", str(config), cwd=elsewhere)
        assert (tmp_path / "runs-here.db").exists() and not list(elsewhere.iterdir())
        assert overnight("report", "--config", str(config), cwd=elsewhere).returncode == 0

    def test_report_before_any_run_hides_the_stores_password(self, tmp_path, repo):
        config = write_config(
            tmp_path / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=repo,
            extra="[store]\nurl = 'postgresql+psycopg://u:SECRETPW@127.0.0.1:9/db?connect_timeout=1'\n",
        )
        result = overnight("report", "--config", str(config))
        assert result.returncode in (1, 4) and "SECRETPW" not in result.stderr and "Traceback" not in result.stderr, result.stderr

    def test_a_broken_config_with_json_logs_is_a_json_line(self, tmp_path):
        (tmp_path / "bad.toml").write_text("x==\n")
        result = overnight("run", "--config", str(tmp_path / "bad.toml"), "--log-format", "json")
        assert result.returncode == 2
        (line,) = result.stderr.strip().splitlines()
        event = json.loads(line)
        assert event["event"] == "command_failed" and "not valid TOML" in event["error"] and event["exit_code"] == 2

    @pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root to give the repository to another user")
    def test_a_repository_of_another_user_is_named_as_such(self, tmp_path, repo):
        """cron running as another user than the repository's owner: git refuses it ("dubious ownership"), not a bad base."""
        import pwd

        subprocess.run(["chown", "-R", str(pwd.getpwnam("nobody").pw_uid), str(repo)], check=True)
        config = write_config(tmp_path / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=repo)
        assert_one_line_error(overnight("run", "--config", str(config)), 2, "[repo] path", "dubious ownership", "safe.directory")

    @pytest.mark.parametrize("name", ["llama3", "nosuchprovider/x"])
    def test_a_model_name_litellm_cannot_route_is_a_config_error(self, tmp_path, repo, name):
        """Not exit 3 ("unreachable") with the task paused: it would fail the same way every night. Said
        before the state dir, its lock and the run store are made, as every config error is."""
        config = write_config(tmp_path / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=repo, model={"name": name})
        assert_one_line_error(overnight("run", "--config", str(config)), 2, "[model] name", repr(name), "provider/model")
        assert not (tmp_path / "state").exists()

    @pytest.mark.parametrize("state", ["repo", "repo/.git/overnight"])
    def test_a_state_dir_that_is_the_repository_or_in_its_git_folder_is_refused(self, tmp_path, repo, state):
        config = write_config(tmp_path / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=repo)
        config.write_text(config.read_text().replace('dir = "state"', f'dir = "{state}"'))
        assert_one_line_error(overnight("run", "--config", str(config)), 2, "[state] dir", "a folder of its own")
        assert git(repo, "status", "--porcelain") == ""

    @pytest.mark.parametrize(
        ("text", "fragment"),
        [
            ("[task]\nname = 'a'\n", "[[task]]: write each task as a [[task]] table"),
            ("[state]\ndir = []\n", "[state] dir: must be a path"),
            ("model = 3\n", "[model]: must be a table"),
        ],
    )
    def test_a_wrong_shape_is_said_in_plain_words(self, tmp_path, text, fragment):
        (tmp_path / "overnight.toml").write_text(text)
        result = overnight("run", "--config", str(tmp_path / "overnight.toml"))
        assert_one_line_error(result, 2, fragment)
        assert "class" not in result.stderr and "instance of" not in result.stderr

    def test_a_config_that_is_a_pipe_is_refused_instead_of_read_forever(self, tmp_path):
        os.mkfifo(tmp_path / "overnight.toml")
        assert_one_line_error(overnight("run", "--config", str(tmp_path / "overnight.toml")), 2, "not a regular file")

    def test_missing_config_file(self, tmp_path):
        """A missing config file says where it looked and how to make one."""
        assert_one_line_error(overnight("run", "--config", str(tmp_path / "nope.toml")), 2, "not found", "overnight init")

    def test_no_config_in_the_current_folder_names_the_folder_and_config_option(self, tmp_path):
        """`overnight report` run away from the config's folder says which file it looked for and how to name another."""
        assert_one_line_error(overnight("report", cwd=tmp_path), 2, f"not found: {tmp_path / 'overnight.toml'}", "--config")

    def test_config_saved_with_a_byte_order_mark_is_read(self, tmp_path, repo):
        """Windows editors start UTF-8 files with a byte-order mark; the config reads as without one."""
        config = write_config(tmp_path / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=repo)
        config.write_bytes(b"\xef\xbb\xbf" + config.read_bytes())
        result = overnight("report", "--config", str(config))
        assert "no runs recorded yet" in result.stderr and "TOML" not in result.stderr

    def test_no_tasks(self, tmp_path):
        """A config without tasks is a configuration error."""
        config = tmp_path / "overnight.toml"
        config.write_text("[model]\nname = 'openai/x'\n")
        assert_one_line_error(overnight("run", "--config", str(config)), 2, "[[task]]")

    def test_repo_that_is_not_git(self, tmp_path):
        """A [repo] path that is not a git repository is named, before any run is recorded."""
        plain = tmp_path / "plain"
        plain.mkdir()
        config = write_config(tmp_path / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=plain)
        assert_one_line_error(overnight("run", "--config", str(config)), 2, "[repo] path", "not a git repository")
        assert not (tmp_path / "state").exists()  # nothing made, not even the lock

    def test_repo_path_inside_a_repository_names_its_top(self, tmp_path, repo):
        """A monorepo's project folder as [repo] path: "not a git repository" misled; the line names the repository it is in."""
        (repo / "services" / "api").mkdir(parents=True)
        config = write_config(tmp_path / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=repo / "services" / "api")
        assert_one_line_error(overnight("run", "--config", str(config)), 2, "[repo] path", f"inside the one at {repo}")

    def test_repo_path_inside_its_git_folder_names_that_folder(self, tmp_path, repo):
        """A [repo] path among git's own files (.git/refs) is named as inside the repository's git folder, as a subfolder of the checkout is named inside it."""
        config = write_config(tmp_path / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=repo / ".git" / "refs")
        assert_one_line_error(overnight("run", "--config", str(config)), 2, "[repo] path", f"inside the git folder {repo / '.git'}")
        assert not (tmp_path / "state").exists()

    def test_bare_repository(self, tmp_path, repo):
        """A bare repository has no checkout to branch task worktrees beside: named, before any run is recorded."""
        bare = tmp_path / "bare.git"
        subprocess.run(["git", "clone", "-q", "--bare", str(repo), str(bare)], check=True)
        config = write_config(tmp_path / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=bare)
        assert_one_line_error(overnight("run", "--config", str(config)), 2, "[repo] path", "bare repository")
        assert not (tmp_path / "state").exists()  # nothing made, not even the lock

    def test_a_repository_with_no_commit_yet_says_so(self, tmp_path):
        """A branch not yet born: commit something first."""
        empty = tmp_path / "empty"
        git(tmp_path, "init", "-q", "-b", "main", str(empty))
        config = write_config(tmp_path / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=empty)
        assert_one_line_error(overnight("run", "--config", str(config)), 2, "[repo] path", "has no commits yet")

    @pytest.mark.parametrize(("held", "shown"), [("garbage\n", "holds 'garbage'"), ("", "holds nothing")])
    def test_a_branch_ref_that_names_no_commit_is_called_broken(self, tmp_path, repo, held, shown):
        """A ref file of `garbage` was "has no commits yet" (of a repository with years of them); an empty one (a crash
        mid-write) a traceback. One line naming the ref, exit 2, nothing made."""
        (repo / ".git" / "refs" / "heads" / "main").write_text(held)
        config = write_config(tmp_path / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=repo)
        result = overnight("run", "--config", str(config))
        assert_one_line_error(result, 2, "[repo] path", f"broken ref: refs/heads/main {shown}, not a commit", "git update-ref")
        assert not (tmp_path / "state").exists()

    def test_base_that_names_no_commit(self, tmp_path, repo):
        """A [repo] base that is no branch, tag or commit is named, before any run is recorded."""
        config = write_config(tmp_path / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=repo)
        config.write_text(config.read_text().replace("[repo]\n", '[repo]\nbase = "no-such-branch"\n'))
        assert_one_line_error(overnight("run", "--config", str(config)), 2, "[repo] base", "no-such-branch")
        assert not (tmp_path / "state").exists()  # nothing made, not even the lock

    def test_unknown_log_format(self, tmp_path, repo):
        """A bad option value is a usage error (exit 2)."""
        config = write_config(tmp_path / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=repo)
        result = overnight("run", "--config", str(config), "--log-format", "xml")
        assert_one_line_error(result, 2, "--log-format")

    @pytest.mark.parametrize("when", ["2026-12-02T01:30:00", "tonight"])
    def test_a_scheduled_for_time_without_its_offset_is_a_usage_error(self, tmp_path, repo, when):
        """`--scheduled-for` (serve passes it) needs its UTC offset (reference.md: exit 2): read as this
        host's time or as UTC, a fire time could be hours off, and with it which earlier runs count."""
        config = write_config(tmp_path / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=repo)
        result = overnight("run", "--config", str(config), "--scheduled-for", when)
        assert_one_line_error(result, 2, "--scheduled-for", "offset")
        assert not (tmp_path / "state").exists()

    @pytest.mark.parametrize("when", ["9999-12-31T23:59:59+14:00", "9999-12-31T23:59:59-14:00", "0001-01-01T00:00:00+05:00", "1969-12-31T23:59:59+00:00"])
    def test_a_scheduled_for_time_out_of_range_is_named_as_such(self, tmp_path, repo, when):
        """A `--scheduled-for` time with its offset that falls outside the years the run store holds (one past year 9999
        in UTC included) is refused as out of range, in one line, exit 2: not as a time that lacks its offset."""
        config = write_config(tmp_path / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=repo)
        result = overnight("run", "--config", str(config), "--scheduled-for", when)
        assert_one_line_error(result, 2, f"--scheduled-for: {when!r} is out of range", "years 1970 to 9998")
        assert "offset" not in result.stderr and not (tmp_path / "state").exists()

    def test_report_before_any_run(self, tmp_path, repo):
        """`overnight report` with no runs yet says so in one line (exit 1, not 4: nothing is broken),
        `--json` still prints JSON, and reading creates neither the state dir nor the database."""
        config = write_config(tmp_path / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=repo)
        result = overnight("report", "--config", str(config))
        assert result.returncode == 1 and "no runs recorded yet" in result.stderr and "Traceback" not in result.stderr
        as_json = overnight("report", "--config", str(config), "--json")
        assert as_json.returncode == 1 and json.loads(as_json.stdout) == {"run": None, "tasks": []}
        assert not (tmp_path / "state").exists()


class TestOtherCommands:
    def test_serve_next_prints_the_coming_nights(self, tmp_path, repo):
        """`overnight serve --next` prints the next three fire times of [schedule] cron and exits 0."""
        config = write_config(
            tmp_path / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=repo,
            extra='[schedule]\ncron = "30 1 * * *"\ntimezone = "UTC"\n',
        )
        result = overnight("serve", "--config", str(config), "--next")
        assert result.returncode == 0, result.stderr
        times = result.stdout.split()
        assert len(times) == 3 and all("T01:30:00" in t for t in times)

    def test_serve_next_needs_no_tasks(self, tmp_path):
        """It judges the cron and the time zone alone (reference.md): a config still without tasks was exit 2."""
        config = tmp_path / "overnight.toml"
        config.write_text('[schedule]\ncron = "30 1 * * *"\ntimezone = "UTC"\n', encoding="utf-8")
        result = overnight("serve", "--config", str(config), "--next")
        assert result.returncode == 0, result.stderr
        assert len(result.stdout.split()) == 3

    @pytest.mark.parametrize(
        ("args", "code", "says"),
        [
            (("run",), 3, "unreachable"),
            (("report",), 1, "no runs recorded yet"),
            (("notes",), 0, "(no notes yet)"),
            (("gc", "--dry-run"), 0, ""),
            (("serve", "--next"), 0, "T01:30:00"),
        ],
        ids=["run", "report", "notes", "gc", "serve"],
    )
    def test_c_is_short_for_config_in_every_command(self, tmp_path, repo, args, code, says):
        """reference.md: `-c` is short for `--config` in every command (init's is tested with init). Run from a
        folder without an overnight.toml: a command that did not take `-c` would not find its default (exit 2)."""
        config = write_config(
            tmp_path / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=repo,
            extra='[schedule]\ncron = "30 1 * * *"\ntimezone = "UTC"\n',
        )
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        result = overnight(args[0], "-c", str(config), *args[1:], cwd=elsewhere)
        assert result.returncode == code, result.stderr
        assert says in result.stdout + result.stderr and "Traceback" not in result.stderr

    def test_demo_with_a_bad_thread_count_leaves_its_folder_empty(self, tmp_path):
        """Refused after the sample was made there, the same --dir was then refused as not empty."""
        folder = tmp_path / "demo"
        folder.mkdir()
        result = subprocess.run(
            [sys.executable, "-m", "orchestrator.cli", "demo", "--dir", str(folder)],
            capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60, env={**os.environ, "OVERNIGHT_LOCAL_THREADS": "four"},
        )
        assert result.returncode == 2 and "OVERNIGHT_LOCAL_THREADS" in result.stderr, result.stderr
        assert list(folder.iterdir()) == []

    def test_gc_dry_run_through_the_cli(self, tmp_path, repo):
        """`overnight gc --dry-run` changes nothing and exits 0; before any night it makes no state dir either."""
        config = write_config(tmp_path / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=repo)
        result = overnight("gc", "--config", str(config), "--dry-run")
        assert result.returncode == 0, result.stderr
        assert "Traceback" not in result.stderr
        assert not (tmp_path / "state").exists()

    @pytest.mark.parametrize("args", [(), ("--dry-run",)], ids=["gc", "gc --dry-run"])
    def test_gc_while_a_night_holds_the_state_dir_exits_75(self, tmp_path, repo, args):
        """reference.md: gc takes the state dir's lock, exit 75 while a night holds it, `--dry-run` too (its list
        would name worktrees a night is changing); the line names the holder."""
        from orchestrator.lock import StateLock

        config = write_config(tmp_path / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=repo)
        with StateLock(tmp_path / "state"):
            result = overnight("gc", "--config", str(config), *args)
        assert_one_line_error(result, 75, "another overnight run holds", f"pid {os.getpid()} on ")

    def test_a_night_while_gc_holds_the_state_dir_says_gc_holds_it(self, tmp_path, repo):
        """The lock file records its holder's command (`overnight gc`), and the second command's line names it."""
        from orchestrator.lock import StateLock

        config = write_config(tmp_path / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=repo)
        with StateLock(tmp_path / "state", command="overnight gc"):
            holder = json.loads((tmp_path / "state" / "overnight.lock").read_text())
            result = overnight("run", "--config", str(config))
        assert set(holder) == {"pid", "host", "since", "command"} and holder["command"] == "overnight gc"
        assert_one_line_error(result, 75, "another overnight gc holds", f"pid {os.getpid()} on ")

    def test_a_holders_command_with_control_characters_is_not_shown(self, tmp_path, repo):
        """A lock file whose recorded command holds terminal escapes (a hand-made or foreign record) is not echoed, raw or
        escaped: the exit-75 line names the lock's own kind of holder instead."""
        from orchestrator.lock import StateLock

        config = write_config(tmp_path / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=repo)
        with StateLock(tmp_path / "state", command="\x1b]0;owned\x07overnight gc\x1b[2J"):
            result = overnight("run", "--config", str(config))
        assert_one_line_error(result, 75, "another overnight run holds", f"pid {os.getpid()} on ")
        assert "owned" not in result.stderr and "\x1b" not in result.stderr

    @pytest.mark.parametrize("command", ["notes", "gc"])
    def test_output_a_latin1_terminal_cannot_hold_prints_as_question_marks(self, tmp_path, repo, command):
        """`overnight notes` and `gc` on a latin-1 stdout: what it cannot encode prints as "?", not a traceback."""
        from orchestrator.notes import NotesBook

        config = write_config(tmp_path / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=repo)
        NotesBook(tmp_path / "state" / "notes.md").append(task="t", iteration=1, reason="check_failed", correction="use \u201cquotes\u201d \u2192 fix")
        git(repo, "branch", "overnight/caf\u00e9\u2603")
        result = subprocess.run(
            [sys.executable, "-m", "orchestrator.cli", command, "--config", str(config)],
            capture_output=True, stdin=subprocess.DEVNULL, timeout=60, env={**os.environ, "PYTHONIOENCODING": "latin-1"},
        )
        assert result.returncode == 0, result.stderr.decode("latin-1")
        expected = "use ?quotes? ? fix" if command == "notes" else "removed branch overnight/caf\u00e9?"
        assert expected in result.stdout.decode("latin-1")

    def test_report_on_a_latin1_terminal_prints(self, config_file, server):
        """`overnight report` on a latin-1 stdout: its marks (\u2714) print as "?", not a traceback."""
        from orchestrator.scripted import call

        config = config_file(tasks=[{"name": "t", "prompt": "p", "check": "true"}], night={"max_iterations": 1})
        server.enqueue(call("submit", {"summary": "x"}))
        assert overnight("run", "--config", str(config), "--log-format", "json").returncode == 0
        result = subprocess.run(
            [sys.executable, "-m", "orchestrator.cli", "report", "--config", str(config)],
            capture_output=True, stdin=subprocess.DEVNULL, timeout=60, env={**os.environ, "PYTHONIOENCODING": "latin-1"},
        )
        assert result.returncode == 0, result.stderr.decode("latin-1")
        assert "? t: succeeded" in result.stdout.decode("latin-1")

    @pytest.mark.parametrize("folder", ["50%-rewrite", "x%41y", "what? now", "ci #12", "me@host", "caf\u00e9", "c:d"])
    def test_the_run_store_is_the_state_dirs_runs_db_whatever_its_path_holds(self, tmp_path, repo, server, folder):
        """A state dir in a folder named with `%`, `?`, `#`, `@`, a space, unicode or `:` keeps its store in its own runs.db, which
        report names before the first night and reads after it: the URL was the path pasted in, and `x%41y` put it in `xAy`."""
        from tests.test_night import FIX

        (tmp_path / folder).mkdir()
        config = write_config(tmp_path / folder / "overnight.toml", api_base=server.url, repo=repo)
        store = tmp_path / folder / "state" / "runs.db"
        before = overnight("report", "--config", str(config))
        assert before.returncode == 1 and before.stderr.strip().endswith(f"no runs recorded yet in {store}"), before.stderr
        server.enqueue(*FIX)
        assert overnight("run", "--config", str(config)).returncode == 0
        # Nowhere else: not `xAy/state/runs.db`, not a file `what` where `?` ended the path.
        assert [found for found in tmp_path.rglob("*") if found.is_file() and found.name in ("runs.db", "what")] == [store]
        after = overnight("report", "--config", str(config))
        assert after.returncode == 0 and "fix-greet: succeeded" in after.stdout, after.stdout + after.stderr

    def test_gc_on_a_folder_that_is_no_repository_makes_no_state_dir(self, tmp_path):
        config = write_config(tmp_path / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=tmp_path / "nothing")
        assert_one_line_error(overnight("gc", "--config", str(config)), 2, "[repo] path")
        assert not (tmp_path / "state").exists()

    def test_serve_with_a_local_zone_tzlocal_cannot_read_is_one_line(self, tmp_path, repo):
        """TZ=UTC0 (a POSIX rule, common in containers) with the default timezone = "local"."""
        config = write_config(tmp_path / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=repo)
        result = subprocess.run(
            [sys.executable, "-m", "orchestrator.cli", "serve", "--config", str(config), "--next"],
            capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60, env={**os.environ, "TZ": "UTC0"},
        )
        assert_one_line_error(result, 2, "[schedule] timezone", "IANA")

    def test_serve_with_a_store_driver_sqlalchemy_cannot_load_is_one_line(self, tmp_path, repo):
        extra = "[store]\nurl = 'postgresql+nosuchdriver://u@127.0.0.1/db'\n"
        config = write_config(tmp_path / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=repo, extra=extra)
        assert_one_line_error(overnight("serve", "--config", str(config)), 4, "nosuchdriver")

    @pytest.mark.parametrize("where", ["a-file/sub", "loop"])
    def test_demo_dir_that_cannot_be_made_is_one_line(self, tmp_path, where):
        (tmp_path / "a-file").write_text("x")
        (tmp_path / "loop").symlink_to("loop")
        assert_one_line_error(overnight("demo", "--dir", str(tmp_path / where)), 2, "--dir")


class TestAStateDirInTheCheckout:
    @pytest.mark.parametrize("command", ["gc", "run", "serve"])
    @pytest.mark.parametrize(("state", "line"), [(".overnight", "/.overnight/"), ("*", "/\\*/")])
    def test_the_first_command_to_make_it_keeps_it_out_of_git_status(self, tmp_path, repo, command, state, line):
        """`overnight gc` (or a `run`, `serve` that ends before any worktree: here, a store whose driver cannot load) in a
        checkout no night has worked in: its lock file and folders showed in `git status`, for a `git add -A` to take; the
        exclude line (one, escaped: `*` is that folder, not every one) is now written as the state dir is made."""
        extra = "" if command == "gc" else "[store]\nurl = 'postgresql+nosuchdriver://u@127.0.0.1/db'\n"
        config = write_config(tmp_path / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=repo, extra=extra)
        config.write_text(config.read_text().replace('dir = "state"', f'dir = "repo/{state}"'))
        (repo / "mine").mkdir()
        (repo / "mine" / "new.txt").write_text("a file of the user's, not yet added\n")
        done = overnight(command, "--config", str(config))
        assert done.returncode == (0 if command == "gc" else 4), done.stderr
        assert (repo / state).is_dir()
        assert git(repo, "status", "--porcelain", "--untracked-files=all") == "?? mine/new.txt"
        shutil.rmtree(repo / state)  # made again, the line is not written twice
        assert overnight(command, "--config", str(config)).returncode == done.returncode
        assert (repo / ".git" / "info" / "exclude").read_text().splitlines().count(line) == 1

    def test_a_read_only_exclude_that_has_the_line_is_no_error(self, tmp_path, repo):
        """An info/exclude nobody may write (immutable here, as root) that already holds the line: `gc` makes the state
        dir, exit 0; it opened the file for writing before reading it, exit 4 (and so did each night's first worktree)."""
        config = write_config(tmp_path / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=repo)
        config.write_text(config.read_text().replace('dir = "state"', 'dir = "repo/.overnight"'))
        exclude = repo / ".git" / "info" / "exclude"
        exclude.write_bytes(b"/.overnight/\n")
        if subprocess.run(["chattr", "+i", str(exclude)], capture_output=True).returncode != 0:
            pytest.skip("no chattr +i here: nothing stops root from writing a file")
        try:
            done = overnight("gc", "--config", str(config))
        finally:
            subprocess.run(["chattr", "-i", str(exclude)], capture_output=True)
        assert (done.returncode, done.stdout.strip()) == (0, "nothing to collect"), done.stderr
        assert (repo / ".overnight").is_dir() and exclude.read_bytes() == b"/.overnight/\n"

    def test_a_pipe_at_info_exclude_is_left_alone(self, tmp_path, repo):
        """A pipe where the exclude file goes: `gc` neither waits on it for ever nor fails; the state dir shows then."""
        config = write_config(tmp_path / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=repo)
        config.write_text(config.read_text().replace('dir = "state"', 'dir = "repo/.overnight"'))
        exclude = repo / ".git" / "info" / "exclude"
        exclude.unlink(missing_ok=True)
        os.mkfifo(exclude)
        done = overnight("gc", "--config", str(config))
        assert (done.returncode, done.stdout.strip()) == (0, "nothing to collect"), done.stderr
        assert stat.S_ISFIFO(os.lstat(exclude).st_mode)


def overnight_into_a_closed_pipe(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`overnight ARGS | true`, made certain: its stdout is a pipe whose reader is gone before it starts."""
    reader, writer = os.pipe()
    os.close(reader)
    try:
        return subprocess.run(
            [sys.executable, "-m", "orchestrator.cli", *args], cwd=cwd, stdout=writer, stderr=subprocess.PIPE,
            text=True, stdin=subprocess.DEVNULL, timeout=60, env={**os.environ, "NO_COLOR": "1"},
        )
    finally:
        os.close(writer)


class TestAReaderThatGoesAway:
    @pytest.mark.parametrize(
        "args",
        [("notes", "-c", "CONFIG"), ("serve", "--next", "-c", "CONFIG"), ("gc", "--dry-run", "-c", "CONFIG"), ("--help",), ("init", "--help"), ("run", "--help"), ("demo", "--help"), ()],
        ids=["notes", "serve --next", "gc --dry-run", "--help", "init --help", "run --help", "demo --help", "no command"],
    )
    def test_a_command_whose_reader_went_away_exits_141_quietly(self, tmp_path, repo, args):
        """`overnight notes | true`: exit 141, as a command SIGPIPE ended, and nothing on stderr; it was exit 1 (click's),
        which `report` uses for "no runs recorded yet" and `run` for "a task failed"."""
        config = write_config(
            tmp_path / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=repo, extra='[schedule]\ntimezone = "UTC"\n'
        )
        (tmp_path / "state").mkdir()
        (tmp_path / "state" / "notes.md").write_text("## 2026-12-01 01:30 · task `fix-greet` · iteration 1 · `check_failed`\n")
        done = overnight_into_a_closed_pipe(*(str(config) if word == "CONFIG" else word for word in args), cwd=tmp_path)
        assert (done.returncode, done.stderr) == (141, "")

    @pytest.mark.parametrize("as_json", [False, True], ids=["report", "report --json"])
    def test_a_report_whose_reader_went_away_exits_141_quietly(self, config_file, server, as_json):
        """`overnight report --json | head -c 10` in a script: the cut is said by 141, not by exit 1 ("no runs recorded yet")."""
        from tests.test_night import FIX

        config = config_file()
        server.enqueue(*FIX)
        assert overnight("run", "--config", str(config)).returncode == 0
        done = overnight_into_a_closed_pipe("report", "--config", str(config), *(["--json"] if as_json else []))
        assert (done.returncode, done.stderr) == (141, "")


class TestAStdoutThatCannotBeWritten:
    @pytest.mark.parametrize(
        "args",
        [("notes", "-c", "CONFIG"), ("report", "--json", "-c", "CONFIG"), ("serve", "--next", "-c", "CONFIG"), ("--help",), ()],
        ids=["notes", "report --json", "serve --next", "--help", "no command"],
    )
    def test_a_stdout_on_a_full_disk_is_one_line_exit_2(self, tmp_path, repo, args):
        """`overnight report --json > r.json` on a full disk (/dev/full: every write fails with ENOSPC): one line and
        exit 2, as init says of a config it cannot write; it was a traceback and exit 1."""
        config = write_config(
            tmp_path / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=repo, extra='[schedule]\ntimezone = "UTC"\n'
        )
        (tmp_path / "state").mkdir()
        (tmp_path / "state" / "notes.md").write_text("## 2026-12-01 01:30 · task `fix-greet` · iteration 1 · `check_failed`\n")
        with open("/dev/full", "w") as full:
            done = subprocess.run(
                [sys.executable, "-m", "orchestrator.cli", *(str(config) if word == "CONFIG" else word for word in args)],
                cwd=tmp_path, stdout=full, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL, timeout=60,
                env={**os.environ, "NO_COLOR": "1"},
            )
        assert_one_line_error(done, 2, "cannot write to stdout: No space left on device")

    @pytest.mark.parametrize(
        "args",
        [
            ("notes", "-c", "CONFIG"), ("report", "--json", "-c", "CONFIG"), ("serve", "--next", "-c", "CONFIG"),
            ("gc", "-c", "CONFIG"), ("--help",), (), ("demo", "--dir", "DEMO"),
        ],
        ids=["notes", "report --json", "serve --next", "gc", "--help", "no command", "demo"],
    )
    def test_a_closed_stdout_is_one_line_exit_2(self, tmp_path, repo, args):
        """`overnight notes >&-` in a crontab: one line and exit 2, as for a full disk; it was exit 0 and nothing said
        (Python's sys.stdout is None, and every print went nowhere), and the demo a traceback."""
        config = write_config(
            tmp_path / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=repo, extra='[schedule]\ntimezone = "UTC"\n'
        )
        (tmp_path / "state").mkdir()
        (tmp_path / "state" / "notes.md").write_text("## 2026-12-01 01:30 · task `fix-greet` · iteration 1 · `check_failed`\n")
        words = {"CONFIG": str(config), "DEMO": str(tmp_path / "demo")}
        done = overnight_with_stdout_closed(*(words.get(word, word) for word in args), cwd=tmp_path)
        assert_one_line_error(done, 2, "cannot write to stdout: it is closed")
        assert not (tmp_path / "demo").exists()  # the demo says so before its night, not after it

    def test_a_closed_stdout_and_stderr_is_the_exit_code_alone(self, tmp_path, repo):
        """`overnight notes >&- 2>&-`: nowhere to say it, so the exit code (2) says it; it was 0."""
        config = write_config(tmp_path / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=repo)
        (tmp_path / "state").mkdir()
        (tmp_path / "state" / "notes.md").write_text("## 2026-12-01 01:30 · task `fix-greet` · iteration 1 · `check_failed`\n")
        done = overnight_with_stdout_closed("notes", "-c", str(config), cwd=tmp_path, redirections=">&- 2>&-")
        assert done.returncode == 2

    def test_a_night_with_stdout_closed_runs_as_with_it_open(self, config_file, server):
        """`overnight run >&-`: a night writes nothing on stdout, so a closed one changes nothing (logs on stderr, exit 0)."""
        from tests.test_night import FIX

        config = config_file()
        server.enqueue(*FIX)
        done = overnight_with_stdout_closed("run", "--log-format", "json", "--config", str(config))
        assert done.returncode == 0, done.stderr
        assert '"event": "night_finished"' in done.stderr and "Traceback" not in done.stderr


def overnight_with_stdout_closed(
    *args: str, cwd: Path | None = None, redirections: str = ">&-"
) -> subprocess.CompletedProcess[str]:
    """`overnight ARGS >&-` as a crontab line runs it: the process starts with no file descriptor 1 at all."""
    return subprocess.run(
        ["sh", "-c", f'exec "$@" {redirections}', "sh", sys.executable, "-m", "orchestrator.cli", *args], cwd=cwd,
        stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL, timeout=60, env={**os.environ, "NO_COLOR": "1"},
    )
