"""How long reading calls written in an answer's text takes on adversarial floods, by size.

    python bench/written_floods.py [kB,kB,...]

Small models sometimes write a sentence, then thousands of opening fragments of a call (`{"name": {"name": ...`) up
to the length limit. Each shape is read by orchestrator.written_calls.calls_in_text, as an answer that ended as usual
and as one cut at the length limit, at 25, 50, 100, 200 and 400 kB. A shape whose time doubles with its size is
linear; one that quadruples is quadratic. A shape is not measured at larger sizes once one reading took over 20 s.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Callable

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from orchestrator.written_calls import calls_in_text

KNOWN = {"read_file", "write_file", "list_dir", "run_check", "submit"}
PROSE = "I will now call it: "
SIZES_KB = (25, 50, 100, 200, 400)
GIVE_UP_S = 20.0


def _repeated(piece: str, before: str = PROSE) -> Callable[[int], str]:
    return lambda size: before + piece * (size // len(piece))


SHAPES: dict[str, Callable[[int], str]] = {
    "{\"name\": flood after prose": _repeated('{"name": '),
    "{ flood after prose": _repeated("{"),
    "call starts failing at once": _repeated('{"name":} '),
    "unclosed calls after prose": _repeated('{"name": "read_file", "arguments": {'),
    "\"name\": in one unclosed object": _repeated('"name": "x", ', PROSE + '{"name": "read_file", '),
    "single-quoted unclosed calls": _repeated("{'name': 'read_file', 'arguments': {"),
    "{\"name\": flood at a line's start": _repeated('{"name": ', ""),
    "long closed call after prose": lambda size: PROSE
    + '{"name": "write_file", "arguments": {"path": "a.py", "content": "'
    + "x = 1\\n" * (size // 7)
    + '"}}',
}


def main(argv: list[str]) -> int:
    sizes = tuple(int(kb) for kb in argv[0].split(",")) if argv else SIZES_KB
    print(f"{'shape':<36} {'cut':<5} " + " ".join(f"{kb:>7} kB" for kb in sizes))
    for name, make in SHAPES.items():
        for cut in (False, True):
            cells: list[str] = []
            for kb in sizes:
                if cells and cells[-1] in ("-", "") or (cells and float(cells[-1]) > GIVE_UP_S):
                    cells.append("-")
                    continue
                text = make(kb * 1000)
                started = time.perf_counter()
                calls_in_text(text, KNOWN, cut)
                cells.append(f"{time.perf_counter() - started:.3f}")
            print(f"{name:<36} {str(cut):<5} " + " ".join(f"{cell:>10}" for cell in cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
