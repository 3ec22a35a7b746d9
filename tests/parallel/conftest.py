"""Multi-process tests: run as `horovodrun -np 2 -H localhost:2 python -m pytest tests/parallel`.

Every rank runs the same tests in the same order; a test that calls a collective on
one rank must call it on all. Each rank gets its own pytest temp dir; `shared_dir` is
one directory all ranks use.
"""

import os
import shutil
import tempfile

import pytest

from distseg.parallel import distributed as dist

from support import rank_from_env


def pytest_configure(config):
    # Two pytest processes must not race for the same /tmp/pytest-of-USER/pytest-N.
    if config.option.basetemp is None:
        config.option.basetemp = os.path.join(
            tempfile.gettempdir(), f"distseg-parallel-{os.getuid()}", f"rank{rank_from_env()}")


@pytest.fixture(scope="session")
def ctx():
    c = dist.init()
    if c.size < 2:
        # A fail, not a skip: a launcher that came up as single processes must not pass.
        pytest.fail("needs at least 2 ranks: horovodrun -np 2 -H localhost:2 python -m pytest tests/parallel")
    return c


@pytest.fixture
def shared_dir(ctx):
    path = dist.broadcast_object(tempfile.mkdtemp(prefix="distseg-shared-") if ctx.is_root() else None)
    yield path
    dist.barrier()
    if ctx.is_root():
        shutil.rmtree(path, ignore_errors=True)
