"""vLLM's own fused-MoE Triton kernel at GLM-5-FP8's tensor-parallel-8 shapes, timed on this GPU.

What vLLM runs for GLM-5-FP8's routed experts on an H200 at TP 8 (no expert parallelism, no
DeepGEMM): ``fused_moe_kernel`` from ``vllm/model_executor/layers/fused_moe/fused_moe.py`` with the
tuned config ``E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json``
that vLLM ships (N = moe_intermediate_size 2,048 / 8).  This script loads that kernel's source
from a vLLM install (or from ``--kernel-file``: the CUDA machine need not have vLLM), prepares
what ``moe_align_block_size`` would (tokens sorted by expert, padded to BLOCK_SIZE_M), block-wise
FP8 weights and activations with 128 x 128 / 1 x 128 scales, and times the two grouped GEMMs of
one MoE layer (gate_up 6,144 -> 512 per rank, down 256 -> 6,144) for a chunk of T tokens routed
top-8 of 256 uniformly at random.  The activation, its re-quantisation and the top-k are not
timed (elementwise, small).

It prints per T: ms per layer (median, p90), TFLOP/s, the fraction of the H200's dense FP8 peak
(1,979 TFLOP/s) and of its HBM bandwidth (4.8 TB/s) reading the rank's expert weights.  Needs a
CUDA GPU, PyTorch and Triton; not part of the test suite.

    python benchmarks/sim/gpu_vllm_moe.py --kernel-file fused_moe.py --config E=256,...json --json out.json
"""

from __future__ import annotations

import argparse
import ast
import json
import statistics
import sys
from pathlib import Path

HIDDEN, MOE_I, EXPERTS, TOP_K, TP = 6144, 2048, 256, 8, 8  # GLM-5 config.json; TP 8
FP8_PEAK, HBM = 1979e12, 4.8e12  # H200 SXM datasheet (dense FP8; HBM3e)
BLOCK = 128  # GLM-5-FP8's weight_block_size


def load_kernel(path: Path):
    """``fused_moe_kernel`` (and the jit helper it calls) from vLLM's source file, as a module of its
    own: Triton reads a kernel's source through ``inspect``, so it must live in a real file."""
    import importlib.util
    import tempfile

    src = path.read_text()
    tree = ast.parse(src)
    wanted = {"write_zeros_to_output", "fused_moe_kernel"}
    parts = [ast.get_source_segment(src, n) for n in tree.body if getattr(n, "name", None) in wanted]
    out = Path(tempfile.mkdtemp()) / "vllm_fused_moe_kernel.py"
    body = "\n\n\n".join("@triton.jit\n" + part for part in parts if part)  # a segment starts at `def`
    out.write_text("import triton\nimport triton.language as tl\n\n\n" + body + "\n")
    spec = importlib.util.spec_from_file_location(out.stem, out)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.fused_moe_kernel


def pick_config(configs: dict, m: int) -> dict:
    """vLLM's rule (``try_get_optimal_moe_config``): the tuned entry whose batch size is nearest."""
    return dict(configs[min(configs, key=lambda k: abs(int(k) - m))])


def align(torch, topk_ids, block_m: int, num_experts: int):
    """``moe_align_block_size`` in torch: slot ids sorted by expert, each expert padded to block_m."""
    flat = topk_ids.flatten()
    n = flat.numel()
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=num_experts)
    padded = (counts + block_m - 1) // block_m * block_m
    total = int(padded.sum())
    sorted_ids = torch.full((total,), n, dtype=torch.int32, device=flat.device)
    starts = torch.cumsum(padded, 0) - padded
    pos = torch.arange(n, device=flat.device) - (torch.cumsum(counts, 0) - counts).repeat_interleave(counts)
    sorted_ids[(starts.repeat_interleave(counts) + pos).long()] = order.int()
    expert_ids = torch.arange(num_experts, device=flat.device, dtype=torch.int32).repeat_interleave(padded // block_m)
    return sorted_ids, expert_ids, torch.tensor([total], dtype=torch.int32, device=flat.device)


def launch(torch, triton, tl, kernel, a, a_scale, b, b_scale, c, topk_w, ids, top_k: int, cfg: dict):
    sorted_ids, expert_ids, post = ids
    cfg = dict(cfg)
    bm, bn = cfg["BLOCK_SIZE_M"], cfg["BLOCK_SIZE_N"]
    swap = torch.cuda.get_device_capability() == (9, 0) and bm < 64 and bn >= 64  # vLLM's enable_swap_ab
    em = sorted_ids.numel()
    grid = (triton.cdiv(em, bm) * triton.cdiv(b.size(1), bn),)
    cfg["SPLIT_K"] = 1
    bk = min(cfg.pop("BLOCK_SIZE_K"), BLOCK)
    kernel[grid](
        a, b, c, None, a_scale, b_scale, topk_w, sorted_ids, expert_ids, post,
        b.size(1), b.size(2), em, a.size(0) * top_k,
        a.stride(0), a.stride(1), b.stride(0), b.stride(2), b.stride(1), c.stride(1), c.stride(2),
        a_scale.stride(0), a_scale.stride(1), b_scale.stride(0), b_scale.stride(2), b_scale.stride(1), 0, 0,
        BLOCK, BLOCK,
        MUL_ROUTED_WEIGHT=topk_w is not None, top_k=top_k, compute_type=tl.bfloat16, use_fp8_w8a8=True,
        use_int8_w8a8=False, use_int8_w8a16=False, per_channel_quant=False, naive_block_assignment=False,
        HAS_BIAS=False, BLOCK_SIZE_K=bk, SWAP_AB=swap, USE_TD=False, **cfg,
    )  # fmt: skip


def check(torch, a, sa, w, sw, c, topk_ids, slots: int = 4) -> None:
    """The kernel's gate_up output for a few (token, k) slots against a dequantised matmul."""
    up = lambda s, rows, cols: s.repeat_interleave(BLOCK, -2)[..., :rows, :].repeat_interleave(BLOCK, -1)[..., :cols]  # noqa: E731
    for t in range(min(slots, a.size(0))):
        e = int(topk_ids[t, 0])
        x = a[t].float() * sa[t].repeat_interleave(BLOCK)
        ref = (up(sw[e], w.size(1), w.size(2)) * w[e].float()) @ x
        err = (c[t, 0].float() - ref).abs().max() / ref.abs().max()
        if err > 0.02:
            raise SystemExit(f"kernel output differs from the reference: relative error {err:.3g}")


def layer(torch, triton, tl, kernel, configs, tokens: int, reps: int = 20) -> dict:
    dev, f8 = "cuda", torch.float8_e4m3fn
    n1, k2 = 2 * MOE_I // TP, MOE_I // TP
    cfg = pick_config(configs, tokens)
    topk_ids = torch.rand(tokens, EXPERTS, device=dev).topk(TOP_K, dim=1).indices.int()
    topk_w = torch.rand(tokens, TOP_K, device=dev)
    ids = align(torch, topk_ids, cfg["BLOCK_SIZE_M"], EXPERTS)
    a1 = torch.randn(tokens, HIDDEN, device=dev).to(f8)
    s1 = torch.rand(tokens, HIDDEN // BLOCK, device=dev)
    w1 = torch.randn(EXPERTS, n1, HIDDEN, device=dev).to(f8)
    sw1 = torch.rand(EXPERTS, n1 // BLOCK, HIDDEN // BLOCK, device=dev)
    c1 = torch.empty(tokens, TOP_K, n1, device=dev, dtype=torch.bfloat16)
    a2 = torch.randn(tokens * TOP_K, k2, device=dev).to(f8)
    s2 = torch.rand(tokens * TOP_K, k2 // BLOCK, device=dev)
    w2 = torch.randn(EXPERTS, HIDDEN, k2, device=dev).to(f8)
    sw2 = torch.rand(EXPERTS, HIDDEN // BLOCK, k2 // BLOCK, device=dev)
    c2 = torch.empty(tokens, TOP_K, HIDDEN, device=dev, dtype=torch.bfloat16)

    def run():
        launch(torch, triton, tl, kernel, a1, s1, w1, sw1, c1, None, ids, TOP_K, cfg)
        launch(torch, triton, tl, kernel, a2, s2, w2, sw2, c2, topk_w, ids, 1, cfg)

    run()
    check(torch, a1, s1, w1, sw1, c1, topk_ids)
    for _ in range(5):
        run()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        run()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1))
    times.sort()
    ms, p90 = statistics.median(times), times[int(0.9 * (len(times) - 1))]
    flops = 2 * tokens * TOP_K * (HIDDEN * n1 + k2 * HIDDEN)
    touched = int(torch.unique(topk_ids).numel())
    wbytes = touched * (n1 * HIDDEN + HIDDEN * k2)
    row = dict(
        tokens=tokens, rows_per_expert=tokens * TOP_K / EXPERTS, experts_touched=touched, ms_p50=ms, ms_p90=p90,
        tflops=flops / (ms / 1e3) / 1e12, fp8_eff=flops / (ms / 1e3) / FP8_PEAK,
        weight_bw_frac=wbytes / (ms / 1e3) / HBM, config={k: v for k, v in cfg.items()},
    )  # fmt: skip
    print(
        f"T={tokens:>6}  rows/expert {row['rows_per_expert']:7.1f}  experts {touched:3d}  {ms:7.3f} ms (p90 {p90:7.3f})"
        f"  {row['tflops']:7.1f} TFLOP/s  {row['fp8_eff']:.3f} of FP8 peak  {row['weight_bw_frac']:.2f} of HBM"
    )
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernel-file", type=Path, help="vLLM's fused_moe.py (default: the installed vLLM's)")
    ap.add_argument("--config", type=Path, help="vLLM's tuned config JSON (default: the installed vLLM's H200 one)")
    ap.add_argument("--tokens", default="1,8,64,160,512,1024,2048,4096,8192")
    ap.add_argument("--json", help="write the rows here too")
    args = ap.parse_args(argv)
    try:
        import torch
        import triton
        import triton.language as tl
    except ImportError:
        print("needs PyTorch and Triton", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    if args.kernel_file is None or args.config is None:
        import vllm.model_executor.layers.fused_moe as fm

        base = Path(fm.__file__).parent
        args.kernel_file = args.kernel_file or base / "fused_moe.py"
        args.config = (
            args.config
            or base / "configs/E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json"
        )
    kernel = load_kernel(args.kernel_file)
    configs = json.loads(args.config.read_text())
    print(
        f"{torch.cuda.get_device_name()}  torch {torch.__version__}  triton {triton.__version__}",
        f"config {args.config.name}",
    )
    rows = [layer(torch, triton, tl, kernel, configs, int(t)) for t in args.tokens.split(",")]
    if args.json:
        Path(args.json).write_text(json.dumps(dict(device=torch.cuda.get_device_name(), rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
