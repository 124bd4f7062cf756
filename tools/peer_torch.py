#!/usr/bin/env python3
"""The PyTorch peer of qtrain's recipes: the same model, batch and optimizer, trained by PyTorch on
the same GPU, so that qtrain's step times have a yardstick measured in the same device call.

    python3 tools/peer_torch.py RECIPE... [--modes M,M] [--steps N] [--warmup N] [--json FILE]

The model ([model]: linear, relu, gelu (tanh form), silu, swiglu, rmsnorm, residual blocks, moe,
softmax_xent or mse), the optimizer ([optim]: AdamW with its lr, betas, eps, weight decay and
gradient-norm clip) and the batch come from the recipe file, so they cannot drift from what qtrain
runs. Weights start as in qtrain: normal(0, 1/sqrt(fan_in)), biases 0, RMSNorm gains 1.

An moe layer is qtrain's: a router linear (FP32 logits), softmax, the top-k experts per token
with the softmax probabilities as gates (not renormalized), the tokens sorted by expert (a
stable argsort), both expert GEMMs as one grouped matmul each (torch._grouped_mm, BF16, member
counts on the device), the activation between them, the gated outputs summed back per token
(index_add_), and the load-balancing loss alpha E sum_e f_e P_e (f_e the fraction of
assignments to expert e, P_e the mean probability) added to the loss. Without torch._grouped_mm
it loops over the experts (which reads the counts on the host, so the graph mode fails). In the
fp8 mode the experts and the router stay BF16 (PyTorch has no grouped FP8 GEMM to compare).
FLOP counts take the router and the k experts a token runs, not the idle ones.

A recipe whose training data is `synthetic classes` (recipes/bench/) is timed step by step in
these modes (the training step: forward, loss, backward, gradient clip, fused AdamW):
  eager    BF16 autocast, eager
  compile  BF16 autocast, the model and loss under torch.compile
  fp8      FP8 tensorwise: every linear through torch._scaled_mm (E4M3 forward, E5M2 gradients,
           current scaling: one amax per tensor per step) inside a custom autograd Function, under
           torch.compile; linears that a `rule = linear.*@NAME -> bf16` line of the recipe keeps
           in BF16 stay BF16 (the bench recipes' head)
  graph    BF16 autocast, the whole step captured in one CUDA graph (fused capturable AdamW)
The data is generated on the device (class centers N(0, spread^2 / inputs), spread 3 unless the
recipe's `spread=` says otherwise, N(0, 1) noise, uniform labels or with `zipf=S` label c with
weight 1 / (c + 1)^S; qtrain's generator draws other numbers of the same distribution) and batches
are slices of it.
Each mode warms up (compilation included), then times --steps steps (at least 30) with CUDA events
around each step and reports the median and mean ms/step, TFLOP/s of the step counted as
6 x batch x (weights of every linear), and torch.cuda.max_memory_allocated over the mode, also
less the dataset's bytes (which qtrain keeps in host memory unless the recipe says `resident = on`).

A recipe whose training data is `idx` (Fashion-MNIST, recipes/fashion_mnist_*.recipe) trains its
whole schedule with the step in one CUDA graph (BF16 autocast, fused capturable AdamW, the
recipe's learning-rate rows and per-epoch shuffle, the last batch of an epoch padded and its
padding rows ignored like qtrain's) and reports training steps/s (wall time of the train rows)
and the accuracy of the last eval pass. Run from the repository root (the recipes name the IDX
files by paths relative to it).

Output: one JSON line per mode (a line that starts with `{"peer": "torch"`), then a table. A mode
that fails prints its error and a JSON line with "ok": false; the others still run. The exit status
is 1 when any mode failed.
"""

import argparse
import fnmatch
import gc
import gzip
import json
import math
import statistics
import sys
import time
import traceback

# ------------------------------------------------------------------------------------------------
# Recipes: the subset of qtrain's format that the peer needs, read strictly enough to say what it
# does not understand.


class RecipeError(Exception):
    pass


def parse_options(tokens, where):
    opts = {}
    for tok in tokens:
        if "=" not in tok:
            raise RecipeError("%s: expected key=value, found '%s'" % (where, tok))
        key, value = tok.split("=", 1)
        opts[key] = value
    return opts


def parse_source(text, where):
    words = text.split()
    if not words:
        raise RecipeError("%s: empty data source" % where)
    if words[0] == "idx" and len(words) == 3:
        return {"kind": "idx", "images": words[1], "labels": words[2]}
    if words[0] == "synthetic" and len(words) >= 2 and words[1] in ("classes", "teacher"):
        opts = parse_options(words[2:], where)
        src = {"kind": words[1], "inputs": int(opts["inputs"]), "samples": int(opts["samples"]),
               "seed": int(opts.get("seed", "0")), "zipf": float(opts.get("zipf", "0")),
               "spread": float(opts.get("spread", "3"))}
        src["outputs"] = int(opts["classes"] if words[1] == "classes" else opts["outputs"])
        return src
    raise RecipeError("%s: unknown data source '%s'" % (where, text))


UNITS = {"step": "steps", "steps": "steps", "epoch": "epochs", "epochs": "epochs"}


def parse_train_row(words, where):
    """`train N [steps|epochs] [RULE] [warmup N [steps|epochs]] [eval ... every [N] UNIT]`."""
    row = {"mode": "train", "count": int(words[1]), "unit": "steps", "rule": "default",
           "warmup": None, "eval": None}
    i = 2
    if i < len(words) and words[i] in UNITS:
        row["unit"] = UNITS[words[i]]
        i += 1
    rule_start = i < len(words) and (words[i] in ("constant", "cosine", "decay") or (
        words[i] == "warmup" and i + 2 < len(words) and words[i + 2] == "->"))
    if rule_start and words[i] == "constant":
        row.update(rule="constant", a=float(words[i + 1]))
        i += 2
    elif rule_start:
        if i + 3 >= len(words) or words[i + 2] != "->":
            raise RecipeError("%s: expected '%s A -> B'" % (where, words[i]))
        row.update(rule="cosine" if words[i] == "cosine" else "linear", a=float(words[i + 1]),
                   b=float(words[i + 3]))
        i += 4
    while i < len(words):
        if words[i] == "warmup" and i + 1 < len(words):
            count, i = int(words[i + 1]), i + 2
            unit = "steps"
            if i < len(words) and words[i] in UNITS:
                unit, i = UNITS[words[i]], i + 1
            row["warmup"] = (count, unit)
        elif words[i] == "eval":
            i += 1
            clause = {"steps": "all", "dataset": "eval", "every": None}
            if i < len(words) and (words[i] == "all" or words[i].isdigit()):
                clause["steps"], i = words[i], i + 1
            if i < len(words) and words[i] in ("train", "eval"):
                clause["dataset"], i = words[i], i + 1
            if i >= len(words) or words[i] != "every":
                raise RecipeError("%s: expected 'eval ... every [N] steps|epochs'" % where)
            i, count = i + 1, 1
            if i < len(words) and words[i].isdigit():
                count, i = int(words[i]), i + 1
            if i >= len(words) or words[i] not in UNITS:
                raise RecipeError("%s: expected steps or epochs after 'every'" % where)
            clause["every"], i = (count, UNITS[words[i]]), i + 1
            row["eval"] = clause
        else:
            raise RecipeError("%s: unexpected '%s' in a train row" % (where, words[i]))
    return row


def parse_schedule_row(words, where):
    if words[0] == "train":
        return parse_train_row(words, where)
    if words[0] in ("eval", "infer"):
        return {"mode": words[0], "steps": words[1], "dataset": words[2] if len(words) > 2 else
                ("eval" if words[0] == "eval" else "")}
    raise RecipeError("%s: unknown schedule row '%s'" % (where, words[0]))


def parse_recipe(path):
    r = {"path": path, "layers": [], "rules": [], "optim": {}, "schedule": [], "seed": 0,
         "quant": "none", "eval": None}
    section = None
    with open(path) as f:
        lines = f.read().split("\n")
    for number, raw in enumerate(lines, 1):
        where = "%s:%d" % (path, number)
        line = raw
        for i, ch in enumerate(raw):  # '#' at the start of a line or after a blank
            if ch == "#" and (i == 0 or raw[i - 1] in " \t"):
                line = raw[:i]
                break
        line = line.strip()
        if not line:
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        if section == "schedule":
            r["schedule"].append(parse_schedule_row(line.split(), where))
            continue
        if section == "optim":
            words = line.split()
            if words[0] != "adamw":
                raise RecipeError("%s: the peer runs AdamW only, found '%s'" % (where, words[0]))
            r["optim"] = parse_options(words[1:], where)
            continue
        if "=" not in line:
            raise RecipeError("%s: expected key = value" % where)
        key, value = (s.strip() for s in line.split("=", 1))
        if section == "model":
            if key == "input":
                r["input"] = int(value)
            elif key == "layer":
                r["layers"].append(value.split())
            elif key == "loss":
                r["loss"] = value
            else:
                raise RecipeError("%s: unknown [model] key '%s'" % (where, key))
        elif section == "quant":
            if key == "recipe":
                r["quant"] = value
            elif key == "rule":
                r["rules"].append(value)
        elif section == "data":
            if key in ("train", "eval"):
                r[key] = parse_source(value, where)
            elif key == "batch":
                r["batch"] = int(value)
            elif key == "seed":
                r["seed"] = int(value)
        else:
            raise RecipeError("%s: a line outside the sections the peer reads" % where)
    for key in ("input", "loss", "train", "batch"):
        if key not in r:
            raise RecipeError("%s: no '%s' in the recipe" % (path, key))
    return r


def optim_hparams(r):
    o = r["optim"]
    betas = [float(b) for b in o.get("betas", "0.9,0.999").split(",")]
    return {"lr": float(o.get("lr", "1e-3")), "betas": (betas[0], betas[1]),
            "eps": float(o.get("eps", "1e-8")), "weight_decay": float(o.get("wd", "0.01")),
            "clip": float(o.get("clip", "0"))}


def bf16_linears(r):
    """Names of the linears whose weight a `-> bf16` rule of the recipe keeps in BF16."""
    patterns = []
    for rule in r["rules"]:
        role, _, scheme = rule.partition("->")
        if scheme.split() and scheme.split()[0] == "bf16" and "@" in role:
            module_tensor, name = role.strip().split("@", 1)
            if fnmatch.fnmatchcase("linear.weight", module_tensor):
                patterns.append(name)
    names = [layer[1] for layer in linear_layers(r)]
    return {n for n in names if any(fnmatch.fnmatchcase(n, p) for p in patterns)}


def linear_layers(r):
    return [layer for layer in r["layers"] if layer[0] == "linear"]


def moe_options(layer):
    o = parse_options(layer[2:], "moe")
    act = o.get("act", "gelu")
    hidden = int(o["hidden"])
    return {"experts": int(o["experts"]), "topk": int(o["topk"]), "hidden": hidden, "act": act,
            "aux": float(o.get("aux", "0.01")),
            "fc1": 2 * hidden if act == "swiglu" else hidden}


def linear_weights(r):
    """Elements of every linear's weight matrix (an moe layer: the router's and the k experts'
    a token runs): the FLOP count is 6 x batch x this."""
    width, total = r["input"], 0
    for layer in r["layers"]:
        if layer[0] == "linear":
            total += width * int(layer[2])
            width = int(layer[2])
        elif layer[0] == "swiglu":
            width //= 2
        elif layer[0] == "moe":
            o = moe_options(layer)
            total += width * o["experts"] + o["topk"] * (width * o["fc1"] + o["hidden"] * width)
    return total


def expand_schedule(r, epoch, default_lr):
    """The table qtrain builds from the [schedule] rows (runtime/schedule/schedule.c
    sched_table_build, without a --steps cut): rows {"mode", "steps", "dataset"} in order, a train row's epochs
    counted as `epoch` steps and its eval clause's eval rows put in, and the learning-rate rows
    {"start", "steps", "rule", "a", "b"}, a warmup clause's before its rule's."""
    rows, lr_rows, start = [], [], 0

    def steps_of(count, unit):
        return count * epoch if unit == "epochs" else count

    for row in r["schedule"]:
        if row["mode"] != "train":
            rows.append(row)
            continue
        total = steps_of(row["count"], row["unit"])
        rule = "constant" if row["rule"] == "default" else row["rule"]
        a = row.get("a", default_lr)
        b = row.get("b", a)
        warm = steps_of(*row["warmup"]) if row["warmup"] else 0
        if warm:
            lr_rows.append({"start": start, "steps": warm, "rule": "linear", "a": 0.0, "b": a})
        lr_rows.append({"start": start + warm, "steps": total - warm, "rule": rule, "a": a,
                        "b": b})
        start += total
        if not row["eval"]:
            rows.append({"mode": "train", "steps": total})
            continue
        every = steps_of(*row["eval"]["every"])
        for done in range(0, total, every):
            rows.append({"mode": "train", "steps": min(every, total - done)})
            rows.append({"mode": "eval", "steps": row["eval"]["steps"],
                         "dataset": row["eval"]["dataset"]})
    return rows, lr_rows


def lr_at(lr_rows, t):
    """qtrain's learning rate at train step t (ptx/optim.h qt_optim_lr_at)."""
    chosen = lr_rows[0]
    for row in lr_rows[1:]:
        if row["start"] <= t:
            chosen = row
    if chosen["rule"] == "constant" or chosen["steps"] == 0:
        return chosen["a"]
    d = min(max(t - chosen["start"], 0), chosen["steps"])
    f = d / chosen["steps"]
    w = f if chosen["rule"] == "linear" else 0.5 * (1.0 - math.cos(math.pi * f))
    return chosen["a"] + (chosen["b"] - chosen["a"]) * w


# ------------------------------------------------------------------------------------------------
# The model (torch is imported here, so that --help and the recipe reader work without it).

def torch_modules():
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Residual(nn.Module):
        def __init__(self, body):
            super().__init__()
            self.body = body

        def forward(self, x):
            return x + self.body(x)

    class SwiGLU(nn.Module):
        def forward(self, x):
            a, b = x.chunk(2, dim=-1)
            return F.silu(a) * b

    class RMSNorm(nn.Module):
        """nn.RMSNorm with its FP32 gain cast to the input's type: under autocast the input is
        BF16, and a gain of another type sends F.rms_norm to its slow unfused path."""

        def __init__(self, width, eps):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(width))
            self.eps = eps

        def forward(self, x):
            return F.rms_norm(x, self.weight.shape, self.weight.to(x.dtype), self.eps)

    class Fp8Matmul(torch.autograd.Function):
        """y = x w^T with both operands cast to FP8 E4M3 (one scale per tensor from its amax) and
        the gradient to E5M2; torch._scaled_mm takes its first operand row-major and its second
        column-major."""

        @staticmethod
        def forward(ctx, x, w):
            x8, x_inv = to_fp8(x, torch.float8_e4m3fn)
            w8, w_inv = to_fp8(w, torch.float8_e4m3fn)
            y = torch._scaled_mm(x8, w8.t(), scale_a=x_inv, scale_b=w_inv,
                                 out_dtype=torch.bfloat16)
            ctx.save_for_backward(x8, x_inv, w8, w_inv)
            return y

        @staticmethod
        def backward(ctx, gy):
            x8, x_inv, w8, w_inv = ctx.saved_tensors
            g8, g_inv = to_fp8(gy.contiguous(), torch.float8_e5m2)
            dx = torch._scaled_mm(g8, w8.t().contiguous().t(), scale_a=g_inv, scale_b=w_inv,
                                  out_dtype=torch.bfloat16)
            dw = torch._scaled_mm(g8.t().contiguous(), x8.t().contiguous().t(), scale_a=g_inv,
                                  scale_b=x_inv, out_dtype=torch.float32)
            return dx, dw

    def to_fp8(t, dtype):
        fmax = torch.finfo(dtype).max
        amax = t.detach().abs().amax().float().clamp(min=1e-12)
        scale = fmax / amax
        q = (t.float() * scale).clamp(-fmax, fmax).to(dtype)
        return q, scale.reciprocal()

    class Fp8Linear(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.weight, self.bias = inner.weight, inner.bias

        def forward(self, x):
            shape = x.shape
            y = Fp8Matmul.apply(x.reshape(-1, shape[-1]).to(torch.bfloat16), self.weight)
            if self.bias is not None:
                y = y + self.bias.to(y.dtype)
            return y.reshape(*shape[:-1], y.shape[-1])

    class AuxLoss(torch.autograd.Function):
        """Passes x through and adds `aux` to the loss: its gradient is 1 whatever the loss."""

        @staticmethod
        def forward(ctx, x, aux):
            return x

        @staticmethod
        def backward(ctx, gx):
            return gx, torch.ones((), device=gx.device, dtype=torch.float32)

    acts = {"relu": F.relu, "gelu": lambda t: F.gelu(t, approximate="tanh"), "silu": F.silu,
            "swiglu": lambda t: F.silu(t.chunk(2, dim=-1)[0]) * t.chunk(2, dim=-1)[1]}

    def grouped(x, w, counts, offs):
        """x [rows][k] sorted by expert, w [E][n][k]: each expert's rows times its w^T."""
        if hasattr(torch, "_grouped_mm"):
            return torch._grouped_mm(x, w.transpose(1, 2), offs=offs)
        outs, start = [], 0
        for e, c in enumerate(counts.tolist()):
            outs.append(x[start:start + c] @ w[e].t())
            start += c
        return torch.cat(outs)

    class MoE(nn.Module):
        def __init__(self, width, o):
            super().__init__()
            self.o = o
            e = o["experts"]
            self.router = nn.Parameter(torch.randn(e, width) / math.sqrt(width))
            self.w1 = nn.Parameter(torch.randn(e, o["fc1"], width) / math.sqrt(width))
            self.w2 = nn.Parameter(torch.randn(e, width, o["hidden"]) / math.sqrt(o["hidden"]))

        def forward(self, x):
            o, shape = self.o, x.shape
            x = x.reshape(-1, shape[-1])
            tokens, e, k = x.shape[0], o["experts"], o["topk"]
            with torch.autocast("cuda", enabled=False):  # FP32 logits, as qtrain's router
                logits = F.linear(x.float(), self.router.float())
            probs = logits.softmax(dim=-1)
            gate, choice = probs.topk(k, dim=-1)
            flat = choice.reshape(-1)
            order = flat.argsort(stable=True)
            token = order // k
            # scatter_add, not bincount: its output size would be read on the host.
            counts = torch.zeros(e, dtype=torch.long, device=x.device)
            counts.scatter_add_(0, flat, torch.ones_like(flat))
            offs = counts.cumsum(0).to(torch.int32)
            xs = x.to(torch.bfloat16)[token]
            h = acts[o["act"]](grouped(xs, self.w1.to(torch.bfloat16), counts, offs))
            ys = grouped(h, self.w2.to(torch.bfloat16), counts, offs)
            ys = ys * gate.reshape(-1)[order].unsqueeze(1).to(ys.dtype)
            out = torch.zeros(tokens, shape[-1], device=x.device, dtype=ys.dtype)
            out = out.index_add(0, token, ys)
            if o["aux"] > 0 and self.training:
                f = counts.float() / (tokens * k)
                aux = o["aux"] * e * (f.detach() * probs.mean(dim=0)).sum()
                out = AuxLoss.apply(out, aux)
            return out.reshape(shape)

    return torch, nn, Residual, SwiGLU, RMSNorm, Fp8Linear, MoE


def build_model(r, device, fp8=False):
    torch, nn, Residual, SwiGLU, RMSNorm, Fp8Linear, MoE = torch_modules()
    torch.manual_seed(r["seed"])
    keep_bf16 = bf16_linears(r) if fp8 else set()
    stack = [[]]  # layers of each open residual block
    widths = [r["input"]]
    width = r["input"]
    for layer in r["layers"]:
        kind = layer[0]
        if kind == "linear":
            out = int(layer[2])
            lin = nn.Linear(width, out, bias="bias" in layer[3:])
            with torch.no_grad():
                lin.weight.normal_(0.0, 1.0 / math.sqrt(width))
                if lin.bias is not None:
                    lin.bias.zero_()
            stack[-1].append(Fp8Linear(lin) if fp8 and layer[1] not in keep_bf16 else lin)
            width = out
        elif kind == "relu":
            stack[-1].append(nn.ReLU())
        elif kind == "gelu":
            stack[-1].append(nn.GELU(approximate="tanh"))
        elif kind == "silu":
            stack[-1].append(nn.SiLU())
        elif kind == "swiglu":
            stack[-1].append(SwiGLU())
            width //= 2
        elif kind == "moe":
            stack[-1].append(MoE(width, moe_options(layer)))
        elif kind == "rmsnorm":
            opts = parse_options([w for w in layer[1:] if "=" in w], "rmsnorm")
            stack[-1].append(RMSNorm(width, float(opts.get("eps", "1e-5"))))
        elif kind == "residual" and layer[1] == "begin":
            stack.append([])
            widths.append(width)
        elif kind == "residual" and layer[1] == "end":
            body = stack.pop()
            if widths.pop() != width:
                raise RecipeError("a residual block changes the width")
            stack[-1].append(Residual(nn.Sequential(*body)))
        else:
            raise RecipeError("the peer does not build '%s' layers" % " ".join(layer))
    if len(stack) != 1:
        raise RecipeError("an unclosed residual block")
    return nn.Sequential(*stack[0]).to(device)


def loss_fn(r):
    import torch.nn.functional as F
    if r["loss"] == "softmax_xent":
        return lambda out, y: F.cross_entropy(out.float(), y, ignore_index=-1)
    if r["loss"] == "mse":
        return lambda out, y: F.mse_loss(out.float(), y)
    raise RecipeError("the peer does not know loss '%s'" % r["loss"])


def make_optimizer(model, hp, capturable, device):
    import torch
    lr = torch.tensor(hp["lr"], device=device) if capturable else hp["lr"]
    return torch.optim.AdamW(model.parameters(), lr=lr, betas=hp["betas"], eps=hp["eps"],
                             weight_decay=hp["weight_decay"], fused=True, capturable=capturable)


# ------------------------------------------------------------------------------------------------
# Step timing on synthetic data

def synthetic_data(r, device):
    import torch
    src = r["train"]
    g = torch.Generator(device=device)
    g.manual_seed(src["seed"])
    n, k, samples = src["inputs"], src["outputs"], src["samples"]
    if src["kind"] == "classes":
        centers = torch.randn(k, n, generator=g, device=device) * (src["spread"] / math.sqrt(n))
        if src["zipf"] > 0:  # label c with weight 1 / (c + 1)^zipf, as qtrain draws them
            w = torch.arange(1, k + 1, device=device, dtype=torch.float64) ** -src["zipf"]
            y = torch.multinomial(w, samples, replacement=True, generator=g)
        else:
            y = torch.randint(0, k, (samples,), generator=g, device=device)
        x = centers[y] + torch.randn(samples, n, generator=g, device=device)
        del centers
    else:
        x = torch.randn(samples, n, generator=g, device=device)
        y = torch.randn(samples, k, generator=g, device=device)
    return x, y


class Step:
    """One training step of a mode: step(i) runs it on batch i (mod the batches)."""

    def __init__(self, r, mode, device, batches):
        import torch
        self.torch = torch
        self.batches = batches
        self.hp = optim_hparams(r)
        self.model = build_model(r, device, fp8=(mode == "fp8"))
        self.params = list(self.model.parameters())
        self.loss = loss_fn(r)
        self.graph = None
        if mode == "graph":
            self.opt = make_optimizer(self.model, self.hp, True, device)
            self._capture()
        else:
            self.opt = make_optimizer(self.model, self.hp, False, device)
            fwd = self._forward_loss
            if mode in ("compile", "fp8"):
                torch._dynamo.reset()
                fwd = torch.compile(fwd)
            self.fwd = fwd

    def _forward_loss(self, x, y):
        # No cast cache: a captured graph must recast the weights on every replay.
        with self.torch.autocast("cuda", dtype=self.torch.bfloat16, cache_enabled=False):
            return self.loss(self.model(x), y)

    def _body(self, x, y, fwd):
        loss = fwd(x, y)
        loss.backward()
        if self.hp["clip"] > 0:
            self.torch.nn.utils.clip_grad_norm_(self.params, self.hp["clip"], foreach=True)
        self.opt.step()
        return loss

    def _capture(self):
        torch = self.torch
        x0, y0 = self.batches[0]
        self.static_x, self.static_y = x0.clone(), y0.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up outside the graph, as capture requires
            for _ in range(3):
                self.opt.zero_grad(set_to_none=True)
                self._body(self.static_x, self.static_y, self._forward_loss)
        torch.cuda.current_stream().wait_stream(side)
        # Gradients are None at capture, so the captured backward assigns them on every replay.
        self.opt.zero_grad(set_to_none=True)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.static_loss = self._body(self.static_x, self.static_y, self._forward_loss)

    def __call__(self, i):
        x, y = self.batches[i % len(self.batches)]
        if self.graph is not None:
            self.static_x.copy_(x, non_blocking=True)
            self.static_y.copy_(y, non_blocking=True)
            self.graph.replay()
            return self.static_loss
        self.opt.zero_grad(set_to_none=True)
        return self._body(x, y, self.fwd)


def timed_steps(step, first, steps):
    """step(i) for i in first .. first + steps - 1, each between two CUDA events on the current
    stream: the ms of each, the ms from the first start to the last end, the last step's loss."""
    import torch
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(steps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(steps)]
    loss = None
    for i in range(steps):
        starts[i].record()
        loss = step(first + i)
        ends[i].record()
    torch.cuda.synchronize()
    ms = [s.elapsed_time(e) for s, e in zip(starts, ends)]
    return ms, starts[0].elapsed_time(ends[-1]), loss


def time_steps(r, mode, device, batches, steps, warmup, data_bytes):
    import torch
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    step = Step(r, mode, device, batches)
    for i in range(warmup):
        step(i)
    torch.cuda.synchronize()
    setup_s = time.perf_counter() - t0
    ms, total_ms, loss = timed_steps(step, warmup, steps)
    peak = torch.cuda.max_memory_allocated()
    flop = 6 * r["batch"] * linear_weights(r)
    median = statistics.median(ms)
    return {"ms_median": median, "ms_mean": total_ms / steps, "ms_min": min(ms),
            "ms_max": max(ms), "steps": steps, "warmup": warmup, "setup_s": setup_s,
            "flop_per_step": flop, "tflops": flop / (median * 1e-3) / 1e12,
            "peak_bytes": peak, "peak_model_bytes": peak - data_bytes, "data_bytes": data_bytes,
            "loss": float(loss.item())}


def run_synthetic(r, modes, steps, warmup, device, report):
    import torch
    x, y = synthetic_data(r, device)
    b = r["batch"]
    batches = [(x[i:i + b], y[i:i + b]) for i in range(0, x.shape[0] - b + 1, b)]
    if not batches:
        raise RecipeError("%s: fewer samples than one batch" % r["path"])
    data_bytes = x.numel() * x.element_size() + y.numel() * y.element_size()
    for mode in modes:
        try:
            result = time_steps(r, mode, device, batches, steps, warmup, data_bytes)
            report(r, mode, result)
        except Exception as e:  # one mode's failure must not lose the others
            traceback.print_exc()
            report(r, mode, {"error": "%s: %s" % (type(e).__name__, e)})
        # A compiled step refers back to its Step (a cycle): collect it, so that the next mode's
        # peak memory starts from the dataset alone.
        gc.collect()
        torch._dynamo.reset()
        torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------------------
# Whole training runs on IDX data (Fashion-MNIST), the step in one CUDA graph

def read_idx(path, images):
    with open(path, "rb") as f:
        data = f.read()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    magic = int.from_bytes(data[0:4], "big")
    count = int.from_bytes(data[4:8], "big")
    if images:
        if magic != 0x803:
            raise RecipeError("%s: not an IDX image file" % path)
        rows, cols = int.from_bytes(data[8:12], "big"), int.from_bytes(data[12:16], "big")
        return data[16:16 + count * rows * cols], count, rows * cols
    if magic != 0x801:
        raise RecipeError("%s: not an IDX label file" % path)
    return data[8:8 + count], count, 1


def train_samples(r):
    """Samples of the train source (an epoch's length), or None when its files are absent."""
    src = r["train"]
    if src["kind"] != "idx":
        return src["samples"]
    try:
        return read_idx(src["labels"], False)[1]
    except OSError:
        return None


def idx_tensors(src, device):
    import torch
    pixels, count, features = read_idx(src["images"], True)
    labels, label_count, _ = read_idx(src["labels"], False)
    if label_count != count:
        raise RecipeError("%s: %d labels for %d images" % (src["labels"], label_count, count))
    x = torch.frombuffer(bytearray(pixels), dtype=torch.uint8).reshape(count, features)
    y = torch.frombuffer(bytearray(labels), dtype=torch.uint8).to(torch.int64)
    return x.to(device).float() / 255.0, y.to(device)


def padded_batches(x, y, batch, perm=None):
    """One epoch in batches; the last is padded with zero rows labelled -1 (ignored)."""
    import torch
    samples = x.shape[0]
    nb = (samples + batch - 1) // batch
    xe = torch.zeros(nb * batch, x.shape[1], device=x.device)
    ye = torch.full((nb * batch,), -1, dtype=torch.int64, device=x.device)
    xe[:samples] = x if perm is None else x[perm]
    ye[:samples] = y if perm is None else y[perm]
    return [(xe[i * batch:(i + 1) * batch], ye[i * batch:(i + 1) * batch]) for i in range(nb)]


def evaluate(model, batches, samples):
    import torch
    correct, loss_sum = 0, 0.0
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        for xb, yb in batches:
            out = model(xb).float()
            valid = yb >= 0
            loss_sum += float(torch.nn.functional.cross_entropy(
                out, yb, ignore_index=-1, reduction="sum"))
            correct += int(((out.argmax(dim=1) == yb) & valid).sum())
    return correct / samples, loss_sum / samples


def run_idx(r, device, report):
    import torch
    torch.cuda.reset_peak_memory_stats()
    x, y = idx_tensors(r["train"], device)
    ex, ey = idx_tensors(r["eval"], device) if r["eval"] else (None, None)
    data_bytes = sum(t.numel() * t.element_size() for t in (x, y, ex, ey) if t is not None)
    hp = optim_hparams(r)
    b = r["batch"]
    g = torch.Generator(device=device)
    g.manual_seed(r["seed"])
    epoch_batches = padded_batches(x, y, b, torch.randperm(x.shape[0], generator=g,
                                                           device=device))
    step = Step(r, "graph", device, epoch_batches)
    # Capture warmed the weights and the optimizer up on 3 steps; start the training from fresh
    # weights and moments with the same graph (its tensors are updated in place).
    fresh = build_model(r, device)
    with torch.no_grad():
        for p, q in zip(step.model.parameters(), fresh.parameters()):
            p.copy_(q)
    for state in step.opt.state.values():
        for value in state.values():
            value.zero_()
    del fresh
    eval_batches = padded_batches(ex, ey, b) if ex is not None else None
    t, position, train_s, accuracy, eval_loss = 0, 0, 0.0, None, None
    train_steps = 0
    schedule, lr_rows = expand_schedule(r, len(epoch_batches), hp["lr"])
    for row in schedule:
        if row["mode"] == "train":
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(row["steps"]):
                if position == len(epoch_batches):
                    perm = torch.randperm(x.shape[0], generator=g, device=device)
                    epoch_batches = padded_batches(x, y, b, perm)
                    step.batches, position = epoch_batches, 0
                step.opt.param_groups[0]["lr"].fill_(lr_at(lr_rows, t))
                step(position)
                position += 1
                t += 1
            torch.cuda.synchronize()
            train_s += time.perf_counter() - t0
            train_steps += row["steps"]
        elif row["mode"] == "eval" and eval_batches is not None:
            accuracy, eval_loss = evaluate(step.model, eval_batches, ex.shape[0])
    result = {"steps": train_steps, "steps_per_s": train_steps / train_s if train_s else 0.0,
              "ms_mean": 1e3 * train_s / train_steps if train_steps else 0.0,
              "eval_accuracy": accuracy, "eval_loss": eval_loss,
              "loss": float(step.static_loss.item()),
              "flop_per_step": 6 * b * linear_weights(r),
              "peak_bytes": torch.cuda.max_memory_allocated(),
              "peak_model_bytes": torch.cuda.max_memory_allocated() - data_bytes,
              "data_bytes": data_bytes}
    result["tflops"] = (result["flop_per_step"] * result["steps_per_s"] / 1e12)
    report(r, "graph-train", result)


# ------------------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("recipes", nargs="+", metavar="RECIPE")
    ap.add_argument("--modes", default="eager,compile,fp8,graph",
                    help="step-timing modes for synthetic recipes (default: all four)")
    ap.add_argument("--steps", type=int, default=50, help="timed steps per mode (>= 30)")
    ap.add_argument("--warmup", type=int, default=10, help="untimed steps first (compilation)")
    ap.add_argument("--json", metavar="FILE", help="also append the JSON lines to FILE")
    ap.add_argument("--parse-only", action="store_true",
                    help="read the recipes and print what would run, without torch")
    args = ap.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    bad = [m for m in modes if m not in ("eager", "compile", "fp8", "graph")]
    if bad or not modes:
        ap.error("unknown mode(s) %s: choose from eager, compile, fp8, graph" % ",".join(bad))
    if args.steps < 30:
        ap.error("--steps must be at least 30 for a median")

    recipes = []
    for path in args.recipes:
        try:
            recipes.append(parse_recipe(path))
        except (OSError, RecipeError, ValueError, KeyError) as e:
            print("peer_torch: %s: %s" % (path, e), file=sys.stderr)
            return 2
    if args.parse_only:
        for r in recipes:
            kind = r["train"]["kind"]
            print("%s: %s data, batch %d, %d weights in linears, %d FLOP per step, %s" % (
                r["path"], kind, r["batch"], linear_weights(r),
                6 * r["batch"] * linear_weights(r),
                "modes " + ",".join(modes) if kind != "idx" else "whole-run graph"))
            samples = train_samples(r)
            if samples is None:
                continue
            schedule, lr_rows = expand_schedule(r, -(-samples // r["batch"]),
                                                optim_hparams(r)["lr"])
            print("  schedule: %d rows, %d train steps; learning-rate rows: %s" % (
                len(schedule), sum(row["steps"] for row in schedule if row["mode"] == "train"),
                ", ".join("%d+%d %s %g -> %g" % (lr["start"], lr["steps"], lr["rule"], lr["a"],
                                                  lr["b"]) for lr in lr_rows)))
        return 0

    import torch
    if not torch.cuda.is_available():
        print("peer_torch: no CUDA device: the peer runs on a GPU only", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    gpu = torch.cuda.get_device_name(device)
    rows, failed = [], []
    json_file = open(args.json, "a") if args.json else None

    def report(r, mode, result):
        line = {"peer": "torch", "recipe": r["path"], "mode": mode, "ok": "error" not in result,
                "batch": r["batch"], "torch": torch.__version__, "device": gpu}
        line.update(result)
        text = json.dumps(line, sort_keys=False)
        print(text, flush=True)
        if json_file:
            json_file.write(text + "\n")
            json_file.flush()
        rows.append(line)
        if "error" in result:
            failed.append(line)

    for r in recipes:
        try:
            if r["train"]["kind"] == "idx":
                run_idx(r, device, report)
            else:
                run_synthetic(r, modes, args.steps, args.warmup, device, report)
        except Exception as e:
            traceback.print_exc()
            report(r, "all", {"error": "%s: %s" % (type(e).__name__, e)})

    print("\n| recipe | mode | ms/step (median) | steps/s | TFLOP/s | peak MiB (less data) | "
          "loss | eval accuracy |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        if not row["ok"]:
            print("| %s | %s | failed: %s | | | | | |" % (row["recipe"], row["mode"],
                                                         row["error"]))
            continue
        ms = row.get("ms_median", row.get("ms_mean"))
        acc = row.get("eval_accuracy")
        print("| %s | %s | %.2f | %.1f | %.0f | %.0f | %.4g | %s |" % (
            row["recipe"], row["mode"], ms, row.get("steps_per_s", 1e3 / ms), row["tflops"],
            row["peak_model_bytes"] / 2**20, row["loss"],
            "%.2f%%" % (100 * acc) if acc is not None else ""))
    if json_file:
        json_file.close()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
