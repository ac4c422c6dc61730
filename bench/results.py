"""The README's results table and chart, made from the evaluations themselves: each row of docs/results/rows.yaml is
an evaluation kept in docs/results/NAME/ (its summary.json as evaluate.py wrote it, and, after the first row, its
compare.json: compare.py's paired exact test against the row before, or the row it names as `against`, on the same
episodes).

    python bench/results.py            # prints the table; writes docs/results.png
    python bench/results.py --table    # prints the table alone

The table's figures come from these files alone, so that the README's table and this chart say the same
(tests/test_layout.py -k results_table checks the README's table against this script's).
"""

import argparse
import itertools
import json
from pathlib import Path

import yaml

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"
CHART = RESULTS.parent / "results.png"


def rows() -> list[dict]:
    """Each row of rows.yaml with its evaluation's summary and, after the first, its comparison with the row before."""
    listed = yaml.safe_load((RESULTS / "rows.yaml").read_text())
    for row in listed:
        row["summary"] = json.loads((RESULTS / row["name"] / "summary.json").read_text())
        compared = RESULTS / row["name"] / "compare.json"
        row["compare"] = json.loads(compared.read_text()) if compared.exists() else None
    by_name = {row["name"]: row for row in listed}
    for before, row in itertools.pairwise(listed):
        row["against"] = by_name[row.get("against", before["name"])]
        compare = row["compare"]
        # The comparison is of these two evaluations: the same successes on each side.
        assert compare is not None, f"{row['name']}: no compare.json against {row['against']['name']}"
        solved = (row["against"]["summary"]["solved"], row["summary"]["solved"])
        assert (compare["before"], compare["after"]) == solved, row["name"]
    return listed


def p_value_cell(row: dict) -> str:
    if row["compare"] is None:
        return "-"
    compare = row["compare"]
    gained, lost = compare["only_after"], compare["only_before"]
    return f"{row['against']['name']}: p = {compare['p_value']:.2g} ({gained} gained, {lost} lost)"


def table(listed: list[dict]) -> str:
    lines = [
        "| model | success (95% CI) | paired test against | time | command |",
        "| --- | --- | --- | --- | --- |",
    ]
    for row in listed:
        summary = row["summary"]
        low, high = summary["ci95"]
        solved = f"{summary['solved']}/{summary['episodes']}"
        success = f"{100 * summary['success_rate']:.1f}% ({solved}, {100 * low:.1f}-{100 * high:.1f}%)"
        evaluation = f"{summary['seconds'] / 60:.0f} min evaluation"
        time = f"{row['training']} + {evaluation}" if row.get("training") else evaluation
        lines.append(f"| {row['label']} | {success} | {p_value_cell(row)} | {time} | `{row['command']}` |")
    return "\n".join(lines)


def chart(listed: list[dict], image: Path) -> Path:
    """Each task's success, one bar per row, with the rows' mean over tasks in the legend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(listed[0]["summary"]["tasks"])
    width = 0.8 / len(listed)
    fig, axis = plt.subplots(figsize=(8, 4.8))
    for i, row in enumerate(listed):
        of_task = row["summary"]["tasks"]
        rates = [100 * of_task[t]["success_rate"] for t in tasks]
        below = [r - 100 * of_task[t]["ci95"][0] for r, t in zip(rates, tasks, strict=True)]
        above = [100 * of_task[t]["ci95"][1] - r for r, t in zip(rates, tasks, strict=True)]
        positions = [x + (i - (len(listed) - 1) / 2) * width for x in range(len(tasks))]
        label = f"{row['label']}: {100 * row['summary']['success_rate']:.1f}%"
        axis.bar(positions, rates, width, yerr=[below, above], capsize=2, label=label)
    axis.set_xticks(range(len(tasks)), tasks, fontsize="small")
    axis.set_ylim(0, 100)
    axis.set_ylabel("success, % (95% CI)")
    episodes = listed[0]["summary"]["tasks"][tasks[0]]["episodes"]
    axis.set_title(f"SmolLM2-135M-Instruct on page-reading: {episodes} held-out seeds a task, greedy", fontsize="small")
    # Below the bars, which fill the height: a legend inside would hide them.
    axis.legend(fontsize="x-small", loc="upper center", bbox_to_anchor=(0.5, -0.08), ncol=2, frameon=False)
    fig.tight_layout()
    fig.savefig(image, dpi=100)
    plt.close(fig)
    return image


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--table", action="store_true", help="print the table alone, without writing the chart")
    listed = rows()
    print(table(listed))
    if not parser.parse_args().table:
        print(f"chart: {chart(listed, CHART)}")
