"""A new session's first reset: in a new browser context and page, against the page a closed session left.

    python bench/first_resets.py                 # 16 sessions at once, 3 pairs of rounds, on a server of 2 browsers
    python bench/first_resets.py --pairs 5 --sessions 8

A round opens `--sessions` sessions at once, as a run's trainer does, resets each to click-test once, and closes
them. The server keeps a closed session's page for `--keep_s` (its --idle_timeout_s); each pair of rounds starts once
the pages the last round left are closed, so that its first round makes a context and a page for every session, and
its second round follows at once and takes the pages the first left (web_env.server.browsers.BrowserWorker). A
round before the pairs starts the browsers. It prints each round's wall seconds until every first reset had its
observation, the server's CPU-seconds (browsers included) per first reset, and how many resets took a closed session's
page; then the second rounds against the first, as medians. Run it on an otherwise idle machine.
"""

import argparse
import asyncio
import statistics
import time

from env_client import BrowserGymEnv, LocalEnvServer, cpu_reading


async def one_round(url: str, sessions: int, seed: int) -> tuple[float, int]:
    """(wall seconds until every session's first reset answered, resets that took a closed session's page)."""
    clients = [BrowserGymEnv(base_url=url) for _ in range(sessions)]
    start = time.perf_counter()
    results = await asyncio.gather(*(c.reset(task_name="click-test", seed=seed + i) for i, c in enumerate(clients)))
    wall = time.perf_counter() - start
    await asyncio.gather(*(c.close() for c in clients))
    return wall, sum(bool(r.observation.metadata.get("page_of_a_closed_session")) for r in results)


def measured_round(url: str, sessions: int, seed: int, name: str) -> tuple[float, float]:
    """(wall seconds, server CPU-seconds per first reset) of one round, printed."""
    cpu_before, _ = cpu_reading(url)
    wall, adopted = asyncio.run(one_round(url, sessions, seed))
    cpu = (cpu_reading(url)[0] - cpu_before) / sessions
    print(f"{name}: {wall:.2f} s, {cpu:.3f} server CPU-s per first reset, {adopted} of {sessions} took a kept page")
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=16)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--browsers", type=int, default=2)
    parser.add_argument("--keep_s", type=float, default=5.0, help="how long the server keeps a closed session's page")
    args = parser.parse_args()

    new, kept = [], []
    server_args = ["--browsers", str(args.browsers), "--idle_timeout_s", str(args.keep_s)]
    with LocalEnvServer(max_sessions=args.sessions, server_args=server_args) as server:
        asyncio.run(one_round(server.url, args.sessions, seed=0))  # starts the browsers
        for pair in range(args.pairs):
            time.sleep(args.keep_s + 3)  # the kept pages close after keep_s
            seed = (2 * pair + 1) * args.sessions
            new.append(measured_round(server.url, args.sessions, seed, f"pair {pair + 1}, new pages"))
            kept.append(measured_round(server.url, args.sessions, seed + args.sessions, f"pair {pair + 1}, kept pages"))
    wall = statistics.median(w for w, _ in kept) / statistics.median(w for w, _ in new)
    cpu = statistics.median(c for _, c in kept) / statistics.median(c for _, c in new)
    print(f"kept pages against new ones (medians): wall {wall:.2f}x, server CPU {cpu:.2f}x")


if __name__ == "__main__":
    main()
