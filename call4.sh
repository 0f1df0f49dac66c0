[[ -d .devlib ]] || tar xJf build-gpu/device-bundle.tar.xz; source tools/device/env.sh
nvidia-smi --query-gpu=name --format=csv,noheader
echo "== attention test"
timeout 100 build-gpu/device-programs/cuda_cudnn_attention_test --gtest_color=no 2>&1 | grep -E "^\[ +(FAILED|PASSED) |Failure|Expected|Which is|differed|refused|error|Value of" | head -30
echo "== determinism probe, WEFT_DETERMINISTIC=1 with autotuning asked for"
WEFT_DETERMINISTIC=1 WEFT_MATMUL_AUTOTUNE=1 SETTINGS="bias_gelu,input_gradient,swiglu,swiglu_backward" timeout 120 tools/device/determinism-probe
echo "== throughput"
w=build-gpu/device-programs/weft-train
for r in 1 2; do
tools/device/weft-throughput "gpt2 default r$r" $w configs/gpt2-124m.yaml 20
tools/device/weft-throughput "gpt2 deterministic r$r" $w configs/gpt2-124m.yaml 20 --set train.deterministic=true
done
tools/device/weft-throughput "llama default" $w configs/llama-1b.yaml 10
tools/device/weft-throughput "llama deterministic" $w configs/llama-1b.yaml 10 --set train.deterministic=true
d=$(mktemp -d); tools/device/random-token-shard $d/t.bin 200000 32000 >/dev/null
$w configs/gpt2-124m.yaml --set data.train=$d/t.bin --set data.val= --set data.val_fraction=0 --set data.val_every=0 --set train.steps=2 --set train.warmup_steps=1 --set checkpoint.dir= --set log.progress=plain --set train.batch_size=2 --set train.deterministic=true 2>&1 | grep -i "determin"
