"""Turn a config's ``data`` section into a prepared directory, making and caching it on first use.

Several trials (or several nodes) may ask for the same data at once: a file lock serialises
generation, and the atomic rename of each output means a reader sees all of it or nothing.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
from pathlib import Path

from distmis.config import DataConfig
from distmis.data._prepare import prepare_dataset
from distmis.data._record import FORMAT
from distmis.data._synth import write_synthetic_msd
from distmis.exceptions import DataError
from distmis.files import open_nofollow
from distmis.schema import RunFile


def _key(payload: dict) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:12]


#: where an MSD task keeps what it is prepared from
SOURCE_PARTS = ("dataset.json", "imagesTr", "labelsTr", "imagesTs")


def source_fingerprint(src: Path) -> str:
    """A digest of every source file's name, size, modification time and inode.

    Why not the contents: hashing a BraTS-size task (tens of GB) on every trial start would cost
    minutes; a file rewritten in place, copied over, or restored from a backup changes at least one
    of these, and that is what the cache must notice.
    """
    entries = []
    for part in SOURCE_PARTS:
        path = src / part
        found = sorted(path.iterdir()) if path.is_dir() else [path]
        for file in found:
            try:
                st = file.stat()
            except OSError:
                continue
            entries.append((str(file.relative_to(src)), st.st_size, st.st_mtime_ns, st.st_ino))
    return _key({"files": entries})


def resolve_prepared(data: DataConfig, *, base_dir: Path | None = None) -> Path:
    """Return a prepared directory for ``data`` (synthesising / preparing into the cache if needed)."""
    cache = data.resolved_cache_dir()
    prep = data.prepare
    if data.source == "synthetic":
        syn = data.synthetic
        src = cache / f"synthetic-{_key(syn.model_dump(mode='json'))}"
    else:
        src = Path(data.source).expanduser()
        if not src.is_absolute() and base_dir is not None:
            src = (base_dir / src).resolve()
        if (src / RunFile.PREPARED_INFO).is_file():
            return src
        if not (src / "dataset.json").is_file():
            raise DataError(
                f"data.source: {src} holds neither dataset.json (MSD) nor {RunFile.PREPARED_INFO} (prepared)"
            )
    # the format is part of the key: data cached by an older distmis is prepared again, not misread;
    # so are the source files' identities: a label fixed in place is prepared again, not served stale
    key = {
        "src": str(src.resolve()),
        "format": FORMAT,
        "files": None if data.source == "synthetic" else source_fingerprint(src),  # synthetic: made from its options
        **prep.model_dump(mode="json", exclude={"shards"}),
    }
    if data.regions:
        key["regions"] = data.regions
    target = cache / f"prepared-{_key(key)}"
    if (target / RunFile.PREPARED_INFO).is_file():
        return target
    if data.source != "synthetic" and cache.resolve().is_relative_to(src.resolve()):
        raise DataError(
            f"{data.cache_dir_origin()} {cache}: inside the dataset {src}; distmis never writes into its inputs: "
            "choose a cache elsewhere"
        )
    try:
        cache.mkdir(parents=True, exist_ok=True)
        lock = open_nofollow(cache / ".lock", "a")
    except OSError as exc:
        raise DataError(
            f"{data.cache_dir_origin()} {cache}: cannot hold distmis's data cache ({exc.strerror or exc}); "
            "point it at a writable directory"
        ) from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if data.source == "synthetic" and not (src / "dataset.json").is_file():
            syn = data.synthetic
            write_synthetic_msd(
                src,
                cases=syn.cases,
                shape=syn.shape,
                modalities=syn.modalities,
                test_cases=syn.test_cases,
                seed=syn.seed,
            )
        if not (target / RunFile.PREPARED_INFO).is_file():
            prepare_dataset(src, target, prep, regions=data.regions)
    return target
