"""No product function is longer than a reader can hold (issue 61: at most 80 lines, docstring included), the
Triton kernels aside (a kernel is one launch: splitting it would cost registers, not lines). Product code: the
engine, the exports, the bench and the command line; studies and tests are not."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MOST = 80
PRODUCT = ("engine", "export", "bench", "diffsmooth/cli")


def long_functions(source: str):
    """(line, name, lines) of each function in `source` longer than MOST lines, Triton kernels (@triton.jit) aside."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            kernel = any(ast.unparse(d).startswith("triton.jit") for d in node.decorator_list)
            length = node.end_lineno - node.lineno + 1
            if length > MOST and not kernel:
                found.append((node.lineno, node.name, length))
    return found


def test_no_product_function_is_over_80_lines():
    offenders = []
    for folder in PRODUCT:
        for path in sorted((ROOT / folder).rglob("*.py")):
            where = path.relative_to(ROOT).as_posix()
            offenders += [f"{where}:{line} {name} ({length} lines)" for line, name, length in
                          long_functions(path.read_text())]
    assert not offenders, offenders


def test_the_scan_finds_a_long_function_and_leaves_a_kernel():
    body = "".join(f"    x{k} = {k}\n" for k in range(MOST))
    source = f"def long():\n{body}\n@triton.jit\ndef kernel():\n{body}\ndef short():\n    return 1\n"
    assert long_functions(source) == [(1, "long", MOST + 1)]
