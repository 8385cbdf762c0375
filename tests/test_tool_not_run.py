"""A tool's password on a command line is found wherever a command may run the tool, and not where its name is plainly the
argument of a command that takes text or ssh's destination (tool_not_run.py, through inline_secrets.py's tool options)."""

from __future__ import annotations

import pytest

from orchestrator.inline_secrets import inline_secrets
from orchestrator.secrecy import withheld

# Realistic values that hold a tool's password, each with the password, as a variable may hold them: shell lines, Makefile
# recipes, CI, compose and Kubernetes YAML, Dockerfiles, Procfiles, runners, wrappers, paths, and every tool the searches know.
SECRET_COMMANDS = [
    ("mysql -u app -pS3cretA1 shop", "S3cretA1"),
    ("$ mysql -u root -pS3cretA2", "S3cretA2"),
    ("# mysql -uroot -pS3cretA3 -e 'show databases'", "S3cretA3"),
    ("RUN mysql -uroot -pS3cretA4 < /init.sql", "S3cretA4"),
    ("RUN apt-get install -y mysql-client && mysql -h db -pS3cretA5", "S3cretA5"),
    ("command: mysql -h db -u app -pS3cretA6", "S3cretA6"),
    ('command: ["sh", "-c", "mysqladmin ping -h db -pS3cretA7"]', "S3cretA7"),
    ("  - mysql -h 127.0.0.1 -uroot -pS3cretA9 -e 'create database t'", "S3cretA9"),
    ("script: mysqldump -u app -pS3cretB1 shop > dump.sql", "S3cretB1"),
    ("\t@mysql -u app -pS3cretB2 shop < schema.sql", "S3cretB2"),
    ("\tmysqldump -u app -pS3cretB3 shop | gzip > shop.sql.gz", "S3cretB3"),
    ("web: mysql -h $DB_HOST -pS3cretB4 shop", "S3cretB4"),
    ('bash -c "mysql -u app -pS3cretB5 shop"', "S3cretB5"),
    ("sh -c 'mysql -u app -pS3cretB6 -e \"select 1\"'", "S3cretB6"),
    ('su -c "mysql -pS3cretB7" mysql', "S3cretB7"),
    ("su postgres -c 'mysql -pS3cretB8'", "S3cretB8"),
    ("ls *.sql | xargs -n1 mysql -u app -pS3cretB9 shop -e", "S3cretB9"),
    ("watch -n 5 mysqladmin -u root -pS3cretC1 status", "S3cretC1"),
    ("nohup mysqldump -u app -pS3cretC2 shop > /tmp/d.sql &", "S3cretC2"),
    ("flock /tmp/db.lock mysql -u app -pS3cretC3 shop", "S3cretC3"),
    ("time mysql -u app -pS3cretC4 shop < q.sql", "S3cretC4"),
    ("command mysql -u app -pS3cretC5", "S3cretC5"),
    ("exec mysql -u app -pS3cretC6 shop", "S3cretC6"),
    ("{ mysql -u app -pS3cretC7 shop; }", "S3cretC7"),
    ("if mysql -u app -pS3cretC8 -e 'select 1'; then echo up; fi", "S3cretC8"),
    ("! mysql -u app -pS3cretC9 -e 'select 1'", "S3cretC9"),
    ("/usr/bin/mysql -u app -pS3cretD1", "S3cretD1"),
    ("./mysql -u app -pS3cretD2", "S3cretD2"),
    ("ssh db1 mysql -u app -pS3cretD3 shop", "S3cretD3"),
    ("ssh db1 'mysql -u app -pS3cretD4 shop'", "S3cretD4"),
    ("docker exec -i db mysql -uroot -pS3cretD5 shop < dump.sql", "S3cretD5"),
    ("docker compose exec db mysql -uroot -pS3cretD6", "S3cretD6"),
    ("kubectl exec -it mysql-0 -- mysql -uroot -pS3cretD7", "S3cretD7"),
    ("npx mysql -u app -pS3cretD8", "S3cretD8"),
    ("poetry run mysql -u app -pS3cretD9", "S3cretD9"),
    ("/usr/bin/sudo mysql -u root -pS3cretE1", "S3cretE1"),
    ("sudo -u git mysql -u app -pS3cretE2", "S3cretE2"),
    ("sudo -u mysql mysql -pS3cretE3", "S3cretE3"),
    ("FOO=1 mysql -u app -pS3cretE4", "S3cretE4"),
    ("MYSQL_CMD=mysql -u app -pS3cretE5 shop", "S3cretE5"),
    ("find db -name '*.sql' -exec mysql -u app -pS3cretE6 shop -e 'source {}' \\;", "S3cretE6"),
    ("git bisect run mysql -u app -pS3cretE7 -e 'select 1'", "S3cretE7"),
    ("echo mysql -u app -pS3cretE8 | ssh db1", "S3cretE8"),
    ('mysql -e "select now()" -pS3cretE9', "S3cretE9"),
    ("mysql -h $(hostname) -pS3cretF1", "S3cretF1"),
    ("mysql -h `hostname` -pS3cretF2", "S3cretF2"),
    ("(cd db && mysql -u app -pS3cretF3 shop)", "S3cretF3"),
    ("COUNT=$(mysql -N -u app -pS3cretF4 -e 'select count(*) from t')", "S3cretF4"),
    ("mariadb -u app -pS3cretF5 shop", "S3cretF5"),
    ("mariadb-dump -u app -pS3cretF6 shop", "S3cretF6"),
    ("mysql_upgrade -u root -pS3cretF7", "S3cretF7"),
    ("mongosh mongodb://db/shop -u app -p S3cretF8", "S3cretF8"),
    ("mongo -u admin -p S3cretF9 --authenticationDatabase admin", "S3cretF9"),
    ("mongodump -u app -p S3cretG1 --db shop", "S3cretG1"),
    ("mongorestore -u app -pS3cretG2 dump/", "S3cretG2"),
    ("redis-cli -h cache -a S3cretG3 ping", "S3cretG3"),
    ("redis-cli --pass S3cretG4 info", "S3cretG4"),
    ("docker exec cache redis-cli -a S3cretG5 flushall", "S3cretG5"),
    ("sshpass -p S3cretG6 ssh deploy@host", "S3cretG6"),
    ("sshpass -P assword -p S3cretG7 scp a host:", "S3cretG7"),
    ("sqlcmd -S db -U sa -P S3cretG8 -Q 'select 1'", "S3cretG8"),
    ("bcp shop.dbo.t out t.dat -S db -U sa -P S3cretG9 -c", "S3cretG9"),
    ("osql -S db -U sa -P S3cretH1", "S3cretH1"),
    ("keytool -list -keystore ks.jks -storepass S3cretH2", "S3cretH2"),
    ("jarsigner -keystore ks.jks -storepass S3cretH3 app.jar alias", "S3cretH3"),
    ("curl -u admin:S3cretH4 https://example.com/api", "S3cretH4"),
    ("htpasswd -b /etc/nginx/.htpasswd admin S3cretH5", "S3cretH5"),
    ("RUN htpasswd -bc /etc/nginx/.htpasswd admin S3cretH6", "S3cretH6"),
    ("pytest -k mongo && mongosh -u app -p S3cretH7", "S3cretH7"),
    ("grep -q ok log; mysql -u app -pS3cretH8", "S3cretH8"),
    ("git pull && mysql -u app -pS3cretH9 < migrate.sql", "S3cretH9"),
    ("pip install mysqlclient\nmysql -u app -pS3cretI1", "S3cretI1"),
    ("timeout 30 mysql -u app -pS3cretI2 shop", "S3cretI2"),
    ("env MYSQL_HOST=db mysql -u app -pS3cretI3", "S3cretI3"),
    ("cat schema.sql | mysql -u app -pS3cretI4 shop", "S3cretI4"),
    ("mysql.exe -u app -pS3cretI5", "S3cretI5"),
    ("python3 -m mysql -u app -pS3cretI6", "S3cretI6"),
]
# Real passwords next to the shapes that read as arguments (quotes, wrappers and their options, ssh's destination, a
# command begun far back): a quoted string another command runs, a wrapper's option before the tool, a remote command.
SECRETS_BESIDE_ARGUMENTS = [
    ("mysql -u root -pS3cretJ1", "S3cretJ1"),
    ("sudo mysql -pS3cretJ2", "S3cretJ2"),
    ("time mysql -pS3cretJ3", "S3cretJ3"),
    ("env X=1 mysql -pS3cretJ4", "S3cretJ4"),
    ('sh -c "mysql -pS3cretJ5"', "S3cretJ5"),
    ("time -p mysql -u app -pS3cretJ6", "S3cretJ6"),
    ("sudo -u me mysql -pS3cretJ7", "S3cretJ7"),
    ("nice -n 5 mysql -pS3cretJ8", "S3cretJ8"),
    ("timeout -s KILL 30 mysql -pS3cretJ9", "S3cretJ9"),
    ('pytest -k "mongo" && mysql -pS3cretK1', "S3cretK1"),
    ("ssh mongo mysql -u app -pS3cretK2", "S3cretK2"),
    ("ssh -p 2222 mongo mongosh -p S3cretK3", "S3cretK3"),
    ("ssh mongo -p 2222 'mysql -pS3cretK4'", "S3cretK4"),
    ("pytest -k \"$(mysql -pS3cretK5 -e 'select name from t')\"", "S3cretK5"),
    ("""awk 'BEGIN { system("mysql -pS3cretK6") }'""", "S3cretK6"),
    ("sed '1e mysql -pS3cretK7' notes.txt", "S3cretK7"),
    ("xargs -I{} mysql -pS3cretK8 -e {}", "S3cretK8"),
    ('env -S "mysql -pS3cretK9"', "S3cretK9"),
    ("sudo -i mysql -pS3cretL1", "S3cretL1"),
    ("pytest " + "tests/test_module.py " * 30 + "; mysql -pS3cretL2", "S3cretL2"),
    ("timeout --signal=KILL 30 env A=1 B=2 nice -n 5 mysql -pS3cretL3", "S3cretL3"),
    ("bash -c \"pytest -k 'x y' -p q; mysql -pS3cretL4\"", "S3cretL4"),
    ('grep "mysql -pS3cretL5" audit.log', "S3cretL5"),
    ("sudo -X git mysql -pS3cretL6", "S3cretL6"),
    ("uv run --with pytest mysql -pS3cretL7", "S3cretL7"),
    ('pytest -k "x" `mysql -pS3cretL8`', "S3cretL8"),
]
# Realistic values where a tool's name is another command's argument, a word that only begins with one, or its command ends
# before the option: no password.
ORDINARY_COMMANDS = [
    "gcc $(mysql_config --cflags) -pedantic-errors -o x x.c",
    "cc `mariadb_config --libs` -pedantic-errors x.c",
    "$(mysql --version) -pedantic-errors",
    "pytest -k mongo -p pytest_randomly",
    "pytest tests -k mongo -p no_such_plugin_at_all",
    "py.test -k redis-cli -p xdist_worker_plugin",
    "python -m pytest -k mongo -p pytest_randomly",
    "poetry run pytest -k mongo -p pytest_randomly",
    "uv run pytest -k mysql -p pytest_randomly",
    "TEST_CMD=pytest -k mongo -p pytest_randomly",
    'sh -c "pytest -k mongo -p pytest_randomly"',
    "timeout 600 pytest -k mongo -p pytest_randomly",
    "grep -r mysql src -ptest_things",
    "rg mysql -pattern-file",
    "git log --grep mongo -patch-with-stat",
    "git log --grep mysql -pStr0ng-Passw0rd",
    "pip install mysqlclient -progress-bar-off",
    "apt-get install -y mysql-client -plain-output",
    "find . -name mysql -print",
    "ls /etc/mysql -partial-listing",
    "cat /etc/mysql -passwordless",
    "which mongo -pretend-flag",
    "make test; pytest -k mongo -p pytest_randomly",
    "- pytest -k mongo -p pytest_randomly",
    "$ pytest -k mongo -p pytest_randomly",
    "RUN pip install mysqlclient -progress-bar-off",
    "script: pytest -k mongo -p pytest_randomly",
    "\t@pytest -k mongo -p pytest_randomly",
    "sudo pytest -k mongo -p pytest_randomly",
]
# Real passwords after a quote that a shell pairs otherwise than a plain reading of quotes does: an apostrophe a comment, a
# heredoc's body or prose leaves open, bash's `$'...'` with an escaped quote, a double-quoted `$( )` holding quotes, a `\"` an
# outer shell unescapes, and a `(` a comment leaves open. Each would otherwise make the tool's name a text command's argument.
# And in a text command's string that a shell runs: `sed $'1e ...'`, and awk's program that the option's value goes on after;
# after `conda run`, which runs its command.
SECRETS_AFTER_QUOTES_A_SHELL_PAIRS_OTHERWISE = [
    ("# grep isn't needed\nbash -c 'sudo mysql -u root -pS3cretM1'", "S3cretM1"),
    ("# grep isn't needed\nbash -c 'sudo mysql -pS3cretM2' # it's", "S3cretM2"),
    ("grep x f # it's\nbash -c 'sudo mysql -pS3cretM3'", "S3cretM3"),
    ("cat <<EOF\nls won't work\nEOF\n  mysql -e 'select 1' -u root -pS3cretM4", "S3cretM4"),
    ("cat <<EOF\nls won't work\nEOF\nbash -c 'sudo mysql -pS3cretM5'\ncat <<EOF\nit's done\nEOF", "S3cretM5"),
    ("grep it's log; mysql -e 'select 1' -pS3cretM6", "S3cretM6"),
    ("pytest -k $'x\\'' ; mysql -p'S3cretM7'", "S3cretM7"),
    ("pytest -k $'it\\'s' ; bash -c 'sudo mysql -pS3cretM8' # it's", "S3cretM8"),
    ("""pytest -k "$(printf '%s' "it's")" ; bash -c 'sudo mysql -pS3cretM9' # it's""", "S3cretM9"),
    ("""sh -c "grep \\"it's\\" log; mysql -e 'select 1' -pS3cretN1\"""", "S3cretN1"),
    ("""bash -c "git log --grep \\"it's\\" ; bash -c 'sudo mysql -pS3cretN2' ; echo \\"it's\\"\"""", "S3cretN2"),
    ("grep x f # (a\ncase $1 in start) mysql -pS3cretN3 ;; esac", "S3cretN3"),
    ("sed $'1e mysql -pS3cretN4' notes.txt", "S3cretN4"),
    ("""awk 'BEGIN { system("mysql -p'"S3cretN5"'") }'""", '"S3cretN5"'),
    ("conda run -n base mysql -u app -pS3cretN6 shop", "S3cretN6"),
]
# Real passwords after a word of ssh's command that this shell hands over as a `;`, `|` or `&` (escaped, quoted, a variable's or
# a substitution's): ssh joins its command's words for a shell on the destination to read again, and that shell runs the tool.
SECRETS_THAT_SSHS_SHELL_READS_AGAIN = [
    ("ssh db grep x \\; mysql -u app -pS3cretP1", "S3cretP1"),
    ("ssh db pytest -k x ';' mysql -pS3cretP2", "S3cretP2"),
    ('ssh -p 2222 db git log "&&" mongosh -u app -p S3cretP3', "S3cretP3"),
    ("ssh db grep x \\| mysql -pS3cretP4", "S3cretP4"),
    ("ssh db grep x $SEP mysql -pS3cretP5", "S3cretP5"),
    ("ssh db grep x `printf ';'` mysql -pS3cretP6", "S3cretP6"),
]
# Real passwords on the line after a comment whose last character is a backslash: a comment ends at its line's end, as it
# does with a quote left open in it.
SECRETS_AFTER_A_COMMENTS_BACKSLASH = [
    ("pip install mysqlclient  # grep x \\\n  mysql -u app -pS3cretP7", "S3cretP7"),
    ("grep -r mongo src  # slow \\\n\tmongosh -u app -p S3cretP8", "S3cretP8"),
]
# Realistic values whose tool's name is, read as a shell reads it, a text command's argument in quotes, after wrappers and
# their options, far from where its command begins, or ssh's destination.
ARGUMENTS_IN_QUOTES_AND_AFTER_WRAPPERS = [
    'pytest -k "mongo or redis" -p pytest_randomly',
    "pytest -k 'mongo and not slow' -p pytest_randomly",
    "sh -c \"pytest -k 'mongo or redis' -p pytest_randomly\"",
    "sudo -u me pytest -k mongo -p pytest_randomly",
    "sudo -E -u me timeout 60 pytest -k mongo -p pytest_randomly",
    "time -p pytest -k mongo -p pytest_randomly",
    "env CI=1 pytest -k mongo -p pytest_randomly",
    "nice -n 10 pytest -k mongo -p pytest_randomly",
    "timeout -s KILL 600 pytest -k mongo -p pytest_randomly",
    "nohup pytest -k mongo -p pytest_randomly",
    "xargs -n1 pytest -k mongo -p pytest_randomly",
    "exec pytest -k mongo -p pytest_randomly",
    "command pytest -k mongo -p pytest_randomly",
    "pytest " + "tests/test_module.py " * 30 + "-k mongo -p pytest_randomly",
    "ssh mongo -p 222222",
    "ssh -i ~/.ssh/id_ed25519 mongo -p 22222222",
    "ssh ci pytest -k 'mongo or redis' -p pytest_randomly",
]


@pytest.mark.parametrize(("value", "secret"), SECRET_COMMANDS)
def test_a_tools_password_is_found_wherever_a_command_may_run_the_tool(value: str, secret: str) -> None:
    """A tool's password is found in a shell line, a recipe, a YAML or Dockerfile line, a Procfile, after runners (`sh -c`,
    `sudo`, `xargs`, `watch`, `docker exec`, `npx`, ...) and the shell's words, after a path, for every tool known; and the
    variable that holds it is withheld."""
    assert secret in inline_secrets(value)
    assert withheld({"TOOL_ARGS": value}) == ["TOOL_ARGS"]


@pytest.mark.parametrize("value", ORDINARY_COMMANDS)
def test_a_tools_name_that_a_text_command_takes_holds_no_password(value: str) -> None:
    """A tool's name that pytest's `-k`, grep, git, pip, apt-get, find, ls, cat or which takes as text, a `mysql_config`, or a
    name whose `$(...)` or backquotes close before the option holds no password, and withholds nothing."""
    assert inline_secrets(value) == []
    assert withheld({"TOOL_ARGS": value}) == []


@pytest.mark.parametrize(("value", "secret"), SECRETS_BESIDE_ARGUMENTS)
def test_a_tools_password_beside_quotes_and_wrappers_is_still_found(value: str, secret: str) -> None:
    """A tool's password is found after a wrapper and its options, in a quoted string that `sh -c`, `env -S`, awk or sed
    runs, in a substitution inside a text command's quotes, after ssh's destination, after a text command whose quotes
    close or whose command ended far back, and in a quoted string that holds the option too; the variable is withheld."""
    assert secret in inline_secrets(value)
    assert withheld({"TOOL_ARGS": value}) == ["TOOL_ARGS"]


@pytest.mark.parametrize("value", ARGUMENTS_IN_QUOTES_AND_AFTER_WRAPPERS)
def test_a_tools_name_in_quotes_after_wrappers_or_far_from_its_commands_start_holds_no_password(value: str) -> None:
    """A tool's name in a text command's quoted argument, after `sudo -u me`, `time -p`, `env`, `nice -n`, `timeout -s`,
    `nohup`, `xargs -n1`, `exec` or `command`, more than 512 characters after its command's start, or ssh's destination
    holds no password, and withholds nothing."""
    assert inline_secrets(value) == []
    assert withheld({"TOOL_ARGS": value}) == []


@pytest.mark.parametrize(("value", "secret"), SECRETS_AFTER_QUOTES_A_SHELL_PAIRS_OTHERWISE)
def test_a_tools_password_after_quotes_a_shell_pairs_otherwise_is_still_found(value: str, secret: str) -> None:
    """A tool's password is found where a quote left open on its line (a comment's, a heredoc body's, prose's apostrophe),
    `$'...'`'s escaped quote, a double-quoted `$( )`'s inner quotes, an escaped `\\"` in `sh -c "..."` or a comment's `(`
    would pair or close otherwise than a shell does; the variable is withheld."""
    assert secret in inline_secrets(value)
    assert withheld({"TOOL_ARGS": value}) == ["TOOL_ARGS"]


@pytest.mark.parametrize(("value", "secret"), SECRETS_THAT_SSHS_SHELL_READS_AGAIN)
def test_a_tools_password_after_a_separator_that_sshs_shell_reads_again_is_still_found(value: str, secret: str) -> None:
    """A tool's password is found after a word of ssh's command that this shell hands to ssh's as a `;`, `|` or `&` (an
    escaped or quoted one, a variable, a substitution); the variable is withheld."""
    assert secret in inline_secrets(value)
    assert withheld({"TOOL_ARGS": value}) == ["TOOL_ARGS"]


@pytest.mark.parametrize(("value", "secret"), SECRETS_AFTER_A_COMMENTS_BACKSLASH)
def test_a_tools_password_on_the_line_after_a_comments_backslash_is_still_found(value: str, secret: str) -> None:
    """A tool's password is found on the line after a comment that ends in a backslash, in quotes or not: the comment's line
    end is no continuation; the variable is withheld."""
    assert secret in inline_secrets(value)
    assert withheld({"TOOL_ARGS": value}) == ["TOOL_ARGS"]
