"""``distmis compare``: experiment vs data vs hybrid parallelism on the same configurations and resources."""

from distmis.compare._analysis import ModeStats, analyse, best_so_far, choose_target, config_key, same_configurations
from distmis.compare._plan import MODES, ModePlan, fixed_points, mode_config, plan_modes
from distmis.compare._records import (
    EpochPoint,
    ModeRecord,
    TrialRecord,
    find_compare_run,
    load_mode_dir,
    load_modes_from_mlflow,
)
from distmis.compare._report import (
    COLUMNS,
    make_plots,
    plot_best_so_far,
    plot_speedup,
    plot_timeline,
    table_rows,
    write_reports,
)
from distmis.compare._run import CompareResult, run_compare

__all__ = [
    "COLUMNS",
    "MODES",
    "CompareResult",
    "EpochPoint",
    "ModePlan",
    "ModeRecord",
    "ModeStats",
    "TrialRecord",
    "analyse",
    "best_so_far",
    "choose_target",
    "config_key",
    "find_compare_run",
    "fixed_points",
    "load_mode_dir",
    "load_modes_from_mlflow",
    "make_plots",
    "mode_config",
    "plan_modes",
    "plot_best_so_far",
    "plot_speedup",
    "plot_timeline",
    "run_compare",
    "same_configurations",
    "table_rows",
    "write_reports",
]
