"""lm-eval-harness tasks from a run's own data (longctx.hf.harness): what lm-eval reports on the exported model equals
longctx's own evaluation of the same documents (heldout NLL per position bin, passkey and needle key accuracy and
each greedy continuation); generation is deterministic and offline; bad input is one line."""
from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

pytest.importorskip("transformers")
pytest.importorskip("lm_eval")

from longctx import load_run  # noqa: E402
from longctx.data import heldout_batch  # noqa: E402
from longctx.data.tokenizer import EOT, ByteTokenizer  # noqa: E402
from longctx.eval import alphabet_for, exponential_bins, per_token_loss, run_retrieval  # noqa: E402
from longctx.eval.retrieval import MARKER_TEXT  # noqa: E402
from longctx.evaluate import main as evaluate_main  # noqa: E402
from longctx.hf.harness import generate, git_hash_quietly, run_lm_eval  # noqa: E402
from longctx.hf.harness.__main__ import main as harness_main  # noqa: E402

CTX = 128
WORDS = "alpha beta gamma delta river stone light shadow number seven green sky".split()


@pytest.fixture(scope="module")
def text_run(tmp_path_factory, train_run):
    """A tiny GPT-2 trained 2 steps on a bytes-tokenized corpus of Python-like text (ctx 128) -> (run, data)."""
    from longctx.data.prepare import PrepareConfig, prepare_dataset

    root = tmp_path_factory.mktemp("harness")
    rng = np.random.default_rng(0)
    for i in range(3):
        (root / "site" / f"pkg{i}").mkdir(parents=True)
        (root / "site" / f"pkg{i}" / "__init__.py").write_text("".join(
            f"def f_{i}_{k}(x):\n    return " + " ".join(WORDS[w] for w in rng.integers(0, len(WORDS), 6)) + "\n"
            for k in range(60)))
    prepare_dataset(PrepareConfig(source=[str(root / "site")], out=str(root / "ds"), doc_len=256, group_by="package",
                                  tokenizer="bytes", heldout_docs=6, rolled=False, progress=False))
    run = train_run(root / "run", ["data=source_corpus", f"data.path={root / 'ds'}", f"ctx={CTX}",
                                   "trainer.max_steps=2", "trainer.eval_every=2", "optim.warmup_steps=1",
                                   "data.docs_per_batch=4", "data.eval_docs=4", "logger.wandb.mode=disabled",
                                   "trainer.num_threads=2"])
    return run, root / "ds"


SMALL = dict(docs=3, bins=4, contexts=[64, CTX], depths=[0.0, 0.5, 1.0], trials=2)


def rows(folder, task):
    return [json.loads(line) for line in (folder / f"longctx_{task}.jsonl").read_text().splitlines()]


# -- generation ---------------------------------------------------------------------------------------------------

def test_tasks_are_the_runs_heldout_documents_and_the_retrieval_prompts(text_run, tmp_path):
    run, data = text_run
    summary = generate(run, tmp_path / "a", "heldout,passkey,needle", **SMALL)
    assert summary["tasks"] == ["longctx_heldout", "longctx_passkey", "longctx_needle"]
    heldout = heldout_batch(data / "heldout.zarr", CTX, 3)["targets"].numpy()
    edges = exponential_bins(CTX, 4)
    got = rows(tmp_path / "a", "heldout")
    assert [(r["doc"], r["start"], r["end"]) for r in got] == [(i, a, b) for i in range(3) for a, b in edges]
    for r in got:  # bytes: each choice's UTF-8 is exactly the document's ids up to the bin's edges
        ends = ([r["start"]] if r["start"] else []) + [r["end"]]
        assert [list(c.encode()) for c in r["choices"]] == [heldout[r["doc"], :e].tolist() for e in ends]
        assert r["tokens"] == r["bytes"] == r["end"] - r["start"] and r["cell"] == f"nll_{r['start']}_{r['end']}"
    for task in ("passkey", "needle"):
        prompts = rows(tmp_path / "a", task)
        assert [(p["ctx"], p["depth"]) for p in prompts] == [(c, d) for c in (64, CTX) for d in (0, 0.5, 1)
                                                             for _ in range(2)]
        for p in prompts:
            text = p["context"].removeprefix(EOT)  # BOS first, as longctx reads a prompt
            assert p["context"].startswith(EOT) and len(text.encode()) + 5 == p["ctx"]
            assert len(p["target"]) == 5 and p["target"].isdigit() and text.endswith(MARKER_TEXT)
            before, needle = text.split(MARKER_TEXT)[:2]   # the key hidden once, at its depth, then asked for
            assert needle[:5] == p["target"] and text.count(MARKER_TEXT) == 2
            haystack = p["ctx"] - 2 * (len(MARKER_TEXT) + 5)
            assert len(before) == round(p["depth"] * haystack)
            if task == "needle":  # the haystack is the start of a heldout document
                rest = needle[5:].removesuffix(MARKER_TEXT)
                assert any(bytes(doc[:haystack].astype(np.uint8)).decode() == before + rest for doc in heldout)
    # deterministic: a second folder holds the same documents, and YAMLs differing only in the data file's path
    generate(run, tmp_path / "b", "heldout,passkey,needle", **SMALL)
    for name in ("longctx_heldout", "longctx_passkey", "longctx_needle"):
        assert (tmp_path / "a" / f"{name}.jsonl").read_bytes() == (tmp_path / "b" / f"{name}.jsonl").read_bytes()
        a, b = ((tmp_path / x / f"{name}.yaml").read_text() for x in "ab")
        assert a.replace(str(tmp_path / "a"), str(tmp_path / "b")) == b


def test_bits_per_byte_counts_the_texts_bytes_not_the_end_of_text_spelling():
    """A heldout document holding end-of-text tokens (documents joined in a row): each bin's bytes are its byte
    tokens', the end-of-text ids counting none (not the 13 characters lm-eval's text spells them with)."""
    from longctx.hf.export import byte_tokenizer
    from longctx.hf.harness.tasks import Codec, heldout_task

    doc = np.array([[*b"abc def", 256, *b"gh\xc3\xa9", 256, *b"xyz"] + [ord("q")] * 16])
    data = heldout_task(Codec(byte_tokenizer()), doc, 3)
    assert data.skipped == 0
    for r in data.rows:
        part = doc[0, r["start"]:r["end"]]
        assert r["bytes"] == int((part < 256).sum()) and r["tokens"] == len(part), r


def test_the_yamls_are_lm_eval_tasks_naming_longctx_callbacks(text_run, tmp_path):
    from lm_eval.tasks import TaskManager

    from longctx.hf.harness import metrics

    generate(text_run[0], tmp_path / "t", "heldout,passkey", **SMALL)
    manager = TaskManager(include_path=str(tmp_path / "t"), include_defaults=False)
    assert {"longctx_heldout", "longctx_passkey"} <= set(manager.all_tasks)
    assert not [p for p in (tmp_path / "t").iterdir() if p.suffix not in (".yaml", ".jsonl")]  # no code in it
    from lm_eval.tasks._yaml_loader import load_yaml
    config = load_yaml(tmp_path / "t" / "longctx_heldout.yaml")
    assert config["process_results"] is metrics.heldout_results and config["dataset_path"] == "json"
    assert [m["metric"] for m in config["metric_list"]] == ["nll", "bits_per_byte"] + [
        f"nll_{a}_{b}" for a, b in exponential_bins(CTX, 4)]
    passkey = load_yaml(tmp_path / "t" / "longctx_passkey.yaml")
    assert passkey["generation_kwargs"] == {"until": [], "max_gen_toks": 5, "do_sample": False, "temperature": 0.0}


def one_line(capsys, code, words):
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and words in err[0], err


def test_bad_arguments_are_one_line_and_write_nothing(text_run, tmp_path, capsys, monkeypatch):
    run = str(text_run[0])
    out = tmp_path / "tasks"
    cases = [
        ([run, "--tasks", "heldout,bogus"], "--tasks='heldout,bogus': expected some of heldout, passkey, needle"),
        ([run, "--tasks", "mqar"], "mqar needs an MQAR run"),
        ([run, "--docs", "0"], "--docs=0: must be an integer >= 1"),
        ([run, "--contexts", "20", "--tasks", "passkey"], "--contexts: 20 is shorter than"),
        ([run, "--depths", "2"], "--depths='2': expected one or more fractions in [0, 1]"),
        ([str(tmp_path / "nowhere")], "not a folder"),
        ([run, "--text", str(tmp_path / "none.txt")], "--text="),
    ]
    for argv, words in cases:
        one_line(capsys, harness_main([*argv, "--out", str(out)]), words)
        assert not out.exists()
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    one_line(capsys, harness_main([run, "--out", str(tmp_path / "full")]), "is not an empty folder")
    # an exported model holds no data: --text is needed
    (tmp_path / "export").mkdir()
    (tmp_path / "export" / "config.json").write_text(json.dumps({"model_type": "longctx", "ctx": CTX}))
    one_line(capsys, harness_main([str(tmp_path / "export"), "--out", str(out)]), "give --text FILE")
    # evaluate's --harness options, and lm-eval missing: one line naming the extra
    one_line(capsys, evaluate_main([run, "--tasks", "heldout"]), "--tasks: an option of --harness")
    one_line(capsys, evaluate_main([run, "--harness", "--task", "passkey"]), "--harness: runs its own --tasks")
    one_line(capsys, evaluate_main([run, "--harness", "--precision", "bf16"]), "--precision: not an option of")
    one_line(capsys, evaluate_main([run, "--harness", "--limit", "0"]), "--limit=0: must be an integer >= 1")
    one_line(capsys, evaluate_main([run, "--harness", "--no-wandb"]), "--no-wandb: not an option of --harness")
    packed = tmp_path / "packed"
    shutil.copytree(run, packed)
    cfg = OmegaConf.load(packed / "config.yaml")
    cfg.data.pack = True
    OmegaConf.save(cfg, packed / "config.yaml")
    one_line(capsys, evaluate_main([str(packed), "--harness"]), "trained on packed documents (data.pack=true)")
    one_line(capsys, evaluate_main([run, "--harness", "--tasks", "heldout", "--seed", "3"]),
             "--seed: an option of the harness's passkey and needle tasks (--tasks heldout has neither)")
    monkeypatch.setitem(__import__("sys").modules, "lm_eval", None)
    one_line(capsys, harness_main([run, "--out", str(out)]), "pip install 'longctx[hf]'")
    one_line(capsys, evaluate_main([run, "--harness"]), "needs the optional package 'lm_eval'")
    assert not out.exists() and not list(text_run[0].glob("eval/harness*"))


# -- lm-eval on the exported model --------------------------------------------------------------------------------

@torch.no_grad()
def greedy(model, ids: list[int], n: int) -> list[int]:
    """longctx's own greedy continuation: the argmax of a full forward, n times."""
    for _ in range(n):
        ids = ids + [int(model(torch.tensor([ids]))[0, -1].argmax())]
    return ids[-n:]


def test_lm_eval_asks_git_quietly_outside_a_repository(tmp_path, monkeypatch, capfd):
    """lm-eval records the working folder's commit by asking git, whose "fatal: not a git repository" reached the
    console outside one: within run_lm_eval it is asked quietly, None outside a repository, the commit inside."""
    import subprocess
    import lm_eval
    import lm_eval.evaluator
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))   # no repository above tmp_path counts
    asked = []
    monkeypatch.setattr(lm_eval, "simple_evaluate", lambda **kw: asked.append(lm_eval.evaluator.get_git_commit_hash()))
    monkeypatch.setattr("lm_eval.tasks.TaskManager", lambda **kw: None)
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text('{"ctx": 64}')
    run_lm_eval(tmp_path / "model", tmp_path, ["longctx_heldout"])
    assert asked == [None] and "fatal" not in capfd.readouterr().err
    assert lm_eval.evaluator.get_git_commit_hash is not git_hash_quietly          # lm-eval's own again after it
    if shutil.which("git"):
        subprocess.run(["git", "init", "-q"], check=True)
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "c"],
                       check=True)
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        assert git_hash_quietly() == head


@pytest.mark.slow
def test_lm_eval_on_the_export_equals_longctx_on_the_same_documents(text_run, monkeypatch, capsys):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")  # nothing is fetched: the data files and the model are local
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    run, data = text_run
    monkeypatch.setenv("HF_DATASETS_CACHE", str(run / "hf_datasets"))
    import longctx.hf.harness as harness
    fed = []   # the max_length each lm-eval call was given
    monkeypatch.setattr(harness, "run_lm_eval", lambda *a, **k: fed.append(k.get("max_length")) or run_lm_eval(*a, **k))
    code = evaluate_main([str(run), "--harness", "--tasks", "heldout,passkey,needle", "--docs", "3", "--bins", "4",
                          "--contexts", "64,128,256", "--depths", "0,0.5,1", "--trials", "2", "--device", "cpu"])
    assert code == 0, capsys.readouterr().err[-2000:]
    out = capsys.readouterr().out
    assert "step 2, longctx_heldout: nll " in out and f"wrote {run / 'eval' / 'harness-step2.json'}" in out
    record = json.loads((run / "eval" / "harness-step2.json").read_text())
    assert fed == [record["max_length"]] == [257]   # prompts past the run's ctx go whole (not cut on the left)
    got = {task: {k.split(",")[0]: v for k, v in metrics.items()} for task, metrics in
           record["lm_eval"]["results"].items()}
    model, _ = load_run(run, device="cpu")
    # heldout: longctx's per-token NLL of the same 3 documents (BOS + document), per bin and whole
    batch = heldout_batch(data / "heldout.zarr", CTX, 3)
    nll = per_token_loss(model, batch["inputs"], batch["targets"], 4, "fp32")
    assert got["longctx_heldout"]["nll"] == pytest.approx(nll.mean(), rel=1e-6)
    assert got["longctx_heldout"]["bits_per_byte"] == pytest.approx(nll.mean() / math.log(2), rel=1e-6)
    for a, b in exponential_bins(CTX, 4):
        assert got["longctx_heldout"][f"nll_{a}_{b}"] == pytest.approx(nll[:, a:b].mean(), rel=1e-6, abs=1e-9)
    # passkey, needle: longctx's retrieval accuracy on the same prompts (python -m longctx.evaluate --task ...)
    alphabet = alphabet_for(257, 256, CTX, ByteTokenizer().encode, 0)
    for task in ("passkey", "needle"):
        documents = heldout_batch(data / "heldout.zarr", 256, 6)["targets"].numpy() if task == "needle" else None
        own = run_retrieval(model, task, alphabet, [64, CTX, 256], [0.0, 0.5, 1.0], 2, 5, 4, "fp32", documents, 0)
        for i, ctx in enumerate((64, CTX, 256)):
            for j, depth in enumerate((0, 0.5, 1)):
                assert got[f"longctx_{task}"][f"acc_{ctx}_{depth:g}"] == own["key_accuracy"][i][j], (task, ctx, depth)
    # and every key lm-eval generated is longctx's own greedy continuation (the export and the tasks were kept)
    folder = run / "eval" / "harness-step2"
    samples = run_lm_eval(folder / "model", folder / "tasks", ["longctx_needle"], log_samples=True,
                          max_length=record["max_length"])["samples"]
    assert len(samples["longctx_needle"]) == 18
    for s in samples["longctx_needle"]:
        ids = [256] + list(s["doc"]["context"].removeprefix(EOT).encode())
        assert s["resps"][0][0] == bytes(greedy(model, ids, 5)).decode(errors="replace"), s["doc"]["cell"]


@pytest.mark.slow
def test_mqar_on_the_export_equals_longctx_recall_through_the_id_tokenizer(train_run, tmp_path, monkeypatch):
    from longctx.eval.recall import query_hits
    from longctx.hf.export import export_run
    from longctx.train.data import resolve_splits

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf_datasets"))
    run = train_run(tmp_path / "run", ["data=mqar", "data.n_keys=16", "data.n_values=16", "data.n_pairs=4",
                                       "data.train_tokens=8192", "data.n_heldout=8", "data.eval_docs=4", "ctx=64",
                                       "data.docs_per_batch=4", "trainer.max_steps=2", "trainer.eval_every=2",
                                       "optim.warmup_steps=1", "logger.wandb.mode=disabled", "trainer.num_threads=2"])
    summary = generate(run, tmp_path / "tasks", None, docs=3, bins=4)  # ids without text: the folder's tokenizer
    assert summary["tasks"] == ["longctx_heldout", "longctx_mqar"] and summary["tokenizer"] == str(tmp_path / "tasks")
    model_dir = export_run(run, tmp_path / "model")
    assert not (model_dir / "tokenizer.json").exists()
    result = run_lm_eval(model_dir, tmp_path / "tasks", summary["tasks"], log_samples=True,
                         tokenizer=summary["tokenizer"])
    model, cfg = load_run(run, device="cpu")
    batch = heldout_batch(str(resolve_splits(cfg.data, 64).heldout_path), 64, 3)
    nll = per_token_loss(model, batch["inputs"], batch["targets"], 4, "fp32")
    assert result["results"]["longctx_heldout"]["nll,none"] == pytest.approx(nll.mean(), rel=1e-6)
    with torch.no_grad():
        hits = query_hits(model(batch["inputs"]), batch["targets"], batch["queries"]).numpy()
    queries = batch["queries"].numpy()
    samples = result["samples"]["longctx_mqar"]
    assert len(samples) == hits.size
    for s in samples:  # each query: lm-eval's loglikelihood of the value and its greedy flag are longctx's own
        i, q = s["doc"]["doc"], list(queries[s["doc"]["doc"], 0]).index(
            len(s["doc"]["context"].removeprefix(EOT).split()))
        ll, greedy_hit = s["resps"][0][0]
        assert ll == pytest.approx(-nll[i, queries[i, 0, q]], rel=1e-5) and bool(greedy_hit) == bool(hits[i, q])
    assert result["results"]["longctx_mqar"]["acc,none"] == pytest.approx(hits.mean())
