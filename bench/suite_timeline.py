"""Where the test suite's time goes: each test's wall time beside how busy the machine's cores were meanwhile, so that
a test that waits (on a timeout, a page, a subprocess's start) shows apart from one that computes.

    python bench/suite_timeline.py                       # every test, both tiers (what CI runs)
    python bench/suite_timeline.py -- -m slow            # the slow tier; what follows -- goes to pytest
    python bench/suite_timeline.py --file-seconds tests/file_seconds.json -- -n 2 --dist loadfile --no-loadscope-reorder

It runs pytest with a plugin (this module) that writes each test phase's start and stop, while a thread here reads
the machine's CPU counters (/proc/stat, Linux) every second. It prints the run's span and mean busy cores, then by file
and for the slowest tests: wall seconds, the mean busy cores over them, and the idle core-seconds (cores x wall less
busy), the time a test left the machine waiting; on several pytest-xdist processes, when each finished its last test.
Writes both series to --output (JSON), and with --file-seconds each test file's seconds, from which tests/conftest.py
hands the longest files out first.
"""

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

PHASES_VARIABLE = "SUITE_TIMELINE_PHASES"  # where the plugin, inside pytest, writes each phase


def pytest_runtest_logreport(report) -> None:
    """The plugin's one hook: each test phase's start, stop and process, as a JSON line; written by the process that
    reports (pytest-xdist's workers send theirs to it), not by the workers too."""
    if "PYTEST_XDIST_WORKER" in os.environ:
        return
    node = getattr(report, "node", None)  # the worker that ran it, on pytest-xdist
    worker = node.workerinput["workerid"] if node else "main"
    with open(os.environ[PHASES_VARIABLE], "a") as phases:
        line = {"test": report.nodeid, "start": report.start, "stop": report.stop, "worker": worker}
        phases.write(json.dumps(line) + "\n")


def cpu_counters() -> tuple[float, float]:
    """(busy, total) jiffies of all cores so far."""
    user, nice, system, idle, iowait, irq, softirq, steal = map(float, Path("/proc/stat").read_text().split()[1:9])
    return user + nice + system + irq + softirq + steal, user + nice + system + idle + iowait + irq + softirq + steal


def sample_cpu(samples: list, stop: threading.Event) -> None:
    while not stop.wait(1.0):
        samples.append((time.time(), *cpu_counters()))


def busy_cores(samples: list, start: float, stop: float) -> float:
    """The mean number of busy cores between two times, from the samples around them."""
    inside = [s for s in samples if start - 1 <= s[0] <= stop + 1]
    if len(inside) < 2:
        return float("nan")
    (_, busy_0, total_0), (_, busy_1, total_1) = inside[0], inside[-1]
    return os.cpu_count() * (busy_1 - busy_0) / (total_1 - total_0)


def file_of(test: str) -> str:
    return test.split("::")[0]


def file_seconds(phases: list[dict]) -> dict[str, float]:
    """Each test file's seconds: its tests' phases summed, longest first (the table printed and the file written)."""
    seconds = defaultdict(float)
    for phase in phases:
        seconds[file_of(phase["test"])] += phase["stop"] - phase["start"]
    return dict(sorted(seconds.items(), key=lambda item: -item[1]))


def report(phases: list[dict], samples: list, slowest: int) -> None:
    tests = defaultdict(lambda: [float("inf"), 0.0, 0.0])  # first start, last stop, wall summed over phases
    for phase in phases:
        test = tests[phase["test"]]
        test[0], test[1] = min(test[0], phase["start"]), max(test[1], phase["stop"])
        test[2] += phase["stop"] - phase["start"]
    start, stop, cores = min(t[0] for t in tests.values()), max(t[1] for t in tests.values()), os.cpu_count()
    print(f"{len(tests)} tests in {stop - start:.0f} s, {busy_cores(samples, start, stop):.2f} of {cores} cores busy")
    workers = defaultdict(float)
    for phase in phases:
        workers[phase["worker"]] = max(workers[phase["worker"]], phase["stop"])
    if len(workers) > 1:  # the schedule's tail: a process done while another still runs
        ends = ", ".join(f"{worker} {last - start:.0f} s" for worker, last in sorted(workers.items()))
        print("each process's last test ended at", ends)
    rows = [(wall, busy_cores(samples, first, last), test) for test, (first, last, wall) in tests.items()]
    busy_seconds = defaultdict(float)  # each file's busy cores x wall, summed over its tests
    for wall, busy, test in rows:
        busy_seconds[file_of(test)] += wall * busy
    print("\n   wall  busy  file")
    for file, wall in file_seconds(phases).items():
        print(f"{wall:7.0f} {busy_seconds[file] / wall if wall else 0:5.2f}  {file}")
    print("\n   wall  busy  idle core-s  test")
    for wall, busy, test in sorted(rows, reverse=True)[:slowest]:
        print(f"{wall:7.1f} {busy:5.2f} {wall * (cores - busy):12.0f}  {test}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", default="outputs/suite_timeline.json")
    parser.add_argument("--slowest", type=int, default=40, help="tests listed one by one")
    parser.add_argument("--file-seconds", help="also write each test file's seconds here (JSON)")
    parser.add_argument("pytest_args", nargs="*", help="after --: pytest's arguments")
    args = parser.parse_args()
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    phases_file = output.with_suffix(".phases.jsonl")
    phases_file.unlink(missing_ok=True)
    samples, stop = [], threading.Event()
    sampler = threading.Thread(target=sample_cpu, args=(samples, stop), daemon=True)
    sampler.start()
    environment = {**os.environ, PHASES_VARIABLE: str(phases_file.resolve())}
    command = [sys.executable, "-m", "pytest", "-p", "bench.suite_timeline", *args.pytest_args]
    status = subprocess.run(command, env=environment).returncode
    stop.set()
    sampler.join()
    phases = [json.loads(line) for line in phases_file.read_text().splitlines()]
    output.write_text(json.dumps({"phases": phases, "cpu": samples}) + "\n")
    report(phases, samples, args.slowest)
    if args.file_seconds:
        seconds = {file: round(wall, 1) for file, wall in file_seconds(phases).items()}
        Path(args.file_seconds).write_text(json.dumps(seconds, indent=1) + "\n")
    sys.exit(status)


if __name__ == "__main__":
    main()
