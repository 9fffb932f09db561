"""Redraw the README's pictures from real runs (never by hand).

    python docs/screenshots.py --search runs/demo [--compare runs/compare-quickstart] [--out docs]

* ``live-view.png``: distmis' live search view, replayed from the search's own per-trial
  ``metrics.csv`` files at the moment its last two trials were half-way (rendered by the same
  ``LiveProgress`` that ``distmis tune`` shows, recorded by rich as SVG, rasterised by a
  headless chromium);
* ``mlflow-runs.png``: the MLflow UI that ``distmis ui`` starts, on the search's experiment;
* ``compare-best-so-far.png``, ``compare-timeline.png``: the comparison's own plots, copied.

Needs Debian's ``chromium`` (or Chrome) for the first two.
"""

from __future__ import annotations

import argparse
import csv
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from _support.browser import Browser, find_chromium

EXPAND_PARENT_ROWS = (
    """[...document.querySelectorAll('button[data-component-id*="runnamecellrenderer"]')].forEach(b => b.click());"""
)


def screenshot(url: str, png: Path, size: str = "1400,900", expand_runs: bool = False) -> None:
    """``url`` in a headless chromium (tests/_support/browser.py drives it over the DevTools protocol)."""
    exe = find_chromium()
    if exe is None:
        sys.exit("screenshots: no chromium/chrome on PATH (apt-get install chromium)")
    with tempfile.TemporaryDirectory() as profile, Browser(exe, Path(profile), size=size) as browser:
        browser.navigate(url)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # a page is ready when its text stops changing
            first = browser.evaluate("document.body ? document.body.innerText : ''")
            time.sleep(1.5)
            if first and first == browser.evaluate("document.body.innerText"):
                break
        if expand_runs:  # open the parent run's row, as a user would, to show its trials
            browser.evaluate(EXPAND_PARENT_ROWS)
            time.sleep(3)
        browser.screenshot(png)
    print(f"wrote {png}")


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path) as fh:
        return list(csv.DictReader(fh))


def live_view(search: Path, out: Path) -> None:
    """Replay the search into the live view as it looked with its last two trials half-way."""
    import yaml
    from rich.console import Console

    from distmis.tuning import LiveProgress

    config = yaml.safe_load((search / "search.yaml").read_text())
    metric = config.get("search", {}).get("metric", "val_dice")
    epochs = int(config.get("train", {}).get("epochs", 1))
    rows = read_csv(search / "results.csv")
    view = LiveProgress(
        name=config.get("name", search.name),
        metric=metric,
        mode=config.get("search", {}).get("mode", "max"),
        epochs=epochs,
        trials=len(rows),
        concurrency=2,
    )
    ended, running = rows[:-2], rows[-2:]
    for row in ended + running:
        trial = SimpleNamespace(trial_id=row["trial_id"], last_result=None)
        history = read_csv(search / "trials" / row["trial_id"] / "metrics.csv")
        if row in running:
            history = history[: max(1, len(history) // 2)]
        view.on_trial_start(0, [], trial)
        for record in history:
            result = {k: float(v) for k, v in record.items() if v not in ("", None)}
            view.on_trial_result(0, [], trial, result)
        if row in ended:
            trial.last_result = {"epoch": int(float(history[-1]["epoch"]))}
            view.on_trial_complete(0, [], trial)
    view._started = time.time() - float(max((float(r.get("seconds") or 0) for r in rows), default=60)) * 2
    console = Console(record=True, width=96, force_terminal=True)
    console.print(view.render())
    svg = out / "live-view.svg"
    console.save_svg(str(svg), title=f"distmis tune {config.get('name', '')}")
    screenshot(svg.resolve().as_uri(), out / "live-view.png", size="900,420")
    svg.unlink()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mlflow_runs(search: Path, out: Path) -> None:
    from mlflow.tracking import MlflowClient

    runs_dir = search.parent
    experiment = MlflowClient(tracking_uri=f"sqlite:///{(runs_dir / 'mlflow.db').resolve()}").get_experiment_by_name(
        yaml_name(search)
    )
    if experiment is None:
        sys.exit(f"screenshots: no MLflow experiment for {search} in {runs_dir / 'mlflow.db'}")
    port = free_port()
    distmis = Path(sys.executable).parent / "distmis"
    proc = subprocess.Popen(
        [str(distmis), "ui", "--runs", str(runs_dir), "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    sys.exit(f"screenshots: `distmis ui` did not start on port {port}")
                time.sleep(0.3)
        screenshot(
            f"http://127.0.0.1:{port}/#/experiments/{experiment.experiment_id}/runs",
            out / "mlflow-runs.png",
            expand_runs=True,
        )
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def yaml_name(search: Path) -> str:
    import yaml

    return str(yaml.safe_load((search / "search.yaml").read_text()).get("name", search.name))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--search", type=Path, required=True, help="a finished search directory (e.g. runs/demo)")
    p.add_argument("--compare", type=Path, help="a finished `distmis compare` directory")
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    live_view(args.search, args.out)
    mlflow_runs(args.search, args.out)
    if args.compare:
        for name in ("best_so_far", "timeline"):
            src = args.compare / "plots" / f"{name}.png"
            dst = args.out / ("compare-" + name.replace("_", "-") + ".png")
            if src.is_file():
                shutil.copyfile(src, dst)
                print(f"wrote {dst}")


if __name__ == "__main__":
    main()
