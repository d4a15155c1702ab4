"""End-to-end tests on a real Slurm: the submitit launcher's multirun and the sbatch + torchrun DDP script.

Needs a running Slurm whose node is up, e.g. the single-node localhost cluster of
`bash .ci/slurm_setup.sh` (root, Debian; `.ci/run` calls it before pytest). Without `sinfo` or with no
node up, the tests skip and say why. Run them alone with:

    bash .ci/slurm_setup.sh && python -m pytest -m slurm tests/slurm -v

Both submit the tiny CPU default run of train.py (3 steps), each job on its own CPUs, and read back
the run directories the jobs wrote. About a minute in all on 2 cores.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
# The tiny default run, cut to 3 steps with one evaluation; no wandb.
TINY = ["trainer.max_steps=3", "trainer.eval_every=3", "logger.wandb.mode=disabled", "optim.warmup_steps=1"]
READY_STATES = {"idle", "mix", "mixed", "alloc", "allocated", "comp", "completing"}


def _sh(*cmd: str, timeout: float = 30) -> str:
    return subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=timeout).stdout


@pytest.fixture(scope="module")
def slurm() -> dict:
    """The default partition and its CPUs per node; skips when no Slurm node is up."""
    if shutil.which("sinfo") is None or shutil.which("sbatch") is None:
        pytest.skip("Slurm client commands (sinfo, sbatch) not found: start a local cluster with "
                    "`bash .ci/slurm_setup.sh` (root, Debian)")
    try:
        rows = _sh("sinfo", "-h", "-o", "%P|%t|%c").split()
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as err:
        pytest.skip(f"sinfo failed, no slurmctld reachable ({err}): run `bash .ci/slurm_setup.sh`")
    up = [r.split("|") for r in rows if r.split("|")[1].rstrip("*~#") in READY_STATES]
    if not up:
        pytest.skip(f"no Slurm node is up (sinfo: {rows}): run `bash .ci/slurm_setup.sh`")
    default = [r for r in up if r[0].endswith("*")] or up
    partition, _, cpus = default[0]
    return {"partition": partition.rstrip("*"), "cpus": int(cpus.rstrip("+"))}


def _job_state(job_id: str) -> str | None:
    """Slurm's state of a job (COMPLETED, FAILED, RUNNING, ...), None once slurmctld forgot it."""
    try:
        out = _sh("scontrol", "show", "job", job_id)
    except subprocess.CalledProcessError:
        return None
    for field in out.split():
        if field.startswith("JobState="):
            return field.split("=", 1)[1]
    return None


def _wait_done(job_id: str, timeout: float) -> str | None:
    """Wait until Slurm says the job ended; its final state (None if already forgotten). Cancels it on timeout."""
    deadline = time.monotonic() + timeout
    state = _job_state(job_id)
    while state in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED"):
        if time.monotonic() > deadline:
            subprocess.run(["scancel", job_id], check=False)
            pytest.fail(f"Slurm job {job_id} still {state} after {timeout:.0f}s (cancelled)")
        time.sleep(0.5)
        state = _job_state(job_id)
    return state


def _cancel_by_name(name: str) -> None:
    ids = _sh("squeue", "-h", "-n", name, "-o", "%A").split()
    for job_id in sorted(set(ids)):
        subprocess.run(["scancel", job_id], check=False)


def _tail(path: Path, n: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError as err:
        return f"<{err}>"


def _final_record(run_dir: Path) -> dict:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert lines, f"{run_dir}/metrics.jsonl is empty"
    return json.loads(lines[-1])


def _submit_multirun(slurm: dict, sweep: Path) -> dict:
    """`python train.py -m hydra/launcher=submitit_slurm ... seed=0,1` into `sweep`; waits for the jobs."""
    name = f"longctx-test-{uuid.uuid4().hex[:8]}"
    cmd = [sys.executable, "train.py", "-m", "hydra/launcher=submitit_slurm",
           f"hydra.launcher.partition={slurm['partition']}", "hydra.launcher.timeout_min=5",
           "hydra.launcher.cpus_per_task=1", f"hydra.launcher.name={name}",
           f"hydra.sweep.dir={sweep}", *TINY, "trainer.num_threads=1", "seed=0,1"]
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=180)
    except subprocess.TimeoutExpired:
        _cancel_by_name(name)
        raise
    logs = sorted((sweep / ".submitit").glob("*/*_log.*"))
    report = (f"exit {proc.returncode} after {time.monotonic() - t0:.0f}s\n--- launcher stderr\n"
              f"{proc.stderr[-4000:]}\n" + "".join(f"--- {p}\n{_tail(p)}\n" for p in logs))
    return {"sweep": sweep, "returncode": proc.returncode, "report": report, "logs": logs}


@pytest.fixture(scope="module")
def multirun(slurm, tmp_path_factory) -> dict:
    """The seed=0,1 submitit multirun, run once for this module."""
    return _submit_multirun(slurm, tmp_path_factory.mktemp("submitit") / "sweep")


def test_submitit_multirun_two_jobs(multirun):
    """Both jobs of the seed=0,1 multirun ran as one Slurm array and wrote their run directories."""
    sweep, report = multirun["sweep"], multirun["report"]
    assert multirun["returncode"] == 0, report

    # Both jobs went through Slurm: submitit's batch script is an sbatch array of two tasks ...
    scripts = list((sweep / ".submitit").glob("*/*_submission.sh"))
    assert len(scripts) == 1, report
    assert "#SBATCH --array=0-1" in scripts[0].read_text(), report
    job_dirs = sorted(p.name for p in (sweep / ".submitit").iterdir() if p.is_dir() and "_" in p.name)
    assert len(job_dirs) == 2, report
    # ... and Slurm ran both to completion (slurmctld remembers finished jobs for MinJobAge). The
    # launcher returns once the results are written, a moment before the job steps exit.
    for job_dir in job_dirs:
        state = _wait_done(job_dir, timeout=30)
        assert state in ("COMPLETED", None), f"{job_dir}: {state}\n{report}"

    # Each job wrote its own run directory, named by its run name, with the final evaluation.
    run_dirs = sorted(p for p in sweep.iterdir() if (p / "metrics.jsonl").exists())
    assert [p.name for p in run_dirs] == [f"gpt2_exp_d64l3_icl_markov_ctx128_s{s}_warmup_steps1" for s in (0, 1)], report
    records = [_final_record(p) for p in run_dirs]
    for record in records:
        assert record["step"] == 3, record
        assert math.isfinite(record["train_loss"]), record
    assert records[0]["train_loss"] != records[1]["train_loss"], "seeds 0 and 1 gave identical runs"


def test_sbatch_torchrun_ddp(slurm, multirun, tmp_path):
    """`sbatch scripts/slurm/sbatch_ddp.sh <overrides>`: srun + torchrun, 1 node, gloo on CPU.

    With 2 CPUs the job runs 2 ranks; its loss must then equal the 1-process seed-0 job of the
    multirun above (same global batch of 32 documents, split 16 + 16 across the ranks)."""
    nproc = min(2, slurm["cpus"])  # 2 ranks when the node has 2 CPUs: a real gloo process group
    run_dir = tmp_path / "ddp_run"
    out = tmp_path / "slurm-%j.out"
    name = f"longctx-test-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "LONGCTX_PYTHON": sys.executable, "NPROC_PER_NODE": str(nproc)}
    submit = subprocess.run(
        ["sbatch", "--parsable", f"--job-name={name}", f"--partition={slurm['partition']}",
         "--nodes=1", f"--cpus-per-task={nproc}", "--time=5", f"--output={out}",
         "scripts/slurm/sbatch_ddp.sh", *TINY, "trainer.num_threads=1", f"hydra.run.dir={run_dir}"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=30)
    assert submit.returncode == 0, submit.stderr
    job_id = submit.stdout.strip().split(";")[0]
    log = tmp_path / f"slurm-{job_id}.out"

    state = _wait_done(job_id, timeout=150)
    assert state in ("COMPLETED", None), f"job {job_id} ended {state}\n{_tail(log, 80)}"

    text = log.read_text()
    assert f"[sbatch_ddp] job {job_id} (restart 0): 1 node(s) x {nproc} proc" in text, text[-4000:]
    assert "[sbatch_ddp] srun exited with status 0" in text, text[-4000:]
    record = _final_record(run_dir)
    assert record["step"] == 3, record
    assert math.isfinite(record["train_loss"]), record
    # The global batch is the same whatever the rank count: 32 documents x 128 tokens per step ...
    assert record["tokens"] == 3 * 32 * 128, record
    # ... and so is the training: DDP over gloo reproduces the single-process run (float32 sums in
    # another order; measured difference < 1e-6).
    single = multirun["sweep"] / "gpt2_exp_d64l3_icl_markov_ctx128_s0_warmup_steps1" / "metrics.jsonl"
    assert single.exists(), f"the multirun's seed-0 run is missing\n{multirun['report']}"
    reference = _final_record(single.parent)
    assert record["train_loss"] == pytest.approx(reference["train_loss"], abs=1e-4), (record, reference)
    assert record["best_context_loss"] == pytest.approx(reference["best_context_loss"], abs=1e-4)


def test_submitit_multirun_relaunched_into_its_folder_is_complete(slurm, multirun):
    """What hydra-submitit does after a preemption or time limit: the same jobs again, into the same sweep
    folder. Multirun jobs default to trainer.resume=auto, so finished jobs exit 0 saying they are complete
    (and unfinished ones would continue from their checkpoints) instead of refusing an existing run."""
    assert multirun["returncode"] == 0, multirun["report"]
    sweep = multirun["sweep"]
    run_dirs = sorted(p for p in sweep.iterdir() if (p / "metrics.jsonl").exists())
    before = {p: (p / "metrics.jsonl").read_bytes() for p in run_dirs}
    again = _submit_multirun(slurm, sweep)
    assert again["returncode"] == 0, again["report"]
    for p in run_dirs:
        assert (p / "metrics.jsonl").read_bytes() == before[p], p
    logs = "".join(path.read_text(errors="replace") for path in sweep.glob(".submitit/*/*_log.out"))
    assert logs.count("is complete (step 3 of trainer.max_steps=3); nothing to do") >= 2, again["report"]
