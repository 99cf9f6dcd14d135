"""No import circle anywhere in the package, in-function and TYPE_CHECKING imports counted.

import-linter's contracts (pyproject.toml) forbid the circles known so far, layer by layer; this test
catches a new one anywhere: it builds the import graph import-linter uses (grimp, every import statement
wherever it sits) and looks for strongly connected groups of modules. An import moved into a function
does not hide a circle from it.
"""

import pytest

grimp = pytest.importorskip("grimp", reason="grimp (import-linter's graph) is not installed: the dev extra installs it")


def _circles(graph) -> list[frozenset]:
    """Every strongly connected group of more than one module (Tarjan's algorithm, iterative)."""
    modules = sorted(graph.modules)
    edges = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in modules}
    index, low, stack, on_stack, out = {}, {}, [], set(), []
    for root in modules:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            for j in range(i, len(edges[node])):
                nxt = edges[node][j]
                if nxt not in index:
                    work += [(node, j + 1), (nxt, 0)]
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                if low[node] == index[node]:
                    group = set()
                    while True:
                        m = stack.pop()
                        on_stack.discard(m)
                        group.add(m)
                        if m == node:
                            break
                    if len(group) > 1:
                        out.append(frozenset(group))
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
    return out


def _graph():
    return grimp.build_graph("diffsmooth", include_external_packages=False, cache_dir=None)


def test_no_import_circle():
    circles = _circles(_graph())
    assert not circles, "import circles (move what both sides need into a lower module): " + "; ".join(
        " <-> ".join(sorted(c)) for c in circles)


def test_the_search_sees_an_in_function_circle():
    graph = grimp.ImportGraph()
    for m in ("p", "p.a", "p.b", "p.c", "p.d"):
        graph.add_module(m)
    graph.add_import(importer="p.a", imported="p.b")
    graph.add_import(importer="p.b", imported="p.c")
    graph.add_import(importer="p.c", imported="p.a")          # e.g. inside a function
    graph.add_import(importer="p.d", imported="p.a")
    assert _circles(graph) == [frozenset({"p.a", "p.b", "p.c"})]
