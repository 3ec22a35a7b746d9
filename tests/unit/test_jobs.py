"""Slurm job scripts (distseg/cluster/jobs.py, distseg/cluster/outcome.py, distseg/cli/jobs.py,
jobs/) and the Docker files.

Rendered scripts are checked for the numbers they hold (linting them with `bash -n` and
shellcheck is tests/unit/test_lint.py's job, so a missing shellcheck never skips these),
and run only as far as their checks, which refuse before anything is launched. A
rendered script run for real, with 2 ranks, is tests/e2e/test_jobs_e2e.py.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys

import pytest

from distseg.cluster import jobs as jobs_lib
from distseg.cluster import outcome as outcome_lib
from distseg.core import errors, rundir
from distseg.data import synth
from distseg.parallel import distributed

from support import REPO, command_env, slurm_env
from support import jobs_cli as cli

#: What every rendered script exports, from the one definition of each value.
EXPECTED_ENV = {**distributed.HOROVOD_DEFAULTS, **jobs_lib.JOB_HOROVOD_SETTINGS, **distributed.OMPI_DEFAULTS}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """48 training slices of 32x32 (4 cases x 16 slices, by-case split)."""
    path = str(tmp_path_factory.mktemp("data") / "tiny.h5")
    synth.make_dataset(path, cases=4, size=32, seed=0, slices_per_case=16)
    return path


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """Enough 32x32 slices (320 train) for 32 nodes x 2 ranks x batch 4."""
    path = str(tmp_path_factory.mktemp("data") / "big.h5")
    synth.make_dataset(path, cases=25, size=32, seed=1, slices_per_case=16, val_fraction=0.2)
    return path


def _assignments(script: str) -> dict[str, str]:
    return dict(re.findall(r"^([A-Z_]+)=(.*)$", script, flags=re.M))


# ---- threads arithmetic -----------------------------------------------------------------

@pytest.mark.parametrize("cores, ranks, reserved, hw, tpc, want", [
    # cores, ranks/node, reserved, hw threads, threads/core -> (cores/rank, intra, inter, cpus/task, idle)
    (68, 4, 4, 1, 4, (16, 16, 2, 64, 0)),   # KNL default: 64 usable cores / 4 ranks
    (68, 1, 4, 1, 4, (64, 64, 2, 256, 0)),
    (68, 3, 4, 1, 4, (21, 21, 2, 84, 1)),   # 64 / 3: one core idle
    (68, 4, 4, 2, 4, (16, 32, 2, 64, 0)),   # 2 hardware threads per core
    (48, 2, 0, 1, 2, (24, 24, 2, 48, 0)),   # SKX: one rank per socket
    (48, 8, 0, 2, 2, (6, 12, 2, 12, 0)),
    (48, 48, 0, 1, 2, (1, 1, 1, 2, 0)),
    (2, 2, 0, 1, 1, (1, 1, 1, 1, 0)),       # this machine: 2 ranks on 2 cores
    (4, 1, 0, 1, 1, (4, 4, 2, 4, 0)),
])
def test_threads_split_cores_between_ranks(cores, ranks, reserved, hw, tpc, want):
    t = jobs_lib.threads_for(cores, ranks, reserved_cores=reserved, hw_threads=hw, threads_per_core=tpc)
    assert (t.cores_per_rank, t.intra_op, t.inter_op, t.cpus_per_task, t.idle_cores) == want


@pytest.mark.parametrize("kwargs, message", [
    (dict(cores_per_node=68, ranks_per_node=65, reserved_cores=4), "more than the 64 usable cores"),
    (dict(cores_per_node=48, ranks_per_node=0), "--ranks-per-node must be >= 1"),
    (dict(cores_per_node=48, ranks_per_node=2, hw_threads=3, threads_per_core=2), "between 1 and 2"),
    (dict(cores_per_node=4, ranks_per_node=1, reserved_cores=4), "leaves no core"),
])
def test_threads_refuse_impossible_layouts(kwargs, message):
    with pytest.raises(jobs_lib.JobError, match=re.escape(message)):
        jobs_lib.threads_for(**kwargs)


def test_job_errors_are_input_errors_that_exit_2():
    # `except ValueError` callers keep working, and distseg-jobs maps the class to exit 2.
    assert issubclass(jobs_lib.JobError, errors.InputError)
    assert issubclass(jobs_lib.JobError, ValueError)
    assert jobs_lib.JobError("x").exit_code == 2


def test_parse_time():
    assert jobs_lib.parse_minutes("02:00:00") == 120
    assert jobs_lib.parse_minutes("1-12:00:00") == 36 * 60
    assert jobs_lib.parse_minutes("00:10:30") == 11
    assert jobs_lib.parse_minutes("90") == 90
    for bad in ("2h", "1:2:3:4", "00:61:00"):
        with pytest.raises(jobs_lib.JobError, match="not a Slurm wall time"):
            jobs_lib.parse_minutes(bad)


# ---- rendering ------------------------------------------------------------------------------

@pytest.mark.parametrize("partition, nodes, extra", [
    ("knl", 1, []),
    ("knl", 16, ["--ranks-per-node", "4", "--timeline"]),
    ("knl", 4, ["--queue", "flat-quadrant", "--hw-threads", "2", "--account", "TG-ABC123"]),
    ("knl", 2, ["--queue", "development", "--ranks-per-node", "3", "--setup", "module load impi"]),
    ("skx", 1, []),
    ("skx", 32, ["--ranks-per-node", "4", "--launcher", "srun"]),
    ("skx", 2, ["--queue", "skx-dev", "--launcher", "ibrun", "--cores-per-node", "56"]),
    ("generic", 1, ["--ranks-per-node", "2"]),
    ("generic", 8, ["--cores-per-node", "32", "--ranks-per-node", "4", "--launcher", "mpirun",
                    "--srun-mpi", "pmi2", "--no-validate"]),
    ("generic", 3, ["--queue", "gpu-cpu", "--venv", "", "--timeline"]),
])
def test_rendered_scripts_hold_the_job_numbers(big, tmp_path, partition, nodes, extra):
    out = cli("render", "--partition", partition, "--nodes", str(nodes), "--data", big,
              "--runs-dir", str(tmp_path / "runs"), "--preset", "smoke", "--epochs", "3",
              "--batch-size", "2", *extra)
    assert out.exit_code == 0, out.output
    text = out.stdout
    v = _assignments(text)
    assert f"#SBATCH --nodes={nodes}\n" in text
    assert v["NODES"] == str(nodes) and v["NTASKS"] == str(nodes * int(v["RANKS_PER_NODE"]))
    assert v["RUN_DIR"] == str(tmp_path / "runs" / f"distseg-n{nodes}")
    passed = "--no-validate " if "--no-validate" in extra else ""
    assert v["TRAIN_ARGS"] == f"(--preset smoke {passed}--epochs 3 --batch-size 2 --seed 0)"
    for setting in ("export OMP_NUM_THREADS=", "export KMP_AFFINITY=granularity=fine,compact,1,0",
                    "export KMP_BLOCKTIME=1", "HOROVOD_TIMELINE", "--cpu-bind=cores",
                    "--bind-to core", "--allow-run-as-root"):
        assert setting in text, setting
    exports = re.findall(r"^export ((?:HOROVOD|OMPI)_\w+)=\$\{\1:-([\w.]+)\}$", text, flags=re.M)
    assert exports == list(EXPECTED_ENV.items())
    assert "@{" not in text  # every placeholder filled


def _horovod_section(script: str) -> str:
    """The script's Horovod block: from its heading to the next one."""
    start = script.index("# ---- Horovod ")
    return script[start:script.index("# ---- Checks ", start)]


@pytest.mark.parametrize("partition", sorted(jobs_lib.PARTITIONS))
def test_rendered_script_exports_the_horovod_defaults_of_distseg(tmp_path, partition):
    # The values come from distseg.parallel.distributed (what distseg-train sets itself) and
    # jobs.JOB_HOROVOD_SETTINGS, not from a copy in the template: run the script's
    # Horovod block in a clean shell and read back what it exported.
    out = cli("render", "--partition", partition, "--nodes", "1", "--data", "x.h5", "--no-check-data",
              "--preset", "smoke", "--runs-dir", str(tmp_path))
    assert out.exit_code == 0, out.output
    block = _horovod_section(out.stdout)

    def exported(timeline: int, **env: str) -> dict[str, str]:
        code = f"set -euo pipefail\nTIMELINE={timeline}\nRUN_DIR=/runs/r\n{block}\nenv\n"
        res = subprocess.run(["bash", "-c", code], capture_output=True, text=True, timeout=30,
                             env={"PATH": os.environ["PATH"], **env})
        assert res.returncode == 0, res.stderr
        pairs = (line.split("=", 1) for line in res.stdout.splitlines() if "=" in line)
        return {k: v for k, v in pairs if k.startswith(("HOROVOD_", "OMPI_"))}

    assert exported(0) == EXPECTED_ENV
    assert EXPECTED_ENV["HOROVOD_FUSION_THRESHOLD"] == str(128 * 1024 * 1024)
    # A value set by the submitting shell wins; --timeline adds the timeline file.
    assert exported(1, HOROVOD_CYCLE_TIME="5") == {
        **EXPECTED_ENV, "HOROVOD_CYCLE_TIME": "5", "HOROVOD_TIMELINE": "/runs/r/horovod-timeline.json",
        "HOROVOD_TIMELINE_MARK_CYCLES": "1"}


def test_render_knl_numbers(big, tmp_path):
    out = cli("render", "--partition", "knl", "--nodes", "16", "--ranks-per-node", "4", "--data", big,
              "--run-dir", str(tmp_path / "knl16"), "--preset", "smoke", "--seed", "7", "--batch-size", "2")
    assert out.exit_code == 0, out.output
    text = out.stdout
    v = _assignments(text)
    assert "#SBATCH --partition=normal\n" in text and "#SBATCH --ntasks=64\n" in text
    assert "#SBATCH --cpus-per-task=64\n" in text  # 16 cores x 4 hardware threads
    assert v["CORES_PER_RANK"] == "16" and v["MCDRAM"] == "cache"
    assert v["RUN_DIR"] == str(tmp_path / "knl16")
    assert v["TRAIN_ARGS"] == "(--preset smoke --batch-size 2 --seed 7)"
    flat = cli("render", "--partition", "knl", "--nodes", "2", "--queue", "flat-quadrant", "--data", big,
               "--preset", "smoke", "--runs-dir", str(tmp_path))
    assert _assignments(flat.stdout)["MCDRAM"] == "flat"


def test_render_generic_defaults_take_cores_from_the_allocation(tiny, tmp_path):
    out = cli("render", "--partition", "generic", "--nodes", "1", "--data", tiny, "--preset", "smoke",
              "--runs-dir", str(tmp_path))
    assert out.exit_code == 0, out.output
    v = _assignments(out.stdout)
    assert v["CORES_PER_NODE"] == "0" and v["RANKS_PER_NODE"] == "1"
    assert "--cpus-per-task" not in out.stdout.split("#\n", 1)[0]  # unknown until the job runs
    assert "#SBATCH --partition" not in out.stdout


def _err(result) -> str:
    lines = [l for l in result.stderr.splitlines() if l.strip()]
    return lines[-1] if lines else ""


@pytest.mark.parametrize("args, message", [
    (["--partition", "knl", "--nodes", "32", "--queue", "development"], "more than the 16 nodes the development queue"),
    (["--partition", "knl", "--nodes", "1", "--time", "72:00:00"], "longer than the 2-00:00:00 the normal queue"),
    (["--partition", "knl", "--nodes", "1", "--ranks-per-node", "80"], "more than the 64 usable cores"),
    (["--partition", "skx", "--nodes", "1", "--ranks-per-node", "3"], "straddle the 2 sockets"),
    (["--partition", "skx", "--nodes", "1", "--hw-threads", "4"], "--hw-threads must be between 1 and 2"),
    (["--partition", "knl", "--nodes", "1", "--time", "2 hours"], "not a Slurm wall time"),
    (["--partition", "generic", "--nodes", "1", "--time", "00:02:00"],
     "--time 00:02:00 leaves no training before Slurm's USR1 (sent 60 s before the limit, "
     "up to 60 s early); give at least 00:03:00"),
    (["--partition", "generic", "--nodes", "1", "--name", "my run"], "--name 'my run'"),
    (["--partition", "generic", "--nodes", "1", "--preset", "liver2d"], "but --image-size is 240; pass --resize or --image-size 32"),
    (["--partition", "generic", "--nodes", "1", "--image-size", "30"], "not divisible by 2**depth"),
    (["--partition", "knl", "--nodes", "4", "--batch-size", "4"], "fewer than ranks x batch size = 16 x 4"),
    (["--partition", "generic", "--nodes", "1", "--venv", "/nonexistent/venv"], "no bin/ folder"),
])
def test_render_refuses_bad_input_with_one_line(tiny, tmp_path, args, message):
    # Options given twice: the last one wins (as in click), so args can change the preset.
    out = cli("render", "--data", tiny, "--preset", "smoke", "--runs-dir", str(tmp_path), *args)
    assert out.exit_code == 2, out.output
    assert out.stdout == ""
    assert _err(out).startswith("error: ") and message in _err(out), out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_render_refuses_missing_data_and_an_existing_run(tmp_path, tiny):
    out = cli("render", "--partition", "generic", "--nodes", "1", "--data", str(tmp_path / "nope.h5"),
              "--preset", "smoke", "--runs-dir", str(tmp_path))
    assert out.exit_code == 2 and "no such file" in _err(out)
    ok = cli("render", "--partition", "generic", "--nodes", "1", "--data", str(tmp_path / "nope.h5"),
             "--preset", "smoke", "--runs-dir", str(tmp_path), "--no-check-data")
    assert ok.exit_code == 0, ok.output
    os.makedirs(rundir.log_dir(str(tmp_path / "distseg-n1")))
    out = cli("render", "--partition", "generic", "--nodes", "1", "--data", tiny, "--preset", "smoke",
              "--runs-dir", str(tmp_path))
    assert out.exit_code == 2 and "already holds a run (logs exists)" in _err(out)


def test_job_scripts_spell_the_run_directory_as_rundir_does():
    """The bash of jobs/ cannot import ``distseg.core.rundir``, so it repeats its names:
    a resumed job looks for the checkpoint pointer, a fresh one refuses a directory
    that holds a run, the report job looks for rank logs."""
    def template(name):
        with open(os.path.join(jobs_lib.templates_dir(), name), encoding="utf-8") as f:
            return f.read()
    common, report = template("common.sh.in"), template("report.sbatch")
    assert f'"$RUN_DIR/{rundir.CHECKPOINT_DIR}/{rundir.LATEST_CHECKPOINT}"' in common
    assert f"for f in {' '.join(rundir.RUN_MARKERS)}; do" in common
    assert f'"$RUN_DIR/{rundir.JOB_FILE}"' in common
    assert f'"$d/{rundir.LOG_DIR}/{rundir.LOG_GLOB}"' in report


def test_render_passes_the_3d_model_and_recompute_on_and_checks_the_file(tiny, tmp_path):
    # --model unet3d with the smoke (2D) preset and --recompute reach distseg-train as
    # flags; the volume file is checked with the 3D feed first, and a slice file given
    # to the 3D model is refused before anything is queued.
    vols = str(tmp_path / "vols.h5")
    synth.make_volumes(vols, cases=4, size=32, seed=0, slices_per_case=16)
    out = cli("render", "--partition", "generic", "--nodes", "1", "--data", vols, "--preset", "smoke",
              "--model", "unet3d", "--slab", "16,32,32", "--recompute", "--runs-dir", str(tmp_path))
    assert out.exit_code == 0, out.output
    train_args = next(l for l in out.stdout.splitlines() if l.startswith("TRAIN_ARGS="))
    assert "--model unet3d --recompute --slab 16,32,32" in train_args, train_args
    refused = cli("render", "--partition", "generic", "--nodes", "1", "--data", tiny, "--preset", "smoke",
                  "--model", "unet3d", "--slab", "16,32,32", "--runs-dir", str(tmp_path / "other"))
    assert refused.exit_code == 2, refused.output
    assert _err(refused).startswith("error: ") and len(refused.stderr.strip().splitlines()) == 1


def test_render_passes_an_own_model_on_with_an_absolute_path(tiny, tmp_path, monkeypatch):
    (tmp_path / "net.py").write_text("def build(input_shape, num_classes):\n    pass\n")
    monkeypatch.chdir(tmp_path)
    out = cli("render", "--partition", "generic", "--nodes", "1", "--data", tiny, "--preset", "smoke",
              "--model-fn", "net.py:build", "--model-arg", "filters=8", "--augment", "light",
              "--runs-dir", str(tmp_path))
    assert out.exit_code == 0, out.output
    train_args = next(l for l in out.stdout.splitlines() if l.startswith("TRAIN_ARGS="))
    assert f"--model-fn {tmp_path}/net.py:build --model-arg filters=8" in train_args, train_args
    assert "--augment light" in train_args, train_args
    both = cli("render", "--partition", "generic", "--nodes", "1", "--data", tiny, "--preset", "smoke",
               "--model", "unet2d", "--model-fn", "net.py:build", "--runs-dir", str(tmp_path / "x"))
    assert both.exit_code == 2 and "not both" in _err(both), both.output


def test_render_passes_the_global_batch_on_and_refuses_one_the_ranks_cannot_share(tiny, tmp_path):
    out = cli("render", "--partition", "generic", "--nodes", "1", "--ranks-per-node", "2", "--data", tiny,
              "--preset", "smoke", "--global-batch", "8", "--runs-dir", str(tmp_path))
    assert out.exit_code == 0, out.output
    train_args = next(l for l in out.stdout.splitlines() if l.startswith("TRAIN_ARGS="))
    assert "--global-batch 8" in train_args, train_args
    refused = cli("render", "--partition", "generic", "--nodes", "1", "--ranks-per-node", "2", "--data",
                  tiny, "--preset", "smoke", "--global-batch", "3", "--runs-dir", str(tmp_path / "other"))
    assert refused.exit_code == 2, refused.output
    assert _err(refused) == "error: --global-batch 3 cannot be shared by 2 ranks: it must be a multiple " \
        "of the number of ranks (e.g. 2 or 4), or pass --batch-size per rank"


@pytest.mark.parametrize("flag", ["--data=x.h5", "--run-dir", "--intra-op-threads"])
def test_job_refuses_training_options_the_script_sets(flag, tiny):
    spec = jobs_lib.JobSpec(partition="generic", nodes=1, data=tiny, train_args=(flag, "1"))
    with pytest.raises(jobs_lib.JobError, match="set by the job script"):
        jobs_lib.resolve(spec)


# ---- sweeps ---------------------------------------------------------------------------------

STUB_SBATCH = """#!/bin/sh
# Stand-in for sbatch: records its arguments, prints job ids like `sbatch --parsable`.
n=101
if [ -f "$SBATCH_LOG" ]; then n=$(( $(wc -l < "$SBATCH_LOG") + 101 )); fi
echo "$*" >> "$SBATCH_LOG"
echo "$n;cluster1"
"""


def _submit(sweep_dir, tmp_path):
    stub = tmp_path / "sbatch-stub"
    stub.write_text(STUB_SBATCH)
    stub.chmod(stub.stat().st_mode | stat.S_IXUSR)
    log = tmp_path / "sbatch.log"
    env = command_env(SBATCH=str(stub), SBATCH_LOG=str(log))
    out = subprocess.run(["bash", str(sweep_dir / "submit.sh")], capture_output=True, text=True,
                         timeout=30, env=env, cwd=str(tmp_path))
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout, log.read_text().splitlines()


def test_sweep_writes_a_script_per_node_count_and_a_chained_submit(big, tmp_path):
    out_dir = tmp_path / "sweep"
    runs = tmp_path / "runs"
    out = cli("sweep", "--partition", "knl", "--nodes", "1,2,4,8,16,32", "--ranks-per-node", "2",
              "--data", big, "--preset", "smoke", "--batch-size", "2", "--seed", "11",
              "--runs-dir", str(runs), "--name", "scale", "--out", str(out_dir),
              "--target-loss", "-0.75", "--target-loss", "-0.76", "--time", "01:00:00")
    assert out.exit_code == 0, out.output
    names = [f"scale-n{n}.sbatch" for n in (1, 2, 4, 8, 16, 32)]
    assert sorted(os.listdir(out_dir)) == sorted(names + ["report.sbatch", "submit.sh"])
    assert os.access(out_dir / "submit.sh", os.X_OK)
    train_args, run_dirs = set(), []
    for n, name in zip((1, 2, 4, 8, 16, 32), names):
        v = _assignments((out_dir / name).read_text())
        assert v["NODES"] == str(n) and v["NTASKS"] == str(2 * n)
        train_args.add(v["TRAIN_ARGS"])
        run_dirs.append(v["RUN_DIR"])
    # Same options and global seed for every node count; one run directory each.
    assert train_args == {"(--preset smoke --batch-size 2 --seed 11)"}
    assert run_dirs == [str(runs / f"scale-n{n}") for n in (1, 2, 4, 8, 16, 32)]
    report = (out_dir / "report.sbatch").read_text()
    assert all(d in report for d in run_dirs)
    assert "REPORT_ARGS=(--target-loss -0.75 --target-loss -0.76)" in report
    assert f"OUT={runs / 'scale-report'}" in report

    stdout, calls = _submit(out_dir, tmp_path)
    # Chained: each job after the previous one; the report after all six.
    assert calls[0] == "--parsable scale-n1.sbatch"
    for i in range(1, 6):
        assert calls[i] == f"--parsable --dependency=afterany:{100 + i} {names[i]}"
    assert calls[6] == "--parsable --dependency=afterany:101:102:103:104:105:106 report.sbatch"
    assert "submitted report.sbatch as job 107" in stdout
    assert runs.is_dir()  # submit.sh makes the runs folder Slurm writes into


def test_sweep_without_chaining_and_its_errors(big, tmp_path):
    out_dir = tmp_path / "s"
    out_dir.mkdir()
    # No --out: the scripts go into the current directory.
    out = cli("sweep", "--partition", "skx", "--nodes", "1,2", "--data", big, "--preset", "smoke",
              "--runs-dir", str(tmp_path / "runs"), "--no-chain", cwd=str(out_dir))
    assert out.exit_code == 0, out.output
    assert sorted(os.listdir(out_dir)) == ["distseg-n1.sbatch", "distseg-n2.sbatch", "report.sbatch", "submit.sh"]
    _, calls = _submit(out_dir, tmp_path)
    assert calls == ["--parsable distseg-n1.sbatch", "--parsable distseg-n2.sbatch",
                     "--parsable --dependency=afterany:101:102 report.sbatch"]
    for args, message in [
        (["--nodes", "1,x"], "--nodes '1,x': expected node counts like 1,2,4,8"),
        (["--nodes", "2,2"], "--nodes '2,2': a node count appears twice"),
        (["--nodes", "0,2"], "--nodes '0,2': node counts must be >= 1"),
        (["--nodes", "1,256", "--queue", "skx-normal"], "more than the 128 nodes"),
        (["--nodes", "1,64", "--batch-size", "4"], "fewer than ranks x batch size = 128 x 4"),
    ]:
        bad = cli("sweep", "--partition", "skx", "--data", big, "--preset", "smoke",
                  "--runs-dir", str(tmp_path / "runs2"), "--out", str(tmp_path / "bad"), *args)
        assert bad.exit_code == 2 and message in _err(bad), bad.output
        assert not (tmp_path / "bad").exists()  # nothing written unless every job passes


# ---- the script itself, before launching anything ---------------------------------------------

def test_script_refuses_an_allocation_of_another_size(tiny, tmp_path):
    out = cli("render", "--partition", "generic", "--nodes", "1", "--ranks-per-node", "2", "--data", tiny,
              "--preset", "smoke", "--runs-dir", str(tmp_path / "runs"))
    script = tmp_path / "job.sbatch"
    script.write_text(out.stdout)
    res = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=30,
                         env=slurm_env(nodes=2, tasks=4, per_node=2, cpus=2))
    assert res.returncode == 2
    assert "rendered for 1 node(s) but Slurm gave 2" in res.stderr
    assert not (tmp_path / "runs").exists()  # refused before touching anything
    env = dict(slurm_env(1, 2, 2, 2), DISTSEG_LAUNCHER="pbsdsh")
    res = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=30, env=env)
    assert res.returncode == 2 and "launcher 'pbsdsh' is unknown" in res.stderr


# ---- the light side stays light --------------------------------------------------------------

def test_distseg_jobs_imports_neither_tensorflow_nor_horovod(tiny, tmp_path):
    code = (
        "import sys\n"
        "sys.modules['tensorflow'] = None\n"
        "sys.modules['horovod'] = None\n"
        "from distseg.cli.jobs import jobs\n"
        "jobs(['render', '--partition', 'knl', '--nodes', '1', '--data', sys.argv[1], '--preset', 'smoke',\n"
        "      '--runs-dir', sys.argv[2]])\n"
    )
    out = subprocess.run([sys.executable, "-c", code, tiny, str(tmp_path)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("#!/bin/bash\n#SBATCH --job-name=distseg-n1\n")


# ---- Docker ---------------------------------------------------------------------------------------

def test_dockerfile_installs_through_the_install_script_as_a_non_root_user():
    with open(os.path.join(REPO, "docker", "Dockerfile")) as f:
        text = f.read()
    lines = [l.strip() for l in text.splitlines() if l.strip() and not l.strip().startswith("#")]
    assert any(l.startswith("FROM ") and "bookworm" in l for l in lines)
    run_install = [l for l in lines if "scripts/install.sh" in l]
    assert run_install and "VENV=/opt/venv" in " ".join(lines)
    users = [l.split()[1] for l in lines if l.startswith("USER ")]
    assert users and users[-1] not in ("root", "0")
    # The install runs before the switch to the unprivileged user (it needs apt-get).
    assert lines.index(run_install[0]) < lines.index(f"USER {users[-1]}")
    assert re.search(r"ENV .*PATH=/opt/venv/bin:", text)


def test_docker_run_script_and_compose(tmp_path):
    # PyYAML is a dependency of Horovod, so it is there wherever distseg is: no skip.
    import yaml
    with open(os.path.join(REPO, "docker", "run-local.sh")) as f:
        script = f.read()
    assert 'horovodrun -np "$ranks" -H "localhost:$ranks"' in script
    with open(os.path.join(REPO, "docker", "compose.yml")) as f:
        compose = yaml.safe_load(f)
    train = compose["services"]["train"]
    command = " ".join(train["command"]) if isinstance(train["command"], list) else train["command"]
    assert "horovodrun -np 4 -H localhost:4 distseg-train" in command
    mounts = {v.split(":")[1] for v in train["volumes"]}
    assert {"/work/data", "/work/runs"} <= mounts
    assert train["build"]["dockerfile"] == "docker/Dockerfile"


@pytest.mark.parametrize("limit, lead", [
    ("3", 60), ("00:05:00", 60), ("00:20:00", 240), ("00:30:00", 300), ("02:00:00", 300),
    ("1-00:00:00", 300)])
def test_the_time_limit_signal_comes_after_the_start(tiny, tmp_path, limit, lead):
    # A fixed 300 s lead signalled every job of 5 minutes or less at its start (Slurm
    # signals when less than the lead is left, up to a minute early).
    out = cli("render", "--partition", "generic", "--nodes", "1", "--data", tiny, "--time", limit,
              "--run-dir", str(tmp_path / "r"), "--preset", "smoke")
    assert out.exit_code == 0, out.output
    assert f"#SBATCH --signal=B:USR1@{lead}\n" in out.stdout
    # Even a signal a minute early leaves a minute to train.
    minutes = jobs_lib.parse_minutes(limit)
    assert minutes * 60 - lead - jobs_lib.SIGNAL_SLACK_S >= jobs_lib.MIN_SIGNAL_LEAD_S


# ---- how a launch ended: what the job script decides requeueing from ---------------------------

def _logs(run_dir, ends: dict) -> None:
    """Rank logs written by the trainer's own writer: a run record, then the end record
    ``ends[rank]`` names (None: no end record, as a killed rank leaves)."""
    from distseg.training.runlog import RunLog

    for rank, status in ends.items():
        with RunLog(str(run_dir), rank) as log:
            log.write("run", size=len(ends))
            if status:
                log.write("end", status=status, reason="r", t=1.0, epochs_done=0)


def test_run_outcome_reads_the_logs_and_the_checkpoint(tmp_path):
    run = tmp_path / "run"
    _logs(run, {0: "interrupted", 1: "interrupted"})
    # Interrupted everywhere but no checkpoint: nothing to resume, not "stopped".
    assert outcome_lib.run_outcome(str(run), 2).line() == "ended"
    os.makedirs(rundir.checkpoint_dir(str(run)))
    with open(rundir.latest_path(str(run)), "w") as f:
        f.write("{}")
    assert outcome_lib.run_outcome(str(run), 2).line() == "stopped"
    # A rank the launch started but that left no log at all is lost too.
    assert outcome_lib.run_outcome(str(run), 3).line() == "lost 2"

    other = tmp_path / "other"
    _logs(other, {0: "ok", 1: None, 2: "interrupted", 3: None})
    assert outcome_lib.run_outcome(str(other), 4) == outcome_lib.Outcome(stopped=False, without_end=(1, 3))
    # A last line cut off by a kill is no end record.
    with open(rundir.log_path(str(other), 0), "a") as f:
        f.write('{"type":"end","status":"interr')
    assert cli("outcome", str(other), "--ranks", "4").stdout == "lost 0 1 3\n"
