#!/usr/bin/env python3
"""Summarises an alternating A/B comparison of suites (bench/ab-suite.sh): for every row,
each build's figure over the same run's raw AF_XDP baseline, median and spread over the runs,
and B's median over A's. Usage: ab_summary.py DIR RUNS (DIR holds A1/ B1/ A2/ ... suite.json)."""

import json
import statistics
import sys
from pathlib import Path


def headline(row):
    """The row's torusnet figure over raw AF_XDP's in the same run, and what it measures."""
    if "torusnet_p50_over_raw" in row:
        return row["torusnet_p50_over_raw"], "p50 RTT / raw (lower is better)"
    if row.get("goodput_over_raw") is not None:
        return row["goodput_over_raw"], "goodput / raw"
    return None, None


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: ab_summary.py DIR RUNS")
    d, runs = Path(sys.argv[1]), int(sys.argv[2])
    figures = {}  # row -> side -> [figure per run]
    kinds = {}
    for side in "AB":
        for i in range(1, runs + 1):
            f = d / f"{side}{i}" / "suite.json"
            try:
                results = json.loads(f.read_text())["results"]
            except (OSError, ValueError, KeyError) as e:
                sys.exit(f"ab_summary: {f}: {e}")
            for name, row in results.items():
                v, kind = headline(row)
                if v is None:
                    continue
                kinds[name] = kind
                figures.setdefault(name, {"A": [], "B": []})[side].append(v)
    print(f"{'row':<62} {'A median (min-max)':<22} {'B median (min-max)':<22} B/A")
    for name in sorted(figures):
        a, b = figures[name]["A"], figures[name]["B"]
        if not a or not b:
            continue
        ma, mb = statistics.median(a), statistics.median(b)
        ratio = mb / ma if ma else float("nan")
        sa = f"{ma:.3f} ({min(a):.2f}-{max(a):.2f})"
        sb = f"{mb:.3f} ({min(b):.2f}-{max(b):.2f})"
        print(f"{name[:62]:<62} {sa:<22} {sb:<22} {ratio:.3f}  [{kinds[name]}]")


if __name__ == "__main__":
    main()
