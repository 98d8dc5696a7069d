# SPDX-License-Identifier: Apache-2.0
"""LookupIndex: per-request cost of one decode round (extend by the committed tokens, then propose γ) and of
indexing a prompt, at 512, 1k and 4k tokens of history, against a brute-force longest-match search; and the
costs of a full corpus of earlier outputs (``LookupCorpus``): rounds that consult it, keeping one output (with
and without dropping the oldest), and its memory.

python benchmarks/bench_lookup.py [--quick] [--json out.json]

The budget is under 0.2 ms per request per round at 4k tokens of history. The history is
random tokens from a 1k vocabulary with spans copied from earlier in it, so that lookups hit and miss.
Correctness is checked against the brute force on a small case and on the timed streams before timing.
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import Row, Timing, cpu_description, parse_args, report  # noqa: E402
from dspark.decoding.lookup import LookupConfig, LookupIndex  # noqa: E402
from dspark.decoding.lookup_corpus import DEFAULT_CORPUS_TOKENS, LookupCorpus  # noqa: E402

GAMMA = 7
COMMITTED = 2  # tokens one round commits (accepted drafts + the bonus token), a typical count
VOCAB = 1000


def brute_force(history: list[int], cfg: LookupConfig, k: int) -> tuple[list[int], int]:
    """The rule read literally (as in tests/decoding/test_lookup.py): longest n, then the latest end e."""
    if cfg.max_tokens is not None:
        k = min(k, cfg.max_tokens)
    if k == 0:
        return [], 0
    L = len(history)
    for n in range(cfg.max_match, cfg.min_match - 1, -1):
        suffix = history[L - n :] if n <= L else None
        for e in range(L - 1, n - 1, -1):
            if history[e - n : e] == suffix:
                return history[e : min(e + k, L)], n
    return [], 0


def stream(n: int, seed: int, vocab: int = VOCAB) -> list[int]:
    """Random tokens with spans of 8-64 copied from earlier positions (about 40% of the tokens)."""
    rng = random.Random(seed)
    out: list[int] = []
    while len(out) < n:
        if len(out) > 64 and rng.random() < 0.4:
            start = rng.randrange(len(out) - 8)
            out += out[start : start + rng.randint(8, 64)]
        else:
            out += [rng.randrange(vocab) for _ in range(rng.randint(8, 64))]
    return out[:n]


def check_small() -> None:
    """The index equals the brute force after every extend on a small-vocabulary stream, every k, two configs."""
    rng = random.Random(1)
    for cfg in (LookupConfig(), LookupConfig(1, 6, max_tokens=5)):
        tokens = stream(400, seed=2, vocab=6)
        index, history, i = LookupIndex(cfg), [], 0
        while i < len(tokens):
            step = rng.randint(1, 3)
            index.extend(tokens[i : i + step])
            history += tokens[i : i + step]
            i += step
            for k in range(9):
                got = (index.propose(k), index.match_length)
                if got != brute_force(history, cfg, k):
                    raise SystemExit(
                        f"LookupIndex differs from the brute force at {len(history)} tokens, k={k}"
                    )


def quantile_timing(samples_us: list[float]) -> Timing:
    q = statistics.quantiles(samples_us, n=4) if len(samples_us) > 1 else [samples_us[0]] * 3
    return Timing(statistics.median(samples_us), q[2] - q[0], len(samples_us))


def time_rounds(cfg: LookupConfig, tokens: list[int], history: int, rounds: int, repeats: int) -> Timing:
    """Per-round cost: index the first ``history`` tokens untimed, then time ``rounds`` rounds of
    extend(COMMITTED) + propose(GAMMA); one sample per repeat, a fresh index each time."""
    samples = []
    for _ in range(repeats):
        index = LookupIndex(cfg)
        index.extend(tokens[:history])
        chunks = [tokens[history + r * COMMITTED : history + (r + 1) * COMMITTED] for r in range(rounds)]
        t0 = time.perf_counter_ns()
        for chunk in chunks:
            index.extend(chunk)
            index.propose(GAMMA)
        samples.append((time.perf_counter_ns() - t0) / 1e3 / rounds)
    return quantile_timing(samples)


def time_brute_force(cfg: LookupConfig, tokens: list[int], history: int, rounds: int) -> Timing:
    samples = []
    h = list(tokens[:history])
    for r in range(rounds):
        t0 = time.perf_counter_ns()
        h += tokens[history + r * COMMITTED : history + (r + 1) * COMMITTED]
        brute_force(h, cfg, GAMMA)
        samples.append((time.perf_counter_ns() - t0) / 1e3)
    return quantile_timing(samples)


def rounds_stats(cfg: LookupConfig, tokens: list[int], history: int, rounds: int) -> dict:
    """Hit rate and mean proposal length over the timed rounds, checked against the brute force."""
    index = LookupIndex(cfg)
    index.extend(tokens[:history])
    h = list(tokens[:history])
    lengths = []
    for r in range(rounds):
        chunk = tokens[history + r * COMMITTED : history + (r + 1) * COMMITTED]
        index.extend(chunk)
        h += chunk
        got = index.propose(GAMMA)
        if r % 8 == 0 and (got, index.match_length) != brute_force(h, cfg, GAMMA):
            raise SystemExit(f"LookupIndex differs from the brute force at {len(h)} tokens")
        lengths.append(len(got))
    return {
        "hit_rate": round(sum(x > 0 for x in lengths) / rounds, 3),
        "mean_proposed": round(statistics.mean(lengths), 2),
    }


def corpus_costs(quick: bool) -> dict:
    """A corpus filled to capacity with 256-token outputs (random streams like the histories): per-round cost
    of a 4k history that consults it, the time to keep one more output, the overflow's rebuild, the memory."""
    import tracemalloc

    capacity = 16_384 if quick else DEFAULT_CORPUS_TOKENS
    cfg = LookupConfig(corpus_tokens=capacity)
    outputs = [stream(256, seed=10_000 + i) for i in range(capacity // 256)]
    tracemalloc.start()
    corpus = LookupCorpus(cfg.min_match, cfg.max_match, capacity)
    for out in outputs:
        corpus.add(out)
    memory_mb = tracemalloc.get_traced_memory()[0] / 1e6
    tracemalloc.stop()
    rounds, history = 64, 4096
    tokens = stream(history + rounds * COMMITTED, seed=history)
    samples = []
    for _ in range(15 if quick else 100):
        index = LookupIndex(cfg, corpus)
        index.extend(tokens[:history])
        t0 = time.perf_counter_ns()
        for r in range(rounds):
            index.extend(tokens[history + r * COMMITTED : history + (r + 1) * COMMITTED])
            index.propose(GAMMA)
        samples.append((time.perf_counter_ns() - t0) / 1e3 / rounds)
    keep = []
    for i in range(20):  # adds into a corpus with room (no output dropped)
        room = LookupCorpus(cfg.min_match, cfg.max_match, capacity)
        out = stream(256, seed=20_000 + i)
        t0 = time.perf_counter_ns()
        room.add(out)
        keep.append((time.perf_counter_ns() - t0) / 1e3)
    t0 = time.perf_counter_ns()
    corpus.add(stream(512, seed=30_000))  # overflows: the oldest outputs go with their index entries
    overflow_us = (time.perf_counter_ns() - t0) / 1e3
    return {
        "capacity": capacity,
        "memory_mb": round(memory_mb, 1),
        "round_us": round(statistics.median(samples), 2),
        "keep_256_us": round(statistics.median(keep), 1),
        "overflow_us": round(overflow_us, 1),
    }


def main() -> None:
    args = parse_args(__doc__)
    cpu = cpu_description()
    avx512 = ", ".join(f for f in cpu["flags"] if f.startswith("avx512")) or "none"
    print(f"CPU: {cpu['model']}; AVX2: {'yes' if 'avx2' in cpu['flags'] else 'no'}; AVX-512: {avx512}")
    check_small()

    rounds, repeats, ref_rounds = (64, 15, 4) if args.quick else (64, 200, 30)
    configs = [LookupConfig()] if args.quick else [LookupConfig(), LookupConfig(1, 8)]
    rows = []
    for cfg in configs:
        for history in (512, 1024, 4096):
            tokens = stream(history + rounds * COMMITTED, seed=history)
            extra = rounds_stats(cfg, tokens, history, rounds)
            t_op = time_rounds(cfg, tokens, history, rounds, repeats)
            t_ref = time_brute_force(cfg, tokens, history, ref_rounds)
            case = {"history": history, "match": f"{cfg.min_match}-{cfg.max_match}", "gamma": GAMMA}
            case.update(extra)
            rows.append(Row(case, "cpu", t_op, t_ref, extra))
    report(
        f"LookupIndex: one round (extend {COMMITTED} + propose {GAMMA}) per request vs brute-force search",
        rows,
        args,
        ["history", "match", "gamma", "hit_rate", "mean_proposed"],
    )

    prompt = stream(4096, seed=7)
    build = []
    for _ in range(5 if args.quick else 30):
        t0 = time.perf_counter_ns()
        LookupIndex().extend(prompt)
        build.append((time.perf_counter_ns() - t0) / 1e3)
    t_build = quantile_timing(build)
    print(
        f"\nindexing a 4096-token prompt (match 2-4): median {t_build.median_us / 1e3:.2f} ms, "
        f"IQR {t_build.iqr_us / 1e3:.2f} ms over {t_build.runs} runs"
    )
    corpus = corpus_costs(args.quick)
    print(
        f"corpus of {corpus['capacity']} tokens ({corpus['memory_mb']} MB): a round at 4k history consulting it "
        f"{corpus['round_us']} us; keeping a 256-token output {corpus['keep_256_us']} us; keeping a 512-token "
        f"one when full (dropping the oldest) {corpus['overflow_us']} us"
    )
    worst = max(r.op.median_us for r in rows if r.case["history"] == 4096)
    verdict = "within" if worst < 200 else "OVER"
    print(f"budget: {worst:.1f} us per request per round at 4k tokens, {verdict} the 200 us budget")
    if args.json:
        payload = json.loads(args.json.read_text())
        payload["build_4096_us"] = {"median": t_build.median_us, "iqr": t_build.iqr_us, "runs": t_build.runs}
        payload["corpus"] = corpus
        args.json.write_text(json.dumps(payload, indent=2) + "\n")


if __name__ == "__main__":
    main()
