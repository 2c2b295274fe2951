"""The oracle's benchmark path (dev/model.py --bench) under torch 2, run by LeRobot's venv (the
oracle's own tests run under Debian's torch 1.13, which has neither scaled_dot_product_attention
nor torch.compile). dev/gpu_check.sh times this path on a GPU against train_vla, so a mistake in
it should show here first:
  - attention through scaled_dot_product_attention (smolvla.SDPA, what --bench runs) gives the
    plain products' and softmax's values: grouped heads, a block mask, a query that sees no key,
    in float64, float32 and bfloat16;
  - --bench runs eager and under torch.compile, each kind of layer compiled once (--compile) and
    the whole model (--compile model), traced by the aot_eager backend (no code generation: the
    GPU's inductor is not what runs here), and starts from the same weights: the same losses.

    build/lerobot-venv/bin/python tests/bench/test_oracle_bench.py     # last line: N passed, M failed
"""
import math
import os
import re
import subprocess
import sys
import time

import torch

DEV = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "dev")
sys.path.insert(0, DEV)
import smolvla  # noqa: E402

passed = failed = 0


def check(what, good):
    global passed, failed
    print(("ok   " if good else "FAIL ") + what)
    passed, failed = passed + bool(good), failed + (not good)


def attention_checks():
    g = torch.Generator().manual_seed(7)
    B, Tq, Tk, NH, NKV, HS = 2, 9, 11, 6, 2, 16
    mask = torch.rand(B, Tq, Tk, generator=g) > 0.4
    mask[0, 4] = False  # a query that sees no key: a uniform row, not NaN
    for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 2e-6), (torch.bfloat16, 3e-2)):
        q, k, v = (torch.randn(B, T, H, HS, generator=g).to(dtype) for T, H in ((Tq, NH), (Tk, NKV), (Tk, NKV)))
        keep = smolvla.MASKED_SCORE
        if dtype == torch.bfloat16:  # as --bench --amp bf16 sets it
            smolvla.MASKED_SCORE = torch.finfo(torch.bfloat16).min
        try:
            for m, name in ((None, "no mask"), (mask, "block mask, a query with no key")):
                smolvla.SDPA = False
                ref = smolvla.attention(q, k, v, m).double()
                smolvla.SDPA = True
                got = smolvla.attention(q, k, v, m).double()
                err = float((got - ref).abs().max() / ref.abs().max())
                finite = bool(torch.isfinite(got).all())
                check(f"scaled_dot_product_attention = products and softmax, {dtype}, {name}: rel err {err:.2e} "
                      f"(tol {tol:.0e}){'' if finite else ', NOT finite'}", finite and err <= tol)
            if m is not None:
                uniform = float((got[0, 4] - v.double().repeat_interleave(NH // NKV, dim=2)[0].mean(0).reshape(-1))
                                .abs().max())
                check(f"  its query that sees no key gets the mean of the values ({dtype}): {uniform:.2e}",
                      uniform <= tol * 10)
        finally:
            smolvla.SDPA = False
            smolvla.MASKED_SCORE = keep


def bench_runs(shard):
    base = [sys.executable, os.path.join(DEV, "model.py"), "-i", shard, "-p", "tiny", "--train-mode", "all",
            "-b", "2", "--bench", "1", "-t", "1"]
    losses = {}
    for name, extra in (("eager", []), ("layers", ["--compile", "--compile-backend", "aot_eager"]),
                        ("model", ["--compile", "model", "--compile-backend", "aot_eager"])):
        t0 = time.time()
        p = subprocess.run(base + extra, capture_output=True, text=True)
        out = p.stdout + p.stderr
        loss = re.search(r"^loss (\S+)$", out, re.M)
        warm = re.search(r"^warmup_s .*$", out, re.M)
        ok = p.returncode == 0 and loss is not None and math.isfinite(float(loss.group(1)))
        check(f"--bench 1 {' '.join(extra) or '(eager)'}: exit {p.returncode}, {time.time() - t0:.0f} s; "
              f"{warm.group(0) if warm else out.strip().splitlines()[-1:] }", ok)
        if ok:
            losses[name] = float(loss.group(1))
            mode = "off" if name == "eager" else name
            check(f"  it says what it ran: torch.compile {mode}, scaled_dot_product_attention",
                  warm is not None and f"torch.compile: {mode}," in warm.group(0)
                  and "scaled_dot_product" in warm.group(0))
    if len(losses) == 3:
        e = losses["eager"]
        for name in ("layers", "model"):
            rel = abs(losses[name] - e) / abs(e)
            check(f"6 AdamW steps: loss {losses[name]:.6f} compiled ({name}) vs {e:.6f} eager, rel {rel:.1e} "
                  "(tol 1e-5)", rel <= 1e-5)
    p = subprocess.run(base + ["--compile-backend", "aot_eager"], capture_output=True, text=True)
    check(f"--compile-backend without --compile: exit {p.returncode}, {p.stderr.strip()}",
          p.returncode != 0 and p.stderr.strip().startswith("error: --compile-backend goes with --compile"))


def main():
    if not hasattr(torch.nn.functional, "scaled_dot_product_attention") or not hasattr(torch, "compile"):
        check(f"torch 2 or newer (this is {torch.__version__}): run with LeRobot's venv", False)
    else:
        attention_checks()
        shard = sys.argv[1] if len(sys.argv) > 1 else "build/test/s.bin"
        bench_runs(shard)
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
