"""The package's shape: imports point down the layers of docs/architecture.md, never in a
circle; modules, functions and classes stay small.

The import graph is read from the source (AST), not by importing: an import inside a function
counts as much as one at the top, and ``if TYPE_CHECKING:`` imports count too, since a type
that points up is still a dependency a reader has to follow.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "otel_train"
ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"

# Lowest first. A module may import from its own layer's package or from any layer below it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("common", ("otel_train.version", "otel_train.common")),
    ("recording", ("otel_train.recording",)),
    ("records", ("otel_train.records",)),
    ("derived", ("otel_train.derived",)),
    ("export", ("otel_train.export",)),
    ("rundir", ("otel_train.rundir",)),
    ("pipeline", ("otel_train.pipeline",)),
    ("api", ("otel_train", "otel_train.run", "otel_train.process_hooks", "otel_train.sdk")),
    ("integrations", ("otel_train.integrations",)),
    ("cli", ("otel_train.cli",)),
]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _layer(module: str) -> int:
    """The layer of a module: the longest prefix that names one."""
    best, best_len = -1, -1
    for rank, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            exact = prefix == "otel_train"  # the top package's own modules only
            hit = (module == prefix or (not exact and module.startswith(prefix + "."))
                   or (exact and module == "otel_train"))
            if hit and len(prefix) > best_len:
                best, best_len = rank, len(prefix)
    if best < 0:
        raise AssertionError(f"{module} is in no layer: add it to LAYERS and to "
                             "docs/architecture.md")
    return best


def _imports(module: str, path: Path, modules: dict[str, Path]) -> Iterator[tuple[str, int]]:
    """(imported otel_train module, line) for every import in a module's source."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("otel_train"):
                    yield _existing(alias.name, modules), node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("otel_train"):
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                yield (sub if sub in modules else _existing(target, modules)), node.lineno


def _existing(name: str, modules: dict[str, Path]) -> str:
    """The module a dotted name lives in (an extension module counts as its package)."""
    while name not in modules and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def _graph() -> dict[str, dict[str, int]]:
    modules = _modules()
    graph: dict[str, dict[str, int]] = {}
    for name, path in modules.items():
        deps = graph.setdefault(name, {})
        for dep, line in _imports(name, path, modules):
            if dep != name:
                deps.setdefault(dep, line)
    return graph


def _cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_every_module_belongs_to_a_layer() -> None:
    for name in _modules():
        _layer(name)


def _upward(graph: dict[str, dict[str, int]]) -> list[str]:
    """Every import that points to a layer above its module's own."""
    return [
        f"{src}:{line} ({LAYERS[_layer(src)][0]}) imports {dep} ({LAYERS[_layer(dep)][0]})"
        for src, deps in sorted(graph.items()) for dep, line in deps.items()
        # The top package re-exports the public API from every layer: that is its job.
        if src != "otel_train" and _layer(dep) > _layer(src)
    ]


def test_no_module_imports_from_a_layer_above_its_own() -> None:
    upward = _upward(_graph())
    assert not upward, "imports that point up:\n" + "\n".join(upward)


def _without_top_package(graph: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    # The top package re-exports every layer's public names; an import of it from below is
    # an upward import (caught above), so it is left out of the cycle search.
    return {k: {d: n for d, n in v.items() if d != "otel_train"}
            for k, v in graph.items() if k != "otel_train"}


def test_the_import_graph_has_no_cycle() -> None:
    assert _cycles(_without_top_package(_graph())) == []


def test_the_architecture_page_names_the_layers_and_every_subpackage_in_order() -> None:
    text = ARCHITECTURE.read_text()
    match = re.search(r"<!-- layers -->(.*?)<!-- /layers -->", text, re.S)
    assert match, "docs/architecture.md has no <!-- layers --> block"
    listed = re.findall(r"`otel_train/([a-z_/]*)`", match.group(1))
    packages = sorted(
        str(p.parent.relative_to(PACKAGE)) for p in PACKAGE.rglob("__init__.py")
        if p.parent != PACKAGE)
    assert sorted(set(listed)) == packages, "the layers block and the folder tree differ"
    # ... and in the order of LAYERS, lowest first.
    order = [name for name, _ in LAYERS if name not in ("api",)]
    first_seen = [p.split("/")[0] for p in listed]
    ranks = [order.index(p) for p in dict.fromkeys(first_seen)]
    assert ranks == sorted(ranks), f"the layers block is out of order: {first_seen}"


def test_the_checks_catch_an_upward_import_and_a_cycle() -> None:
    graph = _graph()
    graph["otel_train.records.span_rows"] = {"otel_train.export.otlp.encoding": 48}
    graph["otel_train.export.otlp.encoding"] = {"otel_train.records.span_rows": 1}
    assert any("records.span_rows:48 (records) imports otel_train.export.otlp.encoding (export)"
               in line for line in _upward(graph))
    assert ["otel_train.export.otlp.encoding", "otel_train.records.span_rows"] in _cycles(
        _without_top_package(graph))


def test_relative_and_function_level_imports_are_read() -> None:
    modules = _modules()
    name = "otel_train.cli.main"
    deps = {dep for dep, _ in _imports(name, modules[name], modules)}
    # cli/main.py imports the demo and the report inside its command functions.
    assert {"otel_train.cli.demo", "otel_train.rundir.report"} <= deps


# Small rooms: a reader finds one role per module and each function on one screen.
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60
MAX_BOOLEAN_STATE_FLAGS = 4


def test_no_module_is_over_500_lines() -> None:
    long = {str(p.relative_to(PACKAGE.parent)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert long == {}


def test_no_function_is_over_60_lines() -> None:
    long = [f"{p.relative_to(PACKAGE.parent)}:{node.lineno} {node.name} "
            f"({node.end_lineno - node.lineno + 1} lines)"
            for p in PACKAGE.rglob("*.py") for node in ast.walk(ast.parse(p.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert long == []


def _boolean_flags(cls: ast.ClassDef) -> set[str]:
    """Attributes a class sets to True or False on ``self``: its boolean state."""
    return {target.attr for node in ast.walk(cls) if isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant) and isinstance(node.value.value, bool)
            for target in node.targets if isinstance(target, ast.Attribute)
            and isinstance(target.value, ast.Name) and target.value.id == "self"}


def test_no_class_keeps_more_than_a_handful_of_boolean_state_flags() -> None:
    many = [f"{p.relative_to(PACKAGE.parent)} {node.name}: {sorted(flags)}"
            for p in PACKAGE.rglob("*.py") for node in ast.walk(ast.parse(p.read_text()))
            if isinstance(node, ast.ClassDef)
            and len(flags := _boolean_flags(node)) > MAX_BOOLEAN_STATE_FLAGS]
    assert many == []


def test_the_boolean_flag_count_reads_a_class_that_has_them() -> None:
    source = ("class Client:\n    def __init__(self):\n        self.a = False\n"
              "        self.b = True\n        self.n = 0\n    def close(self):\n"
              "        self.a = True\n")
    cls = ast.parse(source).body[0]
    assert isinstance(cls, ast.ClassDef)
    assert _boolean_flags(cls) == {"a", "b"}


def _documented_modules(text: str) -> list[str]:
    """The modules the architecture page's module table lists, relative to otel_train/.

    Each row's first cell names modules in backticks; a name without a folder continues the
    folder of the name before it in the same cell (``export/process/launch.py``,
    ``outbox.py``), or is a top-level module when none came before (``run.py``)."""
    section = text.split("## Modules, in the order data flows", 1)[1].split("\n## ", 1)[0]
    listed = []
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        folder = ""
        for name in re.findall(r"`([^`]+)`", line.split("|")[1]):
            if "/" in name:
                folder = name.rsplit("/", 1)[0] + "/"
                listed.append(name)
            else:
                listed.append(folder + name)
    return [name for name in listed if name.endswith(".py")]


def test_the_architecture_page_lists_every_module_once() -> None:
    listed = _documented_modules(ARCHITECTURE.read_text())
    tree = {p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py")}
    # A subpackage's __init__ only re-exports; __main__ runs the CLI.
    tree = {m for m in tree if not (m.endswith("/__init__.py") or m.endswith("__main__.py"))}
    assert sorted(tree - set(listed)) == [], "modules the architecture page does not list"
    assert sorted(set(listed) - tree) == [], "the architecture page lists modules that are gone"
    repeated = sorted({m for m in listed if listed.count(m) > 1})
    assert repeated == [], "modules listed in more than one row"


def test_the_module_list_reads_folders_carried_over_and_top_level_names() -> None:
    text = ("## Modules, in the order data flows\n\n| module | holds |\n| --- | --- |\n"
            "| `export/process/launch.py`, `outbox.py` | x |\n| `run.py` | y |\n\n## Threads\n")
    assert _documented_modules(text) == ["export/process/launch.py", "export/process/outbox.py",
                                         "run.py"]


def test_docstrings_and_comments_name_only_modules_that_exist() -> None:
    """A ``something.py`` named in the package's source is a file of this repository (a
    module, a test, a benchmark), or ``train.py``, the user's script in command examples."""
    repo = PACKAGE.parent
    names = {p.name for p in repo.rglob("*.py")
             if not {".venv", ".git", "build"} & set(p.relative_to(repo).parts)}
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            for name in re.findall(r"(?<![\w.])(\w+\.py)\b", line):
                if name not in names and name != "train.py":
                    missing.append(f"{path.relative_to(repo)}:{n}: {name}")
    assert missing == [], "modules that do not exist:\n" + "\n".join(missing)
# Options are resolved once, in pipeline/ (pipeline/settings.py, pipeline/plan.py), into each
# part's own settings: no part below the pipeline reads RunOptions.
SETTINGS_ONLY_PACKAGES = ("recording", "records", "derived", "export", "rundir")


def _runoptions_imports(module: str, path: Path) -> list[str]:
    """``module:line`` for each import of the name ``RunOptions`` in a module's source."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and any(
                alias.name == "RunOptions" for alias in node.names):
            found.append(f"{module}:{node.lineno}")
        elif isinstance(node, ast.Attribute) and node.attr == "RunOptions":
            found.append(f"{module}:{node.lineno}")
    return found


def _options_below_pipeline(modules: dict[str, Path]) -> list[str]:
    return [hit for name, path in sorted(modules.items())
            if name.split(".")[1:2] and name.split(".")[1] in SETTINGS_ONLY_PACKAGES
            for hit in _runoptions_imports(name, path)]


def test_no_part_below_the_pipeline_imports_run_options() -> None:
    below = _options_below_pipeline(_modules())
    assert below == [], ("RunOptions read below pipeline/ (give the part its own settings, "
                         "made in pipeline/settings.py):\n" + "\n".join(below))


def test_the_settings_check_catches_a_derived_module_that_imports_run_options(
        tmp_path: Path) -> None:
    bad = tmp_path / "console.py"
    bad.write_text("from otel_train.common.options import RunOptions\n"
                   "import otel_train.common.options as o\nx = o.RunOptions\n")
    modules = {"otel_train.derived.console": bad,
               "otel_train.pipeline.settings": PACKAGE / "pipeline" / "settings.py"}
    assert _options_below_pipeline(modules) == ["otel_train.derived.console:1",
                                                "otel_train.derived.console:3"]
