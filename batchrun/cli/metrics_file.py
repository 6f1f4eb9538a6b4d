"""Opening `--metrics-file`: the `metrics` extra and the file's folder checked
before anything is sent, then the writer (`metrics.MetricsFile`).

This module imports `metrics` only when the flag is given, so that batchrun runs
without prometheus_client, and says how to install it when the flag needs it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from batchrun.core.errors import UsageError

if TYPE_CHECKING:
    from batchrun.cli.metrics import MetricsFile

NO_EXTRA = (
    "--metrics-file needs prometheus_client, which the metrics extra installs: "
    "pip install 'batchrun[metrics]' (or pip install 'prometheus-client>=0.20,<1')."
)


def metrics_writer(
    path: Path | None, jobs_file: Path, warn: Callable[[str], None]
) -> MetricsFile | None:
    """--metrics-file's writer, labelled with the jobs file's name; None without
    the flag.

    Raises:
        UsageError: when the metrics extra is not installed, or the file's
            folder does not exist.
    """
    if path is None:
        return None
    try:
        from batchrun.cli.metrics import MetricsFile
    except ImportError:
        raise UsageError(NO_EXTRA) from None
    if not path.parent.is_dir():
        msg = f"--metrics-file {path}: the folder {path.parent} does not exist."
        raise UsageError(msg)
    if path.suffix != ".prom":
        warn(f"--metrics-file {path}: node_exporter reads only files named *.prom.")
    return MetricsFile(path, label=jobs_file.name, warn=warn)
