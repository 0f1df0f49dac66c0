[[ -d .devlib ]] || tar xJf build-gpu/device-bundle.tar.xz; source tools/device/env.sh
nvidia-smi --query-gpu=name --format=csv,noheader
echo "== attention test"
timeout 100 build-gpu/device-programs/cuda_cudnn_attention_test --gtest_color=no 2>&1 | grep -E "^\[ +(OK|FAILED|PASSED) |Failure|Expected|Which is|differed|selection|refused|error|Value of" | head -40
echo "== determinism probe, deterministic attention"
WEFT_ATTENTION_DETERMINISTIC=1 SETTINGS="bias_gelu,input_gradient,swiglu,swiglu_backward" timeout 120 tools/device/determinism-probe
echo "== throughput"
w=build-gpu/device-programs/weft-train
for r in 1 2; do
tools/device/weft-throughput "default r$r" $w configs/gpt2-124m.yaml 20
WEFT_ATTENTION_DETERMINISTIC=1 tools/device/weft-throughput "det-attn r$r" $w configs/gpt2-124m.yaml 20
WEFT_HOPPER_GEMM=swiglu,swiglu_backward tools/device/weft-throughput "old-default r$r" $w configs/gpt2-124m.yaml 20
done
echo "== peer"
PEER_MODES=compile timeout 200 tools/gpt2_benchmark.sh $w /opt/torch/.venv/bin/python 15 2>&1 | tail -8
