"""The code's shape holds: no private import across packages, no upward import, no function over
80 lines, Ray's private code behind one module, the metric, tag and file names each spelt in one module (see ``tests/_support/layering.py``, which prints them all)."""

from __future__ import annotations

from _support import layering


def test_no_private_module_is_imported_from_another_package() -> None:
    files = layering.python_files(layering.PACKAGE, "tests", "benchmarks", "docs", "notebooks")
    assert layering.private_imports(files) == []


def test_no_room_imports_one_on_a_higher_floor() -> None:
    assert layering.upward_imports(layering.python_files(layering.PACKAGE)) == []


def test_no_function_is_too_long_to_read_at_once() -> None:
    assert layering.long_functions(layering.python_files(layering.PACKAGE)) == []


def test_metric_names_are_spelt_in_one_module() -> None:
    assert layering.metric_literals(layering.python_files(layering.PACKAGE)) == []


def test_ray_private_code_is_imported_by_one_module_only() -> None:
    files = layering.python_files(layering.PACKAGE, "tests", "benchmarks", "docs", "notebooks")
    assert layering.ray_private_imports(files) == []


def test_tag_and_file_names_are_spelt_in_one_module() -> None:
    assert layering.schema_literals(layering.python_files(layering.PACKAGE)) == []


def test_every_room_is_on_a_floor() -> None:
    rooms = {p.name.removesuffix(".py") for p in (layering.REPO / layering.PACKAGE).iterdir()}
    rooms = {r for r in rooms if not r.startswith(".") and r not in ("py.typed", "resources")}
    floors = {room for floor in layering.LAYERS for room in floor}
    assert rooms - floors == set(), "add new modules to tests/_support/layering.py LAYERS"


def test_the_simulate_package_exports_what_a_user_needs() -> None:
    """``distmis.simulate`` is for the CLI and a user's script; what studies the simulator itself
    (its surrogate, clock and constants) is in ``distmis.simulate.study``."""
    import distmis.simulate
    import distmis.simulate.study

    assert len(distmis.simulate.__all__) <= 12
    assert not set(distmis.simulate.__all__) & set(distmis.simulate.study.__all__)
    for name in distmis.simulate.__all__ + distmis.simulate.study.__all__:
        assert not name.startswith("_")


def _product_lines(pattern: str, *, outside: str = "") -> list[str]:
    """``path:line: text`` of every product line matching ``pattern`` (a package ``outside`` left out)."""
    import re

    return [
        f"{path}:{number}: {line.strip()}"
        for path in layering.python_files(layering.PACKAGE)
        if not outside or outside not in path.relative_to(layering.REPO / layering.PACKAGE).parts[:1]
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if re.search(pattern, line)
    ]


def test_the_product_never_imports_the_benchmarks() -> None:
    assert _product_lines(r"^\s*(from|import)\s+(benchmarks|benchlib)\b") == []


def test_mlflow_is_written_by_the_tracking_package_only() -> None:
    """One owner for MLflow: every run goes through its outage queue, and its API is spelt once."""
    assert _product_lines(r"^\s*(from|import)\s+mlflow\b", outside="tracking") == []


def test_the_prepared_and_model_records_are_read_as_attributes() -> None:
    """``info.json`` and ``preprocessing.json`` are typed records: a string key is a typo mypy cannot see."""
    assert _product_lines(r"(info|preprocessing|manifest)\[\"") == []
