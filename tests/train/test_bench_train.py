"""scripts/bench_train.py runs the trainer's own path (config, model, optimizer, data reader) for each row and
variant; scripts/compare_train_paths.py trains the fast and the eager path on the same batches."""
import json

import pytest
import torch

from longctx.models.common import rotary, rotary_tables

CPU = "model=tiny device=cpu trainer.compile=false trainer.precision=fp32"


def test_bench_rows_run_the_trainer_and_record_what_ran(import_script, tmp_path, capfd):
    bench = import_script("bench_train")
    record = bench.main(["--archs", "gpt2", "--rows", "exp@64", "none@64", "--tokens", "128", "--docs", "1",
                         "--steps", "1", "--min-seconds", "0.3", "--warmup", "1", "--out", str(tmp_path),
                         "--variant", f"eager={CPU} trainer.activation_checkpointing=false",
                         "--variant", f"ckpt={CPU} trainer.activation_checkpointing=true"])
    rows = {(r["attention"], r["variant"]): r for r in record["rows"]}
    assert len(rows) == 4 and all(r["error"] is None and r["tokens_per_s"] > 0 for r in rows.values())
    # timed for at least --steps steps and --min-seconds; the reader's share is measured, not assumed
    assert all(r["steps_timed"] >= 1 and r["steps_timed"] * r["step_s"] >= 0.29 for r in rows.values())
    assert all(0 <= r["data_wait_s"] <= r["step_s"] for r in rows.values())
    assert rows["exp", "ckpt"]["checkpointing"] and not rows["exp", "eager"]["checkpointing"]
    assert rows["exp", "eager"]["micro_docs"] == 2 and rows["exp", "eager"]["docs_per_step"] == 2  # 128 // 64
    # the ceiling row charges no attention: 3 x the weight FLOPs only; exp adds its causal state FLOPs
    assert rows["none", "eager"]["train_flops_per_token"] < rows["exp", "eager"]["train_flops_per_token"]
    saved = json.loads((tmp_path / "bench_train.json").read_text())
    assert saved["rows"] == record["rows"] and (tmp_path / "bench_train.md").read_text().count("| gpt2 |") == 4
    # the trainer's start-up estimate counts the row's warmup and timed steps (2), not a run of a million steps
    out = capfd.readouterr()
    times = [line.split("training time ")[1] for line in (out.out + out.err).splitlines() if "estimate:" in line]
    assert len(times) == 4 and all(t.startswith("~") and t.split()[1] == "s" for t in times), times


def test_bench_data_has_longcrawl64_chunks(import_script, tmp_path):
    """LongCrawl64's chunks are 2048 documents x 2048 positions (fewer where the array is smaller): a 1k-token batch
    then decodes at most twice the tokens it uses, as on the real data."""
    import zarr
    bench = import_script("bench_train")
    root = bench.write_random_dataset(tmp_path, doc_len=8192, n_train=300, n_heldout=2, vocab=100)
    train, heldout = (zarr.open_array(str(root / f"{s}.zarr"), mode="r") for s in ("train", "heldout"))
    assert train.shape == (300, 8192) and train.chunks == (300, 2048) and heldout.chunks == (2, 2048)
    assert int(train[:].max()) < 100 and train.attrs["bos_id"] == 99


def test_bench_names_a_bad_row(import_script, tmp_path):
    bench = import_script("bench_train")
    with pytest.raises(SystemExit, match="--rows 'power-65536'"):
        bench.main(["--rows", "power-65536", "--out", str(tmp_path)])


@pytest.mark.slow
def test_fast_path_trains_like_the_eager_path(import_script, tmp_path):
    """Compiled blocks without checkpointing vs eager with checkpointing: the same losses step for step (CPU,
    bf16 autocast as the recipe), while another seed differs."""
    compare = import_script("compare_train_paths")
    compare.main(["--steps", "4", "--ctx", "128", "--docs", "2", "--out", str(tmp_path),
                  "--overrides", "arch=gpt2 attention=power p=2 model=tiny device=cpu"])
    rec = json.loads((tmp_path / "train_paths_loss.json").read_text())
    fast, eager, seed1 = rec["losses"].values()
    assert max(abs(a - b) for a, b in zip(fast, eager)) < 2e-3
    assert max(abs(a - b) for a, b in zip(seed1, eager)) > 1e-2
    assert (tmp_path / "train_paths_loss.png").stat().st_size > 10_000


def test_rotary_tables_rotate_pairs_by_position_times_frequency():
    """Closed form: channel pair (i, i + d/2) at position m turns by the angle m * base^(-2i/d); a table that
    starts at an offset continues the positions of a longer one."""
    d, base, t = 8, 10000.0, 5
    x = torch.randn(1, t, 2, d, dtype=torch.float64)
    got = rotary(x, tuple(z.double() for z in rotary_tables(t, d, base, offset=3)))
    m = torch.arange(3, 3 + t, dtype=torch.float64)[:, None]
    theta = m * base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)                 # (t, d/2)
    z = torch.complex(x[..., : d // 2], x[..., d // 2:]) * torch.exp(1j * theta)[None, :, None, :]
    torch.testing.assert_close(got, torch.cat([z.real, z.imag], -1))
    longer = rotary_tables(t + 3, d, base)
    assert torch.equal(longer[0][3:], rotary_tables(t, d, base, offset=3)[0])


def test_stopped_comparison_continues_with_only_its_missing_runs(import_script, tmp_path, monkeypatch):
    """--continue-from keeps the finished runs of an earlier record and trains the rest; a record made with other
    settings is refused, naming the field that differs."""
    compare = import_script("compare_train_paths")
    trained = []

    def fake_losses(overrides, steps):  # which run trains, and losses that say which it was
        trained.append(overrides)
        return [float(len(trained))] * steps

    monkeypatch.setattr(compare, "train_losses", fake_losses)
    args = ["--steps", "3", "--ctx", "64", "--overrides", "model=tiny device=cpu"]
    compare.main([*args, "--out", str(tmp_path / "a")])
    first = json.loads((tmp_path / "a" / "train_paths_loss.json").read_text())
    names = list(compare.RUNS)
    stopped = {**first, "losses": {k: first["losses"][k] for k in names[:2]}}
    stopped.pop("summary")
    (tmp_path / "stopped.json").write_text(json.dumps(stopped))
    trained.clear()
    compare.main([*args, "--out", str(tmp_path / "b"), "--continue-from", str(tmp_path / "stopped.json")])
    assert len(trained) == 1 and "seed=1" in trained[0]          # only the missing run trained
    rec = json.loads((tmp_path / "b" / "train_paths_loss.json").read_text())
    assert [rec["losses"][k] for k in names[:2]] == [first["losses"][k] for k in names[:2]]
    assert rec["losses"][names[2]] == [1.0] * 3
    assert rec["summary"]["fast_vs_eager"] == 1.0 and rec["summary"]["seed_vs_seed"] == 1.0
    with pytest.raises(SystemExit, match="missing.json: no such file"):
        compare.main([*args, "--out", str(tmp_path / "c"), "--continue-from", str(tmp_path / "missing.json")])
    with pytest.raises(SystemExit, match="its overrides"):
        compare.main(["--steps", "3", "--ctx", "128", "--overrides", "model=tiny device=cpu",
                      "--out", str(tmp_path / "c"), "--continue-from", str(tmp_path / "stopped.json")])


def test_bench_kernel_switches_hold_during_their_variant_only(import_script, tmp_path, monkeypatch):
    """`kernel:FIELD=VALUE` items of a variant set that power-kernel switch while its rows train (seen from inside
    the trainer's steps), not during the other variant's, and not after; a misspelt one stops the run first."""
    from longctx.kernels.power.chunk_p2 import config as p2_config
    from longctx.train.trainer import Trainer
    bench = import_script("bench_train")
    seen = []
    step = Trainer.train_step

    def spy(self, batch):
        seen.append(p2_config.current().concurrent_bwd)
        return step(self, batch)

    monkeypatch.setattr(Trainer, "train_step", spy)
    common = ["--archs", "gpt2", "--rows", "exp@64", "--tokens", "64", "--docs", "1", "--steps", "1",
              "--min-seconds", "0", "--warmup", "1", "--out", str(tmp_path)]
    record = bench.main(common + ["--variant", f"plain={CPU}", "--variant", f"serial={CPU} kernel:concurrent_bwd=0"])
    plain, serial = record["rows"]
    assert plain["error"] is None and serial["error"] is None and "kernel:concurrent_bwd=0" in serial["overrides"]
    assert seen == [True] * (len(seen) // 2) + [False] * (len(seen) // 2) and len(seen) >= 4
    assert p2_config.current().concurrent_bwd is True
    with pytest.raises(SystemExit, match="--variant typo: kernel switch 'concurent_bwd=0'"):
        bench.main(common + ["--variant", f"typo={CPU} kernel:concurent_bwd=0"])
