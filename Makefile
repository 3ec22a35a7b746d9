# distseg: two commands do everything (as root on a fresh Debian machine, or as a
# user with sudo). Each installs what is missing first and is quick when it is there.
#
#   make demo   real 2-rank Horovod training on LiTS case 117, then the scaling report
#   make test   the whole test suite (what .ci/run calls)

SHELL := /bin/bash
VENV ?= $(CURDIR)/.venv
BIN := $(VENV)/bin
export PATH := $(BIN):$(PATH)
# Quiet TensorFlow's C++ start-up banners in test and demo output.
export TF_CPP_MIN_LOG_LEVEL ?= 2
# The repository's own modules compiled once, not in each of the hundreds of processes
# the tests launch (an environment that sets this, as some CI images do, recompiles them
# every time).
unexport PYTHONDONTWRITEBYTECODE
# Multi-process suites are killed after this many seconds, so a hang fails fast.
PARALLEL_TIMEOUT ?= 600
# Every tier lists its tests of 10 s and more (at most 10), so a CI log shows where the
# suite's minutes went (docs/development.md#how-long-make-test-takes).
PYTEST_FLAGS ?= -q --color=no -p no:cacheprovider --durations=10 --durations-min=10

# A run of the tests installs the test tools too (one apt step, the first time):
# headless Chromium for the screenshot test of report.html (tests/e2e/test_report_e2e.py),
# shellcheck, and MPICH as the wrong launcher of tests/e2e/test_wrong_mpi.py.
ifneq ($(filter test test-serial test-quick,$(MAKECMDGOALS)),)
export WITH_TEST_TOOLS := 1
endif

.PHONY: install install-user demo test test-quick test-parallel test-serial test-slurm slurm-install test-docker lint bench bench-link bench-stateff bench-precision bench-augment clean tier-unit tier-parallel tier-e2e tier-e2e-beside tier-e2e-alone tier-slurm tiers-beside-slurm

install:
	@bash scripts/install.sh

# Without root: never apt; the compiler, CMake, MPI and Python from your modules
# (docs/install.md#from-a-clusters-login-node). `make install-user VENV=~/venvs/distseg`
install-user:
	@SKIP_APT=1 bash scripts/install.sh

demo: install
	@bash scripts/demo.sh

# Tiers (docs/development.md#tiers): tests/unit (one process, no launcher: the inner
# loop, `make test-quick`), tests/e2e (real commands, launchers and trainings) and
# tests/parallel (2 real Horovod ranks, once over MPI, once over Gloo; a rank count
# below 2 fails there, it does not skip).
lint: install
	$(BIN)/ruff check distseg analysis tests benchmarks

test-quick: lint tier-unit

test-parallel: install tier-parallel

# Slurm's commands are installed first (slurm-install), so tests/e2e's test of node
# ranges expanded by the real scontrol runs on a fresh machine too.
test-serial: install slurm-install
	$(BIN)/python -m pytest tests/unit tests/e2e $(PYTEST_FLAGS) -rs

# slurm-wlm and munge with apt when missing (scripts/slurm-cluster.sh install; about a
# minute the first time, nothing after). Root only, as CI is: elsewhere the tests that
# need Slurm skip with their reason.
slurm-install:
	@if [ "$$(id -u)" = 0 ]; then bash scripts/slurm-cluster.sh install; \
	else echo "slurm-install: not root, Slurm not installed (the tests that need it skip)"; fi

# tests/slurm: distseg-jobs scripts through a real Slurm that the session starts and
# stops (scripts/slurm-cluster.sh: munged, slurmctld and slurmd as plain processes;
# slurm-install puts slurm-wlm and munge there). Needs root, as CI has; skipped with the
# reason otherwise. Time: docs/cluster.md#a-real-slurm-in-the-tests.
test-slurm: install slurm-install tier-slurm

# The tiers themselves, without the install step (so two can run at once).
tier-unit:
	$(BIN)/python -m pytest tests/unit $(PYTEST_FLAGS) -rs
tier-parallel:
	timeout $(PARALLEL_TIMEOUT) $(BIN)/horovodrun -np 2 -H localhost:2 --mpi \
	  $(BIN)/python -m pytest tests/parallel $(PYTEST_FLAGS) -rs
	timeout $(PARALLEL_TIMEOUT) $(BIN)/horovodrun -np 2 -H localhost:2 --gloo \
	  $(BIN)/python -m pytest tests/parallel $(PYTEST_FLAGS) -rs
# tests/e2e in two groups. Files that bound how fast something ends (a fault, a kill,
# a signal, a trial failing on one rank, a refusal) or time a link run alone in one
# pytest; a file whose time limits are only hang guards is not one of them. Every other
# file runs in its own pytest, E2E_JOBS at once (make -j takes the next file when one
# ends, the longest first; -k: a failing file does not stop the others), its output
# shown when it ends. Two keep the 2 cores 93 % busy; three took longer and more CPU
# (docs/development.md#how-long-make-test-takes). Both groups always run; the tier
# fails if either failed. A new e2e file that bounds a wall time belongs in E2E_ALONE
# (docs/development.md#tiers).
E2E_ALONE := $(addprefix tests/e2e/,test_faults.py test_jobs_signal.py test_netns.py \
  test_precision_cache.py test_elastic_docs.py test_elastic.py)
E2E_LONGEST := $(addprefix tests/e2e/,test_noise_halves.py test_weight_ema.py \
  test_model_fn.py test_predict_ensemble.py test_train_cli.py test_output_dirs.py \
  test_multichannel.py test_lr_auto.py test_cv_local.py test_lr_schedule_runs.py \
  test_predict.py test_bench_stateff_parity.py test_cv_configurations.py test_augment_exact.py \
  test_precision_auto.py test_full_disk.py)
E2E_JOBS ?= 2
E2E_BESIDE := $(E2E_LONGEST) $(filter-out $(E2E_ALONE) $(E2E_LONGEST),$(sort $(wildcard tests/e2e/test_*.py)))
tier-e2e:
	@status=0; \
	$(MAKE) --no-print-directory -k -j$(E2E_JOBS) --output-sync=target tier-e2e-beside || status=1; \
	$(MAKE) --no-print-directory tier-e2e-alone || status=1; \
	exit $$status
tier-e2e-beside: $(E2E_BESIDE:%=e2e-file/%)
tier-e2e-alone:
	$(BIN)/python -m pytest $(E2E_ALONE) $(PYTEST_FLAGS) -rs
e2e-file/%:
	$(BIN)/python -m pytest $* $(PYTEST_FLAGS) -rs
tier-slurm:
	$(BIN)/python -m pytest tests/slurm $(PYTEST_FLAGS) -rs
tiers-beside-slurm: tier-unit
	@$(MAKE) --no-print-directory tier-parallel

# The unit and parallel tiers run beside the Slurm tier, whose jobs mostly wait on
# slurmctld's 30-second checks and on a user's install; each tier's output is shown
# when it ends (--output-sync). Then the e2e tier, in its two groups (tier-e2e).
# (docs/development.md#how-long-make-test-takes)
test: lint slurm-install
	$(MAKE) --no-print-directory -j2 --output-sync=recurse tiers-beside-slurm tier-slurm
	$(MAKE) --no-print-directory tier-e2e

# The Docker image built from docker/Dockerfile and run for real without a Docker
# engine (buildah, chroot isolation): 4 Horovod ranks and the report inside it, the
# logs checked on the host. Needs root; minutes, so not part of `make test`
# (docs/docker.md).
test-docker: install
	DISTSEG_TEST_DOCKER=1 $(BIN)/python -m pytest tests/e2e/test_docker.py $(PYTEST_FLAGS) -rs -s

# One table of speed ratios, goal beside measured (docs/performance.md#make-bench), about
# 15 minutes here; results in bench/results/bench-*.json. The Horovod settings comparison
# of docs/performance.md is benchmarks/bench_horovod.py.
bench: install
	@test -f data/liver117.h5 || $(BIN)/distseg-data lits-sample --out data/liver117.h5
	$(BIN)/python benchmarks/bench_table.py --data data/liver117.h5
	$(MAKE) bench-link

# --precision auto against float32 and bfloat16 (docs/performance.md#precision): the demo at
# 1 and 2 ranks (interleaved rounds), 1 x 8 against 2 x 4, the liver2d step and liver3d on
# volumes; about 25 minutes here; results in bench/results/precision-*.json.
bench-precision: install
	@test -f data/liver117.h5 || $(BIN)/distseg-data lits-sample --out data/liver117.h5
	$(BIN)/python benchmarks/bench_precision_auto.py --data data/liver117.h5

# data.augment none, light and default on one rank held to one core (taskset; the reader
# thread that augments shares it with the step), interleaved rounds: the demo and liver3d's
# median step, data_wait and the augmenter alone against 10 % of a step
# (docs/augmentation.md#what-it-costs); about 15 minutes here; results in
# bench/results/augment-*.json.
bench-augment: install
	@test -f data/liver117.h5 || $(BIN)/distseg-data lits-sample --out data/liver117.h5
	$(BIN)/python benchmarks/bench_augment.py --data data/liver117.h5

# Two nodes (network namespaces, root) over a link shaped to 1 and 10 Gbit/s and
# unshaped: 1 process vs 2 ranks, fp16, overlap and MultiWorkerMirroredStrategy, and the
# projection's step time checked (docs/performance.md#over-a-link-between-nodes; the
# measurements: docs/studies/link-2026-11-26.md); about 20 minutes here; results in
# bench/results/link-*.json.
bench-link: install
	@test -f data/liver117.h5 || $(BIN)/distseg-data lits-sample --out data/liver117.h5
	$(BIN)/python benchmarks/bench_link.py --models demo --epochs 3 --steps 6 --repeat 3
	$(BIN)/python benchmarks/bench_link.py --models liver2d --rates 1gbit \
	  --variants 1proc,distseg,fp16 --epochs 2 --steps 3 --repeat 1

# The large-batch study (docs/statistical-efficiency.md): time to a validation Dice target
# at 1 and 2 ranks (real runs of the demo model, GroupNorm, global batch 8), samples to
# it at 1, 2, 4 and 8 ranks with a global batch of 8 (the step-exact emulation), the
# noise scale's prediction for 8 ranks x 8 slices beside a measured run; and global
# batches 16, 32, 64 past G = 8 under the sqrt rule, the gain rule and fixed lr
# multipliers, the noise scale's prediction of them from the B = 8 run, and the goodput
# policy against fixed per-rank batches 1-8 at 32 emulated ranks (runs end at the
# target); one rank's noise scale against two ranks' (study_noise.py) and the lr found
# against fixed multipliers on the phantom, validating every 128 samples
# (study_lr_phantom.py). About three and a half hours here; results in
# bench/results/stateff-*.json, which `make bench` prints, noise-study-*.json and
# lr-phantom-*.json; the studies: docs/studies/README.md.
STATEFF_SEEDS ?= 0,1,2
STATEFF_SWEEP = gbatch-gn-x1,gbatch-gn-x1.4,gbatch-gn-x2,gbatch-gn-x2.8,gbatch-gn-x4
bench-stateff: install
	$(BIN)/python benchmarks/bench_stateff.py --backend hvd --scale demo --variants gbatch-gn \
	  --ranks 1,2 --seeds $(STATEFF_SEEDS) --hvd-epochs 8
	$(BIN)/python benchmarks/bench_stateff.py --backend sim --variants gbatch-gn --ranks 1,2,4,8 \
	  --seeds $(STATEFF_SEEDS)
	$(BIN)/python benchmarks/bench_stateff.py --backend sim --variants gn --ranks 8 --seeds $(STATEFF_SEEDS)
	$(BIN)/python benchmarks/bench_stateff.py --backend sim --stop-at-target \
	  --variants gbatch-gn,gbatch-gn-gain,$(STATEFF_SWEEP) --ranks 16,32,64 --seeds $(STATEFF_SEEDS)
	$(BIN)/python benchmarks/bench_stateff.py --backend sim --stop-at-target \
	  --variants gbatch-gn-x2,gbatch-gn-x4 --ranks 8 --seeds $(STATEFF_SEEDS)
	$(BIN)/python benchmarks/bench_stateff.py --backend sim --stop-at-target \
	  --variants gbatch-gn --ranks 128,256 --seeds $(STATEFF_SEEDS)
	$(BIN)/python benchmarks/bench_stateff.py --backend sim --stop-at-target \
	  --variants gbatch-gn-goodput --ranks 32 --seeds $(STATEFF_SEEDS)
	$(BIN)/python benchmarks/study_noise.py --data data/liver117.h5 --seeds $(STATEFF_SEEDS)
	for b in 8 16 32; do $(BIN)/python benchmarks/study_lr_phantom.py --global-batch $$b || exit 1; done
	$(BIN)/python benchmarks/bench_stateff.py --report --backend sim,hvd --scale small,demo \
	  --variants gbatch-gn,gn,gbatch-gn-gain,gbatch-gn-goodput,$(STATEFF_SWEEP) \
	  --ranks 1,2,4,8,16,32,64,128,256 --seeds $(STATEFF_SEEDS) --hvd-epochs 8 \
	  --recommended gbatch-gn --grown gn --timed gbatch-gn@demo

clean:
	rm -rf runs/ report/ .pytest_cache
