"""``threads.import_tensorflow``: TensorFlow and Keras load without what Keras imports
only if it can (``threads.KERAS_OPTIONAL``), and those stay importable after. Each
case runs in a fresh interpreter, where TensorFlow is not imported yet."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from distseg.parallel import threads

from support import REPO

# Prints which of KERAS_OPTIONAL the TensorFlow import brought in, then imports them.
SCRIPT = textwrap.dedent("""
    import importlib, json, sys
    from distseg.parallel import threads
    if sys.argv[1] == "plain":
        import tensorflow, keras
    else:
        tf = threads.import_tensorflow()
        assert tf is sys.modules["tensorflow"] and "keras" in sys.modules
    loaded = [m for m in threads.KERAS_OPTIONAL if m in sys.modules]
    for name in threads.KERAS_OPTIONAL:
        importlib.import_module(name)
    print(json.dumps({"loaded": loaded, "finders": len(sys.meta_path)}))
""")


def _imports(how: str) -> dict:
    env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2", MPLBACKEND="Agg")
    out = subprocess.run([sys.executable, "-c", SCRIPT, how], capture_output=True, text=True,
                         timeout=120, env=env, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_tensorflow_loads_without_keras_optional_imports_and_they_import_after():
    plain, hidden = _imports("plain"), _imports("hidden")
    # What the hiding saves is real on this stack: a plain import brings them all in.
    assert plain["loaded"] == list(threads.KERAS_OPTIONAL), plain
    assert hidden["loaded"] == [], hidden
    # The finder is gone again: the interpreter's import machinery is as before.
    assert hidden["finders"] == plain["finders"], (hidden, plain)
