"""What Horovod really says when a peer is gone, pinned: ``distributed.lost_peer`` is the
one function that reads Horovod's words, and these tests trigger the real errors so
that a Horovod or TensorFlow upgrade that changes them fails here, not in a lost-rank
diagnosis in production.
"""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

from proc_group import horovodrun_cmd, run_group
from support import REPO, command_env

TIMEOUT = 180
pytestmark = pytest.mark.timeout(TIMEOUT + 60)

#: Runs three collectives on rank 0 after rank 1 has shut Horovod down and exited, and
#: writes what each raised (type, whether it holds the shut-down phrase, lost_peer).
#: Rank 0 waits for those two events: rank 1 writes its pid to a file once shut down,
#: and rank 0 then waits for that process to end (a minute at most).
PEER_GONE = textwrap.dedent("""
    import json, os, sys, time
    import tensorflow as tf
    from distseg.parallel import distributed as dist

    ctx = dist.init()
    shut_down = sys.argv[1] + ".rank1"
    if ctx.rank == 1:
        dist.shutdown()  # this rank finishes; rank 0's next collective has no peer
        with open(shut_down + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.replace(shut_down + ".tmp", shut_down)
        sys.exit(0)


    def rank1_gone():
        if not os.path.exists(shut_down):
            return False
        with open(shut_down) as f:
            pid = int(f.read())
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] == "Z"  # ended, not yet reaped
        except OSError:
            return True


    deadline = time.monotonic() + 60
    while not rank1_gone():
        if time.monotonic() > deadline:
            sys.exit("rank 1 did not shut down and exit within 60 s")
        time.sleep(0.05)
    step = tf.function(lambda x: dist.average_gradients([x], [x * 2]))
    seen = {}
    for name, call in (("step", lambda: step(tf.constant(1.0))),
                       ("allreduce", lambda: dist.allreduce([1.0])),
                       ("allgather_object", lambda: dist.allgather_object(1))):
        try:
            call()
            seen[name] = None
        except Exception as e:
            seen[name] = {"type": type(e).__name__, "phrase": dist.HOROVOD_SHUT_DOWN in str(e),
                          "lost_peer": dist.lost_peer(e), "recoverable": dist.recoverable(e),
                          "message": str(e)[:300]}
    with open(sys.argv[1], "w") as f:
        json.dump(seen, f)
""")

#: One process: a Horovod op after ``hvd.shutdown()`` fails, but no peer was lost.
AFTER_SHUTDOWN = textwrap.dedent("""
    import json, sys
    import tensorflow as tf
    from distseg.parallel import distributed as dist

    dist.init()
    dist.shutdown()
    try:
        tf.function(lambda x: dist.average_gradients([x]))(tf.constant(1.0))
        seen = None
    except Exception as e:
        seen = {"type": type(e).__name__, "horovod_op": "HorovodGroupedAllreduce" in str(e),
                "lost_peer": dist.lost_peer(e)}
    with open(sys.argv[1], "w") as f:
        json.dump(seen, f)
""")


def _script(tmp_path, text: str) -> str:
    path = tmp_path / "probe.py"
    path.write_text(text)
    return str(path)


def test_a_peer_that_shut_down_is_a_lost_peer_in_every_collective(tmp_path):
    out = tmp_path / "seen.json"
    cmd = horovodrun_cmd(sys.executable, _script(tmp_path, PEER_GONE), str(out), controller="gloo")
    done = run_group(cmd, timeout=TIMEOUT, env=command_env(), cwd=REPO, merge_stderr=True)
    assert out.exists(), done.stdout[-3000:]
    seen = json.loads(out.read_text())
    for name, what in seen.items():
        assert what is not None, f"{name} succeeded without its peer"
        assert (what["type"], what["phrase"], what["lost_peer"], what["recoverable"]) == \
            ("UnknownError", True, True, True), (name, what)


def test_a_horovod_op_after_shutdown_is_not_a_lost_peer(tmp_path):
    """The op's name is in the message, but the error is TensorFlow's
    FailedPreconditionError ("not initialized"), not a broken ring."""
    out = tmp_path / "seen.json"
    done = run_group([sys.executable, _script(tmp_path, AFTER_SHUTDOWN), str(out)],
                     timeout=TIMEOUT, env=command_env(), cwd=REPO)
    assert out.exists(), done.stderr[-3000:]
    seen = json.loads(out.read_text())
    assert seen == {"type": "FailedPreconditionError", "horovod_op": True, "lost_peer": False}


def test_horovods_own_exceptions_are_read_by_type():
    from horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt

    from distseg.parallel import distributed as dist
    assert dist.lost_peer(HorovodInternalError("any words")) and dist.recoverable(HorovodInternalError("x"))
    assert dist.recoverable(HostsUpdatedInterrupt(False)) and not dist.lost_peer(HostsUpdatedInterrupt(True))
    assert not dist.lost_peer(RuntimeError("HorovodAllreduce failed: not a TensorFlow error"))
    assert not dist.recoverable(ValueError("bad input"))
