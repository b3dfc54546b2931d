"""The layout's rules, checked on the source: no import cycle between shipyard's modules or between its packages,
and imports at the top of each module unless a comment says why one is deliberately lazy."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "shipyard"


def module_name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def imported(path: Path, known: set[str]) -> set[str]:
    """shipyard modules that ``path`` imports (anywhere in the file), resolved to module names."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from pkg import x`: x is a submodule, or a name that pkg's __init__ defines
            names = [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name.startswith("shipyard"):
                out.add(name)
    # every module imports its own parent packages first; that is not a dependency between stages
    me = module_name(path)
    return {m for m in out if not me.startswith(m + ".")}


def graph(collapse) -> dict[str, set[str]]:
    mods = modules()
    g: dict[str, set[str]] = {}
    for name, path in mods.items():
        src = collapse(name)
        for dep in imported(path, set(mods)):
            dst = collapse(dep)
            if dst != src and dst != "shipyard":
                g.setdefault(src, set()).add(dst)
    return g


def find_cycle(g: dict[str, set[str]]) -> list[str] | None:
    """A cycle as a list of nodes (first == last), or None. Iterative DFS with colours."""
    colour: dict[str, int] = {}
    for start in sorted(g):
        if colour.get(start):
            continue
        stack = [(start, iter(sorted(g.get(start, ()))))]
        path = [start]
        colour[start] = 1
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                colour[node] = 2
                stack.pop()
                path.pop()
            elif colour.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif not colour.get(nxt):
                colour[nxt] = 1
                path.append(nxt)
                stack.append((nxt, iter(sorted(g.get(nxt, ())))))
    return None


def package_of(name: str) -> str:
    """shipyard.containers.push -> shipyard.containers; shipyard.slurm -> shipyard.slurm (a top-level module)."""
    parts = name.split(".")
    return ".".join(parts[:2])


def test_no_import_cycle_between_modules():
    assert find_cycle(graph(lambda n: n)) is None


def test_no_import_cycle_between_packages():
    assert find_cycle(graph(package_of)) is None


def test_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


@pytest.mark.parametrize("path", sorted(PKG.rglob("*.py")), ids=lambda p: str(p.relative_to(PKG)))
def test_imports_at_top_unless_commented_lazy(path):
    """An import inside a function is allowed only for a heavy library, with ``# lazy: why`` on its line."""
    lines = path.read_text().splitlines()
    tree = ast.parse("\n".join(lines))
    top = {id(n) for n in tree.body}
    bad = [f"{path.name}:{n.lineno}: {lines[n.lineno - 1].strip()}" for n in ast.walk(tree)
           if isinstance(n, (ast.Import, ast.ImportFrom)) and id(n) not in top
           and "# lazy:" not in lines[n.lineno - 1]]
    assert bad == []


def test_every_package_directory_is_a_regular_package():
    """setuptools' find_packages skips directories without __init__.py: their modules would be missing from a
    non-editable install."""
    missing = [str(d.relative_to(PKG)) for d in PKG.rglob("*") if d.is_dir() and d.name != "__pycache__"
               and any(d.glob("*.py")) and not (d / "__init__.py").exists()]
    assert missing == []


SLURM_CLIENTS = {"sbatch", "srun", "squeue", "sacct", "scontrol", "sinfo", "scancel", "salloc"}
SPAWN = {"run", "Popen", "call", "check_call", "check_output"}


def spawned_slurm_clients(path: Path) -> list[str]:
    """``subprocess.X([...])`` calls whose argv literal starts with a Slurm client, in one module."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in SPAWN \
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "subprocess" and node.args:
            first = node.args[0]
            if isinstance(first, (ast.List, ast.Tuple)) and first.elts and isinstance(first.elts[0], ast.Constant) \
                    and first.elts[0].value in SLURM_CLIENTS:
                found.append(f"{path.name}:{node.lineno}")
    return found


def test_slurm_clients_run_only_through_the_slurm_module():
    """One Slurm client (shipyard/slurm.py): routing to the sandbox, timeouts and errors live there alone."""
    offenders = [hit for name, path in modules().items() if name != "shipyard.slurm"
                 for hit in spawned_slurm_clients(path)]
    assert offenders == []


def test_the_slurm_check_would_notice_a_direct_call(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import subprocess\nsubprocess.run(['sbatch', '--parsable', 'x'])\n")
    assert spawned_slurm_clients(bad) == ["bad.py:2"]


# ------------------------------------------------------------------------------------------------ stages and commands

STAGES = ("registry", "definitions", "containers", "staging", "launch", "jobs", "sandbox", "remote")


def stage_offences(path: Path) -> list[str]:
    """What a stage module must not do: define a ``*_command``, load the registry (``registry.load`` /
    ``loader.load``), or import the commands layer or the CLI helpers."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.endswith("_command"):
            found.append(f"{path.name}:{node.lineno}: defines {node.name}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "load" \
                and isinstance(node.func.value, ast.Name) and node.func.value.id in ("registry", "loader"):
            found.append(f"{path.name}:{node.lineno}: calls {node.func.value.id}.load")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and (
                node.module.startswith(("shipyard.commands", "shipyard.cli"))
                or (node.module == "shipyard" and {a.name for a in node.names} & {"commands", "cli"})):
            found.append(f"{path.name}:{node.lineno}: imports {node.module}")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and path.parent.name != "registry" \
                and node.module in ("shipyard.registry", "shipyard.registry.loader") \
                and "load" in {a.name for a in node.names}:  # the registry package itself re-exports it
            found.append(f"{path.name}:{node.lineno}: imports load from {node.module}")
    return found


@pytest.mark.parametrize("stage", STAGES)
def test_stages_leave_use_cases_to_the_commands_layer(stage):
    """A stage takes objects and returns values: the registry is loaded, names resolved and the gate run once, in
    shipyard/commands/ (see the package's docstring)."""
    offenders = [hit for path in sorted((PKG / stage).rglob("*.py")) for hit in stage_offences(path)]
    assert offenders == []


def test_the_stage_check_would_notice_each_offence(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from shipyard import registry\nfrom shipyard.commands import gate\n"
                   "def x_command():\n    return registry.load()\n")
    assert stage_offences(bad) == ["bad.py:2: imports shipyard.commands", "bad.py:3: defines x_command",
                                   "bad.py:4: calls registry.load"]


# the packages that sit above containers in the import order and that it must never reach: staging reads the build
# manifest and launch reads the stage record; the build knows neither
ABOVE_CONTAINERS = ("shipyard.launch", "shipyard.staging")


def from_above(imports: set[str], above=ABOVE_CONTAINERS) -> list[str]:
    return sorted(m for m in imports if any(m == a or m.startswith(a + ".") for a in above))


def test_containers_imports_nothing_from_launch_or_staging():
    """Images are made below staging and launch: ``containers`` imports neither."""
    known = set(modules())
    offenders = [f"{name} imports {', '.join(hits)}" for name, path in modules().items()
                 if name == "shipyard.containers" or name.startswith("shipyard.containers.")
                 for hits in [from_above(imported(path, known))] if hits]
    assert offenders == []


def test_the_containers_check_would_notice_an_import_of_staging():
    imports = {"shipyard.staging.record", "shipyard.launch", "shipyard.launchpad", "shipyard.registry"}
    assert from_above(imports) == ["shipyard.launch", "shipyard.staging.record"]


# the floors below containers, and what each must never reach above it (tasks.py -> commands -> {launch, jobs,
# sandbox} -> staging -> containers -> definitions -> {slurm, runtimes} -> registry -> core)
NEVER_ABOVE = {
    "shipyard.staging": ("shipyard.launch", "shipyard.jobs", "shipyard.sandbox"),
    "shipyard.definitions": ("shipyard.containers", "shipyard.staging", "shipyard.launch", "shipyard.jobs"),
    "shipyard.runtimes": ("shipyard.definitions", "shipyard.containers", "shipyard.staging", "shipyard.launch",
                          "shipyard.jobs", "shipyard.registry"),
    "shipyard.registry": ("shipyard.definitions", "shipyard.containers", "shipyard.staging", "shipyard.launch",
                          "shipyard.jobs", "shipyard.runtimes"),
}


@pytest.mark.parametrize("package", sorted(NEVER_ABOVE))
def test_the_pipeline_goes_one_way(package):
    known = set(modules())
    offenders = [f"{name} imports {', '.join(hits)}" for name, path in modules().items()
                 if package_of(name) == package
                 for hits in [from_above(imported(path, known), NEVER_ABOVE[package])] if hits]
    assert offenders == []


def test_tasks_load_no_command_module_until_a_task_runs():
    """`invoke --list` and every task's --help load tasks.py only: the command modules (the registry loader,
    jsonschema, Jinja2, the launcher) are imported inside each task, so no task pays for another's start-up."""
    code = ("import sys, shipyard.tasks; "
            "print(sorted(m for m in sys.modules if m.startswith(('shipyard.commands', 'shipyard.registry', "
            "'jsonschema', 'jinja2'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", f"tasks.py imports at load time: {out.strip()}"


# ------------------------------------------------------------------------------------------------ tasks


# what a task's call may compute besides the one command call: the Flags' own hand-overs and plain conversions
FLAG_HANDOVERS = {"context", "options", "after_dashdash"}
CONVERSIONS = {"int", "float", "str"}


def task_offences(path: Path) -> list[str]:
    """Every task is a ``Spec(...)`` (shipyard/taskspec.py): flags, help and ``call``, a lambda that is one call of
    the command it is handed, its arguments read from the flags (``f.x``, ``not f.x``, ``f.x or None``,
    ``int(f.x)``, ``f.context()``). Anything else (a ``@task`` function, a branch, a second call, a comprehension)
    is logic that belongs in shipyard/commands/."""
    found = []
    tree = ast.parse(path.read_text())
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
                isinstance(d.func if isinstance(d, ast.Call) else d, ast.Name)
                and (d.func if isinstance(d, ast.Call) else d).id == "task" for d in fn.decorator_list):
            found.append(f"{fn.name}: a @task function, not a Spec")
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Spec"):
            continue
        given = {k.arg: k.value for k in node.keywords} | dict(zip(("name", "doc", "flags", "command", "call"),
                                                                   node.args))
        name = given["name"].value if isinstance(given.get("name"), ast.Constant) else f"line {node.lineno}"
        call = given.get("call")
        if not (isinstance(call, ast.Lambda) and len(call.args.args) == 2):
            found.append(f"{name}: its call is not a lambda of (command, flags)")
            continue
        run, flags = (a.arg for a in call.args.args)
        body = call.body
        if not (isinstance(body, ast.Call) and isinstance(body.func, ast.Name) and body.func.id == run):
            found.append(f"{name}: its call is not one call of the command")
            continue
        for inner in ast.walk(body):
            if inner is body:
                continue
            if isinstance(inner, ast.Call):
                handover = (isinstance(inner.func, ast.Attribute) and isinstance(inner.func.value, ast.Name)
                            and inner.func.value.id == flags and inner.func.attr in FLAG_HANDOVERS)
                if not handover and not (isinstance(inner.func, ast.Name) and inner.func.id in CONVERSIONS):
                    found.append(f"{name}: calls {ast.unparse(inner.func)} besides the command")
            elif isinstance(inner, (ast.IfExp, ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp,
                                    ast.GeneratorExp, ast.NamedExpr)):
                found.append(f"{name}: {type(inner).__name__} in its call")
    return found


TASK_FILES = (PKG / "tasks.py", PKG.parent / "tasks.py")


@pytest.mark.parametrize("path", TASK_FILES, ids=lambda p: str(p.relative_to(PKG.parent)))
def test_a_task_is_its_options_and_one_command_call(path):
    assert "Spec(" in path.read_text()
    assert task_offences(path) == []


def test_the_task_check_would_notice_logic_in_a_task(tmp_path):
    bad = tmp_path / "tasks.py"
    bad.write_text("from invoke import task\n\n"
                   "A = Spec('a', 'doc', {}, 'm:a', lambda run, f: run(f.context(), int(f.x), not f.y))\n"
                   "B = Spec('b', 'doc', {}, 'm:b', lambda run, f: run(f.x if f.y else 1))\n"
                   "C = Spec('c', 'doc', {}, 'm:c', lambda run, f: run(other(f.x)))\n"
                   "D = Spec('d', 'doc', {}, 'm:d', call=lambda run, f: f.x and run(f.x))\n"
                   "E = Spec('e', 'doc', {}, 'm:e', helper)\n"
                   "F = Spec('f', 'doc', {}, 'm:f', lambda run, f: run([x for x in f.x]))\n\n"
                   "@task\ndef g(c):\n    raise SystemExit(g_commands.run())\n")
    assert task_offences(bad) == ["g: a @task function, not a Spec",
                                  "b: IfExp in its call",
                                  "c: calls other besides the command",
                                  "d: its call is not one call of the command",
                                  "e: its call is not a lambda of (command, flags)",
                                  "f: ListComp in its call"]


def test_every_task_is_made_from_a_spec():
    """The namespace holds the tasks of the specs and nothing else: no task made by hand beside the table."""
    sys.path.insert(0, str(PKG.parent))
    try:
        import tasks as root_tasks
    finally:
        sys.path.remove(str(PKG.parent))
    from shipyard import tasks as shipyard_tasks
    from shipyard.taskspec import Flags

    specs = shipyard_tasks.SPECS + root_tasks.SPECS
    assert len(root_tasks.ns.task_names) == len(specs)
    assert {s.name for s in specs} >= {t.rsplit(".", 1)[-1] for t in root_tasks.ns.task_names}
    assert {t.body.__doc__ for t in (root_tasks.ns[n] for n in root_tasks.ns.task_names)} == {s.doc for s in specs}
    # a flag named like one of the Flags' hand-overs would hide it
    assert not {n for s in specs for n in s.flags} & {n for n in dir(Flags) if not n.startswith("_")}
