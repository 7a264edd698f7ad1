#!/usr/bin/env python3
"""Turns dynmo-bench-paper-scale's JSON (one file per pipeline unit) into the
markdown table of docs/benchmarks.md and an SVG bar chart of the speed-ups.

usage: paper_scale_report.py OUT.svg blocks.json [halves.json]
Standard library only.
"""
import json
import sys

PAPER = {"pruning": "3.18×", "freezing": "2.23×", "sparse-attention": "4.02×",
         "early-exit": "4.52×", "moe": "1.23×", "mod": "1.17×"}
MODES = ["repartition", "oracle", "release", "reshape"]
COLOURS = {"repartition": "#4e79a7", "oracle": "#bab0ac", "reshape": "#59a14f",
           "reshape final": "#8cd17d"}


def table(runs):
    print("| case | units | GPUs (pp × dp) | re-partition | oracle | release: tok/s, mean GPUs, GPU-hours | "
          "reshape: whole run, after the last 10% | final grid (reshape) | paper |")
    print("|---|---|---|---|---|---|---|---|---|")
    for rows in runs:
        for r in rows:
            rel, rs = r["release"], r["reshape"]
            print(f"| {r['case']} | {r['units']} | {r['gpus']} ({r['pp']}×{r['dp']}) "
                  f"| {r['repartition']['speedup']:.3f}× | {r['oracle']['speedup']:.3f}× "
                  f"| {rel['speedup']:.3f}×, {rel['mean_gpus']:.0f}, {100 * rel['gpu_hours_vs_static']:.0f}% "
                  f"| {rs['speedup']:.3f}×, {rs['final_speedup']:.3f}× | {rs['final_grid']} "
                  f"| {PAPER.get(r['case'], '')} |")


def targets(rows):
    print()
    for r in rows:
        rp, orc = r["repartition"]["speedup"], r["oracle"]["speedup"]
        print(f"- {r['case']} ({r['units']}): re-partition {rp:.3f}× vs oracle {orc:.3f}× "
              f"({'within' if rp >= orc * 0.98 else 'NOT within'} 2%; "
              f"{'not below' if rp >= 1.0 else 'BELOW'} static)")
    for r in rows:
        if r["case"] == "pruning":
            rel, rs = r["release"], r["reshape"]
            print(f"- pruning ({r['units']}): release uses {100 * rel['gpu_hours_vs_static']:.1f}% of static's "
                  f"GPU-hours at {100 * rel['speedup']:.1f}% of its tokens/s (target <= 75% at >= 98%); "
                  f"reshape {rs['final_speedup']:.3f}× static once pruned (target >= 1.6×), "
                  f"{rs['speedup']:.3f}× over the whole run")


def svg(rows, path):
    bars = ["repartition", "oracle", "reshape", "reshape final"]
    w, h, left, bottom = 860, 360, 60, 60
    top = max(max(r["reshape"]["final_speedup"], r["oracle"]["speedup"]) for r in rows)
    ymax = max(2.0, round(top + 0.25, 1))
    group = (w - left - 20) / len(rows)
    bw = group / (len(bars) + 1)
    y = lambda v: h - bottom - (h - bottom - 30) * v / ymax
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">',
           f'<text x="{w / 2}" y="16" text-anchor="middle" font-size="13">Speed-up over static in the simulator '
           f'({rows[0]["units"]}; 48 layers, 24×30 GPUs, MoE/MoD 16×8)</text>']
    for t in [0.5 * i for i in range(int(ymax / 0.5) + 1)]:
        out.append(f'<line x1="{left}" x2="{w - 20}" y1="{y(t):.1f}" y2="{y(t):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{left - 6}" y="{y(t) + 4:.1f}" text-anchor="end">{t:.1f}×</text>')
    out.append(f'<line x1="{left}" x2="{w - 20}" y1="{y(1):.1f}" y2="{y(1):.1f}" stroke="#333"/>')
    for i, r in enumerate(rows):
        x0 = left + i * group + bw / 2
        for j, b in enumerate(bars):
            v = r["reshape"]["final_speedup"] if b == "reshape final" else r[b]["speedup"]
            out.append(f'<rect x="{x0 + j * bw:.1f}" y="{y(v):.1f}" width="{bw - 2:.1f}" '
                       f'height="{y(0) - y(v):.1f}" fill="{COLOURS[b]}"><title>{b} {v:.3f}×</title></rect>')
        out.append(f'<text x="{x0 + 2 * bw:.1f}" y="{h - bottom + 16}" text-anchor="middle">{r["case"]}</text>')
    for j, b in enumerate(bars):
        out.append(f'<rect x="{left + j * 150}" y="{h - 24}" width="12" height="12" fill="{COLOURS[b]}"/>')
        out.append(f'<text x="{left + j * 150 + 16}" y="{h - 14}">{b}</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def main():
    if len(sys.argv) < 3:
        print("usage: paper_scale_report.py OUT.svg blocks.json [halves.json]", file=sys.stderr)
        return 2
    runs = []
    for p in sys.argv[2:]:
        with open(p) as f:
            runs.append(json.load(f))
    table(runs)
    for rows in runs:
        targets(rows)
    svg(runs[-1], sys.argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
