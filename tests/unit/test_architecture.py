"""The layout holds: every import in ``distseg/`` points down the stages, ``analysis/``
reaches only ``distseg.core`` and the data file's format (``distseg.data``, for the
coverage check against the file's split), no module of either imports itself round a cycle, and no
function reaches 80 lines.

The stages, lowest first (peers share a tier and may import each other):

0. ``core``: plain facts (config, errors, log schema, run directory).
1. ``parallel``: the runtime every stage shares (Horovod, thread pools).
2. ``networks``, ``losses``, ``metrics``: the U-Net, what it is trained with, how it is scored.
3. ``data``: data on disk and on its way to the model.
4. ``sliding``: the sliding-window inferer (pads as the data's slab reader pads).
5. ``training``: the loop, its step, validation, checkpoints.
6. ``inference``, ``cluster``: prediction from a trained run; Slurm jobs and hosts.
7. ``cli``: one thin module per command.

``training`` holds its pieces in rooms named for when they act, with the same rule among
them (lowest first; peers share a tier):

0. ``progress``: what changes as training goes on (epoch plan, lr, noise scale, batch policy).
1. ``step``: the train step and the factory that builds it, validation's scoring.
2. ``epoch``, ``checkpoints``: the model parts and observers around each epoch; checkpoints
   and resume (a checkpoint saves the parts, two parts read its rules).
3. ``startup``: the decisions before the first step.
4. the loop's own modules, directly in ``training/`` (``loop``, ``session``, ...).

No room, and not ``training/`` itself, holds more than ``ROOM_SIZE`` modules: a flat folder
hides the stages.

The imports are read from the source (``ast``), function-level ones included, so a lazy
import against the order fails too.
"""

import ast
import os

from support import REPO

TIERS = (("core",), ("parallel",), ("networks", "losses", "metrics"), ("data",),
         ("sliding",), ("training",), ("inference", "cluster"), ("cli",))
TIER = {stage: i for i, names in enumerate(TIERS) for stage in names}
PACKAGES = ("distseg", "analysis")
#: The rooms of ``training``, lowest first; "" is the loop's own modules in ``training/``.
ROOMS = (("progress",), ("step",), ("epoch", "checkpoints"), ("startup",), ("",))
ROOM = {room: i for i, names in enumerate(ROOMS) for room in names}
ROOM_SIZE = 12
TRAINING = os.path.join("distseg", "training")


def _modules(package: str) -> dict[str, str]:
    """Dotted module name -> file, for every ``.py`` file under ``package``."""
    out = {}
    for root, _, files in os.walk(os.path.join(REPO, package)):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(root, name)
                dotted = os.path.relpath(path, REPO)[:-3].replace(os.sep, ".")
                out[dotted.removesuffix(".__init__")] = path
    return out


def _imported(path: str) -> set[str]:
    """Every ``distseg``/``analysis`` module ``path`` imports, at any depth of the file
    (``from distseg import losses`` counts as ``distseg.losses``)."""
    out = set()
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] in PACKAGES)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] in PACKAGES:
                out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


def _stage(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "distseg" else None


def test_every_stage_of_distseg_is_in_the_order():
    stages = {_stage(m) for m in _modules("distseg")} - {None}
    assert stages == set(TIER), "a new stage needs a tier in TIERS (and docs/architecture.md)"


def test_every_import_in_distseg_points_down_the_stages():
    against = []
    for module, path in sorted(_modules("distseg").items()):
        source = _stage(module)
        for target in sorted(_imported(path)):
            stage = _stage(target)
            if source and stage in TIER and TIER[stage] > TIER[source]:
                against.append(f"{module} -> {target}")
    assert against == []


def test_analysis_reaches_only_the_plain_stages_of_distseg():
    reach = sorted(f"{m} -> {t}" for m, path in _modules("analysis").items()
                   for t in _imported(path) if t.startswith("distseg.")
                   and _stage(t) not in ("core", "data"))
    assert reach == []


def _room(module: str) -> str | None:
    """The room of a ``distseg.training`` module ("" for one directly in ``training/``)."""
    parts = module.split(".")
    if parts[:2] != ["distseg", "training"] or len(parts) < 3:
        return None
    return parts[2] if os.path.isdir(os.path.join(REPO, TRAINING, parts[2])) else ""


def test_every_room_of_training_is_in_the_order():
    rooms = {_room(m) for m in _modules("distseg")} - {None}
    assert rooms == set(ROOM), "a new room needs a tier in ROOMS (and docs/architecture.md)"


def test_every_import_in_training_points_down_the_rooms():
    against = [f"{module} -> {target}" for module, path in sorted(_modules("distseg").items())
               if (source := _room(module)) is not None
               for target in sorted(_imported(path))
               if (room := _room(target)) is not None and ROOM[room] > ROOM[source]]
    assert against == []


def test_no_room_of_training_holds_more_than_12_modules():
    sizes = {}
    for module in _modules("distseg"):
        room = _room(module)
        if room is not None and module != f"distseg.training.{room}".rstrip("."):
            sizes[room] = sizes.get(room, 0) + 1
    assert sizes and {r: n for r, n in sizes.items() if n > ROOM_SIZE} == {}


def test_an_import_up_the_rooms_is_found():
    assert _room("distseg.training.loop") == "" and _room("distseg.training.step.steps") == "step"
    assert ROOM[_room("distseg.training.startup.prepare")] > ROOM[_room("distseg.training.epoch.board")]


def _graph(package: str) -> dict[str, set[str]]:
    mods = _modules(package)

    def owner(target: str) -> str | None:
        # ``from distseg.core import config`` names a module; ``from x import name`` a name.
        while target and target not in mods:
            target = target.rpartition(".")[0]
        return target or None
    return {m: {o for t in _imported(p) if (o := owner(t)) and o != m and o != package}
            for m, p in mods.items()}


def test_no_import_cycle_between_modules():
    for package in PACKAGES:
        graph = _graph(package)

        def reaches(start, goal, seen, graph=graph):
            return any(n == goal or (n not in seen and reaches(n, goal, seen | {n}))
                       for n in graph.get(start, ()))
        assert [m for m in graph if reaches(m, m, set())] == [], package


def test_no_function_reaches_80_lines():
    long = []
    for package in PACKAGES:
        for module, path in sorted(_modules(package).items()):
            tree = ast.parse(open(path).read())
            long += [f"{module}:{n.name}" for n in ast.walk(tree)
                     if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                     and n.end_lineno - n.lineno >= 80]
    assert long == []


def _calls(attribute: str, roots=("distseg", "benchmarks")) -> set[str]:
    """Files (relative to the repository) whose code calls ``X.<attribute>(...)``."""
    found = set()
    for root in roots:
        for dirpath, _, files in os.walk(os.path.join(REPO, root)):
            for name in files:
                if not name.endswith(".py"):
                    continue
                path = os.path.join(dirpath, name)
                with open(path) as f:
                    tree = ast.parse(f.read())
                if any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                       and n.func.attr == attribute for n in ast.walk(tree)):
                    found.add(os.path.relpath(path, REPO))
    return found


def test_the_optimizers_lr_has_one_writer():
    # ``optimizer.learning_rate.assign(...)``: only ``distseg.core.lr.assign``.
    writers = {f for f in _calls("assign") if "learning_rate.assign" in open(os.path.join(REPO, f)).read()}
    assert writers == {"distseg/core/lr.py"}


def test_the_train_step_is_built_from_the_config_in_one_place():
    # The memory probe builds a step for a planned U-Net spec, not for a run's config.
    assert _calls("make_train_step") <= {"distseg/training/step/factory.py", "distseg/training/step/memprobe.py",
                                         "benchmarks/benchlib/step_variants.py"}
    assert "distseg/training/step/factory.py" in _calls("make_train_step")
