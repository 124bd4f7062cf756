#!/usr/bin/env python3
"""PyTorch DDP of a qtrain bench recipe's model: the yardstick of `qtrain run --gpus N`.

    python3 tools/ddp_torch.py RECIPE [--gpus 2,1] [--steps N] [--warmup N] [--json FILE]

The model, the optimizer and the batch come from the recipe through tools/peer_torch.py (the same
parser and model builder as the one-GPU peer: normal(0, 1/sqrt(fan_in)) weights, tanh GELU,
RMSNorm, residual blocks, fused AdamW with the recipe's hyper-parameters and gradient clip). The
recipe's batch is the global batch, as in qtrain: each of the N ranks takes batch / N rows of it.
Each world size in --gpus runs as its own torch.multiprocessing.spawn of N processes, one per GPU,
joined by the NCCL backend through a file in a temporary folder (no network), with NVLink multicast
off (NCCL_NVLS_ENABLE=0, as the GPU machines set it). The step is DDP's: BF16 autocast, forward,
loss, backward (the gradients all-reduced in DDP's buckets, overlapped with the backward pass),
gradient clip, fused AdamW. After --warmup steps, --steps steps are timed on rank 0 with CUDA
events around each step (every rank runs in lockstep through the collectives); the median and mean
ms/step, the throughput (samples/s of the global batch) and rank 0's peak memory are reported.

Output: one JSON line per world size (`{"peer": "torch-ddp", ...}`), then a table; exit status 1
when any world size failed (its error is printed and the others still run).
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_torch  # noqa: E402  (the recipe parser and the model builder)


def worker(rank, world, recipe_path, steps, warmup, init_file, out_file):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method="file://" + init_file, rank=rank,
                            world_size=world)
    try:
        r = peer_torch.parse_recipe(recipe_path)
        device = torch.device("cuda", rank)
        batch = r["batch"]
        if batch % world:
            raise peer_torch.RecipeError("batch %d is not divisible by %d GPUs" % (batch, world))
        share = batch // world
        x, y = peer_torch.synthetic_data(r, device)
        # Rank r's contiguous share of each global batch, as qtrain splits it.
        batches = []
        for start in range(0, x.shape[0] - batch + 1, batch):
            lo = start + rank * share
            batches.append((x[lo:lo + share], y[lo:lo + share]))
        hp = peer_torch.optim_hparams(r)
        model = DDP(peer_torch.build_model(r, device), device_ids=[rank])
        loss_fn = peer_torch.loss_fn(r)
        opt = peer_torch.make_optimizer(model, hp, False, device)
        params = list(model.parameters())

        def step(i):
            bx, by = batches[i % len(batches)]
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = loss_fn(model(bx), by)
            loss.backward()
            if hp["clip"] > 0:
                torch.nn.utils.clip_grad_norm_(params, hp["clip"], foreach=True)
            opt.step()
            return loss

        torch.cuda.reset_peak_memory_stats(device)
        for i in range(warmup):
            step(i)
        torch.cuda.synchronize(device)
        ms, total_ms, loss = peer_torch.timed_steps(step, warmup, steps)
        if rank == 0:
            median = statistics.median(ms)
            flop = 6 * batch * peer_torch.linear_weights(r)
            result = {"peer": "torch-ddp", "recipe": recipe_path, "gpus": world, "ok": True,
                      "batch": batch, "batch_per_gpu": share, "ms_median": median,
                      "ms_mean": total_ms / steps,
                      "samples_per_s": batch / (median * 1e-3),
                      "tflops": flop / (median * 1e-3) / 1e12,
                      "peak_bytes": torch.cuda.max_memory_allocated(device),
                      "loss": float(loss.item()), "steps": steps, "warmup": warmup}
            with open(out_file, "w") as f:
                json.dump(result, f)
    finally:
        dist.destroy_process_group()


def run_world(recipe, world, steps, warmup):
    import torch
    import torch.multiprocessing as mp
    if torch.cuda.device_count() < world:
        raise RuntimeError("%d GPUs asked for, %d present" % (world, torch.cuda.device_count()))
    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "init")
        out_file = os.path.join(tmp, "result.json")
        start = time.perf_counter()
        mp.spawn(worker, args=(world, recipe, steps, warmup, init_file, out_file), nprocs=world,
                 join=True)
        with open(out_file) as f:
            result = json.load(f)
        result["wall_s"] = time.perf_counter() - start
        return result


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("recipe")
    ap.add_argument("--gpus", default="2,1", help="world sizes to run, in order (default 2,1)")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--json", help="append the JSON lines to this file too")
    args = ap.parse_args()
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    results, failed = [], False
    for world in [int(w) for w in args.gpus.split(",") if w]:
        try:
            result = run_world(args.recipe, world, args.steps, args.warmup)
        except Exception as e:  # one world size failing leaves the others to run
            traceback.print_exc()
            result = {"peer": "torch-ddp", "recipe": args.recipe, "gpus": world, "ok": False,
                      "error": str(e)}
            failed = True
        line = json.dumps(result)
        print(line, flush=True)
        if args.json:
            with open(args.json, "a") as f:
                f.write(line + "\n")
        results.append(result)
    print("| GPUs | global batch | per GPU | ms/step (median) | samples/s | TFLOP/s | peak GiB |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        if not r.get("ok"):
            print("| %d | - | - | failed | - | - | - |" % r["gpus"])
            continue
        print("| %d | %d | %d | %.2f | %.0f | %.1f | %.2f |" % (
            r["gpus"], r["batch"], r["batch_per_gpu"], r["ms_median"], r["samples_per_s"],
            r["tflops"], r["peak_bytes"] / 2**30))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
