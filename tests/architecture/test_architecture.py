"""The layers of docs/architecture.md hold in the import graph: nothing imports a layer below it (one named
exception), there is no import cycle among the imports a module makes outside its functions (those under
`if TYPE_CHECKING:` included), only the app layer imports streamlit, no function is long and no file very long;
the docs say what is true now, name tests that exist, and their library example runs."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAYER = {"safetext": 0, "catalogue": 1, "losses": 2, "loss_checks": 2, "metrics": 2, "loss_grids": 2, "bandit": 3,
         "engine": 3,
         "runs": 3.2,  # run management, importing the engine
         "trl": 3.5, "importers": 3.5, "verl": 3.5, "ray": 3.5,  # beside the engine and runs, importing them
         "evidence": 4, "views": 5, "app": 6, "cli": 7, "cli_train": 7, "cli_claims": 7, "cli_output": 7, "__main__": 7}
ALLOWED_UPWARD = {("divviz.runs.worker", "divviz.trl.run")}  # the worker runs a queued TRL run; lazy, TRL optional


def modules() -> dict[str, Path]:
    found = {}
    for path in (ROOT / "divviz").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def outside_functions(tree: ast.AST):
    """The nodes of `tree` not inside a function: a module's own statements, those under `if TYPE_CHECKING:` or a
    `try:` included (a type-only import is still an edge of the graph a reader follows)."""
    for node in ast.iter_child_nodes(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            yield node
            yield from outside_functions(node)


def imports(path: Path, module_level_only: bool) -> set[str]:
    """The divviz modules `path` imports (`from divviz.x import y` counts y when y is a module); with
    `module_level_only`, those it imports outside its functions."""
    tree = ast.parse(path.read_text())
    nodes = outside_functions(tree) if module_level_only else ast.walk(tree)
    names = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("divviz"):
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names if alias.name.startswith("divviz"))
    return names & set(modules())


def layer(module: str) -> int:
    parts = module.split(".")
    return LAYER[parts[1]] if len(parts) > 1 else -1  # `divviz` itself holds only __version__


def test_every_module_belongs_to_a_layer():
    assert all(m == "divviz" or m.split(".")[1] in LAYER for m in modules()), sorted(modules())


def test_nothing_imports_a_layer_below_it():
    upward = {(m, target) for m, path in modules().items() for target in imports(path, module_level_only=False)
              if layer(target) > layer(m)}
    assert upward == ALLOWED_UPWARD


def test_a_type_only_import_is_an_edge_of_the_graph(tmp_path):
    """The cycle test sees what a module imports under `if TYPE_CHECKING:` (a circle the runtime never meets is still
    one a reader walks), and not what a function imports."""
    path = tmp_path / "m.py"
    path.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from divviz.engine.grpo import Trainer\n"
                    "def f():\n    from divviz.runs import store\n")
    assert imports(path, module_level_only=True) == {"divviz.engine.grpo"}
    assert "divviz.runs.store" in imports(path, module_level_only=False)


def test_no_module_level_import_cycle():
    graph = {m: imports(path, module_level_only=True) - {m} for m, path in modules().items()}
    state: dict[str, int] = {}

    def visit(m, trail):
        state[m] = 1
        for n in graph[m]:
            assert state.get(n) != 1, " -> ".join([*trail, m, n])
            if n not in state:
                visit(n, [*trail, m])
        state[m] = 2

    for m in graph:
        if m not in state:
            visit(m, [])


def test_only_the_app_layer_imports_streamlit():
    importers = {str(p.relative_to(ROOT)) for p in (ROOT / "divviz").rglob("*.py") if "import streamlit" in p.read_text()}
    assert importers and all(p.startswith("divviz/app/") for p in importers), importers


def test_every_table_is_shown_by_one_widget():
    """A page shows a data table through `widgets.show_table`, so a missing value reads the same (a dash, not
    Streamlit's grey "None") on every page."""
    direct = {str(p.relative_to(ROOT)) for p in [*(ROOT / "app_pages").glob("*.py"), *(ROOT / "divviz").rglob("*.py")]
              if "st.dataframe(" in p.read_text()}
    assert direct == {"divviz/app/widgets.py"}


def test_each_layer_package_is_its_docstring_and_no_file_is_long():
    for package in ("catalogue", "bandit", "evidence", "views", "app"):
        tree = ast.parse((ROOT / "divviz" / package / "__init__.py").read_text())
        assert len(tree.body) == 1 and isinstance(tree.body[0].value, ast.Constant), package
    long = {str(p.relative_to(ROOT)): n for p in [*(ROOT / "divviz").rglob("*.py"), *(ROOT / "app_pages").glob("*.py")]
            if (n := len(p.read_text().splitlines())) > 450}
    assert not long


FUNCTION_LINES = 60  # a function a reader holds in one screen, its docstring included
LONG_BY_NATURE = {"divviz/cli_train.py:add_train_parser"}  # the CLI's parser: one add_argument per option


def test_no_function_is_longer_than_a_screen():
    long = {f"{p.relative_to(ROOT)}:{node.name}": node.end_lineno - node.lineno + 1
            for p in (ROOT / "divviz").rglob("*.py") for node in ast.walk(ast.parse(p.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > FUNCTION_LINES}
    assert set(long) == LONG_BY_NATURE, long


def test_docs_and_code_say_what_is_true_now_not_when_it_was_done():
    """No numbered work period, issue or finding in docs/, README or the code's comments and docstrings: those say
    what is true now and how to reproduce it (dates label measurements)."""
    import re

    numbered = re.compile(r"\b(" + "|".join(("session", "issue", "finding")) + r") #?\d+", re.I)
    files = [*ROOT.glob("docs/*.md"), ROOT / "README.md",
             *(p for folder in ("divviz", "app_pages", "bench", "scripts", "tests") for p in (ROOT / folder).rglob("*.py"))]
    found = {str(p.relative_to(ROOT)): m[0] for p in files if (m := numbered.search(p.read_text()))}
    assert len(files) > 100 and not found


def test_every_test_is_in_a_folder_of_the_map_and_every_test_path_the_docs_name_exists():
    """docs/tests.md's map names one folder per layer: every test module is in one of them, and a path to a test in
    README, docs/ or a docstring names a file that is there."""
    rows = [line for line in (ROOT / "docs" / "tests.md").read_text().splitlines() if line.startswith("| ")]
    mapped = {folder for row in rows for folder in re.findall(r"`tests/(\w+)/`", row)}
    folders = {p.parent.name for p in (ROOT / "tests").rglob("test_*.py")}
    assert not list((ROOT / "tests").glob("test_*.py")) and folders == mapped
    texts = [*ROOT.glob("docs/*.md"), ROOT / "README.md", *(ROOT / "divviz").rglob("*.py"), *(ROOT / "scripts").glob("*.py")]
    named = {m for path in texts for m in re.findall(r"tests/[\w/]+\.py", path.read_text())}
    assert named and all((ROOT / path).is_file() for path in named), sorted(p for p in named if not (ROOT / p).is_file())


@pytest.mark.parametrize("document", ["README.md", "docs/library.md"])
def test_the_library_example_runs_as_written(document):
    """The documents' first library example (`policy_loss` under an objective) runs on a batch of its shapes."""
    import torch

    text = (ROOT / document).read_text()
    example = next(block for block in re.findall(r"```python\n(.*?)```", text, re.S) if "policy_loss(" in block)
    b, t = 3, 5
    logp_old = torch.rand(b, t).clamp(min=0.05).log()
    scope = {"logp_new": (logp_old + 0.1 * torch.randn(b, t)).requires_grad_(), "logp_old": logp_old,
             "advantages": torch.tensor([1.0, -1.0, 0.5]), "completion_mask": torch.ones(b, t),
             "logp_ref": logp_old.clone()}
    exec(compile(example, document, "exec"), scope)  # our own documentation's code, not user text
    assert scope["out"].loss.isfinite() and scope["logp_new"].grad is not None
