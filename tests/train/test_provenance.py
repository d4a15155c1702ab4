"""provenance.json: what a run folder records of how it was made, and the command that makes it again."""
from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from longctx import provenance

REPO = Path(__file__).resolve().parents[2]
QUICK = ["trainer.max_steps=2", "trainer.eval_every=2"]


def train(args: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "train.py"), *args], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=600)


def config_without_run_dir(run_dir: Path) -> dict:
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    cfg.pop("run_dir")
    return cfg


def test_a_run_records_its_command_and_reruns_to_the_same_config(train_env, tiny, tmp_path):
    first = tmp_path / "first"
    args = [*tiny, *QUICK, "attention=power", "optim.lr=0.002"]
    out = train([*args, f"hydra.run.dir={first}"], train_env)
    assert out.returncode == 0, out.stderr[-3000:]

    record = provenance.read(first)
    assert record["overrides"] == args  # Hydra's own record of the job's overrides; hydra.* kept apart
    assert record["command"][1:] == [*args, f"hydra.run.dir={first}"]
    assert record["device"] == "cpu" and record["world_size"] == 1
    assert record["versions"]["python"] == ".".join(map(str, sys.version_info[:3]))
    assert record["versions"]["torch"] is not None and record["versions"]["torch"].split("+")[0] in \
        __import__("torch").__version__
    git = record["git"]
    if git["commit"] is not None:  # the code runs from a git checkout
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True)
        assert git["commit"] == head.stdout.strip()
        assert (git["diff_file"] is not None) == git["dirty"]
        if git["dirty"]:
            assert (first / git["diff_file"]).read_text().startswith("diff --git")
        assert record["config_git"] is None   # train.py's conf/ is in the package's own tree
    else:
        assert record["config_git"][0]["dir"] == str(REPO / "conf")   # Hydra's primary config folder, named
    assert len(record["launches"]) == 1 and record["launches"][0]["time"] == record["time"]

    # The reconstructed command (entry point + the job's overrides) trains the same config elsewhere.
    command = provenance.command_line(record, python=sys.executable)
    second = tmp_path / "second"
    again = subprocess.run([*command, f"hydra.run.dir={second}"], env=train_env, cwd=REPO, capture_output=True,
                           text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert config_without_run_dir(second) == config_without_run_dir(first)

    # A resumed launch appends its own record; the first one stays as it was.
    more = train([*args, "trainer.max_steps=4", "trainer.resume=true", f"hydra.run.dir={first}"], train_env)
    assert more.returncode == 0, more.stderr[-3000:]
    resumed = provenance.read(first)
    assert {k: v for k, v in resumed.items() if k != "launches"} == {k: v for k, v in record.items()
                                                                    if k != "launches"}
    assert resumed["launches"][0] == record["launches"][0]
    assert resumed["launches"][1]["overrides"] == [*args, "trainer.max_steps=4", "trainer.resume=true"]
    # each launch names the config it trained under: the report reads the newest launch's bounds from it
    assert [launch["config_file"] for launch in resumed["launches"]] == ["config.yaml", "config.resume_step2.yaml"]
    assert (first / "config.resume_step2.yaml").is_file()


def test_outside_a_git_tree_git_is_null(tmp_path, monkeypatch):
    monkeypatch.setattr(provenance, "CODE_DIR", tmp_path)  # not a git tree
    whole = provenance.write(tmp_path, device="cpu")
    assert whole["git"] == {"commit": None, "dirty": None, "diff_file": None}
    assert provenance.read(tmp_path) == whole


def test_no_git_program_is_null(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no `git` to run
    assert provenance.git_states([]) == ({"commit": None, "dirty": None, "diff_file": None}, None, {})


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


def test_a_dirty_tree_leaves_each_launch_its_diff(tmp_path, monkeypatch):
    code = tmp_path / "code"
    code.mkdir()
    source = code / Path(provenance.__file__).name
    source.write_text("x = 1\n")
    _git(code, "init", "-q")
    _git(code, "add", ".")
    _git(code, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    monkeypatch.setattr(provenance, "CODE_DIR", code)
    run_dir = tmp_path / "run"
    run_dir.mkdir()

    clean = provenance.write(run_dir, device="cpu")
    assert clean["git"] == {"commit": _git(code, "rev-parse", "HEAD").strip(), "dirty": False, "diff_file": None}
    source.write_text("x = 2\n")
    dirty = provenance.write(run_dir, device="cpu", world_size=4)
    assert dirty["launches"][0] == clean["launches"][0] and len(dirty["launches"]) == 2
    second = dirty["launches"][1]
    assert second["git"]["dirty"] is True and second["world_size"] == 4
    diff = (run_dir / second["git"]["diff_file"]).read_text()
    assert "-x = 1" in diff and "+x = 2" in diff
    assert json.loads((run_dir / "provenance.json").read_text()) == dirty


@pytest.mark.parametrize("overrides, argv, expected", [
    (["seed=1", "ctx=64"], ["train.py", "-m", "seed=0,1", "ctx=64"], ["python", "train.py", "seed=1", "ctx=64"]),
    (None, ["scripts/x.py", "--a", "1"], ["python", "scripts/x.py", "--a", "1"]),
    (["seed=1"], ["/venv/lib/python3.11/site-packages/submitit/core/_submit.py", "/multirun/.submitit/1"],
     ["python", "train.py", "seed=1"]),  # a Slurm job: submitit's runner ran the task
])
def test_command_line_replays_the_jobs_own_overrides(overrides, argv, expected):
    assert provenance.command_line({"command": argv, "overrides": overrides}) == expected
    assert shlex.split(provenance.format_command({"command": argv, "overrides": overrides})) == expected
    # a launch of two processes (DDP, context parallelism) starts as two again: its config may need that world size
    two = {"command": argv, "overrides": overrides, "world_size": 2}
    assert provenance.command_line(two) == ["torchrun", "--nproc_per_node=2", *expected[1:]]


def test_an_unreadable_record_is_kept_aside(tmp_path, monkeypatch):
    monkeypatch.setattr(provenance, "CODE_DIR", tmp_path)
    (tmp_path / "provenance.json").write_text('{"command": ["tr')  # cut short
    whole = provenance.write(tmp_path, device="cpu")
    assert len(whole["launches"]) == 1
    assert (tmp_path / "provenance.json.unreadable").read_text() == '{"command": ["tr'


def test_a_second_unreadable_record_keeps_the_first(tmp_path, monkeypatch):
    monkeypatch.setattr(provenance, "CODE_DIR", tmp_path)
    for text in ('{"command": ["tr', "[1, 2]\n"):
        (tmp_path / "provenance.json").write_text(text)
        provenance.write(tmp_path, device="cpu")
    assert (tmp_path / "provenance.json.unreadable").read_text() == '{"command": ["tr'
    assert (tmp_path / "provenance.json.unreadable2").read_text() == "[1, 2]\n"
    assert len(json.loads((tmp_path / "provenance.json").read_text())["launches"]) == 1


def test_collect_describes_this_process():
    record = provenance.collect()
    assert record["command"] == sys.argv and record["world_size"] == 1
    torch = pytest.importorskip("torch")
    assert record["device"] == (torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu")
    assert set(record["versions"]) == {"torch", "triton", "fla", "longctx", "python"}
    assert set(record["git"]) == {"commit", "dirty", "diff_file"}


def test_differences_from_now_name_each_version_and_commit_that_changed(tmp_path, monkeypatch):
    """The latest launch's versions and commit against this process's: only what differs, both values; a run without
    a record (older runs) or with unknown values says nothing."""
    now = provenance.collect("cpu")
    then = json.loads(json.dumps(now))
    assert provenance.differences_from_now(then) == {}
    assert provenance.differences_from_now(None) == {}
    then["versions"]["torch"] = "0.0.1"
    then["git"]["commit"] = "0" * 40 if now["git"]["commit"] else None
    record = {**now, "launches": [now, then]}  # the latest launch is the one compared
    differs = provenance.differences_from_now(record)
    assert differs["versions.torch"] == ("0.0.1", now["versions"]["torch"])
    assert ("git.commit" in differs) == (now["git"]["commit"] is not None)
    assert set(differs) <= {"versions.torch", "git.commit"}


def test_a_config_from_another_checkout_is_recorded_with_its_own_tree(tmp_path, monkeypatch):
    """train.py and conf/ of one checkout, the package installed from another (or a --config-dir): the record names
    each config folder outside the package's tree with its tree's commit (and its diff, dirty); untracked config
    files count as new ones, in either tree; a folder no git tree holds reads null."""
    code, other = tmp_path / "code", tmp_path / "other"
    for tree, text in ((code, "x = 1\n"), (other, "lr: 1\n")):
        (tree / "conf").mkdir(parents=True)
        (tree / Path(provenance.__file__).name).write_text(text)
        (tree / "conf" / "config.yaml").write_text(text)
        _git(tree, "init", "-q")
        _git(tree, "add", ".")
        _git(tree, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    monkeypatch.setattr(provenance, "CODE_DIR", code)
    monkeypatch.setattr(provenance, "config_dirs", lambda: [code / "conf"])
    record = provenance.collect("cpu")
    assert record["config_git"] is None and record["git"]["dirty"] is False
    (code / "conf" / "new_group.yaml").write_text("added: 1\n")               # untracked, in the package's tree
    git, _, diffs = provenance.git_states([code / "conf"])
    assert git["dirty"] is True and b"+added: 1" in diffs["git"] and b"b/conf/new_group.yaml" in diffs["git"]
    (code / "conf" / "new_group.yaml").unlink()

    loose = tmp_path / "loose"                                                 # in no git tree
    loose.mkdir()
    monkeypatch.setattr(provenance, "config_dirs", lambda: [other / "conf", loose])
    (other / "conf" / "config.yaml").write_text("lr: 2\n")
    (other / "conf" / "extra.yaml").write_text("extra: 1\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    record = provenance.write(run_dir, device="cpu")
    assert record["git"]["commit"] == _git(code, "rev-parse", "HEAD").strip() and record["git"]["dirty"] is False
    assert record["config_git"] == [
        {"dir": str(other / "conf"), "commit": _git(other, "rev-parse", "HEAD").strip(), "dirty": True,
         "diff_file": "provenance.config.diff"},
        {"dir": str(loose), "commit": None, "dirty": None, "diff_file": None}]
    diff = (run_dir / "provenance.config.diff").read_text()
    assert "+lr: 2" in diff and "+extra: 1" in diff and not (run_dir / "provenance.diff").exists()


def test_a_config_folder_never_committed_reads_dirty_with_its_files_new(tmp_path, monkeypatch):
    other = tmp_path / "other"
    (other / "conf").mkdir(parents=True)
    (other / "README").write_text("r\n")
    (other / "conf" / "config.yaml").write_text("lr: 3\n")
    _git(other, "init", "-q")
    _git(other, "add", "README")
    _git(other, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    monkeypatch.setattr(provenance, "CODE_DIR", tmp_path / "code")             # the package: in no tree here
    _, others, diffs = provenance.git_states([other / "conf"])
    assert others[0]["dirty"] is True and b"+lr: 3" in diffs["config_git.0"]


def _committed_tree(path: Path, files: dict) -> Path:
    for name, data in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_bytes(data)
    _git(path, "init", "-q")
    _git(path, "add", ".")
    _git(path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    return path


def test_a_config_diff_applies_whole_whatever_its_files_hold(tmp_path, monkeypatch):
    """The recorded diff of a config tree applies to its commit (paths from the tree's root, bytes as they are: a
    Latin-1 edit, CRLF lines); what git cannot diff (a link to a folder, a nested checkout) is named, and nothing of
    it stops the record; a checkout nested in the package's folder is another tree."""
    code = _committed_tree(tmp_path / "code", {Path(provenance.__file__).name: b"x = 1\n", ".gitignore": b"conf/\n"})
    conf = _committed_tree(code / "conf", {"config.yaml": b"lr: 1\n"})       # its own checkout, ignored by code's
    monkeypatch.setattr(provenance, "CODE_DIR", code)
    (conf / "config.yaml").write_bytes(b"lr: 2 # caf\xe9\n")
    (conf / "group").mkdir()
    (conf / "group" / "new.yaml").write_bytes(b"a: 1\r\nb: 2\r\n")
    (conf / "etc").symlink_to(tmp_path)
    (conf / "gone.yaml").symlink_to(tmp_path / "missing")
    git, others, diffs = provenance.git_states([conf])
    assert git["dirty"] is False and others[0]["dirty"] is True and "git" not in diffs
    diff = diffs["config_git.0"]
    assert b"# untracked, not copied: etc" in diff
    copy = tmp_path / "copy"
    subprocess.run(["git", "clone", "-q", str(conf), str(copy)], check=True)
    patch = tmp_path / "patch.diff"
    patch.write_bytes(diff)
    subprocess.run(["git", "-C", str(copy), "apply", "--exclude=gone.yaml", str(patch)], check=True,
                   capture_output=True)
    assert (copy / "config.yaml").read_bytes() == b"lr: 2 # caf\xe9\n"
    assert (copy / "group" / "new.yaml").read_bytes() == b"a: 1\r\nb: 2\r\n"


def test_an_unreadable_record_takes_its_diffs_with_it(tmp_path, monkeypatch):
    """A cut provenance.json is set aside with the diffs its launches named (one number for all), so this record's
    diff never overwrites an earlier launch's."""
    code = _committed_tree(tmp_path / "code", {Path(provenance.__file__).name: b"x = 1\n"})
    monkeypatch.setattr(provenance, "CODE_DIR", code)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (code / Path(provenance.__file__).name).write_text("x = 2\n")
    provenance.write(run_dir, device="cpu")
    (run_dir / "provenance.json").write_text('{"command": ["tr')
    (code / Path(provenance.__file__).name).write_text("x = 3\n")
    record = provenance.write(run_dir, device="cpu")
    assert record["git"]["diff_file"] == "provenance.diff" and "+x = 3" in (run_dir / "provenance.diff").read_text()
    assert "+x = 2" in (run_dir / "provenance.diff.unreadable").read_text()
    assert (run_dir / "provenance.json.unreadable").read_text() == '{"command": ["tr'


def test_config_dirs_names_the_primary_folder_and_a_config_dir(tmp_path):
    """Hydra's own record of where the job's config came from: the app's conf/ (provider main) and --config-dir."""
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "config.yaml").write_text("a: 1\n")
    (tmp_path / "extra").mkdir()
    (tmp_path / "extra" / "alt.yaml").write_text("a: 3\n")
    (tmp_path / "app.py").write_text(
        "import hydra\nfrom longctx import provenance\n\n"
        "@hydra.main(version_base='1.3', config_path='conf', config_name='config')\n"
        "def main(cfg):\n    print([str(p) for p in provenance.config_dirs()], cfg.a)\n\nmain()\n")
    out = subprocess.run([sys.executable, "app.py", "--config-dir", "extra", "--config-name", "alt",
                          "hydra.run.dir=.", "hydra.output_subdir=null"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == f"{[str(tmp_path / 'conf'), str(tmp_path / 'extra')]} 3"
