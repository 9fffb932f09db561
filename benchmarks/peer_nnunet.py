"""distmis against nnU-Net v2 on the same task, the same test cases and the same wall time.

For each task, budget and seed:

- **distmis**: ``distmis init DATA --budget B`` (its defaults otherwise, or ``--recipe``), ``distmis
  tune`` of the file it wrote (the search includes its own prepare), then ``distmis evaluate`` of the
  best model on the search's test split, with test-time mirroring as nnU-Net predicts by default;
- **distmis + finalize** (``--systems finalize``): ``distmis init DATA --budget B --finalize``, which
  plans the search for half the budget and writes a ``finalize`` section (its best configuration on
  two rounds of folds at the search's parallelism); ``tune``, then ``distmis finalize RUN`` as the
  file says, and ``evaluate`` of the ensemble (``RUN/final``): the search and the ensemble inside one
  budget;
- **distmis + nnU-Net augmentation** (``--systems distmis-aug``): the first, with nnU-Net's augmentation
  for a 3D patch turned on in the file init wrote (``benchlib.NNUNET_AUGMENT``);
- **one part changed** (``--set KEY=VALUE``, repeatable, for every distmis system): the file init
  wrote with a dotted key set to a YAML value (``--set model.norm=instance``, ``--set
  train.lr_schedule=poly``), so each part of a recipe can be measured on and off at the same budget;
  its runs keep a folder of their own;
- **nnU-Net v2**: the same MSD task converted to nnU-Net's raw format (one file per channel,
  ``dataset.json`` with ``channel_names``, ``labels`` and ``file_ending``) with the search's test
  cases as ``imagesTs`` and every other labelled case for training; ``nnUNetv2_plan_and_preprocess``;
  ``nnUNetv2_train DATASET 3d_fullres all`` with a trainer variant whose only change is its length:
  epochs of ``--iterations`` steps, as many as fit the budget from the command's start (planned
  from three timed steps, then again after each epoch from the epochs' own time; its poly schedule
  runs to the end of them), and no final validation (fold ``all`` has no held-out case);
  ``nnUNetv2_predict`` of the test cases (nnU-Net's default 8-way
  mirroring). Its predictions are scored by distmis's own metrics (``score_case``);
- **nnU-Net v2 without augmentation** (``--systems nnunet-noda``): the same with the trainer variant
  also derived from nnU-Net's own ``nnUNetTrainerNoDA`` (no augmentation, and so no mirroring when it
  predicts), which shares the first's planning and preprocessing.

nnU-Net trains and predicts on ``--nnunet-device``: by default a GPU where the peer environment's
torch sees one (as distmis's TensorFlow takes one), else the CPU; each run's record keeps it.

The trainer variant is installed the way nnU-Net documents it: as a module inside
``nnunetv2/training/nnUNetTrainer`` of the environment nnU-Net runs in (the ``peers`` extra:
``pip install '.[peers]'``, or ``--nnunet-python`` for another environment).

Writes ``OUT/TASK/peer_nnunet.json`` (every run), ``.md`` (median and range over seeds per system and
budget) and ``.png`` (test Dice per class against wall time); finished runs are kept, so a
second call only runs what is missing. Peak memory is the largest summed RSS of each command's
process tree, sampled every half second.

    python benchmarks/peer_nnunet.py --task mni152 --budgets 5m,20m --seeds 0,1,2 --out runs/peer
    python benchmarks/peer_nnunet.py --task path/to/Task04_Hippocampus --budgets 5m --seeds 0,1,2

``--task`` takes a built-in task or any MSD-layout dataset folder, so a task of your own goes through
the same comparison; its runs are kept under ``--out`` in a folder of the dataset folder's name, and
the dataset itself is only read.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, NoReturn

import benchlib
import numpy as np
from benchlib import NNUNET_AUGMENT, add_out_option, write_report

REPO = Path(__file__).resolve().parents[1]
TRAINER = "nnUNetTrainer_DistmisBudget"
TRAINER_NODA = "nnUNetTrainer_DistmisBudgetNoDA"
#: the trainer variant: nnUNetTrainer with epochs of DISTMIS_PEER_ITERATIONS steps, as many as the
#: budget holds, counted from the training command's start (DISTMIS_PEER_STARTED): first from three
#: timed steps, then again after every epoch from the epochs' own mean time (three steps misjudged a
#: step by -5 % to +50 % on 2 cores), the poly schedule stretched or shortened to the new length.
#: Validation iterations are cut to a tenth of them (nnU-Net's pseudo-Dice is only logged), and the
#: final validation is skipped: fold ``all`` validates on its own training cases, which says nothing
#: and cost 74 s of a 5-minute budget; the benchmark scores the test cases itself. Everything else is
#: nnU-Net's default.
TRAINER_SOURCE = '''
import os
import time

import torch

from nnunetv2.training.lr_scheduler.polylr import PolyLRScheduler
from nnunetv2.training.nnUNetTrainer.nnUNetTrainer import nnUNetTrainer
from nnunetv2.training.nnUNetTrainer.variants.data_augmentation.nnUNetTrainerNoDA import nnUNetTrainerNoDA


class nnUNetTrainer_DistmisBudget(nnUNetTrainer):
    """nnUNetTrainer sized to a wall-time budget (distmis's benchmarks/peer_nnunet.py)."""

    def __init__(self, plans, configuration, fold, dataset_json, device=torch.device("cuda")):
        super().__init__(plans, configuration, fold, dataset_json, device)
        self.num_iterations_per_epoch = int(os.environ.get("DISTMIS_PEER_ITERATIONS", "25"))
        self.num_val_iterations_per_epoch = max(1, self.num_iterations_per_epoch // 10)
        self.budget_seconds = float(os.environ["DISTMIS_PEER_BUDGET_S"])
        self.started = float(os.environ.get("DISTMIS_PEER_STARTED", time.time()))

    def _left(self):
        return self.budget_seconds - (time.time() - self.started)

    def on_train_start(self):
        super().on_train_start()
        timed = []
        for _ in range(3):
            start = time.time()
            self.train_step(next(self.dataloader_train))
            timed.append(time.time() - start)
        step = sorted(timed)[1]
        per_epoch = step * (self.num_iterations_per_epoch + self.num_val_iterations_per_epoch / 3)
        self.num_epochs = max(1, int(self._left() // per_epoch))
        self.lr_scheduler = PolyLRScheduler(self.optimizer, self.initial_lr, self.num_epochs)
        self.print_to_log_file(f"budget {self.budget_seconds:.0f} s: {self.num_epochs} epochs at {step:.2f} s a step")
        self.epochs_started = time.time()

    def _replan(self):
        """As many more epochs as the time left holds at the epochs' own mean time; the poly schedule
        is stretched or shortened to end with them."""
        per_epoch = (time.time() - self.epochs_started) / self.current_epoch
        planned = self.current_epoch + max(0, int(self._left() // per_epoch))
        if planned != self.num_epochs:
            self.print_to_log_file(f"budget: {planned} epochs in all at {per_epoch:.1f} s an epoch (was {self.num_epochs})")
            self.num_epochs = self.lr_scheduler.max_steps = planned

    def run_training(self):
        # nnU-Net's own loop (nnUNetTrainer.run_training), with a length that the epochs may change
        self.on_train_start()
        while self.current_epoch < self.num_epochs:
            self.on_epoch_start()
            self.on_train_epoch_start()
            outputs = [self.train_step(next(self.dataloader_train)) for _ in range(self.num_iterations_per_epoch)]
            self.on_train_epoch_end(outputs)
            with torch.no_grad():
                self.on_validation_epoch_start()
                val = [self.validation_step(next(self.dataloader_val)) for _ in range(self.num_val_iterations_per_epoch)]
                self.on_validation_epoch_end(val)
            self.on_epoch_end()
            self._replan()
        self.on_train_end()

    def perform_actual_validation(self, save_probabilities=False):
        self.print_to_log_file("final validation skipped: fold all would validate on its training cases")


class nnUNetTrainer_DistmisBudgetNoDA(nnUNetTrainer_DistmisBudget, nnUNetTrainerNoDA):
    """The same length, with nnU-Net's own no-augmentation variant's transforms and mirroring."""
'''


def _duration(text: str) -> float:
    from distmis.config import parse_duration

    return parse_duration(text)


class PeakMemory:
    """The largest summed RSS of a process and its descendants, sampled every half second."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self._stop = pid, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import psutil

        while not self._stop.is_set():
            try:
                root = psutil.Process(self.pid)
                procs = [root, *root.children(recursive=True)]
                total = 0
                for p in procs:
                    with contextlib.suppress(psutil.Error):  # a process that ended between the two calls
                        total += p.memory_info().rss
                self.peak = max(self.peak, total)
            except psutil.Error:
                pass
            self._stop.wait(0.5)

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.peak / 2**30


#: the script's name: its error lines, its report's files and its default output folder
NAME = "peer_nnunet"


def fail(message: str) -> NoReturn:
    """Bad input to the benchmark: one error line and exit code 2, before anything is built or trained."""
    benchlib.fail(NAME, message)


def run(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> tuple[float, float]:
    """Run ``cmd`` to ``log``; (wall seconds, peak GiB of its process tree). Raises on failure."""
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.time()
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
        memory = PeakMemory(proc.pid)
        rc = proc.wait()
    peak = memory.stop()
    if rc != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {rc}; see {log}")
    return time.time() - start, peak


# --------------------------------------------------------------------------- tasks
#: the tasks the benchmark writes itself; any other ``--task`` is an MSD-layout folder of the user's
BUILTIN_TASKS = ("mni152", "brats")


def task_key(task: str) -> str:
    """The folder under ``--out`` that holds a task's runs: a built-in task's name, or the name of the
    user's dataset folder (which must not be a built-in's, so that their runs never mix)."""
    if task in BUILTIN_TASKS:
        return task
    folder = Path(task)
    if not (folder / "dataset.json").is_file():
        fail(f"--task {task}: expected {' or '.join(BUILTIN_TASKS)}, or an MSD-layout "
                         "dataset folder holding dataset.json")  # fmt: skip
    name = folder.resolve().name
    if name in BUILTIN_TASKS or name == "data":
        fail(f"--task {task}: a dataset folder named {name!r} would share the "
                         "benchmark's own folder of that name under --out; rename or link it")  # fmt: skip
    return name


def task_data(task: str, root: Path) -> Path:
    """The MSD-layout task: ``mni152`` (grey/white matter, 16 subjects at 48 x 56 x 48, 2 mm, real
    anatomy from nilearn's template: init's split for fewer than 20 cases leaves 2 to test on),
    ``brats`` (distmis's synthetic BraTS-like task: 3 nested tumour labels, 4 channels, the
    3-or-more-class case), or the user's own dataset folder, which is only read (each system
    prepares or converts it into folders of its own under ``--out``)."""
    if task not in BUILTIN_TASKS:
        return Path(task).resolve()
    raw = root / "data" / task
    if (raw / "dataset.json").is_file():
        return raw
    if task == "mni152":
        sys.path.insert(0, str(REPO / "tests"))
        from _support.anatomy import write_mni152_task

        write_mni152_task(raw, cases=16, shape=(48, 56, 48), voxel_mm=2.0, seed=0)
    else:
        raw.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "distmis", "synth", str(raw), "--cases", "16", "--shape", "48,48,48"],
            check=True,
        )  # fmt: skip
    return raw


# --------------------------------------------------------------------------- distmis
def parse_sets(texts: list[str]) -> dict[str, Any]:
    """``--set KEY=VALUE`` texts as ``{dotted key: YAML value}``, in the order given."""
    import yaml

    sets: dict[str, Any] = {}
    for text in texts:
        key, eq, value = text.partition("=")
        if not eq or not key or any(not part for part in key.split(".")):
            fail(f"--set {text!r}: expected KEY=VALUE with a dotted KEY")
        sets[key] = yaml.safe_load(value)
    return sets


def apply_sets(doc: dict[str, Any], sets: dict[str, Any]) -> None:
    """Set each dotted key of ``sets`` in the search file ``doc``, making sections that are missing."""
    for key, value in sets.items():
        *sections, leaf = key.split(".")
        node = doc
        for section in sections:
            node = node.setdefault(section, {})
            if not isinstance(node, dict):
                fail(f"--set {key}: {section} is not a section of init's file")
        node[leaf] = value


def sets_label(sets: dict[str, Any]) -> str:
    """How ``sets`` read in a system's name and folder: ``model.norm=instance,train.lr_schedule=poly``."""
    return ",".join(f"{k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in sets.items())


def sets_folder(sets: dict[str, Any]) -> str:
    """The folder suffix of a ``--set`` run: its label where that is a plain file name, else a digest."""
    import hashlib

    label = sets_label(sets)
    if re.fullmatch(r"[A-Za-z0-9._=,+-]{1,120}", label):
        return f"+{label}"
    return "+set-" + hashlib.sha256(label.encode()).hexdigest()[:12]


def run_distmis(
    raw: Path,
    budget: str,
    seed: int,
    out: Path,
    recipe: str | None,
    finalize: bool,
    augment: bool = False,
    sets: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """distmis on the whole budget (the searched best), or with ``finalize``: init's ``--finalize``
    plan (the search on half the budget, then ``finalize`` as the file's section says), and the
    ensemble scored; the wall time counts init, tune and finalize.
    ``augment`` adds nnU-Net's augmentation to the file init wrote, ``sets`` the ``--set`` keys."""
    import yaml

    sets = sets or {}
    system = (
        "distmis"
        + (" + finalize" if finalize else "")
        + (" + nnU-Net augmentation" if augment else "")
        + (f" ({recipe})" if recipe else "")
        + (f" [{sets_label(sets)}]" if sets else "")
    )
    result = out / "result.json"
    if result.is_file():
        kept = json.loads(result.read_text())
        if kept.get("system") != system:  # another --recipe or --set ran here: never report it as this one
            fail(f"{out} holds a run of {kept.get('system')!r}, not {system!r}; "
                             "give another --out")  # fmt: skip
        return kept
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    plan = out / "plan.yaml"
    init = [sys.executable, "-m", "distmis", "init", str(raw), "--budget", budget, "--out", str(plan)]
    init += ["--finalize"] if finalize else []
    init_s, _ = run(init + (["--recipe", recipe] if recipe else []), out / "init.log")
    doc = yaml.safe_load(plan.read_text())
    doc["search"]["seed"] = seed
    doc["train"]["seed"] = seed
    if augment:
        doc["train"]["augment"] = {**doc["train"].get("augment", {}), **NNUNET_AUGMENT}
    apply_sets(doc, sets)
    plan.write_text(yaml.safe_dump(doc, sort_keys=False))
    env = {"DISTMIS_DATA_HOME": str(out / "data"), "MLFLOW_TRACKING_URI": f"sqlite:///{out / 'mlflow.db'}"}
    tune_s, tune_gb = run([sys.executable, "-m", "distmis", "tune", str(plan), "--out", str(out / "run")],
                          out / "tune.log", env)  # fmt: skip
    final_s, final_gb, model = 0.0, 0.0, out / "run" / "best"
    if finalize:
        final_s, final_gb = run([sys.executable, "-m", "distmis", "finalize", str(out / "run")],
                                out / "finalize.log", env)  # fmt: skip
        model = out / "run" / "final"
    evaluate = [sys.executable, "-m", "distmis", "evaluate", str(model), "--split", "test",
                "--out", str(out / "test"), "--no-track", "--tta"]  # fmt: skip
    eval_s, eval_gb = run(evaluate, out / "evaluate.log", env)
    summary = json.loads((out / "test" / "summary.json").read_text())
    from distmis.data import read_dataset_json

    labels = read_dataset_json(raw).labels
    dice = class_dice({k: v["mean"] for k, v in summary["metrics"].items()}, labels)
    data = {
        "system": system,
        "budget": budget,
        "seed": seed,
        "train_seconds": tune_s + final_s,
        "total_seconds": init_s + tune_s + final_s,
        "predict_seconds": eval_s,
        "peak_gb": max(tune_gb, final_gb, eval_gb),
        "stage_peak_gb": {"tune": tune_gb, "finalize": final_gb, "evaluate": eval_gb},
        "dice": dice,
    }
    result.write_text(json.dumps(data, indent=2))
    return data


# --------------------------------------------------------------------------- nnU-Net
def nnunet_cli(python: str, name: str) -> list[str]:
    """One of nnU-Net's commands run by ``python``, so that the peer's own environment needs no scripts on PATH."""
    return [python, "-c", f"import sys; from nnunetv2.{name}; sys.exit(main())"]


# nnU-Net finds a dataset by its folder's name, DatasetXXX_NAME: this writes that name and reads it back
NNUNET_FOLDER = re.compile(r"Dataset(\d{3,})_(\w+)")


def nnunet_folder(dataset_id: int, task: str) -> str:
    """nnU-Net's folder name for ``task``: a user's folder name may hold characters it does not accept."""
    return f"Dataset{dataset_id:03d}_{re.sub(r'[^A-Za-z0-9_]', '_', task)}"


def nnunet_dataset_id(folder: str) -> int | None:
    """The dataset number of one of nnU-Net's folder names, or None for any other name."""
    match = NNUNET_FOLDER.fullmatch(folder)
    return int(match.group(1)) if match else None


NNUNET_ENTRY = {
    "plan": "experiment_planning.plan_and_preprocess_entrypoints import plan_and_preprocess_entry as main",
    "train": "run.run_training import run_training_entry as main",
    "predict": "inference.predict_from_raw_data import predict_entry_point as main",
}


#: nnU-Net's own ``-device`` values; ``auto`` is the benchmark's, resolved by :func:`nnunet_device`
NNUNET_DEVICES = ("auto", "cpu", "cuda", "mps")

# what the peer's torch can run on, best first, as nnU-Net's -device names them
_PROBE = (
    "import torch; print(' '.join(['cuda'] * torch.cuda.is_available() + "
    "['mps'] * torch.backends.mps.is_available() + ['cpu']))"
)


def add_nnunet_options(p: argparse.ArgumentParser) -> None:
    """``--nnunet-python`` and ``--nnunet-device``, the same in the benchmark and the re-score."""
    p.add_argument("--nnunet-python", default=sys.executable, help="the Python that has nnunetv2 (the peers extra)")
    p.add_argument("--nnunet-device", choices=NNUNET_DEVICES, default="auto",
                   help="where nnU-Net trains and predicts (default auto: a GPU where the peer's torch sees one, "
                   "as distmis's TensorFlow takes one, else the CPU)")  # fmt: skip


def nnunet_device(python: str, device: str, script: str) -> str:
    """The device nnU-Net is run on, checked before anything trains: ``auto`` is the first the peer's
    own torch can use (a user's GPU, not a device written into the benchmark); a device it cannot use
    is ``script``'s one error line and exit 2, not a failure after the distmis runs of an hour."""
    if device == "cpu":
        return device
    try:
        probe = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True)
    except OSError as err:
        benchlib.fail(script, f"--nnunet-python {python}: cannot run it ({err.strerror})")
    if probe.returncode != 0:
        why = (probe.stderr.strip().splitlines() or ["no message"])[-1]
        benchlib.fail(script, f"--nnunet-python {python}: cannot import torch ({why})")
    usable = probe.stdout.split()
    if device == "auto":
        return usable[0]
    if device not in usable:
        benchlib.fail(script, f"--nnunet-device {device}: the torch of {python} can use only {', '.join(usable)}")
    return device


def nnunet_train_cmd(python: str, dataset_id: int, trainer: str, device: str) -> list[str]:
    """``nnUNetv2_train`` of fold ``all`` (every training case; nnU-Net's single model) with ``trainer``."""
    return [*nnunet_cli(python, NNUNET_ENTRY["train"]), str(dataset_id), "3d_fullres", "all", "-tr", trainer,
            "-device", device]  # fmt: skip


def nnunet_predict_cmd(python: str, images: Path, out: Path, dataset_id: int, trainer: str, device: str) -> list[str]:
    """``nnUNetv2_predict`` of the images in ``images`` into ``out`` with the final checkpoint of the
    ``trainer`` model of fold ``all``: how the benchmark and the re-score both predict, so that their
    scores come from the same model and the same mirroring."""
    return [*nnunet_cli(python, NNUNET_ENTRY["predict"]), "-i", str(images), "-o", str(out),
            "-d", str(dataset_id), "-c", "3d_fullres", "-f", "all", "-tr", trainer, "-device", device,
            "-chk", "checkpoint_final.pth"]  # fmt: skip


def install_trainer(python: str) -> None:
    """Put the trainer variant where nnU-Net looks for trainers (its documented way to add one)."""
    where = subprocess.run(
        [python, "-c", "import nnunetv2, os; print(os.path.join(nnunetv2.__path__[0], 'training', 'nnUNetTrainer'))"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    target = Path(where) / "variants" / "distmis_budget.py"
    if not target.is_file() or target.read_text() != TRAINER_SOURCE:
        target.write_text(TRAINER_SOURCE)


def to_nnunet_raw(raw: Path, splits: dict[str, list[str]], dataset_id: int, target: Path) -> Path:
    """The MSD task in nnU-Net's raw format: training = every non-test case, imagesTs = the test split."""
    from distmis.data import read_dataset_json

    meta = read_dataset_json(raw)
    folder = target / nnunet_folder(dataset_id, raw.name)
    if (folder / "dataset.json").is_file():
        return folder
    tmp = folder.with_name(folder.name + ".part")
    shutil.rmtree(tmp, ignore_errors=True)
    for sub in ("imagesTr", "labelsTr", "imagesTs"):
        (tmp / sub).mkdir(parents=True)
    test = set(splits["test"])
    cases = {c.case_id: c for c in meta.training}
    for cid, case in cases.items():
        write_nnunet_images(case.image, cid, tmp / ("imagesTs" if cid in test else "imagesTr"))
        if cid not in test and case.label is not None:
            shutil.copyfile(case.label, tmp / "labelsTr" / f"{cid}.nii.gz")
    labels = {("background" if value == 0 else name): value for value, name in sorted(meta.labels.items())}
    doc = {
        "channel_names": {str(i): m for i, m in enumerate(meta.modalities)},
        "labels": labels,
        "numTraining": len(cases) - len(test),
        "file_ending": ".nii.gz",
    }
    (tmp / "dataset.json").write_text(json.dumps(doc, indent=2))
    tmp.rename(folder)
    return folder


def write_nnunet_images(image: Path, case_id: str, folder: Path) -> None:
    """One MSD image (channels last) as nnU-Net reads a case: a file per channel, ``CASE_0000.nii.gz``, ..."""
    import nibabel as nib

    img = nib.load(str(image))
    data = np.asarray(img.dataobj)
    channels = data[..., None] if data.ndim == 3 else data
    for ch in range(channels.shape[-1]):
        out = nib.Nifti1Image(channels[..., ch].astype(np.float32), img.affine)
        nib.save(out, str(folder / f"{case_id}_{ch:04d}.nii.gz"))


def run_nnunet(python: str, raw: Path, splits: dict[str, list[str]], budget: str, seed: int, out: Path,
               scorer: Any, procs: int, trainer: str, device: str) -> dict[str, Any]:  # fmt: skip
    """nnU-Net v2 trained with ``trainer`` for the budget, fold ``all``, and its test predictions scored;
    the task's planning and preprocessing are shared by every run of the seed (and counted once)."""
    result = out / "result.json"
    if result.is_file():
        return json.loads(result.read_text())
    dataset_id = 500 + seed
    base = out.parent / f"nnunet-data-{raw.name}"
    folder = to_nnunet_raw(raw, splits, dataset_id, base / "raw")
    env = {
        "nnUNet_raw": str(base / "raw"),
        "nnUNet_preprocessed": str(base / "preprocessed"),
        "nnUNet_results": str(out / "results"),
        "nnUNet_n_proc_DA": str(procs),
        "DISTMIS_PEER_BUDGET_S": str(_duration(budget)),
    }
    plan_s = 0.0
    if not (base / "preprocessed" / folder.name / "nnUNetPlans.json").is_file():
        cmd = [*nnunet_cli(python, NNUNET_ENTRY["plan"]), "-d", str(dataset_id), "-c", "3d_fullres", "-np", str(procs),
               "--verify_dataset_integrity"]  # fmt: skip
        plan_s, _ = run(cmd, out / "plan.log", env)
    train = nnunet_train_cmd(python, dataset_id, trainer, device)
    train_s, train_gb = run(train, out / "train.log", {**env, "DISTMIS_PEER_STARTED": str(time.time())})
    pred = out / "predictions"
    predict = nnunet_predict_cmd(python, folder / "imagesTs", pred, dataset_id, trainer, device)
    predict_s, predict_gb = run(predict, out / "predict.log", env)
    dice = scorer(pred)
    data = {
        "system": "nnU-Net v2" + (", no augmentation (NoDA)" if trainer == TRAINER_NODA else ""),
        "budget": budget,
        "seed": seed,
        "device": device,
        "train_seconds": train_s,
        "total_seconds": plan_s + train_s,
        "plan_seconds": plan_s,
        "predict_seconds": predict_s,
        "peak_gb": max(train_gb, predict_gb),
        "stage_peak_gb": {"train": train_gb, "predict": predict_gb},
        "dice": dice,
    }
    result.write_text(json.dumps(data, indent=2))
    return data


def scorer_for(model: Path, raw: Path, test_ids: list[str]) -> Any:
    """Scores a folder of predictions (``CASE.nii.gz``) with distmis's own per-class metrics, as
    ``distmis evaluate`` scores its own (:func:`distmis.inference.score_labels`, the model's classes):
    the mean over the cases of each class's Dice."""
    by_case = case_scorer(model, raw, test_ids)

    def score(folder: Path) -> dict[str, float]:
        rows = list(by_case(folder).values())
        return {c: float(np.mean([r[c] for r in rows])) for c in rows[0]}

    return score


def case_scorer(model: Path, raw: Path, case_ids: list[str]) -> Any:
    """Scores a folder of predictions (``CASE.nii.gz``) case by case: {case: {class: Dice}}, with the
    classes and metrics of the distmis ``model`` (:func:`distmis.inference.score_labels`)."""
    import nibabel as nib

    from distmis.data import read_dataset_json
    from distmis.inference import read_model_record, score_labels

    record = read_model_record(model)
    meta = read_dataset_json(raw)
    cases = [c for c in meta.training if c.case_id in case_ids]

    def score(folder: Path) -> dict[str, dict[str, float]]:
        rows = {}
        for case in cases:
            pred_img = nib.load(str(folder / f"{case.case_id}.nii.gz"))
            truth_img = nib.load(str(case.label))
            if not np.allclose(pred_img.affine, truth_img.affine, atol=1e-3):
                raise RuntimeError(f"{case.case_id}: nnU-Net's prediction is not in its label's geometry")
            spacing = [float(z) for z in truth_img.header.get_zooms()[:3]]
            truth = np.asarray(truth_img.dataobj).astype(np.int64)
            pred = np.asarray(pred_img.dataobj).astype(np.int64)
            metrics = score_labels(record, truth, pred, spacing)
            rows[case.case_id] = class_dice({k: v for k, v in metrics.items() if k == "dice" or k.startswith("dice_")},
                                            meta.labels)  # fmt: skip
        return rows

    return score


def class_dice(metrics: dict[str, float], labels: dict[int, str]) -> dict[str, float]:
    """Test Dice by class name from distmis's metric names: ``dice_<class>`` for each class of a
    multi-class model, and plain ``dice`` for a binary one, named here by the task's one foreground
    label in ``labels`` (dataset.json's; ``foreground`` where the binary model merged several)."""
    per_class = {k.removeprefix("dice_"): v for k, v in metrics.items() if k.startswith("dice_")}
    if per_class or "dice" not in metrics:
        return per_class
    names = [name for value, name in sorted(labels.items()) if value != 0]
    return {names[0] if len(names) == 1 else "foreground": metrics["dice"]}


# --------------------------------------------------------------------------- report
def report(rows: list[dict[str, Any]], out: Path) -> None:
    """``out/peer_nnunet.{json,md,png}``: per system and budget, the test Dice of each class (median
    [range] over seeds), the median wall time and the peak memory; every run in the JSON."""
    classes = sorted({k for r in rows for k in r["dice"]})
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["system"], r["budget"]), []).append(r)
    table = []
    for (system, budget), rs in sorted(groups.items()):
        row: dict[str, Any] = {"system": system, "budget": budget, "seeds": len(rs)}
        row["wall s (median)"] = round(float(np.median([r["total_seconds"] for r in rs])))
        for c in classes:
            vals = [r["dice"][c] for r in rs if c in r["dice"]]
            row[c] = f"{np.median(vals):.3f} [{min(vals):.3f}-{max(vals):.3f}]" if vals else "-"
        row["peak GiB"] = round(max(r["peak_gb"] for r in rs), 1)
        table.append(row)

    def draw(fig: Any) -> None:
        ax = fig.add_subplot()
        for marker, system in zip("os^v", sorted({r["system"] for r in rows}), strict=False):
            for i, c in enumerate(classes):  # a colour per class, a marker per system
                pts = [(r["total_seconds"], r["dice"][c]) for r in rows if r["system"] == system and c in r["dice"]]
                ax.scatter(*zip(*pts, strict=True), color=f"C{i}", marker=marker, label=f"{system}: {c}")
        ax.set_xlabel("wall time, s")
        ax.set_ylabel("test Dice")
        ax.legend(fontsize=8)

    title = "test Dice [range over seeds] against wall time: distmis and nnU-Net v2 side by side"
    write_report(out, NAME, title=title, rows=table, data={"runs": rows}, figure=draw)


#: ``--systems`` name -> the folder its runs keep under OUT/TASK/BUDGET/seedN
DISTMIS_FOLDERS = {"distmis": "distmis", "finalize": "distmis-finalize", "distmis-aug": "distmis-aug"}
#: ``--systems`` name -> nnU-Net trainer (its folder is the system's name)
NNUNET_TRAINERS = {"nnunet": TRAINER, "nnunet-noda": TRAINER_NODA}


def system_folder(system: str, sets: dict[str, Any]) -> str:
    """The folder a ``--systems`` name keeps its runs in under OUT/TASK/BUDGET/seedN (``--set`` keys
    name a distmis system's folder too, so that a run with them is never read as one without)."""
    if system in DISTMIS_FOLDERS:
        return DISTMIS_FOLDERS[system] + (sets_folder(sets) if sets else "")
    return system


def kept_runs(where: Path, systems: list[str], sets: dict[str, Any]) -> list[dict[str, Any]]:
    """The runs of ``systems`` already kept for one budget and seed under ``where``, so that runs made
    by separate calls (a budget one day, a seed the next) can be reported and drawn together."""
    folders = [system_folder(s, sets) for s in [*DISTMIS_FOLDERS, *NNUNET_TRAINERS] if s in systems]
    return [
        json.loads((where / f / "result.json").read_text()) for f in folders if (where / f / "result.json").is_file()
    ]


def distmis_runs(where: Path) -> list[Path]:
    """The distmis runs kept for one budget and seed, whose test cases nnU-Net is scored on. prepare
    splits by data.prepare.seed, so every distmis run here splits alike unless --set changed
    data.prepare; the plain run's folder sorts first."""
    return sorted(p.parent for p in where.glob("*/run/splits.json"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", default="mni152",
                   help="mni152 (real anatomy, 2 classes), brats (synthetic, 3 nested labels), or the path of an "
                   "MSD-layout dataset folder: your own task, through the same comparison")  # fmt: skip
    p.add_argument("--budgets", default="5m", help="comma-separated wall times (e.g. 5m,20m)")
    p.add_argument("--seeds", default="0", help="comma-separated seeds")
    p.add_argument("--systems", default="distmis,nnunet",
                   help="comma-separated: distmis, finalize (the search on half the budget, then finalize's "
                   "ensemble inside the rest), distmis-aug (with nnU-Net's augmentation), nnunet, "
                   "nnunet-noda (its NoDA variant)")  # fmt: skip
    p.add_argument("--recipe", default=None, help="distmis init --recipe (default: init's)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="sets",
                   help="set a dotted key of init's file to a YAML value for every distmis system (repeatable), "
                   "e.g. model.norm=instance: one part of a recipe on or off")  # fmt: skip
    add_nnunet_options(p)
    p.add_argument("--iterations", type=int, default=25, help="nnU-Net iterations per epoch")
    p.add_argument("--kept", action="store_true",
                   help="run nothing: report and draw the runs already kept under --out for these budgets, "
                   "seeds and systems (a run not there is left out)")  # fmt: skip
    add_out_option(p, NAME, default=Path("runs/peer"))
    a = p.parse_args()
    sets = parse_sets(a.sets)
    root = a.out.resolve()
    key = task_key(a.task)
    if a.kept:
        where = [root / key / b / f"seed{s}" for b in a.budgets.split(",") for s in a.seeds.split(",")]
        rows = [r for w in where for r in kept_runs(w, a.systems.split(","), sets)]
        if not rows:
            fail(f"--kept: no finished run under {root / key}")
        report(rows, root / key)
        return
    systems = a.systems.split(",")
    nnunet = [s for s in NNUNET_TRAINERS if s in systems]
    if nnunet and not any(s in systems for s in DISTMIS_FOLDERS):
        # nnU-Net is scored on the test cases, and with the classes, of a distmis run of the same
        # seed: checked before anything trains, not after an hour of it
        missing = [
            f"{b}/seed{s}"
            for b in a.budgets.split(",")
            for s in a.seeds.split(",")
            if not distmis_runs(root / key / b / f"seed{s}")
        ]
        if missing:
            fail(
                f"--systems: nnU-Net is scored on a distmis run's test cases, and none is kept "
                f"under {root / key} for {', '.join(missing)}: add distmis or finalize to --systems"
            )
    if nnunet:
        device = nnunet_device(a.nnunet_python, a.nnunet_device, NAME)
    raw = task_data(a.task, root)
    if nnunet:
        install_trainer(a.nnunet_python)
        os.environ["DISTMIS_PEER_ITERATIONS"] = str(a.iterations)
    rows = []
    for budget in a.budgets.split(","):
        for seed in [int(s) for s in a.seeds.split(",")]:
            where = root / key / budget / f"seed{seed}"
            for system in DISTMIS_FOLDERS:
                if system in systems:
                    folder = system_folder(system, sets)
                    rows.append(run_distmis(raw, budget, seed, where / folder, a.recipe, system == "finalize",
                                            augment=system == "distmis-aug", sets=sets))  # fmt: skip
            if nnunet:  # the test cases of a distmis run of this seed, for every nnU-Net system
                searched = distmis_runs(where)[0]
                splits = json.loads((searched / "splits.json").read_text())
                score = scorer_for(searched / "best", raw, splits["test"])
            for system in nnunet:
                rows.append(run_nnunet(a.nnunet_python, raw, splits, budget, seed, where / system_folder(system, sets),
                                       score, os.cpu_count() or 1, NNUNET_TRAINERS[system], device))  # fmt: skip
            report(rows, root / key)


if __name__ == "__main__":
    main()
