"""Small helpers shared by subcommands: option types that name what they expect."""

from __future__ import annotations

import argparse


def shape3(text: str) -> tuple[int, int, int]:
    """Parse ``32,32,32`` (or a single ``32``) into a 3-tuple of positive ints."""
    try:
        parts = [int(p) for p in text.replace("x", ",").split(",") if p.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected X,Y,Z positive integers, got {text!r}") from None
    if len(parts) == 1:
        parts *= 3
    if len(parts) != 3 or any(p <= 0 for p in parts):
        raise argparse.ArgumentTypeError(f"expected X,Y,Z positive integers, got {text!r}")
    return parts[0], parts[1], parts[2]


def fractions3(text: str) -> tuple[float, float, float]:
    """``0.7,0.15,0.15``: three fractions >= 0 summing to 1, the first > 0."""
    import math

    try:
        parts = [float(p) for p in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected TRAIN,VAL,TEST fractions, got {text!r}") from None
    if len(parts) != 3 or not all(math.isfinite(p) for p in parts):
        raise argparse.ArgumentTypeError(f"expected TRAIN,VAL,TEST fractions, got {text!r}")
    if any(p < 0 for p in parts) or not math.isclose(sum(parts), 1.0, abs_tol=1e-6) or parts[0] <= 0:
        raise argparse.ArgumentTypeError(
            f"expected fractions >= 0 that sum to 1 with TRAIN > 0, got {text!r} (sum {sum(parts):g})"
        )
    return parts[0], parts[1], parts[2]


def _integer(text: str, minimum: int, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"expected {what}, got {value}")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1 (counts: workers, processes, cases)."""
    return _integer(text, 1, "an integer >= 1")


def at_least_two(text: str) -> int:
    """An integer >= 2 (a dataset needs a training and a validation case)."""
    return _integer(text, 2, "an integer >= 2")


def nonnegative_int(text: str) -> int:
    """An integer >= 0 (seeds, indices)."""
    return _integer(text, 0, "an integer >= 0")


def positive_float(text: str) -> float:
    """A finite number > 0 (CPUs per worker, seconds)."""
    import math

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def regions_option(text: str) -> dict[str, list[int]]:
    """``msd_task01`` (a preset) or ``WT=1,2,3;TC=2,3;ET=3``."""
    import re

    from distmis.labels import PRESETS

    if text in PRESETS:
        return {k: list(v) for k, v in PRESETS[text].items()}
    regions: dict[str, list[int]] = {}
    for part in text.split(";"):
        match = re.fullmatch(r"\s*([A-Za-z0-9_]+)\s*=\s*(\d+(?:\s*,\s*\d+)*)\s*", part)
        if not match:
            raise argparse.ArgumentTypeError(
                f"expected a preset ({', '.join(sorted(PRESETS))}) or NAME=v,v;NAME=v, got {text!r}"
            )
        values = [int(v) for v in match.group(2).split(",")]
        if any(not 1 <= v <= 255 for v in values):
            raise argparse.ArgumentTypeError(f"region {match.group(1)}: label values must be 1..255, got {values}")
        regions[match.group(1)] = values
    return regions


def normalization_option(text: str) -> str | list[str]:
    """``auto``, ``zscore``, ``ct`` or ``none``, or a comma-separated list with one per channel."""
    schemes = ("auto", "zscore", "ct", "none")
    parts = [p.strip() for p in text.split(",")]
    bad = [p for p in parts if p not in schemes]
    if bad or not parts:
        raise argparse.ArgumentTypeError(
            f"expected one of {', '.join(schemes)}, or a comma-separated list with one per channel; got {text!r}"
        )
    return parts[0] if len(parts) == 1 else parts


def overlap_fraction(text: str) -> float:
    """A fraction in [0, 1) (sliding-window overlap)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text!r}") from None
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text!r}")
    return value


def port_number(text: str) -> int:
    """A TCP port, 1..65535."""
    value = _integer(text, 1, "a port number 1..65535")
    if value > 65535:
        raise argparse.ArgumentTypeError(f"expected a port number 1..65535, got {value}")
    return value


def finite_float(text: str) -> float:
    import math

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def nonnegative_float(text: str) -> float:
    """A finite number >= 0 (GPUs per worker)."""
    import math

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


class ConfigKeysHelp(argparse.HelpFormatter):
    """``--help`` that ends with every configuration key, its values and default (drawn from the
    validated models; imported only when help is shown, not on every command)."""

    def format_help(self) -> str:
        from distmis.config import config_reference

        keys = "\n".join(config_reference())
        return f"{super().format_help()}\nconfiguration file keys (values, default):\n{keys}\n"
