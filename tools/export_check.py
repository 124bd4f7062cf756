#!/usr/bin/env python3
"""Checks a `qtrain export` against PyTorch: loads the safetensors file into the recipe's model
(its [model] section, rebuilt here layer by layer), evaluates it on the recipe's eval set (an
IDX pair, e.g. Fashion-MNIST's 10000 test images) and compares the accuracy with the one qtrain
recorded for its last eval row (the export's `qtrain.eval_accuracy`, or --expect).

usage: python3 tools/export_check.py RECIPE EXPORT.safetensors [--weights master|quantized]
           [--activations bf16|fp32] [--expect PERCENT] [--tolerance POINTS] [--device DEV]

  --weights master      the FP32 master weights (the default)
  --weights quantized   the rowwise copies qtrain's forward pass multiplies, dequantized here
                        (needs `qtrain export --quantized`): BF16, FP8 per-tensor, MXFP8, FP8
                        block and NVFP4 layouts of ptx/quant.h
  --activations bf16    round every layer's output to BF16, as qtrain keeps tensors between
                        layers (the default); fp32 keeps them in FP32
Run it from the repository root (the shipped recipes name their data relative to it). Exit
status 0 when the accuracies agree within the tolerance (0.1 point), 1 when not, 2 on bad input.
Needs torch and safetensors (the GPU machine has both); runs on the GPU when there is one.
"""
import argparse
import gzip
import struct
import sys

import torch
import torch.nn.functional as F
from safetensors import safe_open


def fail(message):
    print(f"export_check: {message}", file=sys.stderr)
    sys.exit(2)


def recipe_sections(path):
    """The recipe's lines per section, comments removed (`#` at a line's start or after a
    blank, as qtrain reads them)."""
    sections, current = {}, None
    with open(path, encoding="utf-8") as f:
        for line in f:
            cut = line.find("#")
            while cut > 0 and line[cut - 1] not in " \t":
                cut = line.find("#", cut + 1)
            if cut >= 0:
                line = line[:cut]
            line = line.strip()
            if not line:
                continue
            if line.startswith("[") and line.endswith("]"):
                current = sections.setdefault(line[1:-1], [])
                continue
            if current is None:
                fail(f"{path}: '{line}' before the first section")
            current.append(line)
    return sections


def parse_model(lines):
    """[model] as a list of (kind, name, options) and the input width."""
    layers, width, norms = [], None, 0
    for line in lines:
        key, _, value = (part.strip() for part in line.partition("="))
        tokens = value.split()
        if key == "input":
            width = int(tokens[0])
        elif key == "layer":
            kind = tokens[0]
            if kind == "linear":
                layers.append(("linear", tokens[1], {"out": int(tokens[2]),
                                                     "bias": "bias" in tokens[3:]}))
            elif kind in ("relu", "gelu", "silu", "swiglu"):
                layers.append((kind, None, {}))
            elif kind == "rmsnorm":
                norms += 1
                names = [t for t in tokens[1:] if "=" not in t]
                options = dict(t.split("=", 1) for t in tokens[1:] if "=" in t)
                layers.append(("rmsnorm", names[0] if names else f"rmsnorm{norms}",
                               {"eps": float(options.get("eps", "1e-5"))}))
            elif kind == "residual":
                layers.append(("residual_" + tokens[1], None, {}))
            else:
                fail(f"layer '{kind}' is not supported here")
    if width is None:
        fail("the recipe's [model] has no 'input = N'")
    return layers, width


def read_idx(path):
    opener = gzip.open if open(path, "rb").read(2) == b"\x1f\x8b" else open
    with opener(path, "rb") as f:
        data = f.read()
    magic, = struct.unpack(">I", data[:4])
    dims = magic & 0xFF
    shape = struct.unpack(">" + "I" * dims, data[4:4 + 4 * dims])
    tensor = torch.frombuffer(bytearray(data[4 + 4 * dims:]), dtype=torch.uint8)
    return tensor.reshape(shape)


def eval_set(sections):
    for line in sections.get("data", []):
        key, _, value = (part.strip() for part in line.partition("="))
        tokens = value.split()
        if key == "eval":
            if tokens[0] != "idx":
                fail("the recipe's eval set is not an IDX pair")
            images, labels = read_idx(tokens[1]), read_idx(tokens[2])
            return images.reshape(images.shape[0], -1), labels.long()
    fail("the recipe has no 'eval = idx IMAGES LABELS' in [data]")


E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                     -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def copy_name(scheme):
    """The rowwise copy's suffix: a BF16 weight has one copy for both directions."""
    return "bf16" if scheme == "bf16" else "row_data"


def dequantize(f, name, quantizer, rows, cols):
    """The rowwise copy of weight `name` ([rows][cols], cols padded) as FP32 (ptx/quant.h)."""
    scheme = quantizer.split()[0]
    data = f.get_tensor(f"{name}.{copy_name(scheme)}")
    if scheme == "bf16":
        return data.float()
    if scheme in ("delayed", "current"):
        return data.float() * f.get_tensor(f"{name}.scale_inv").float()[0]
    if scheme == "mxfp8":
        e8m0 = f.get_tensor(f"{name}.row_scale").int()
        scale = torch.exp2((e8m0 - 127).float()).repeat_interleave(32, dim=1)[:, :cols]
        return data.float() * scale
    if scheme == "block":
        s = f.get_tensor(f"{name}.row_scale").float()
        if "2d=1" in quantizer.split():  # [ceil(M/128)][ceil(K/128)]
            s = s.repeat_interleave(128, 0).repeat_interleave(128, 1)[:rows, :cols]
        else:  # [ceil(K/128)][M]
            s = s.t().repeat_interleave(128, 1)[:, :cols]
        return data.float() * s
    if scheme == "nvfp4":
        packed = data.to(torch.int64)
        codes = torch.stack([packed & 0xF, packed >> 4], dim=2).reshape(rows, -1)[:, :cols]
        values = E2M1[codes]
        amax = f.get_tensor(f"{name}.amax").float()[0]
        block = f.get_tensor(f"{name}.row_scale").float()
        scale = (block * amax) * torch.tensor(1.0 / 2688.0, dtype=torch.float32)
        return values * scale.repeat_interleave(16, dim=1)[:, :cols]
    fail(f"{name}: unknown scheme '{scheme}'")


def load_weights(path, layers, mode):
    weights = {}
    with safe_open(path, framework="pt") as f:
        metadata = f.metadata() or {}
        keys = set(f.keys())
        for kind, name, options in layers:
            if kind == "linear":
                master = f.get_tensor(f"{name}.weight").float()
                quantizer = metadata.get(f"qtrain.quantizer.{name}.weight")
                if mode == "quantized" and quantizer is not None:
                    copy = f"{name}.weight.{copy_name(quantizer.split()[0])}"
                    if copy not in keys:
                        fail(f"{path} has no quantized copies: export it with --quantized")
                    rows = master.shape[0]
                    padded = f.get_slice(copy).get_shape()[1]
                    if quantizer.split()[0] == "nvfp4":
                        padded *= 2
                    full = dequantize(f, f"{name}.weight", quantizer, rows, padded)
                    master = full[:, :master.shape[1]]
                weights[f"{name}.weight"] = master
                if options["bias"]:
                    weights[f"{name}.bias"] = f.get_tensor(f"{name}.bias").float()
            elif kind == "rmsnorm":
                weights[f"{name}.weight"] = f.get_tensor(f"{name}.weight").float()
    return weights, metadata


def forward(x, layers, weights, bf16):
    stack = []
    for kind, name, options in layers:
        if kind == "linear":
            x = x @ weights[f"{name}.weight"].t()
            if options["bias"]:
                x = x + weights[f"{name}.bias"]
        elif kind == "relu":
            x = F.relu(x)
        elif kind == "gelu":
            x = F.gelu(x, approximate="tanh")
        elif kind == "silu":
            x = F.silu(x)
        elif kind == "swiglu":
            a, b = x.chunk(2, dim=-1)
            x = F.silu(a) * b
        elif kind == "rmsnorm":
            x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + options["eps"])
            x = x * weights[f"{name}.weight"]
        elif kind == "residual_begin":
            stack.append(x)
            continue
        elif kind == "residual_end":
            x = x + stack.pop()
        if bf16:
            x = x.bfloat16().float()
    return x


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe")
    parser.add_argument("export")
    parser.add_argument("--weights", choices=("master", "quantized"), default="master")
    parser.add_argument("--activations", choices=("bf16", "fp32"), default="bf16")
    parser.add_argument("--expect", type=float, help="qtrain's eval accuracy in percent")
    parser.add_argument("--tolerance", type=float, default=0.1, help="points (default 0.1)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()

    sections = recipe_sections(args.recipe)
    layers, width = parse_model(sections.get("model", []))
    images, labels = eval_set(sections)
    if images.shape[1] != width:
        fail(f"the eval images have {images.shape[1]} features, the model {width}")
    weights, metadata = load_weights(args.export, layers, args.weights)
    device = torch.device(args.device)
    weights = {k: v.to(device) for k, v in weights.items()}
    correct = 0
    with torch.no_grad():
        for begin in range(0, images.shape[0], 1024):
            x = images[begin:begin + 1024].to(device).float() / 255.0
            logits = forward(x, layers, weights, args.activations == "bf16")
            correct += (logits.argmax(-1).cpu() == labels[begin:begin + 1024]).sum().item()
    accuracy = 100.0 * correct / images.shape[0]
    expected = args.expect
    if expected is None and "qtrain.eval_accuracy" in metadata:
        expected = 100.0 * float(metadata["qtrain.eval_accuracy"])
    print(f"accuracy {accuracy:.2f}% over {images.shape[0]} samples ({args.weights} weights, "
          f"{args.activations} activations, {metadata.get('qtrain.recipe', '?')} at train step "
          f"{metadata.get('qtrain.train_step', '?')})")
    if expected is None:
        print("no expected accuracy: the export has no eval row (pass --expect PERCENT)")
        return 0
    difference = accuracy - expected
    agree = abs(difference) <= args.tolerance
    print(f"qtrain    {expected:.2f}%: difference {difference:+.2f} points "
          f"({'within' if agree else 'beyond'} {args.tolerance} points)")
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
