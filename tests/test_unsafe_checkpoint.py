"""A checkpoint whose pickle holds objects a weights-only load refuses (a class of its own, a call into a blocked
module, an opcode the safe unpickler has none for) is refused in one line naming the file and, where torch names it,
the global: never torch's advice on loading it unsafely, and nothing in it runs. The truth is the file written
here and what torch's unpickler is documented to refuse."""
from __future__ import annotations

import os
import pickle
import sys

import pytest
import torch

import longctx.export as export_cli
from longctx.runs import RunError, load_run, pick_checkpoint
from longctx.train.console import setup_logging

PLAIN = "not only tensors and plain values; not loaded, as that could run code"


class Custom:
    """A class of the test's own: not among the globals a weights-only load rebuilds."""


class Calls:
    """Unpickled, it would call os.system (a blocked module's function) and leave `marker` behind."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def step_file(run_dir, step: int):
    path = run_dir / "checkpoints" / f"step_{step:08d}.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def save(run_dir, step: int, model) -> str:
    path = step_file(run_dir, step)
    torch.save({"schema_version": 1, "model": model}, path)
    return str(path)


def save_legacy_instance(run_dir, step: int) -> str:
    """torch's legacy (pre-zip) format whose object is a protocol-0 INST of Custom: torch names no global for it."""
    from torch.serialization import MAGIC_NUMBER, PROTOCOL_VERSION
    info = {"protocol_version": PROTOCOL_VERSION, "little_endian": sys.byteorder == "little",
            "type_sizes": {"short": 2, "int": 4, "long": 4}}
    body = f"(i{Custom.__module__}\n{Custom.__qualname__}\n.".encode()
    path = step_file(run_dir, step)
    path.write_bytes(pickle.dumps(MAGIC_NUMBER, 2) + pickle.dumps(PROTOCOL_VERSION, 2) + pickle.dumps(info, 2) + body)
    return str(path)


def cases(tmp_path):
    """(run_dir, the one line its load must raise, the marker a run of its code would leave)."""
    marker = tmp_path / "ran"
    made = []
    for name, write, held in [
            ("blocked", lambda r: save(r, 1, {"x": Calls(marker)}), f"{os.system.__module__}.system, {PLAIN}"),
            ("custom", lambda r: save(r, 1, {"x": Custom()}), f"{Custom.__module__}.Custom, {PLAIN}"),
            ("opcode", lambda r: save_legacy_instance(r, 1), None)]:
        run = tmp_path / name
        path = write(run)
        why = (f"it holds {held}" if held else  # an opcode torch names nothing for: as likely a damaged file
               "a pickle the weights-only loader refuses (a damaged file, or objects other than tensors and plain "
               "values); not loaded")
        made.append((run, f"checkpoint {path} is unreadable ({why})", marker))
    return made


def test_a_checkpoint_torch_refuses_is_one_line_naming_the_file_and_global(tmp_path):
    for run, line, marker in cases(tmp_path):
        for step in (None, 1):
            with pytest.raises(RunError) as err:
                load_run(run, step=step, device="cpu")
            said = str(err.value)
            assert said == (line if step == 1 else f"none of the 1 checkpoint(s) in {run / 'checkpoints'} is "
                                                   f"readable: {line}")
            assert "\n" not in said and "weights_only" not in said and "Weights only" not in said
        assert not marker.exists()  # refused before anything in the file ran


def test_the_cli_says_it_in_one_line(tmp_path, capsys):
    run, line, marker = cases(tmp_path)[0]
    assert export_cli.main([str(run), "--out", str(tmp_path / "hf"), "--step", "1"]) == 2
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [f"error: {line}"] and captured.out == ""
    assert not marker.exists() and not (tmp_path / "hf").exists()


def test_a_refused_newest_checkpoint_is_said_plainly_and_the_older_one_taken(tmp_path, capsys):
    run, line, marker = cases(tmp_path)[0]
    save(run, 0, {"w": torch.ones(2)})
    setup_logging()
    step, path, state = pick_checkpoint(run, None)
    assert step == 0 and torch.equal(state["model"]["w"], torch.ones(2))
    warnings = [s for s in capsys.readouterr().err.splitlines() if s.strip()]
    assert warnings == [f"warning: {line}; falling back to step_00000000.pt"]
    assert not marker.exists()


def test_a_damaged_pickle_is_not_said_to_hold_a_class(tmp_path):
    """torch's weights-only loader words a broken pickle's structure as "..., but got <class 'dict'>" too: only its
    builder refusals name a class the file asked for; the others read as a damaged file."""
    import io
    import zipfile

    from longctx.train import checkpoint as ckpt

    def with_pickle(pkl: bytes, name: str):
        buf = io.BytesIO()
        torch.save({"a": 1}, buf)
        src, path = zipfile.ZipFile(io.BytesIO(buf.getvalue())), tmp_path / name
        with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as out:
            for item in src.infolist():
                out.writestr(item, pkl if item.filename.endswith("data.pkl") else src.read(item.filename))
        return path

    damaged = ("a pickle the weights-only loader refuses (a damaged file, or objects other than tensors and plain "
               "values)")
    for name, pkl, said in [("append.pt", b"\x80\x02}K\x01a.", damaged),           # APPEND onto a dict
                            ("persid.pt", b"\x80\x02X\x03\x00\x00\x00abcQ.", damaged),  # a str persistent id
                            ("system.pt", b"\x80\x02cos\nsystem\nq\x00.", "it holds os.system, " + PLAIN)]:
        with pytest.raises(ckpt.CheckpointError) as err:
            ckpt.read(with_pickle(pkl, name))
        assert said in str(err.value), (name, str(err.value))
