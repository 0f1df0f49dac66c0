"""A weft-train run's throughput from its log.metrics_file, as the benchmark scripts report it.

Wall time, as the PyTorch peers measure theirs (the time of N steps run back to back, divided by N):
from the end of the last step before the ones counted to the end of the last step, by each line's
elapsed_s. That counts the host's work between steps, which a step's own step_ms leaves out when
one step is in flight. Files without elapsed_s (older builds) fall back to the mean of the steps'
tokens_per_s.
"""
import json


def summary(path, skip):
    """(tokens/s, step ms, MFU or 0, peak memory MB) over the steps after the first `skip`."""
    rows = [json.loads(line) for line in open(path) if '"tokens_per_s"' in line]
    counted = rows[skip:]
    n = len(counted)
    mean_tokens_per_s = sum(r["tokens_per_s"] for r in counted) / n
    mean_mfu = sum(r["mfu"] or 0 for r in counted) / n  # no MFU on the CPU
    peak = max(r["memory_mb"] for r in counted)
    if skip == 0 or "elapsed_s" not in counted[0]:
        return mean_tokens_per_s, sum(r["step_ms"] for r in counted) / n, mean_mfu, peak
    tokens_per_step = counted[0]["tokens_per_s"] * counted[0]["step_ms"] / 1000.0
    seconds = counted[-1]["elapsed_s"] - rows[skip - 1]["elapsed_s"]
    tokens_per_s = tokens_per_step * n / seconds
    # MFU is FLOPs per second: the same FLOPs per token at the wall rate.
    return tokens_per_s, 1000.0 * seconds / n, mean_mfu * tokens_per_s / mean_tokens_per_s, peak
