"""`python -m bench [--quick] [--only NAME,...]`: every figure beside its raw baseline.

Prints a table, writes bench-results/latest.json (figures + machine) and
bench-results/ratios.png (ratio per figure; 1.0 = as fast as raw).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import logging
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

from .local_cases import CASES, Config
from .measure import Figure

RESULTS = Path("bench-results")


def machine() -> dict[str, object]:
    return {
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "load_average": os.getloadavg(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def extra_cases() -> list[object]:
    """Benchmarks of optional parts (docker, confinement) that exist only when their
    module does; each decides itself whether it can run here."""
    cases = []
    optional = (
        "bench.docker_cases",
        "bench.confine_cases",
        "bench.blaxel_cases",
        "bench.cloudflare_cases",
        "bench.kubernetes_cases",
        "bench.sdk_cases",
        "bench.agents_sdk_cases",
        "bench.workspace_cases",
        "bench.core_cases",
        "bench.agents_cases",
        "bench.lease_cases",
        "bench.cli_cases",
        "bench.runner_cases",
        "bench.settle_cases",
    )
    for module_name in optional:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        cases.extend(module.CASES)
    return cases


def fmt(values: list[float]) -> str:
    if not values:
        return "-"
    values = sorted(values)
    med = values[len(values) // 2]
    return f"{med:.3g} [{values[0]:.3g}..{values[-1]:.3g}]"


def print_table(figures: list[Figure]) -> None:
    rows = [("figure", "unit", "ours (median [min..max])", "baseline", "ratio")]
    for f in figures:
        ratio = f"{f.ratio:.2f}" if f.ratio is not None else "-"
        rows.append((f"{f.group}: {f.name}", f.unit, fmt(f.ours), fmt(f.baseline), ratio))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    for r in rows:
        print("  ".join(c.ljust(widths[i]) for i, c in enumerate(r)))
    print("\nratio: ours relative to raw, 1.00 = as good as raw, < 1 = slower/bigger")
    for f in figures:
        if f.note:
            print(f"  {f.group}: {f.name}: {f.note}")


def plot(figures: list[Figure], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [f for f in figures if f.ratio is not None]
    fig, ax = plt.subplots(figsize=(10, 0.4 * len(shown) + 1.5))
    labels = [f"{f.group}: {f.name}" for f in shown]
    ratios = [f.ratio or 0 for f in shown]
    colors = ["tab:green" if r >= 0.8 else "tab:orange" if r >= 0.4 else "tab:red" for r in ratios]
    ax.barh(labels, ratios, color=colors)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("ratio to raw baseline (1 = as good as raw; log scale)")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


async def run(quick: bool, only: set[str]) -> list[Figure]:
    figures: list[Figure] = []
    with tempfile.TemporaryDirectory(prefix="sandbox-bench-") as tmp:
        cfg = Config(quick=quick, workdir=Path(tmp))
        for case in [*CASES, *extra_cases()]:
            name = case.__name__  # type: ignore[attr-defined]
            if only and name not in only:
                continue
            t0 = time.perf_counter()
            result = await case(cfg)  # type: ignore[operator]
            figures.extend(result)
            print(f"# {name}: {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("--quick", action="store_true", help="smaller sizes, fewer rounds")
    parser.add_argument("--only", default="", help="comma-separated case names")
    args = parser.parse_args()
    # The scale case fills the registry on purpose: its near-full warning is expected.
    logging.getLogger("sandbox").setLevel(logging.ERROR)
    started = time.perf_counter()
    figures = asyncio.run(run(args.quick, {n for n in args.only.split(",") if n}))
    print_table(figures)
    RESULTS.mkdir(exist_ok=True)
    data = {
        "machine": machine(),
        "quick": args.quick,
        "seconds": time.perf_counter() - started,
        "figures": [f.as_dict() for f in figures],
    }
    (RESULTS / "latest.json").write_text(json.dumps(data, indent=2))
    plot(figures, RESULTS / "ratios.png")
    print(
        f"\nwrote {RESULTS}/latest.json and {RESULTS}/ratios.png "
        f"({time.perf_counter() - started:.0f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
