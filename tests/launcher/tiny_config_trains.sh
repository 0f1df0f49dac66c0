#!/usr/bin/env bash
# The README's default run, shortened: weft-train configs/tiny-cpu.yaml must bring the training loss
# from about ln(256) = 5.55 to below 3.3 within 150 steps (the full 600-step run reaches about 2.5).
#   usage: tiny_config_trains.sh WEFT_TRAIN CONFIG WORK_DIR
set -euo pipefail
weft_train=$1 config=$2 work=$3
mkdir -p "$work"
metrics=$work/tiny-metrics.jsonl
rm -f "$metrics"
"$weft_train" "$config" --set train.steps=150 --set data.val_every=0 --set log.every=50 \
  --set log.metrics_file="$metrics"
/usr/bin/python3 - "$metrics" <<'PYTHON'
import json, sys
losses = [json.loads(line)["loss"] for line in open(sys.argv[1]) if '"loss"' in line]
first, last = losses[0], sum(losses[-10:]) / 10
print(f"first loss {first:.3f}, mean of the last 10 steps {last:.3f}")
if not (first > 5.0 and last < 3.3):
    sys.exit(f"the loss did not fall as expected: first {first:.3f} (want > 5.0), last {last:.3f} (want < 3.3)")
PYTHON
