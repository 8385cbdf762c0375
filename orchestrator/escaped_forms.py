"""The forms a secret value takes where a program writes it out: as JSON encoders escape it in a string, as repr() and
ascii() quote it or its bytes, and as URL and form writers percent-encode it (`escaped_forms`)."""

from __future__ import annotations

import json
import re
from urllib.parse import quote, quote_plus

# A value of these characters alone has no other form: every encoder below writes them as they are.
_ONE_FORM = re.compile(r"[A-Za-z0-9_.-]*")
_GO_AS_U = "<>&\u2028\u2029"
_GO_BEFORE_1_22_AS_U = _GO_AS_U + "\b\f"
_GSON_AS_U = "<>&='\u2028\u2029"
_DOTNET_AS_U = "\"'+<>&`"
# An escape of a JSON string's text (kept whole: the `/` of `\\/` is no slash) or a character an encoder may write otherwise.
_RESPELLED = re.compile("\\\\u[0-9a-f]{4}|\\\\.|[" + re.escape("/=" + _GO_AS_U + _DOTNET_AS_U) + "]", re.DOTALL)
# json.dumps's short escapes of the characters some encoder writes as `\u` escapes instead.
_SHORT_ESCAPED = {'\\"': '"', "\\b": "\b", "\\f": "\f"}
# What URL writers keep as it is of a value besides letters, digits, `-._` and `~` (RFC 3986's unreserved characters):
# nothing (Python's quote(safe=""), curl, PHP's rawurlencode), `/` (Python's quote(): a path), space and `+`
# (SQLAlchemy's URL: a store's password), the sub-delimiters a user info may hold (Go's url.UserPassword; yarl's, which
# aiohttp writes, all of them; WHATWG's, which Node's URL and httpx write, `%` too but not `;=`), `!'()*` (JavaScript's
# encodeURIComponent).
_URL_KEPT = ("", "/", " +", "$&+,;=", "!$&'()*+,;=", "!$%&'()*+,", "!'()*")
# What form writers (space as `+`) keep as it is besides letters, digits and `-._`, and `~` only where it is listed:
# Python's quote_plus and urlencode, Go's QueryEscape (`~`); PHP's urlencode (nothing); Java's URLEncoder and WHATWG's
# form, JavaScript's URLSearchParams (`*`); .NET's HttpUtility and WebUtility (`!()*`); yarl's query, aiohttp's params.
_FORM_KEPT = ("~", "", "*", "!()*", "!$'()*,/:?@~")
_PERCENT_ESCAPE = re.compile("%[0-9A-F]{2}")


def escaped_forms(value: str) -> tuple[str, ...]:
    """`value`, and the same as the JSON encoders in use write it in a string (`_json_forms`), as repr() and ascii() quote a
    str or its bytes holding it (`_repr_forms`), and as URL writers percent-encode it (`_percent_forms`). A value of
    letters, digits and `-_.` (most secrets) is its only form: no cost added. An encoder's mix of these per character is
    not matched: no decoder."""
    if _ONE_FORM.fullmatch(value):
        return (value,)
    return tuple({value, *_json_forms(value), *_repr_forms(value), *_percent_forms(value)})


def _json_forms(value: str) -> set[str]:
    """`value` as JSON encoders write it in a string: Python's json.dumps with and without ensure_ascii (JavaScript's
    JSON.stringify and nlohmann's C++ write the latter), each also with its `\\u` escapes in upper-case hex (Java's Jackson)
    and with `/` as `\\/` (PHP's json_encode); Jackson escaping non-ASCII, which leaves DEL (U+007F) as it is; Go's (`<`,
    `>`, `&`, U+2028 and U+2029 as `\\u` escapes; before Go 1.22 `\\b` and `\\f` too); Java's Gson (Go's, and `=` and `'`,
    by default); .NET's System.Text.Json (`"`, `'`, `+`, `<`, `>`, `&`, the backtick and non-ASCII as upper-case `\\u`
    escapes)."""
    unicode = json.dumps(value, ensure_ascii=False)[1:-1]
    ascii_only = json.dumps(value)[1:-1]
    forms = {
        _respelled(written, upper_hex=upper_hex, slash=slash) for written in (unicode, ascii_only) for upper_hex in (False, True) for slash in (False, True)
    }
    forms.add(_respelled(ascii_only, upper_hex=True, unescaped="\x7f"))
    forms.update(_respelled(unicode, as_u=as_u) for as_u in (_GO_AS_U, _GO_BEFORE_1_22_AS_U, _GSON_AS_U))
    forms.add(_respelled(ascii_only, as_u=_DOTNET_AS_U, upper_hex=True))
    return forms


def _repr_forms(value: str) -> set[str]:
    """`value` as repr() writes it in a str (a traceback's `{value!r}`), as ascii() does (`{value!a}`: non-ASCII as `\\xNN`,
    `\\uNNNN`, `\\UNNNNNNNN`) and as repr() writes its UTF-8 bytes (`b'...'`: non-ASCII as `\\xNN`), each with `'` escaped or
    not (they quote with `"` what holds `'` only). The three differ only for a value holding non-ASCII."""
    forms: set[str] = set()
    for written in (repr('"' + value)[2:-1], ascii('"' + value)[2:-1], repr(b'"' + _utf8(value))[3:-1]):  # both quotes: `'` escaped
        forms.update((written, written.replace("\\'", "'")))
    return forms


def _percent_forms(value: str) -> set[str]:
    """`value` as URL writers percent-encode its UTF-8 bytes into a query, a path or a user info, in upper-case hex as RFC
    3986 asks, each keeping as they are the characters `_URL_KEPT` lists for it; and as form writers encode it (space as
    `+`), each keeping those `_FORM_KEPT` lists. Python's quote_plus, the one that keeps nothing and .NET's form also in
    lower-case hex (.NET's HttpUtility.UrlEncode writes a form so). Other writers match where their choice is one of
    these for the value (JavaScript's encodeURI keeps base64's `/+=`: the value as written); one that re-quotes a whole
    URL keeping most delimiters (requests', httpx's, encodeURI), or hex of mixed case, does not: no decoder."""
    raw = _utf8(value)
    forms = {quote(raw, safe=kept) for kept in _URL_KEPT}
    # quote_plus keeps `~` whatever `safe` says: a form writer that does not writes it %7E.
    forms.update(quote_plus(raw, safe=kept) if "~" in kept else quote_plus(raw, safe=kept).replace("~", "%7E") for kept in _FORM_KEPT)
    in_lower_hex = (quote(raw, safe=""), quote_plus(raw), quote_plus(raw, safe="!()*").replace("~", "%7E"))
    return forms | {_PERCENT_ESCAPE.sub(lambda escape: escape.group().lower(), form) for form in in_lower_hex}


def _utf8(value: str) -> bytes:
    """`value` as a program writes it out: UTF-8, an environment's undecodable bytes (os.fsdecode's escapes) as they were."""
    try:
        return value.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a surrogate no undecodable byte gave (json.loads of "\ud800"): no program writes it
        return value.encode("utf-8", "surrogatepass")


def _respelled(written: str, *, upper_hex: bool = False, slash: bool = False, as_u: str = "", unescaped: str = "") -> str:
    """JSON string text (json.dumps's, quotes off) as another encoder writes it: its `\\u` escapes in upper-case hex,
    `/` as `\\/`, the characters of `as_u` (`"`, `\\b` and `\\f` too, which json.dumps writes `\\"`, `\\b`, `\\f`) as `\\u`
    escapes, those of `unescaped` as they are."""
    hex_digits = "X" if upper_hex else "x"

    def respell(found: re.Match[str]) -> str:
        token = found.group()
        if token.startswith("\\u"):
            if (character := chr(int(token[2:], 16))) in unescaped:
                return character
            return "\\u" + (token[2:].upper() if upper_hex else token[2:])
        character = _SHORT_ESCAPED.get(token, token)
        if len(character) > 1:  # another escape: `\\\\`, `\\n`
            return token
        if character in as_u:
            return f"\\u{ord(character):04{hex_digits}}"
        return "\\/" if character == "/" and slash else token

    return _RESPELLED.sub(respell, written)
