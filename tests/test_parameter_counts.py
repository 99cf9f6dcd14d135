"""No engine function takes more than 8 parameters (issue 53: settings travel as one object, the fast path as a
FastPath, a training run as its settings), the Triton kernels aside (their arguments are the kernel's launch
contract). Parameters: positional and keyword-only, self/cls left out; *args / **kwargs are not counted."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MOST = 8
KERNELS = {("engine/models/triton_conv.py", "_conv_kernel"), ("engine/models/triton_conv.py", "_block_kernel")}


def wide_functions(source: str):
    """(line, name, count) of each function in `source` with more than MOST parameters."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs if x.arg not in ("self", "cls")]
            if len(names) > MOST:
                found.append((node.lineno, node.name, len(names)))
    return found


def test_no_engine_function_takes_more_than_eight_parameters():
    offenders = []
    for path in sorted((ROOT / "engine").rglob("*.py")):
        where = path.relative_to(ROOT).as_posix()
        offenders += [f"{where}:{line} {name} ({count})" for line, name, count in wide_functions(path.read_text())
                      if (where, name) not in KERNELS]
    assert not offenders, offenders


def test_the_scan_counts_what_it_should():
    source = "def a(p1, p2, p3, p4, p5, p6, p7, p8, *, p9): pass\n" \
             "class C:\n    def b(self, p1, p2, p3, p4, p5, p6, p7, p8, **kw): pass\n"
    assert wide_functions(source) == [(1, "a", 9)]
