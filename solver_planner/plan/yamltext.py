"""Plain data (dicts, lists, strings, numbers, booleans, None) as YAML text, fast.

A plan file of 100 000 GPUs holds about three million values; PyYAML's representer (Python,
before libyaml's emitter) spent 12-15 s of ``plan``'s time turning them into nodes.  This
writes the same data directly: block mappings, block lists, lists of scalars in flow style
(``[0, 1, 2]``), strings plain only when YAML 1.1 reads them back as the same string, else
quoted.  What it writes loads back equal under PyYAML's safe loaders (tested on random
data and on every plan file the tests write)."""

from __future__ import annotations

import math
import re

__all__ = ["dump"]

# strings written without quotes: a letter or underscore first, then letters, digits and
# ``_ . / -`` in words separated by single spaces.  Neither YAML 1.1's resolvers (numbers,
# timestamps, ``.inf``) nor flow or block indicators can match that, except these words.
_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_./-]*(?: [A-Za-z0-9_./-]+)*\Z")
_WORDS = {"yes", "no", "true", "false", "on", "off", "null", "y", "n"}
# characters a double-quoted scalar may hold as they are (printable, and not a YAML line break)
_RAW = re.compile(r"[ !#-\[\]-~\xa0-\u2027\u202a-\ud7ff\ue000-\ufefe\uff00-\ufffd\U00010000-\U0010ffff]")


def _string(s: str) -> str:
    if _PLAIN.match(s) and s.lower() not in _WORDS:
        return s
    if all(" " <= ch <= "~" for ch in s):
        return "'" + s.replace("'", "''") + "'"
    out = []
    for ch in s:
        if "\ud800" <= ch <= "\udfff":
            # a lone surrogate is no character: no YAML reader takes it back
            raise ValueError(f"cannot write a string holding a lone surrogate to a plan file: {s!r}")
        if _RAW.match(ch):
            out.append(ch)
        elif ch in '"\\':
            out.append("\\" + ch)
        else:
            n = ord(ch)
            out.append(f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}")
    return '"' + "".join(out) + '"'


def _float(x: float) -> str:
    if math.isnan(x):
        return ".nan"
    if math.isinf(x):
        return ".inf" if x > 0 else "-.inf"
    text = repr(x).lower()
    # YAML 1.1 reads a float only with a dot: 1e-05 would come back a string
    return text.replace("e", ".0e", 1) if "." not in text and "e" in text else text


def _scalar(v) -> str:
    if v is None:
        return "null"
    if v is True:
        return "true"
    if v is False:
        return "false"
    if isinstance(v, int):
        return str(int(v))
    if isinstance(v, float):
        return _float(float(v))
    if isinstance(v, str):
        return _string(v)
    raise TypeError(f"cannot write a {type(v).__name__} to a plan file: {v!r}")


def _is_scalar(v) -> bool:
    return v is None or isinstance(v, (bool, int, float, str))


def _flow(values: list) -> str:
    return "[" + ", ".join(_scalar(v) for v in values) + "]"


def _emit(v, indent: str, out: list[str]) -> None:
    """Append the lines of a non-empty mapping or list, at ``indent``."""
    if not isinstance(v, (dict, list)):
        raise TypeError(f"cannot write a {type(v).__name__} to a plan file: {v!r}")
    if isinstance(v, dict):
        for k, x in v.items():
            key = _scalar(k)
            if len(key) > 1000 or not _is_scalar(k):
                raise ValueError(f"a mapping key must be a short scalar, got {k!r}")
            if _is_scalar(x) or x == {} or x == []:
                out.append(f"{indent}{key}: {_inline(x)}")
            elif isinstance(x, list) and all(_is_scalar(e) for e in x):
                out.append(f"{indent}{key}: {_flow(x)}")
            else:
                out.append(f"{indent}{key}:")
                # a list under a key sits at the key's indent, as PyYAML writes it
                _emit(x, indent if isinstance(x, list) else indent + "  ", out)
        return
    for x in v:
        if _is_scalar(x) or x == {} or x == []:
            out.append(f"{indent}- {_inline(x)}")
        elif isinstance(x, list) and all(_is_scalar(e) for e in x):
            out.append(f"{indent}- {_flow(x)}")
        else:
            sub: list[str] = []
            _emit(x, indent + "  ", sub)
            sub[0] = f"{indent}- " + sub[0][len(indent) + 2:]
            out.extend(sub)


def _inline(x) -> str:
    if isinstance(x, dict):
        return "{}"
    if isinstance(x, list):
        return "[]"
    return _scalar(x)


def dump(doc) -> str:
    """YAML text of ``doc`` (a dict, list or scalar of plain data; tuples are not plain)."""
    if isinstance(doc, (dict, list)) and doc:
        out: list[str] = []
        _emit(doc, "", out)
        return "\n".join(out) + "\n"
    return _inline(doc) + "\n"
