"""The scripts under hostile conditions: run from another folder, signalled, out of disk, on a machine without
CUDA, fed long inputs. Each ends in one line naming what is wrong, a non-zero exit, and nothing written outside
the asked place."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts"


# ----- run_points.py --------------------------------------------------------------------------------------
# A stand-in for train.py: records its working folder and pid, then sleeps until SIGTERM, which it answers as
# the trainer does (a last line, then exit).
STUB_POINT = textwrap.dedent("""
    import os, signal, sys, time
    from pathlib import Path
    marks = Path(sys.argv[1])
    def on_term(signum, frame):
        (marks / f"{os.getpid()}.term").write_text("checkpointed")
        sys.exit(0)
    signal.signal(signal.SIGTERM, on_term)
    (marks / f"{os.getpid()}.pid").write_text(os.getcwd())
    time.sleep(float(sys.argv[2]))
""")


def run_points_with_stub(marks: Path, sleep_s: float, argv: list[str]) -> str:
    """python -c source running run_points.main(argv) with each point's train.py replaced by STUB_POINT."""
    return textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(SCRIPTS)!r})
        import run_points
        run_points.train_command = lambda common, point, run_dir: [sys.executable, "-c", {STUB_POINT!r},
                                                                   {str(marks)!r}, "{sleep_s}"]
        sys.exit(run_points.main({argv!r}))
    """)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def wait_for(predicate, limit_s: float = 60.0) -> None:
    end = time.monotonic() + limit_s
    while not predicate():
        assert time.monotonic() < end, "the condition never came true"
        time.sleep(0.05)


def test_run_points_resolves_dir_and_runs_points_in_the_callers_folder(tmp_path):
    caller = tmp_path / "elsewhere"
    caller.mkdir()
    dry = subprocess.run([sys.executable, str(SCRIPTS / "run_points.py"), "--dry-run", "--dir", "pts",
                          "--grid", "seed=0,1"], capture_output=True, text=True, cwd=caller)
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.count(f"hydra.run.dir={caller / 'pts'}/${{run_name}}") == 2, dry.stdout
    marks = tmp_path / "marks"
    marks.mkdir()
    code = run_points_with_stub(marks, 0, ["--dir", "pts", "--grid", "seed=0,1"])
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=caller, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    cwds = {p.read_text() for p in marks.glob("*.pid")}
    assert cwds == {str(caller)}  # not the repository: relative paths of the overrides mean the caller's
    assert sorted(p.name for p in (caller / "pts" / "logs").iterdir()) == ["seed0.log", "seed1.log"]
    assert not (REPO / "pts").exists()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_run_points_forwards_a_signal_to_its_points_and_prints_the_table(tmp_path, signum):
    marks = tmp_path / "marks"
    marks.mkdir()
    code = run_points_with_stub(marks, 600, ["--jobs", "2", "--dir", str(tmp_path / "pts"),
                                             "--grid", "seed=0,1,2"])
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pids = []
    try:
        wait_for(lambda: len(list(marks.glob("*.pid"))) == 2)
        pids = [int(p.stem) for p in marks.glob("*.pid")]
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
        leaked = [pid for pid in pids if alive(pid)]
        for pid in leaked:
            os.kill(pid, signal.SIGKILL)
    assert not leaked, "a point outlived run_points"
    assert proc.returncode == 128 + signum, out + err
    assert sorted(p.stem for p in marks.glob("*.term")) == sorted(map(str, pids))  # each got SIGTERM
    name = signal.Signals(signum).name
    table = out[out.index("point "):].splitlines()
    assert len(table) == 4 and table[0].split() == ["point", "seconds", "outcome"], out
    assert [line.split("  ")[0].strip() for line in table[1:]] == ["seed=0", "seed=1", "seed=2"]
    assert sum(f"stopped by {name} (run again to continue)" in line for line in table) == 2
    assert table[3].endswith(f"not started ({name})")


# ----- the CUDA benchmarks on a machine without CUDA ------------------------------------------------------
@pytest.mark.parametrize("script, argv", [
    ("bench_attention", ["--out", "{out}"]),
    ("bench_decode", ["--out", "{out}", "--device", "cuda"]),
    ("bench_decode", ["--out", "{out}", "--device", "cuda:1", "--tiny"]),
])
def test_a_cuda_benchmark_without_cuda_is_one_line(import_script, monkeypatch, capsys, tmp_path, script, argv):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    module = import_script(script)
    out = tmp_path / "bench"
    argv = [a.format(out=out) for a in argv]
    monkeypatch.setattr(sys, "argv", [f"{script}.py", *argv])
    with pytest.raises(SystemExit) as stopped:
        module.main(argv) if script == "bench_decode" else module.main()
    assert stopped.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "needs a CUDA device" in err[0], err
    assert not out.exists()


def test_bench_decode_names_a_device_it_does_not_know(import_script, capsys, tmp_path):
    with pytest.raises(SystemExit) as stopped:
        import_script("bench_decode").main(["--out", str(tmp_path / "bench"), "--device", "gpu"])
    assert stopped.value.code == 2
    assert capsys.readouterr().err.strip() == "error: --device='gpu': expected auto, cpu, cuda or cuda:N"
    assert not (tmp_path / "bench").exists()


# ----- prepare_dataset: long text files, a full disk ------------------------------------------------------
def universal_newlines(data: bytes) -> str:
    return data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")


TRICKY = ("line one\r\nline two\rthree\n\n\nafter a gap\r\n\r\nmulti-byte: délta 数据 εψιλον\n\n\n\n"
          "end\n").encode()


@pytest.mark.parametrize("block", [1, 2, 3, 7, 1 << 16])
def test_text_file_documents_are_the_whole_files_split_whatever_the_block(monkeypatch, tmp_path, block):
    from longctx.data import prepare

    monkeypatch.setattr(prepare, "READ_CHARS", block)
    path = tmp_path / "t.txt"
    path.write_bytes(TRICKY)
    text = universal_newlines(TRICKY)
    expected = {"document": [text], "line": text.split("\n"), "paragraph": [t for t in text.split("\n\n") if t]}
    for sample_by, want in expected.items():
        docs, _ = prepare.open_source(str(path), sample_by=sample_by)
        assert list(docs) == want, sample_by
    # a document longer than max_chars is cut there, and the next one still starts where it should
    docs, _ = prepare.open_source(str(path), sample_by="line", max_chars=4)
    assert list(docs) == [t[:4] for t in text.split("\n")]
    docs, _ = prepare.open_source(str(path), sample_by="paragraph", max_chars=5)
    assert list(docs) == [t[:5] for t in text.split("\n\n") if t]


@pytest.mark.parametrize("block", [2, 1 << 16])
def test_a_non_utf8_byte_deep_in_a_file_is_found_at_its_offset(monkeypatch, tmp_path, block):
    from longctx.data import prepare

    monkeypatch.setattr(prepare, "READ_CHARS", block)
    data = "é".encode() * 50 + b"ok\n" + b"\xff tail"
    (tmp_path / "bad.txt").write_bytes(data)
    skipped = []
    docs, _ = prepare.open_source(str(tmp_path / "bad.txt"), sample_by="line", skipped=skipped)
    assert list(docs) == [] and skipped == [str(tmp_path / "bad.txt")]
    assert prepare._first_non_utf8(str(tmp_path / "bad.txt")) == (data.index(b"\xff"), 0xff)


@pytest.mark.parametrize("sample_by", ["line", "paragraph", "document"])
def test_reading_a_large_text_file_holds_a_small_part_of_it(tmp_path, sample_by):
    import tracemalloc

    from longctx.data import prepare

    path = tmp_path / "big.txt"
    line = "a line of some forty characters or so, " * 2 + "\n"
    with open(path, "w") as f:
        for i in range(80_000):  # ~6.6 MB; every 10th line is followed by a blank one (paragraphs)
            f.write(line + ("\n" if i % 10 == 9 else ""))
    size = path.stat().st_size
    docs, _ = prepare.open_source(str(path), sample_by=sample_by, max_chars=prepare._read_chars(4096))
    tracemalloc.start()
    try:
        count = sum(1 for _ in docs)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert count == {"line": 88_001, "paragraph": 8_000, "document": 1}[sample_by]
    assert peak < size / 4, f"{peak} bytes at the peak for a {size}-byte file"


def small_corpus(tmp_path: Path) -> Path:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(12):
        (corpus / f"{i:02d}.txt").write_text(f"document {i} " + "some words of text " * 30)
    return corpus


def full_disk_open(real_open, after_bytes: int):
    """open() whose binary writers fail with ENOSPC once `after_bytes` were written (a disk filling up)."""
    import errno

    class FillingFile:
        def __init__(self, f):
            self.f, self.written = f, 0

        def write(self, data):
            if self.written + len(data) > after_bytes:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self.f.name)
            self.written += len(data)
            return self.f.write(data)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    def fake_open(file, mode="r", *args, **kwargs):
        f = real_open(file, mode, *args, **kwargs)
        return FillingFile(f) if "w" in mode and "b" in mode else f
    return fake_open


def test_prepare_dataset_on_a_full_disk_is_one_line_and_leaves_nothing(import_script, monkeypatch, capsys,
                                                                       tmp_path):
    from longctx.data import prepare

    cli = import_script("prepare_dataset")
    corpus = small_corpus(tmp_path)
    common = ["--input", str(corpus), "--tokenizer", "bytes", "--doc-len", "256", "--heldout-docs", "2", "--quiet"]
    kept = tmp_path / "kept"
    assert cli.main([*common, "--out", str(kept)]) == 0
    before = {p.relative_to(kept): p.read_bytes() for p in kept.rglob("*") if p.is_file()}
    capsys.readouterr()
    monkeypatch.setattr(prepare, "open", full_disk_open(open, after_bytes=1000), raising=False)
    for out, extra in ((tmp_path / "new", []), (kept, ["--overwrite"])):
        assert cli.main([*common, "--out", str(out), *extra]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("prepare_dataset: error: No space left on device"), err
        assert err[0].endswith(f"nothing was written to {str(out)!r}")
    assert not (tmp_path / "new").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus", "kept"]  # no temporary folder left
    assert {p.relative_to(kept): p.read_bytes() for p in kept.rglob("*") if p.is_file()} == before


# ----- evaluate: contexts that cannot fit, a full disk -----------------------------------------------------
TINY_RUN = ["trainer.max_steps=2", "trainer.eval_every=2", "logger.wandb.mode=disabled", "data.train_tokens=65536",
            "data.n_heldout=16", "data.eval_docs=8", "data.docs_per_batch=4", "data.doc_len=256", "ctx=64",
            "trainer.num_threads=2", "attention=power", "p=2", "attention.chunk_size=16", "optim.warmup_steps=1"]
GIB = 2 ** 30


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, train_run):
    return train_run(tmp_path_factory.mktemp("runs") / "power", TINY_RUN)


def memory_of(monkeypatch, gib: float) -> None:
    """The machine's available memory, as the estimate reads it, set to `gib` GiB (every device)."""
    from longctx.train import estimate

    monkeypatch.setattr(estimate, "available_memory", lambda device: gib * GIB)


def eval_files(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / "eval").iterdir()) if (run_dir / "eval").exists() else []


def test_a_retrieval_context_that_cannot_fit_is_refused_before_any_work(tiny_run, monkeypatch, capsys):
    from longctx.evaluate import main as evaluate_main

    memory_of(monkeypatch, 4)
    before = eval_files(tiny_run)  # the trainer's own records
    args = [str(tiny_run), "--task", "passkey", "--device", "cpu", "--no-wandb", "--depths", "0,1", "--trials", "3"]
    assert evaluate_main([*args, "--contexts", "1024,4000000"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    prompts_gib = (2 * 6 + 3) * 4_000_000 * 8 / GIB  # 6 prompts twice (+ BOS) and 3 haystacks, int64
    assert err[0].startswith("error: --contexts: 4000000 needs ~")  # 1024 fits
    assert "but 4 GiB is available" in err[0] and f"6 prompts of a context held {prompts_gib:.3g} GiB" in err[0]
    assert eval_files(tiny_run) == before
    assert evaluate_main([*args, "--contexts", "64"]) == 0  # a context that fits still runs under that memory
    assert len(eval_files(tiny_run)) == len(before) + 2


def test_a_heldout_context_that_cannot_fit_is_refused_before_any_work(tiny_run, monkeypatch, capsys):
    from longctx.evaluate import main as evaluate_main

    memory_of(monkeypatch, 1 / 1024)  # 1 MiB
    before = eval_files(tiny_run)
    assert evaluate_main([str(tiny_run), "--ctx", "256", "--docs", "4", "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    held_gib = 4 * 256 * 16 / GIB  # inputs and targets of 4 documents, int64
    assert len(err) == 1 and err[0].startswith("error: --ctx: 256 needs ~"), err
    assert "but 0.000977 GiB is available" in err[0] and f"4 heldout documents held {held_gib:.3g} GiB" in err[0]
    assert err[0].endswith("evaluate at a shorter --ctx, or with fewer --docs or --micro-docs")
    assert eval_files(tiny_run) == before


@pytest.mark.parametrize("args", [["--ctx", "100000000"], ["--task", "needle", "--contexts", "100000000"]])
def test_an_evaluation_that_cannot_fit_generates_no_data_first(tiny_run, tmp_path, capsys, args):
    """The generated data's documents are max(1024, ctx) long: an evaluation refused for its memory is refused before
    any of it is generated (it once generated for minutes, silently, before the check)."""
    from longctx.evaluate import main as evaluate_main

    cache = tmp_path / "cache"
    assert evaluate_main([str(tiny_run), *args, "--device", "cpu", f"data.cache_dir={cache}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {args[-2]}: 100000000 needs ~"), err
    assert not cache.exists() or not any(cache.iterdir())


def disk_full_after_writing(path_of, partial: bytes = b"\x89PNG half"):
    """A writer that puts `partial` bytes where it writes (path_of(*args)), then fails as a full disk does."""
    import errno

    def write(*args, **kwargs):
        path = Path(path_of(*args))
        path.write_bytes(partial)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
    return write


def test_a_full_disk_at_the_figure_keeps_the_records_whole(tiny_run, monkeypatch, capsys, tmp_path):
    from longctx import evaluate
    from longctx.eval import read_doc_record

    monkeypatch.setattr(evaluate, "plot_icl", disk_full_after_writing(lambda records, png, *a: png))
    monkeypatch.setattr(evaluate, "plot_retrieval", disk_full_after_writing(lambda record, png, *a: png))
    held, passkey = tmp_path / "held.json", tmp_path / "passkey.json"
    assert evaluate.main([str(tiny_run), "--ctx", "64", "--docs", "2", "--device", "cpu", "--out", str(held)]) == 1
    assert evaluate.main([str(tiny_run), "--task", "passkey", "--contexts", "64", "--depths", "0", "--trials", "2",
                          "--device", "cpu", "--no-wandb", "--out", str(passkey)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert [line for line in err if line.startswith("error: ")] == [
        f"error: {tmp_path / 'held.png'}: No space left on device; the figure was not written, the records were "
        f"({held}, {tmp_path / 'held.npz'})",
        f"error: {tmp_path / 'passkey.png'}: No space left on device; the figure was not written, the records were "
        f"({passkey})"]
    assert json.loads(held.read_text())["ctx"] == 64 and json.loads(passkey.read_text())["contexts"] == [64]
    assert read_doc_record(tmp_path / "held.npz")["loss"].shape[0] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["held.json", "held.npz", "passkey.json"]


def test_a_full_disk_at_the_records_leaves_nothing(tiny_run, monkeypatch, capsys, tmp_path):
    from longctx import evaluate

    monkeypatch.setattr(evaluate, "write_doc_record",
                        disk_full_after_writing(lambda path, arrays: f"{path}.tmp", b"PK half an archive"))
    monkeypatch.setattr(evaluate, "plot_icl", lambda *a, **k: pytest.fail("the figure of records never written"))
    out = tmp_path / "held.json"
    assert evaluate.main([str(tiny_run), "--ctx", "64", "--docs", "2", "--device", "cpu", "--out", str(out)]) == 1
    err = [line for line in capsys.readouterr().err.strip().splitlines() if line.startswith("error: ")]
    assert err == [f"error: {tmp_path / 'held.npz.tmp'}: No space left on device; nothing was written"]
    assert list(tmp_path.iterdir()) == []


MEASURE_FORWARD = textwrap.dedent("""
    import sys, torch
    from omegaconf import OmegaConf
    from longctx.models import build_model
    from longctx.models.spec import ModelSpec
    from longctx.train.estimate import forward_memory
    torch.set_num_threads(2)
    att, ctx, micro = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    spec = ModelSpec(attention=att, vocab_size=256, d_model=512, n_layers=1, n_heads=4, ctx=ctx)
    model = build_model(spec).eval()
    est = forward_memory(model, OmegaConf.create({"ctx": ctx, "window": 1024, "trainer": {"precision": "fp32"}}),
                         ctx, micro, "cpu", False)
    x = torch.randint(0, 256, (micro, ctx))
    def peak_rss():  # this process's own peak (ru_maxrss may carry its parent's across exec)
        line = next(l for l in open("/proc/self/status") if l.startswith("VmHWM:"))
        return int(line.split()[1]) * 1024
    before = peak_rss()
    with torch.no_grad():
        model(x, x)
    print(peak_rss() - before, est["activations"] + est["loss"])
""")


def test_the_forward_estimate_bounds_the_measured_peak_closely():
    r = subprocess.run([sys.executable, "-c", MEASURE_FORWARD, "exp", "8192", "1"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    measured, estimate = map(float, r.stdout.split())  # the peak resident memory the forward added, in bytes
    assert measured <= estimate <= 2 * measured, (measured, estimate)
