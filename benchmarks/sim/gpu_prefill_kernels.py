"""Kernel efficiencies behind the simulator's prefill terms, measured on the GPU this runs on.

The presets (kvtrace/sim/presets.py) take their kernel efficiencies from public figures; this
script measures the same kernels at the shapes one tensor-parallel rank runs in a prefill chunk, so
a preset's efficiency can be checked against the hardware it names (an H200 for every preset):

- GLM-5's routed experts, TP 8 (vLLM's default without expert parallelism): every rank holds a
  1/8 slice of all 256 experts (gate_up 6,144 -> 2 x 256, down 256 -> 6,144), a chunk of T tokens
  sends 8T rows spread over the 256 experts.  FP8 (e4m3, row/col-wise scales) grouped GEMM
  (``torch._scaled_grouped_mm``), falling back to one ``torch._scaled_mm`` per expert; BF16
  ``torch._grouped_mm`` beside it.
- Dense FP8 and BF16 GEMMs at a rank's projection shapes (T x 6,144 x 2,048 and T x 2,048 x 6,144).
- Causal attention (``scaled_dot_product_attention``, BF16, 8 heads a rank, head dim 128).

It prints one line per shape: milliseconds (median and p90 of the timed runs, CUDA events),
TFLOP/s and the fraction of the datasheet's dense peak (H200: 989.5 BF16, 1,979 FP8), and writes
the same as JSON (``--json``).  Needs a CUDA GPU and PyTorch >= 2.8; it is not part of the test suite.

    python benchmarks/sim/gpu_prefill_kernels.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

PEAK = {"bf16": 989.5e12, "fp8": 1979e12}  # H200 SXM datasheet, dense
HIDDEN, MOE_I, EXPERTS, TOP_K, TP = 6144, 2048, 256, 8, 8  # GLM-5 config.json; vLLM TP 8


def _time(torch, fn, warmup: int = 5, reps: int = 20) -> tuple[float, float]:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b))
    out.sort()
    return statistics.median(out), out[int(0.9 * (len(out) - 1))]


def _fp8(torch, x):
    return x.to(torch.float8_e4m3fn)


def _groups(tokens: int, align: int) -> list[int]:
    """Rows per expert for ``tokens`` tokens, top-8 of 256 spread evenly, each padded to ``align``."""
    rows = tokens * TOP_K
    base, extra = divmod(rows, EXPERTS)
    sizes = [base + (i < extra) for i in range(EXPERTS)]
    return [-(-s // align) * align for s in sizes]


def moe_fp8(torch, tokens: int) -> dict:
    n1, k2 = 2 * MOE_I // TP, MOE_I // TP
    flops = 2 * tokens * TOP_K * (HIDDEN * n1 + k2 * HIDDEN)
    sizes = _groups(tokens, 16)
    total = sum(sizes)
    dev = "cuda"
    a1 = _fp8(torch, torch.randn(total, HIDDEN, device=dev))
    a2 = _fp8(torch, torch.randn(total, k2, device=dev))
    w1 = _fp8(torch, torch.randn(EXPERTS, n1, HIDDEN, device=dev)).transpose(1, 2)  # column-major
    w2 = _fp8(torch, torch.randn(EXPERTS, HIDDEN, k2, device=dev)).transpose(1, 2)
    offs = torch.tensor(sizes, device=dev, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    sa1, sa2 = torch.ones(total, device=dev), torch.ones(total, device=dev)
    sb1, sb2 = torch.ones(EXPERTS, n1, device=dev), torch.ones(EXPERTS, HIDDEN, device=dev)
    try:

        def grouped():
            torch._scaled_grouped_mm(a1, w1, sa1, sb1, offs=offs, out_dtype=torch.bfloat16)
            torch._scaled_grouped_mm(a2, w2, sa2, sb2, offs=offs, out_dtype=torch.bfloat16)

        grouped()
        fn, path = grouped, "torch._scaled_grouped_mm"
    except (RuntimeError, AttributeError, TypeError) as exc:  # an older torch or another GPU
        print(f"  grouped FP8 unavailable ({str(exc).splitlines()[0][:100]}); one _scaled_mm per expert")
        one = torch.tensor(1.0, device=dev)
        starts = [0, *offs.tolist()[:-1]]

        def looped():
            for e, (s, n) in enumerate(zip(starts, sizes, strict=False)):
                if n:
                    torch._scaled_mm(a1[s : s + n], w1[e], one, one, out_dtype=torch.bfloat16)
                    torch._scaled_mm(a2[s : s + n], w2[e], one, one, out_dtype=torch.bfloat16)

        fn, path = looped, "torch._scaled_mm per expert"
    med, p90 = _time(torch, fn)
    return _row(f"moe fp8 T={tokens} rows/expert={tokens * TOP_K / EXPERTS:.1f}", "fp8", flops, med, p90, path)


def moe_bf16(torch, tokens: int) -> dict:
    n1, k2 = 2 * MOE_I // TP, MOE_I // TP
    flops = 2 * tokens * TOP_K * (HIDDEN * n1 + k2 * HIDDEN)
    sizes = _groups(tokens, 16)
    total, dev = sum(sizes), "cuda"
    a1 = torch.randn(total, HIDDEN, device=dev, dtype=torch.bfloat16)
    a2 = torch.randn(total, k2, device=dev, dtype=torch.bfloat16)
    w1 = torch.randn(EXPERTS, HIDDEN, n1, device=dev, dtype=torch.bfloat16)
    w2 = torch.randn(EXPERTS, k2, HIDDEN, device=dev, dtype=torch.bfloat16)
    offs = torch.tensor(sizes, device=dev, dtype=torch.int32).cumsum(0, dtype=torch.int32)

    def grouped():
        torch._grouped_mm(a1, w1, offs=offs)
        torch._grouped_mm(a2, w2, offs=offs)

    try:
        grouped()
    except (RuntimeError, AttributeError, TypeError) as exc:
        print(f"  grouped BF16 unavailable: {str(exc).splitlines()[0][:100]}")
        return {}
    med, p90 = _time(torch, grouped)
    return _row(f"moe bf16 T={tokens}", "bf16", flops, med, p90, "torch._grouped_mm")


def dense(torch, tokens: int, k: int, n: int, dtype: str) -> dict:
    dev = "cuda"
    if dtype == "fp8":
        a = _fp8(torch, torch.randn(tokens, k, device=dev))
        b = _fp8(torch, torch.randn(n, k, device=dev)).t()
        one = torch.tensor(1.0, device=dev)

        def fn():
            torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16)
    else:
        a = torch.randn(tokens, k, device=dev, dtype=torch.bfloat16)
        b = torch.randn(k, n, device=dev, dtype=torch.bfloat16)

        def fn():
            a @ b

    med, p90 = _time(torch, fn)
    return _row(
        f"dense {dtype} {tokens}x{k}x{n}",
        dtype,
        2 * tokens * k * n,
        med,
        p90,
        "torch._scaled_mm" if dtype == "fp8" else "matmul",
    )


def attention(torch, seq: int, heads: int = 8, dim: int = 128) -> dict:
    q, k, v = (torch.randn(1, heads, seq, dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def fn():
        sdpa(q, k, v, is_causal=True)

    med, p90 = _time(torch, fn)
    flops = 4 * heads * dim * seq * seq / 2  # QK and AV, causal half
    return _row(f"attention causal seq={seq} heads={heads} d={dim}", "bf16", flops, med, p90, "sdpa")


def _row(name: str, dtype: str, flops: float, med_ms: float, p90_ms: float, path: str) -> dict:
    tflops = flops / (med_ms / 1e3) / 1e12
    eff = tflops * 1e12 / PEAK[dtype]
    print(
        f"{name:<52} {med_ms:8.3f} ms (p90 {p90_ms:8.3f})  {tflops:7.1f} TFLOP/s  {eff:5.2f} of {dtype} peak  [{path}]"
    )
    return dict(name=name, dtype=dtype, flops=flops, ms_p50=med_ms, ms_p90=p90_ms, tflops=tflops, eff=eff, path=path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the rows here too")
    args = ap.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("needs PyTorch with CUDA", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}")
    rows = []
    for t in (160, 1024, 4096, 8192):
        rows += [moe_fp8(torch, t), moe_bf16(torch, t)]
    for t in (1024, 8192):
        for k, n in ((HIDDEN, 2048), (2048, HIDDEN)):
            rows += [dense(torch, t, k, n, "fp8"), dense(torch, t, k, n, "bf16")]
    for s in (2048, 8192, 24576):
        rows.append(attention(torch, s))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                dict(device=torch.cuda.get_device_name(), torch=torch.__version__, rows=[r for r in rows if r]),
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
