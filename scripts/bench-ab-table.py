"""The table of an A/B send-load benchmark (scripts/bench-outbox, scripts/bench-stamp):
medians over the rounds of send-load's own per-phase medians, and the A/B ratio (with
send-load's pgbench baseline, its ratios to the seed's figures too).

    python3 scripts/bench-ab-table.py OUT ROUNDS A "A's title" B "B's title"

reads OUT/send-load-{A,B}-{1..ROUNDS}.json (send-load --out)."""
import json
import statistics
import sys

out, rounds, a, a_title, b, b_title = sys.argv[1], int(sys.argv[2]), *sys.argv[3:7]


def figure(mode, path):
    values = []
    for r in range(1, rounds + 1):
        v = json.load(open(f"{out}/send-load-{mode}-{r}.json"))["summary"]
        for key in path.split("/"):
            v = v.get(key) if isinstance(v, dict) else None
        values.append(v["median"] if isinstance(v, dict) else float("nan"))
    return values


rows = [("sends/s, spread over 500 conversations", "spread.sends_per_s"),
        ("send p99 ms, spread", "spread.p99_ms"),
        ("sends/s, one hot conversation", "hot.sends_per_s"),
        ("send p99 ms, hot", "hot.p99_ms"),
        # With send-load's pgbench baseline (no --no-baseline): each run's own ratios.
        ("spread / the seed's pgbench spread", "spread_over_seed"),
        ("spread / pgbench one statement", "spread_over_one_statement"),
        ("hot / the seed's pgbench hot", "hot_over_seed_hot")]
print(f"\n{rounds} rounds, alternating; median (min-max) of the rounds")
print(f"| figure | {a_title} | {b_title} | {a} / {b} |")
print("|---|---|---|---|")
for name, key in rows:
    x, y = figure(a, key), figure(b, key)
    if any(v != v for v in x + y):  # not measured in these runs (NaN)
        continue
    f = lambda v: f"{statistics.median(v):.1f} ({min(v):.1f}-{max(v):.1f})"
    print(f"| {name} | {f(x)} | {f(y)} | {statistics.median(x) / statistics.median(y):.2f}x |")
