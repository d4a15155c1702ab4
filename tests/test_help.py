"""Start-up and `--help` of every command: train.py lists the main keys (one list, conf/hydra/help/longctx.yaml, that README's
"Main overrides" table and the composed config's defaults are checked against), every script and tool answers
`--help` with exit 0, and none imports torch._dynamo (~2.5 s) to do so."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

REPO = Path(__file__).resolve().parents[1]
HELP = REPO / "conf" / "hydra" / "help" / "longctx.yaml"
SCRIPTS = sorted(p.name for p in (REPO / "scripts").glob("*.py"))
TOOLS = sorted(p.stem for p in (REPO / "tools").glob("*.py") if "__main__" in p.read_text())
CLIS = ["longctx.evaluate", "longctx.generate", "longctx.report"]
GROUPS = {"arch", "attention", "model", "data", "experiment"}


def help_rows() -> list[tuple[list[str], list[str], str]]:
    """(keys, defaults, meaning) of each row of train.py --help's "Main overrides" section."""
    template = yaml.safe_load(HELP.read_text())["template"]
    section = template.split("== Main overrides", 1)[1].split("\n\n", 1)[0]
    rows = []
    for line in section.splitlines()[1:]:
        keys, defaults, meaning = re.split(r"\s{2,}", line.strip(), maxsplit=2)
        rows.append(([k.strip() for k in keys.split(",")], [d.strip() for d in defaults.split(",")], meaning))
    return rows


def readme_keys() -> set[str]:
    text = (REPO / "README.md").read_text()
    table = text.split("## Main overrides", 1)[1].split("\n## ", 1)[0]
    keys = set()
    for line in table.splitlines():
        if line.startswith("| `"):
            keys |= set(re.findall(r"`([^`]+)`", line.split("|")[1]))
    return keys


def run(args: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-X", "importtime", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=300, **kwargs)


def test_train_help_lists_the_main_keys_with_defaults_and_meaning():
    out = run(["train.py", "--help"])
    assert out.returncode == 0, out.stderr[-2000:]
    for keys, defaults, meaning in help_rows():
        assert len(keys) == len(defaults), keys
        assert f"{', '.join(keys)}" in out.stdout and meaning in out.stdout
    assert "== Configuration groups" in out.stdout and "attention: exp, linear, power, window" in out.stdout


def test_train_help_imports_no_torch():
    """`train.py --help` answers without torch (~1 s of its start): checked in the process that answered, so an
    import nested anywhere under train.py's help path counts."""
    code = ("import runpy, sys\nsys.argv = ['train.py', '--help']\ntry:\n    runpy.run_path('train.py', "
            "run_name='__main__')\nexcept SystemExit as done:\n    assert not done.code, done.code\n"
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')), file=sys.stderr)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "== Main overrides" in out.stdout, out.stderr[-2000:]
    assert out.stderr.strip().splitlines()[-1] == "[]"


def test_train_help_lists_every_data_option():
    """The data row names every option of conf/data (the group list below it shows them too, without meaning)."""
    row = next(meaning for keys, _, meaning in help_rows() if keys == ["data"])
    named = set(re.findall(r"\w+", row))
    missing = [p.stem for p in (REPO / "conf" / "data").glob("*.yaml") if p.stem not in named]
    assert not missing, missing


def test_help_defaults_are_the_configs(compose):
    cfg = compose()
    for keys, defaults, _ in help_rows():
        for key, default in zip(keys, defaults):
            if default == "-":
                continue
            value = cfg[key].name if key in GROUPS else OmegaConf.select(cfg, key)
            shown = "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
            assert shown == default or (isinstance(value, float) and float(default) == value), (key, default, value)


def test_readme_overrides_table_and_help_list_the_same_keys():
    helped = {k for keys, _, _ in help_rows() for k in keys}
    assert readme_keys() == helped, (sorted(readme_keys() - helped), sorted(helped - readme_keys()))


@pytest.mark.parametrize("script", SCRIPTS)
def test_script_help(script):
    out = run([f"scripts/{script}", "--help"])
    assert out.returncode == 0 and "usage" in out.stdout.lower(), out.stderr[-2000:]
    assert "torch._dynamo" not in out.stderr


@pytest.mark.parametrize("tool", TOOLS)
def test_tool_help(tool):
    out = run(["-m", f"tools.{tool}", "--help"])
    assert out.returncode == 0 and "usage" in out.stdout.lower(), out.stderr[-2000:]
    assert "torch._dynamo" not in out.stderr


@pytest.mark.parametrize("module", CLIS)
def test_package_cli_help(module):
    out = run(["-m", module, "--help"])
    assert out.returncode == 0 and "usage" in out.stdout.lower(), out.stderr[-2000:]
    assert "torch._dynamo" not in out.stderr


@pytest.mark.parametrize("module", ["longctx.export", "longctx.report.findings", "longctx.train.estimate",
                                    "longctx.hf.import_weights"])
def test_other_readme_cli_help(module):
    """The README's other commands answer --help on stdout with exit 0 (longctx.hf imports transformers, and with
    it torch._dynamo, before any argument is read)."""
    out = run(["-m", module, "--help"])
    assert out.returncode == 0 and "usage" in out.stdout.lower(), out.stderr[-2000:]


def test_trainer_import_does_not_load_dynamo():
    """torch._dynamo costs ~2.5 s of every command's start; the models load it only when torch.compile runs."""
    code = "import sys, longctx.train.trainer, longctx.evaluate; print('torch._dynamo' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.stdout.strip() == "False", out.stderr[-2000:]


def test_the_loss_still_runs_outside_a_compiled_graph(compose):
    """nll_sum is compiler-disabled only while torch.compile traces (so importing the models does not load dynamo):
    under trainer.compile=model it still runs eagerly, with the same loss and gradients as without compile."""
    import torch

    from longctx.models import build_model
    from longctx.train.trainer import model_spec, model_vocab_size

    cfg = compose("run_dir=unused", "ctx=32")
    torch.manual_seed(0)
    model = build_model(model_spec(cfg, model_vocab_size(cfg.data.vocab + 1)))
    x = torch.randint(0, model.spec.vocab_size, (2, 32))
    eager = model(x, x, reduction="sum")
    eager.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    compiled = torch.compile(model, backend="eager")(x, x, reduction="sum")
    compiled.backward()
    assert torch.allclose(compiled, eager, rtol=1e-6, atol=0)
    assert all(torch.allclose(p.grad, g, rtol=1e-5, atol=1e-7) for p, g in zip(model.parameters(), grads))
