"""Hugging Face GPT-2 and Llama in plain PyTorch, for weft's interoperability tests.

Written from Hugging Face's semantics (GPT2LMHeadModel, LlamaForCausalLM) without transformers or
the safetensors package, neither of which Debian ships: GPT-2's Conv1D weights are [in, out], its
GELU is gelu_new (tanh); Llama's RoPE is the rotate-half form, with grouped-query attention.

  write KIND DIR [--dtype F32|BF16] [--shards N]
      random weights: DIR/model.safetensors (or N shards and their index) + DIR/config.json
  ids KIND COUNT                               the token ids the tests feed, comma-separated
  check DIR WEFT_JSON [--export] [--differs-from DIR2]
      the logits of DIR's model for the first T ids (T = rows of WEFT_JSON) against weft's; with
      --export also the config.json keys transformers needs; with --differs-from, the weights must
      not equal DIR2's (training moved them)
"""
import json
import math
import struct
import sys

import torch

SIZES = {
    "gpt2": dict(model_type="gpt2", vocab_size=300, n_positions=32, n_embd=64, n_layer=2, n_head=4,
                 activation_function="gelu_new", layer_norm_epsilon=1e-5, tie_word_embeddings=True),
    "llama": dict(model_type="llama", vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32, rms_norm_eps=1e-5,
                  rope_theta=10000.0, hidden_act="silu", tie_word_embeddings=False, attention_bias=False,
                  mlp_bias=False, rope_scaling=None),
}

DTYPES = {"F32": (torch.float32, 4), "BF16": (torch.bfloat16, 2), "F16": (torch.float16, 2), "F64": (torch.float64, 8)}


def write_safetensors(path, tensors, dtype="F32"):
    torch_dtype, size = DTYPES[dtype]
    header, chunks, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(tensors):
        tensor = tensors[name].to(torch_dtype).contiguous()
        raw = tensor.view(torch.int16).numpy().tobytes() if size == 2 else tensor.numpy().tobytes()
        header[name] = {"dtype": dtype, "shape": list(tensor.shape), "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * ((8 - (8 + len(text)) % 8) % 8)
    with open(path, "wb") as out:
        out.write(struct.pack("<Q", len(text)) + text + b"".join(chunks))


def read_safetensors(path):
    with open(path, "rb") as file:
        data = file.read()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + length])
    body = data[8 + length:]
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        torch_dtype, size = DTYPES[entry["dtype"]]
        raw = bytearray(body[begin:end])
        if size == 2:
            tensor = torch.frombuffer(raw, dtype=torch.int16).view(torch_dtype)
        else:
            tensor = torch.frombuffer(raw, dtype=torch_dtype)
        tensors[name] = tensor.reshape(entry["shape"]).to(torch.float32)
    return tensors, header.get("__metadata__", {})


def random_weights(kind, generator):
    c = SIZES[kind]
    normal = lambda *shape: torch.randn(*shape, generator=generator) * 0.2
    w = {}
    if kind == "gpt2":
        C, V, P, F = c["n_embd"], c["vocab_size"], c["n_positions"], 4 * c["n_embd"]
        w["transformer.wte.weight"] = normal(V, C)
        w["transformer.wpe.weight"] = normal(P, C)
        for layer in range(c["n_layer"]):
            h = f"transformer.h.{layer}."
            for norm in ("ln_1", "ln_2"):
                w[h + norm + ".weight"] = 1 + normal(C)
                w[h + norm + ".bias"] = normal(C)
            w[h + "attn.c_attn.weight"], w[h + "attn.c_attn.bias"] = normal(C, 3 * C), normal(3 * C)
            w[h + "attn.c_proj.weight"], w[h + "attn.c_proj.bias"] = normal(C, C), normal(C)
            w[h + "mlp.c_fc.weight"], w[h + "mlp.c_fc.bias"] = normal(C, F), normal(F)
            w[h + "mlp.c_proj.weight"], w[h + "mlp.c_proj.bias"] = normal(F, C), normal(C)
            # Buffers older transformers saved with the weights; a reader must skip them.
            w[h + "attn.bias"] = torch.tril(torch.ones(P, P)).view(1, 1, P, P)
        w["transformer.ln_f.weight"], w["transformer.ln_f.bias"] = 1 + normal(C), normal(C)
        w["lm_head.weight"] = w["transformer.wte.weight"].clone()  # tied: present or not, it is the embedding
    else:
        C, V, F = c["hidden_size"], c["vocab_size"], c["intermediate_size"]
        H, K = c["num_attention_heads"], c["num_key_value_heads"]
        D = C // H
        w["model.embed_tokens.weight"] = normal(V, C)
        for layer in range(c["num_hidden_layers"]):
            h = f"model.layers.{layer}."
            w[h + "input_layernorm.weight"] = 1 + normal(C)
            w[h + "post_attention_layernorm.weight"] = 1 + normal(C)
            w[h + "self_attn.q_proj.weight"] = normal(H * D, C)
            w[h + "self_attn.k_proj.weight"] = normal(K * D, C)
            w[h + "self_attn.v_proj.weight"] = normal(K * D, C)
            w[h + "self_attn.o_proj.weight"] = normal(C, H * D)
            w[h + "mlp.gate_proj.weight"] = normal(F, C)
            w[h + "mlp.up_proj.weight"] = normal(F, C)
            w[h + "mlp.down_proj.weight"] = normal(C, F)
        w["model.norm.weight"] = 1 + normal(C)
        w["lm_head.weight"] = normal(V, C)
    return w


def causal_attention(q, k, v):  # [H, T, D] each
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    mask = torch.triu(torch.ones(q.shape[1], q.shape[1], dtype=torch.bool), 1)
    return torch.softmax(scores.masked_fill(mask, float("-inf")), -1) @ v


def gpt2_logits(w, c, ids):
    C, H, eps = c["n_embd"], c["n_head"], c["layer_norm_epsilon"]
    prefix = "transformer." if "transformer.wte.weight" in w else ""
    g = lambda name: w[prefix + name]
    gelu_new = lambda x: 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    norm = lambda x, name: torch.nn.functional.layer_norm(x, (C,), g(name + ".weight"), g(name + ".bias"), eps)
    T = len(ids)
    x = g("wte.weight")[ids] + g("wpe.weight")[:T]
    for layer in range(c["n_layer"]):
        h = f"h.{layer}."
        qkv = norm(x, h + "ln_1") @ g(h + "attn.c_attn.weight") + g(h + "attn.c_attn.bias")  # Conv1D: x W
        q, k, v = (part.reshape(T, H, C // H).transpose(0, 1) for part in qkv.split(C, -1))
        y = causal_attention(q, k, v).transpose(0, 1).reshape(T, C)
        x = x + y @ g(h + "attn.c_proj.weight") + g(h + "attn.c_proj.bias")
        m = gelu_new(norm(x, h + "ln_2") @ g(h + "mlp.c_fc.weight") + g(h + "mlp.c_fc.bias"))
        x = x + m @ g(h + "mlp.c_proj.weight") + g(h + "mlp.c_proj.bias")
    x = norm(x, "ln_f")
    head = w["lm_head.weight"] if not c.get("tie_word_embeddings", True) else g("wte.weight")
    return x @ head.T


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), -1)


def llama_logits(w, c, ids):
    C, H = c["hidden_size"], c["num_attention_heads"]
    K, D, eps = c.get("num_key_value_heads", H), C // H, c["rms_norm_eps"]
    T = len(ids)
    norm = lambda x, weight: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight
    inverse_frequency = 1.0 / (c["rope_theta"] ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    angles = torch.outer(torch.arange(T, dtype=torch.float64), inverse_frequency)
    angles = torch.cat((angles, angles), -1)
    cos, sin = angles.cos().float(), angles.sin().float()
    x = w["model.embed_tokens.weight"][ids]
    for layer in range(c["num_hidden_layers"]):
        h = f"model.layers.{layer}."
        a = norm(x, w[h + "input_layernorm.weight"])
        q = (a @ w[h + "self_attn.q_proj.weight"].T).reshape(T, H, D).transpose(0, 1)
        k = (a @ w[h + "self_attn.k_proj.weight"].T).reshape(T, K, D).transpose(0, 1)
        v = (a @ w[h + "self_attn.v_proj.weight"].T).reshape(T, K, D).transpose(0, 1)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = k.repeat_interleave(H // K, 0), v.repeat_interleave(H // K, 0)  # transformers' repeat_kv
        y = causal_attention(q, k, v).transpose(0, 1).reshape(T, C)
        x = x + y @ w[h + "self_attn.o_proj.weight"].T
        m = norm(x, w[h + "post_attention_layernorm.weight"])
        gate = torch.nn.functional.silu(m @ w[h + "mlp.gate_proj.weight"].T)
        x = x + (gate * (m @ w[h + "mlp.up_proj.weight"].T)) @ w[h + "mlp.down_proj.weight"].T
    x = norm(x, w["model.norm.weight"])
    head = w["model.embed_tokens.weight"] if c.get("tie_word_embeddings") else w["lm_head.weight"]
    return x @ head.T


def token_ids(vocab, count):
    return [(7 * i + 3) % vocab for i in range(count)]


def main(argv):
    command = argv[0]
    if command == "write":
        kind, folder = argv[1], argv[2]
        dtype = argv[argv.index("--dtype") + 1] if "--dtype" in argv else "F32"
        weights = random_weights(kind, torch.Generator().manual_seed(1234 if kind == "gpt2" else 4321))
        if "--shards" in argv:  # model-0000N-of-0000M.safetensors and the index naming each tensor's file
            count, names = int(argv[argv.index("--shards") + 1]), sorted(weights)
            weight_map = {}
            for shard in range(count):
                file = f"model-{shard + 1:05d}-of-{count:05d}.safetensors"
                part = names[shard * len(names) // count:(shard + 1) * len(names) // count]
                write_safetensors(f"{folder}/{file}", {name: weights[name] for name in part}, dtype)
                weight_map.update({name: file for name in part})
            with open(f"{folder}/model.safetensors.index.json", "w") as out:
                json.dump({"metadata": {}, "weight_map": weight_map}, out)
        else:
            write_safetensors(f"{folder}/model.safetensors", weights, dtype)
        with open(f"{folder}/config.json", "w") as out:
            json.dump(dict(SIZES[kind], architectures=["GPT2LMHeadModel" if kind == "gpt2" else "LlamaForCausalLM"],
                           torch_dtype="float32", bos_token_id=0), out, indent=2)
        return
    if command == "ids":
        print(",".join(map(str, token_ids(SIZES[argv[1]]["vocab_size"], int(argv[2])))))
        return
    if command == "check":
        folder, weft_json = argv[1], argv[2]
        with open(f"{folder}/config.json") as file:
            config = json.load(file)
        weights, metadata = read_safetensors(f"{folder}/model.safetensors")
        weft = torch.tensor(json.load(open(weft_json))["logits"], dtype=torch.float32)
        ids = token_ids(config["vocab_size"], weft.shape[0])
        with torch.no_grad():
            ours = (gpt2_logits if config["model_type"] == "gpt2" else llama_logits)(weights, config, ids)
        worst = (ours - weft).abs().max().item()
        scale = ours.abs().max().item()
        print(f"{folder}: {config['model_type']} logits {list(weft.shape)}, max |PyTorch - weft| = {worst:.3g} "
              f"(largest logit {scale:.3g})")
        if ours.shape != weft.shape or not worst <= 1e-4 * max(1.0, scale):
            sys.exit(f"FAIL: the logits differ by {worst:.3g}")
        if "--export" in argv:
            architecture = "GPT2LMHeadModel" if config["model_type"] == "gpt2" else "LlamaForCausalLM"
            for key in ("architectures", "model_type", "torch_dtype", "vocab_size"):
                if key not in config:
                    sys.exit(f"FAIL: the exported config.json has no '{key}'")
            if config["architectures"] != [architecture] or metadata.get("format") != "pt":
                sys.exit(f"FAIL: architectures {config['architectures']} / metadata {metadata}")
        if "--differs-from" in argv:
            before, _ = read_safetensors(argv[argv.index("--differs-from") + 1] + "/model.safetensors")
            name = "transformer.h.0.attn.c_attn.weight" if config["model_type"] == "gpt2" else \
                "model.layers.0.self_attn.q_proj.weight"
            if torch.equal(before[name], weights[name]):
                sys.exit(f"FAIL: {name} is unchanged: the exported weights are not the trained ones")
        return
    sys.exit(f"unknown command {command}")


if __name__ == "__main__":
    main(sys.argv[1:])
