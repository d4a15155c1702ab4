"""Where metrics go: metrics.jsonl in the run directory, wandb (offline by default), and the ICL-curve PNG."""
from __future__ import annotations

import json
import logging
import netrc
import os
import re
from pathlib import Path
from urllib.parse import urlparse

import numpy as np

from longctx.plotting import fill_title, new_figure, pyplot, save_figure
from longctx.train import dashboards
from longctx.train.run_files import open_append, write_atomic

log = logging.getLogger("longctx")
WANDB_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")  # what wandb accepts as a run id (no '/', ':', spaces, ...)


def is_record(value) -> bool:
    """Whether one parsed metrics.jsonl line is an evaluation record: a JSON object with an integer step."""
    return isinstance(value, dict) and isinstance(value.get("step"), int)


class JsonlLogger:
    """One JSON object per evaluation, appended to <run_dir>/metrics.jsonl.

    A process killed while appending can leave the last line cut short: reading drops that line (said once; its
    evaluation had no checkpoint yet, so a resume redoes it). Any other line that is not a record is an error
    naming the file and line."""

    def __init__(self, run_dir: str | Path):
        self.path = Path(run_dir) / "metrics.jsonl"
        self._said_cut = False

    def log(self, record: dict) -> None:
        with open_append(self.path) as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def records(self) -> list[dict]:
        if not self.path.exists():
            return []
        with open(self.path, "rb") as f:
            lines = [(n, line) for n, line in enumerate(f.read().split(b"\n"), 1) if line.strip()]
        out = []
        for i, (n, line) in enumerate(lines):
            try:
                record = json.loads(line)
            except ValueError:
                record = None
            if is_record(record):
                out.append(record)
            elif i == len(lines) - 1 and record is None:  # cut short by a kill mid-append
                if not self._said_cut:
                    log.warning(f"{self.path}: line {n} is cut short (a process killed while writing it); "
                                f"dropped")
                    self._said_cut = True
            else:
                raise ValueError(f"{self.path}: line {n} is not an evaluation record (a JSON object with an integer "
                                 f"step); fix or remove that line")
        return out

    def count_records(self) -> int:
        """How many lines are evaluation records, never refusing: for a file about to be set aside (a start-over),
        whose malformed lines are kept with it, not fixed first."""
        if not self.path.exists():
            return 0
        count = 0
        for line in self.path.read_bytes().split(b"\n"):
            try:
                record = json.loads(line) if line.strip() else None
            except ValueError:
                continue
            count += is_record(record)
        return count

    def truncate_after(self, step: int) -> Path | None:
        """On resume: drop the evaluations newer than the checkpoint from metrics.jsonl (the resumed launch redoes
        them, perhaps under another config), atomically, having kept them first: their lines go to
        `redone_after_step{N}[.k]/evaluations.jsonl` in the run folder and their per-document records and
        per-position curves move there under the names the lines give (relative to that folder). Returns that folder,
        None when nothing was dropped."""
        records = self.records()
        dropped = [r for r in records if r["step"] > step]
        folder = self._keep(dropped, step) if dropped else None
        # rewritten whole even when nothing is dropped: a line cut short by a kill goes, later lines never follow it
        write_atomic(self.path, "".join(json.dumps(r) + "\n" for r in records if r["step"] <= step))
        return folder

    def _keep(self, dropped: list[dict], step: int) -> Path:
        """truncate_after's folder for the records it drops, with their files."""
        run_dir = self.path.parent
        k, folder = 1, run_dir / f"redone_after_step{step}"
        while folder.exists() or folder.is_symlink():
            k += 1
            folder = run_dir / f"redone_after_step{step}.{k}"
        folder.mkdir()
        write_atomic(folder / "evaluations.jsonl", "".join(json.dumps(r) + "\n" for r in dropped))
        for record in dropped:
            names = [str(record.get("doc_bins") or "").partition("#")[0],
                     f"per_position_loss/step_{record['step']:08d}.npy"]
            for name in filter(None, names):
                source = run_dir / name
                inside = ".." not in Path(name).parts and not Path(name).is_absolute()  # a line names only its own
                if inside and source.is_file() and not source.is_symlink():
                    (folder / name).parent.mkdir(parents=True, exist_ok=True)
                    source.rename(folder / name)
        return folder


def new_wandb_id() -> str:
    """wandb's own run id generator (8 characters of [a-z0-9])."""
    try:
        from wandb.sdk.lib.runid import generate_id  # wandb >= 0.19 keeps it here
    except ImportError:  # older wandb
        from wandb.util import generate_id
    return generate_id()


def wandb_id_for(run_dir: str | Path, from_checkpoint: str | None = None) -> str:
    """The run's one wandb id, kept in <run_dir>/wandb_id from its first launch on: every relaunch that continues
    the run (resume, requeue) continues the same wandb run; a folder started over (no checkpoint) sets it aside."""
    path = Path(run_dir) / "wandb_id"
    stored = read_wandb_id(run_dir)
    if stored is not None:
        return stored
    run_id = from_checkpoint if from_checkpoint is not None else new_wandb_id()
    write_atomic(path, run_id + "\n")
    return run_id


def read_wandb_id(run_dir: str | Path) -> str | None:
    """The wandb id stored in <run_dir>/wandb_id (None when there is none); one that wandb would refuse is an error
    naming the file."""
    path = Path(run_dir) / "wandb_id"
    if not path.exists():
        return None
    try:
        text = path.read_text().strip()
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: unreadable wandb id ({type(err).__name__})") from None
    if not text:
        return None
    if not WANDB_ID.fullmatch(text):
        raise ValueError(f"{path}: {text[:40]!r} is not a wandb run id (letters, digits, '_' and '-', at most 64); "
                         f"fix it, or remove the file to start a new wandb run")
    return text


def has_wandb_key(environ=os.environ) -> bool:
    """Whether wandb can log in without asking: WANDB_API_KEY, an identity token file, or `wandb login`'s netrc entry
    for the wandb host (WANDB_BASE_URL, default api.wandb.ai)."""
    if environ.get("WANDB_API_KEY") or environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    host = urlparse(environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    try:
        entry = netrc.netrc(environ.get("NETRC")).authenticators(host)
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False
    return bool(entry and entry[2])


def check_wandb(cfg_logger, environ=os.environ) -> None:
    """logger.wandb.mode=online needs a key: said in one line before the run starts, not as wandb's traceback
    (or its prompt) after the run folder is written."""
    if cfg_logger.wandb.mode == "online" and not has_wandb_key(environ):
        raise ValueError("config: logger.wandb.mode='online': no wandb API key (WANDB_API_KEY, or `wandb login`); "
                         "log in, or use logger.wandb.mode=offline and `wandb sync` later")


class WandbLogger:
    """wandb run in <run_dir>/wandb; mode offline (sync later with `wandb sync`), online or disabled.

    Each launch of a run (first, resumed, requeued) continues the same wandb run id. Offline, wandb writes
    one folder per launch, `<run_dir>/wandb/offline-run-<time>-<id>` (it never reuses a folder): each holds
    the steps and images that launch logged; `wandb sync <run_dir>/wandb/offline-run-*` uploads them all,
    oldest first, into the one run. Quiet: no banners on the console (`describe()` gives one line).
    """

    def __init__(self, cfg_logger, run_dir: str | Path, config: dict, run_name: str, run_id: str):
        import wandb

        self._wandb = wandb
        self.run = wandb.init(
            project=cfg_logger.wandb.project, entity=cfg_logger.wandb.entity, group=cfg_logger.wandb.group,
            tags=list(cfg_logger.wandb.tags), name=run_name, config=config, dir=str(run_dir),
            mode=cfg_logger.wandb.mode, id=run_id, resume="allow", settings=wandb.Settings(silent=True),
        )
        self.id = self.run.id
        self.mode = cfg_logger.wandb.mode
        self._config, self._last_eval = config, None
        dashboards.define_metrics(self.run)

    def describe(self) -> str:
        where = self.run.settings.sync_dir
        if self.mode == "offline":
            return f"wandb: offline run {self.id} in {where}; upload with `wandb sync {Path(where).parent}/offline-run-*`"
        return f"wandb: run {self.id}: {self.run.url}"

    def log_train(self, step: int, scalars: dict) -> None:
        self.run.log(scalars, step=step)

    def log_eval(self, step: int, record: dict, png: Path | None) -> None:
        wandb = self._wandb
        scalars = {f"eval/{k}": v for k, v in record.items() if isinstance(v, (int, float)) and k != "step"}
        centers = [float(np.sqrt(max(a, 1) * b)) for a, b, _ in record["icl_curve"]]
        ys = [[v for _, _, v in record["icl_curve"]]]
        keys = ["model"]
        if "bayes_curve" in record:
            ys.append([v for _, _, v in record["bayes_curve"]])
            keys.append("bayes_optimal")
        scalars["eval/icl_curve"] = wandb.plot.line_series(
            xs=centers, ys=ys, keys=keys, title=f"ICL curve (step {step})", xname="position")
        table = wandb.Table(columns=["step", "bin_start", "bin_end", "loss"],
                            data=[[step, a, b, v] for a, b, v in record["icl_curve"]])
        scalars["eval/icl_table"] = table
        if png is not None and png.exists():
            scalars["eval/icl_curves_png"] = wandb.Image(str(png))
        self.run.log(scalars, step=step)
        self._last_eval = record

    def finish(self) -> None:
        cfg = self._config
        if self._last_eval is not None:  # the final per-bin ICL curve, for the group's overlay panel
            dashboards.log_final_icl_table(self.run, self._last_eval, cfg["run_name"], cfg["attention"]["tag"],
                                           cfg["ctx"])
        group = cfg["logger"]["wandb"]["group"]
        if cfg["logger"]["wandb"]["mode"] == "online" and group:
            try:
                url = dashboards.save_workspace(self.run.entity, self.run.project, group)
                print(f"wandb workspace of group {group}: {url}", flush=True)
            except Exception as err:  # the run's data is logged; only the dashboard failed: say so, keep going
                print(f"warning: could not save the wandb workspace of group {group}: {err}", flush=True)
        self.run.finish()


FINAL_CURVE_COLOR = "#d62728"  # red: apart from every colour of viridis (earlier evaluations) and the black optimum


def plot_icl_curves(records: list[dict], path: str | Path, title: str) -> Path:
    """ICL curves of every evaluation (thin, colour = training step), the final one thick in red on top, the
    Bayes-optimal curve dashed behind them; a long title (the run's name) wrapped to the figure's width."""
    plt = pyplot()
    fig, ax = new_figure((7, 4.5))
    cmap = plt.get_cmap("viridis")
    steps = [r["step"] for r in records]
    for i, rec in enumerate(records):
        centers = [np.sqrt(max(a, 1) * b) for a, b, _ in rec["icl_curve"]]
        final = i == len(records) - 1
        ax.plot(centers, [v for *_, v in rec["icl_curve"]], marker="." if final else None,
                color=FINAL_CURVE_COLOR if final else cmap(i / max(1, len(records) - 1)), lw=2.6 if final else 1.0,
                alpha=1.0 if final else 0.8, zorder=4 if final else 2,
                label=f"step {rec['step']} (final)" if final else (f"step {rec['step']}" if i == 0 else None))
    if records and "bayes_curve" in records[-1]:
        rec = records[-1]
        centers = [np.sqrt(max(a, 1) * b) for a, b, _ in rec["bayes_curve"]]
        ax.plot(centers, [v for *_, v in rec["bayes_curve"]], color="black", linestyle="--", lw=1.2, zorder=1,
                label="Bayes-optimal")
    ax.set_xscale("log")
    ax.set_xlabel("position in context (log scale; bin centres)")
    ax.set_ylabel("heldout loss (nats)")
    ax.set_title(fill_title(title, 5.2, 10), fontsize=10)  # the axes' width, less the colourbar's
    if len(steps) > 1:
        sm = plt.cm.ScalarMappable(cmap=cmap, norm=plt.Normalize(min(steps), max(steps)))
        fig.colorbar(sm, ax=ax, label="training step (earlier evaluations)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return save_figure(fig, path)
