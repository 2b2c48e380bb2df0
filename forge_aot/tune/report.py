"""The tuning report: Markdown with PNG plots (matplotlib), written from a run's JSON.

``forge-aot tune`` writes it at the end of a run (``build/forge-aot/tune/report/report.md``); ``forge-aot
report RUN.json`` renders it again elsewhere (a GPU machine without matplotlib can leave it to a laptop).
Without matplotlib the Markdown is written without plots, and says so.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_")[:120]


def _ms(v: float | None) -> str:
    if v is None:
        return "–"
    return f"{v * 1e3:.1f} µs" if v < 1 else f"{v:.3f} ms"


def _throughput(item: dict[str, Any], device: dict[str, Any]) -> str:
    ms = item.get("winner_ms")
    if not ms:
        return "–"
    parts = []
    if item.get("flops"):
        tf = item["flops"] / (ms / 1e3) / 1e12
        parts.append(f"{tf:.0f} TFLOP/s ({tf * 1e12 / device['peak_flops']:.0%} of peak)")
    if item.get("bytes"):
        tb = item["bytes"] / (ms / 1e3) / 1e12
        parts.append(f"{tb:.2f} TB/s ({tb * 1e12 / device['peak_bytes_per_s']:.0%})")
    return ", ".join(parts) or "–"


def _plots(run: dict[str, Any], out: Path) -> dict[str, str]:
    """PNG files by role (``summary``, ``split``, row id): empty without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return {}
    files: dict[str, str] = {}
    tuned = [i for i in run["items"] if i.get("speedup")]
    if tuned:
        fig, ax = plt.subplots(figsize=(10, max(2.5, 0.28 * len(tuned) + 1)))
        labels = [i["row"] for i in tuned]
        ax.barh(range(len(tuned)), [i["speedup"] for i in tuned], color="#3a7bd5")
        ax.axvline(1.0, color="black", linewidth=0.8)
        ax.set_yticks(range(len(tuned)), labels, fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel("untuned default time / winner time")
        ax.set_title(f"Winner against the untuned default — {run['device']['name']}")
        fig.tight_layout()
        fig.savefig(out / "summary.png", dpi=110)
        plt.close(fig)
        files["summary"] = "summary.png"
    fig, ax = plt.subplots(figsize=(6, 2.2))
    parts = [("compile (CPU-seconds, all cores)", run["compile_seconds"], "#e0a030"),
             ("compile (wall)", run["compile_wall"], "#f0c060"),
             ("benchmark (GPU-worker seconds)", run["benchmark_seconds"], "#3a7bd5"),
             ("benchmark (wall)", run["benchmark_wall"], "#7aa7e5"), ("whole run (wall)", run["wall"], "#888888")]
    ax.barh(range(len(parts)), [p[1] for p in parts], color=[p[2] for p in parts])
    ax.set_yticks(range(len(parts)), [p[0] for p in parts], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds")
    fig.tight_layout()
    fig.savefig(out / "time_split.png", dpi=110)
    plt.close(fig)
    files["split"] = "time_split.png"
    for item in run["items"]:
        cands = [c for c in item.get("candidates", []) if c.get("median_ms")]
        if not cands:
            continue
        cands.sort(key=lambda c: c["median_ms"])
        colors = ["#2e9e44" if c["cid"] == item.get("winner") else "#e07b20" if c["cid"] == item.get("default")
                  else "#9db8de" for c in cands]
        fig, ax = plt.subplots(figsize=(9, 3))
        ax.bar(range(len(cands)), [c["median_ms"] * 1e3 for c in cands], color=colors)
        lo = [(c["median_ms"] - (c.get("stats") or {}).get("p20_ms", c["median_ms"])) * 1e3 for c in cands]
        hi = [((c.get("stats") or {}).get("p80_ms", c["median_ms"]) - c["median_ms"]) * 1e3 for c in cands]
        ax.errorbar(range(len(cands)), [c["median_ms"] * 1e3 for c in cands], yerr=[lo, hi], fmt="none",
                    ecolor="black", elinewidth=0.6)
        ax.set_ylabel("µs (median, p20–p80)")
        others = {s: sum(1 for c in item["candidates"] if c["status"] == s)
                  for s in ("wrong", "failed", "crashed", "timeout", "pruned", "unbenchmarked")}
        rest = ", ".join(f"{n} {s}" for s, n in others.items() if n)
        ax.set_title(f"{item['row']}: {len(cands)} timed" + (f"; {rest}" if rest else ""), fontsize=9)
        ax.set_xticks([])
        ax.set_xlabel("candidates, fastest first (green: winner, orange: untuned default)")
        fig.tight_layout()
        name = f"row_{_slug(item['row'])}.png"
        fig.savefig(out / name, dpi=100)
        plt.close(fig)
        files[item["row"]] = name
    return files


def write_report(run: dict[str, Any], out: Path) -> Path:
    """Write ``report.md`` (and its PNGs) into ``out``; returns the Markdown's path."""
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.png"):
        old.unlink()
    plots = _plots(run, out)
    d = run["device"]
    lines = [f"# Tuning report — {d['name']} ({run['target']})", ""]
    lines.append(f"{len(run['gpus'])} GPU(s) ({', '.join(run['gpus'])}), driver {d.get('driver') or '?'}, CUDA "
                 f"{d.get('cuda') or '?'}, torch {d.get('torch')}; measured ceilings "
                 f"{d['peak_bytes_per_s'] / 1e12:.2f} TB/s (device-to-device copy) and "
                 f"{d['peak_flops'] / 1e12:.0f} TFLOP/s (fp16 matrix product).")
    lines.append("")
    counts: dict[str, int] = {}
    for i in run["items"]:
        counts[i["status"]] = counts.get(i["status"], 0) + 1
    lines.append(f"Rows: {', '.join(f'{n} {s}' for s, n in sorted(counts.items())) or 'none'}. Binaries: "
                 f"{run['binaries']}. Time: {run['wall']:.1f} s in all; compiling {run['compile_seconds']:.1f} "
                 f"CPU-seconds ({run['compile_wall']:.1f} s wall), benchmarking {run['benchmark_seconds']:.1f} "
                 f"GPU-worker seconds ({run['benchmark_wall']:.1f} s wall, overlapping the compiles).")
    if not plots:
        lines += ["", "_matplotlib is not installed here: no plots (render them elsewhere with "
                      "`forge-aot report run.json`)._"]
    for note in run.get("notes", []):
        lines.append(f"- {note}")
    lines.append("")
    if "summary" in plots:
        lines += [f"![winners against the untuned default]({plots['summary']})", ""]
    if "split" in plots:
        lines += [f"![compile and benchmark time]({plots['split']})", ""]
    lines += ["| row | status | winner | time | untuned default | speedup | bound | achieved | benchmarked |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for i in run["items"]:
        sp = f"{i['speedup']:.2f}×" if i.get("speedup") else "–"
        bench = f"{i.get('benchmarked', 0)} / {i.get('space', 0)}" + (f" ({i['strategy']})" if i.get("strategy")
                                                                      else "")
        lines.append(f"| {i['row']} | {i['status']} | {i.get('winner') or '–'} | {_ms(i.get('winner_ms'))} | "
                     f"{_ms(i.get('default_ms'))} | {sp} | {i.get('bound') or '–'} | {_throughput(i, d)} | {bench} |")
    lines.append("")
    for i in run["items"]:
        if i["status"] == "up to date":
            continue
        lines += [f"## {i['row']}", ""]
        if i["row"] in plots:
            lines += [f"![candidates of {i['row']}]({plots[i['row']]})", ""]
        for note in i.get("notes", []):
            lines.append(f"- {note}")
        bad = [c for c in i.get("candidates", []) if c["status"] in ("wrong", "crashed", "timeout", "failed")]
        if bad:
            lines += ["", "| candidate | status | detail |", "| --- | --- | --- |"]
            for c in bad:
                detail = c.get("error") or (f"relative error {c['rel_err']:.3g}" if c.get("rel_err") is not None
                                            else "")
                detail = " ".join(str(detail).split())[:160].replace("|", "/")
                lines.append(f"| {c['cid']} | {c['status']} | {detail} |")
        lines.append("")
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
