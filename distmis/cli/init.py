"""Write a search file for an MSD dataset, planned from its fingerprint by stated rules.

Reads every training case once (as `distmis inspect` does), then chooses the prepared shape, the
patch and batch for the memory given, the label mode and loss, the normalisation, the network's
normalisation layer, a learning-rate range and the budget, each with a comment saying which rule
gave it. Search the file with `distmis tune FILE`.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from distmis.cli._common import add_renamed_option, positive_float, positive_int


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dataset", help="MSD dataset directory (holding dataset.json)")
    p.add_argument(
        "--gpu-memory",
        type=positive_float,
        default=None,
        help="memory of each GPU in GiB: plan the patch for it and one GPU per trial (default: a CPU search)",
    )
    p.add_argument("--out", default=None, help="the search file to write (default <dataset name>.yaml here)")
    p.add_argument("--overwrite", action="store_true", help="replace a file distmis init wrote earlier")
    add_renamed_option(p, "--workers", "--processes", type=positive_int, help="parallel processes (default: all cores)")


def run(args: argparse.Namespace) -> int:
    from distmis.console import progress_bar as progress
    from distmis.data import INIT_HEADER as HEADER
    from distmis.data import fingerprint, plan_search, read_dataset_json, relative_source
    from distmis.exceptions import ConfigError, OutputError
    from distmis.files import atomic_file
    from distmis.links import refuse_link

    dataset = Path(args.dataset)
    meta = read_dataset_json(dataset)  # a missing or malformed dataset.json: one line, before any work
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", dataset.resolve().name).lstrip("._-") or "search"
    out = Path(args.out or f"{name}.yaml")
    refuse_link(out, what="the search file")
    if out.resolve().is_relative_to(dataset.resolve()):
        raise OutputError(f"--out {out}: inside the dataset {dataset}; distmis never writes into its inputs")
    if out.exists():
        if out.is_dir():
            raise OutputError(f"--out {out}: a directory; give a file name")
        if not args.overwrite:
            raise OutputError(f"--out {out}: exists; give --overwrite to replace it, or another --out")
        if not out.read_text(errors="replace").startswith(HEADER):
            raise OutputError(f"--out {out}: not written by distmis init; it is left as it is (choose another --out)")
    with progress("reading cases") as update:
        fp = fingerprint(dataset, workers=args.processes, progress=update)
    text = plan_search(
        fp,
        source=_yaml_string(relative_source(dataset, out)),
        name=name,
        gpu_memory_gb=args.gpu_memory,
        modalities=list(meta.modalities),
    )
    with atomic_file(out) as tmp:
        tmp.write_text(text, encoding="utf-8")
        _check(tmp, out, ConfigError)
    for warning in fp["warnings"]:
        print(f"distmis: warning: {warning}")
    print(f"wrote {out}: {fp['dataset']}, {fp['cases']} cases; search it with: distmis tune {out}")
    return 0


def _yaml_string(value: str) -> str:
    """A path as a YAML scalar that reads back unchanged whatever it holds (``#``, ``:``, spaces)."""
    import json

    return json.dumps(value)


def _check(tmp: Path, out: Path, error: type[Exception]) -> None:
    """The planned file must load as a search (a rule that wrote an invalid value is a bug, named here)."""
    from distmis.config import load_config
    from distmis.exceptions import DistmisError

    try:
        load_config(tmp, require_space=True)
    except DistmisError as exc:
        raise error(f"{out}: the planned search file does not load ({exc}); please report this") from None
