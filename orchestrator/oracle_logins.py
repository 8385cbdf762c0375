"""Oracle's `user/password@connect` logins in a text: their passwords (`oracle_passwords`), and the text with them as ***
(`oracle_passwords_hidden`)."""

from __future__ import annotations

import re

from orchestrator.redactable import REDACTED

# Oracle's `user/password@connect`, which no URL reader reads: JDBC's thin and OCI URLs
# (`jdbc:oracle:thin:scott/tiger@//db:1521/orcl`, `...@db:1521:orcl`), EZConnect with `//` or a port and a service
# (`scott/tiger@db:1521/orcl`), a TNS descriptor (`scott/tiger@(DESCRIPTION=...)`), and the login the tools take
# (`sqlplus -S scott/tiger@orcl`, `rman target sys/tiger@orcl`, `expdp userid=scott/tiger@orcl`).
# Alone, `a/b@c` is a path, a GitHub Action (`actions/checkout@v4`), a Go module's version (`golang.org/x/tools@v0.1.0`), an
# npm package's (`@scope/pkg@1.2`) or an image (`docs/v1@2x.png`).
# Oracle reads a password with marks other than `_$#` only double-quoted, so an unquoted one ends at a `/`: a search from
# every word of a run of `a/,a/,a/` then reads up to its next `/` only, not to the run's end.
_ORACLE_LOGIN = re.compile(
    r"""(?:
        jdbc:oracle:\w++:                # a JDBC URL's driver (thin, oci)
      | (?<![\w$\#.@:-])                 # a tool, its folder before it (`$ORACLE_HOME/bin/sqlplus`), its options, rman's
        (?i:sqlplus|sqlldr|expdp|impdp|rman|dgmgrl)(?:\.exe)?+(?:\s++-[A-Za-z]\w*+)*+\s++  # database to connect to,
        (?i:(?:target|catalog|auxiliary)\s++)?+(?:\\?+["'])?+  # the login quoted too, also for a shell's
                                    # `\"`: `expdp \"sys/pw@orcl as sysdba\"`
      | (?:\A|(?<=[\n;"']))[ \t]*+(?i:conn(?:ect)?+)[ \t]++  # SQL*Plus's CONNECT: a statement's first word (a line's, after
                                    # a `;` or a quote), the login all that follows but a role, an edition and the statement's
                                    # end: prose's `connect org/repo@main to CI` is none; and with a database (`@`) or a role,
                                    # or ended by a `;` or a quote: a line of its own, GitLab's CI_COMMIT_TITLE `Connect
                                    # web/checkout-flow`, would hide the folder `checkout-flow` wherever it is named
        (?=(?:"[^"\r\n]*+"|[^\s;"'])++(?:[ \t]++(?i:as[ \t]++sys\w*+|edition=[^\s;"']*+))?+[ \t]*+(?:[;"'\r\n]|\Z))
        (?=(?:"[^"\r\n]*+"|[^\s;"'@])*+(?:@|[ \t]++(?i:as[ \t]++sys)|(?:[ \t]++(?i:edition=[^\s;"']*+))?+[ \t]*+[;"'])
           |[^\s;"'@/]++/")          # or with a quoted password
      | (?<=SQL>)[ \t]*+(?i:conn(?:ect)?+)[ \t]++  # at SQL*Plus's prompt, a local login's line too
        (?=(?:"[^"\r\n]*+"|[^\s;"'])++(?:[ \t]++(?i:as[ \t]++sys\w*+|edition=[^\s;"']*+))?+[ \t]*+(?:[;"'\r\n]|\Z))
      | (?<![\w$\#./@:\\-])              # else a word of its own: not a path's part (`a/b/c@//h`) nor a package's (`@s/p@1`)
        (?:(?i:userid)=["']?+            # the tools' `userid=` parameter
          | (?=[A-Za-z][\w$\#.]*+(?:\[[A-Za-z][\w$\#.]*+\])?+/(?:\\?+"[^"\r\n]*+"|[^\s@"'/]++)@  # or EZConnect's `@//`
                                    # (`@tcps://`), a TNS descriptor, or
              (?:(?:tcps?:)?//|\((?i:description)|  # a host (a name or an IPv4 address), a port and a service or SID:
                 (?:[A-Za-z][\w.-]*+|[0-9]++(?:\.[0-9]++){3})(?<!\.):[0-9]{2,5}+[/:][A-Za-z])))  # not `a/b@10:30`,
                                    # `x/y@npm:2.1`, `web/App@localhost:3000`
    )
    [A-Za-z][\w$\#.]*+(?:\[[A-Za-z][\w$\#.]*+\])?+/  # the user, as Oracle's names: letters, digits, `_$#`; a proxy
                                    # user's the user it connects as in brackets (`scott[hr]/pw@orcl`)
    (?:\\?+"((?:[^"\\\r\n]|\\(?!"))*+)\\?+"(?=[@\s"';]|\Z)  # the password: double-quoted (`\"pass word\"` too),
      | ([^\s@"'/]++(?=["']?+@)         # or up to a connect's `@` (`"scott/tiger"@orcl` too),
         | [^\s@"'/.&;]++(?=[\s"';]|\Z)))  # or, with none (a local login), without a file's `.`, a query's `&` or a
                                    # statement's `;`: a tool's name before a path (`sqlplus scripts/deploy.sql`) gives none""",
    re.VERBOSE,
)


def oracle_passwords(text: str | None) -> list[str]:
    """The passwords of the Oracle logins in `text` (`_ORACLE_LOGIN`), as written."""
    if not text or "/" not in text:
        return []
    return [login.group(1) if login.group(1) is not None else login.group(2) for login in _ORACLE_LOGIN.finditer(text)]


def oracle_passwords_hidden(text: str) -> str:
    """`text` with the passwords of its Oracle logins (quoted or not) as ***."""
    return _ORACLE_LOGIN.sub(_hide_oracle_password, text) if "/" in text else text


def _hide_oracle_password(login: re.Match[str]) -> str:
    """The Oracle login `login` matched, its password (quoted or not) as ***."""
    group = 1 if login.group(1) is not None else 2
    start, end = login.start(group) - login.start(), login.end(group) - login.start()
    return login.group()[:start] + REDACTED + login.group()[end:]
