#!/usr/bin/env python3
"""Eviction policies compared on real training: `make bench-policy`.

1. Records an access trace of `--steps` training steps (after one that
   traces the step function) of ResNet-50 (96x96, batch 32), DenseNet121
   (64x64, batch 32), MobileNetV2 (96x96, batch 32) and a Transformer
   encoder (4 blocks, width 256, sequence 256, batch 32) on a roomy emulated
   device (models from benchmarks/mincap.py).
2. Replays each trace (tensorflow_lms_allocator/replay.py) at 1/2 and 1/4 of
   its peak under LRU, the learned policy, the engine with perfect foresight
   (`oracle`: the learned policy's rules with every unit's true next use) and
   the offline Belady simulation (objects one by one, no pages), and prints
   swap bytes per step for each (bytes copied out and in: a page copies its
   live objects only, Note [Live bytes only] in engine.h), with the lower
   bound (device bytes) and two ratios: learned/oracle (what the predictions
   cost) and oracle/Belady (what the engine's units cost: small objects take
   device memory a 2 MiB page at a time). The
   learned policy learns from the previous step, so the first replayed step
   is its learning step: swap per step is the mean over the steps after it,
   and the first step is shown apart.
3. Trains ResNet-50 for real at 1/2 of its peak with LRU, with the learned
   policy (with and without prefetching), and uncapped without LMS (the same
   emulated device and kernels), and prints step time as a ratio to uncapped
   and swap bytes per step. Each of those is a process of its own, and this
   project's machines move a step's time by 10-30% from one process to the
   next; so then one process under the learned policy trains `--blocks`
   blocks of `--train-steps` steps with reclaims in its order and as many in
   LRU's, in turn (a block's first step, which evicts what the other order
   kept, dropped; the policy learns throughout), and prints
   `learned_vs_lru_step_in_one_process R`: the median step under the learned
   order over the median under LRU's.

The last lines are `oracle_vs_belady R`, `swap_bytes_vs_oracle R` and
`swap_bytes_vs_belady R`: the worst oracle/Belady, learned/oracle and
learned/Belady ratios of swap bytes per step (after the first step) over the
replayed cases where both fit. The first is what the engine's own units
(2 MiB pages of small objects) cost with perfect predictions, the second what
the predictions cost: where learned is near the oracle and the oracle is over
a target against Belady, the units miss it, not the predictions. The replay
is stricter than TensorFlow (module docstring of replay.py): a case may not
fit in replay and still train. Each recording and training run is its own
subprocess, with progress lines.

Example:
    make bench-policy
    .venv/bin/python benchmarks/policy.py --models resnet50 --skip-training
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Sequence

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from probe_process import run_probe_process  # noqa: E402

MIB = 1 << 20
MODELS = ("resnet50", "densenet121", "mobilenetv2", "transformer")
# Also replayable on request: thousands of small tensors a step (mincap.py's rnn).
OTHER_MODELS = ("rnn",)
ROOMY_MB = 8192


def swapped(before: dict[str, int], after: dict[str, int]) -> int:
    return sum(after[k] - before[k] for k in ("bytes_copied_out", "bytes_copied_in"))


def child(argv: list[str]) -> int:
    """In a subprocess: `record MODEL PATH STEPS`, `train MODEL STEPS RESULT` or
    `alternate MODEL BLOCKS STEPS RESULT` (blocks of steps under the learned and
    LRU orders in turn)."""
    import time

    import tensorflow_lms_allocator as lms  # before tensorflow
    from mincap import build_model
    from tensorflow_lms_allocator.overlay import activation

    command, model_name = argv[0], argv[1]
    model, inputs, labels = build_model(model_name)
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    model.train_on_batch(inputs, labels)  # traces the step function
    if command == "record":
        path, steps = argv[2], int(argv[3])
        with lms.record_trace(path, max_mb=1024):
            for _ in range(steps):
                model.train_on_batch(inputs, labels)
        return 0
    if command == "alternate":
        blocks, steps, result = int(argv[2]), int(argv[3]), Path(argv[4])
        orders: dict[str, dict[str, list[float]]] = {
            order: {"step_seconds": [], "swap_per_step": []} for order in ("learned", "lru")}
        for block in range(2 * blocks):
            order = ("learned", "lru")[block % 2]
            activation.set_learned_order(lms.device_names()[0], order == "learned")
            model.train_on_batch(inputs, labels)  # dropped: evicts what the last order kept
            before = lms.get_statistics(0)
            for _ in range(steps):
                start = time.perf_counter()
                model.train_on_batch(inputs, labels)
                orders[order]["step_seconds"].append(time.perf_counter() - start)
            orders[order]["swap_per_step"].append(swapped(before, lms.get_statistics(0)) / steps)
        result.write_text(json.dumps(orders))
        return 0
    steps, result = int(argv[2]), Path(argv[3])
    before = lms.get_statistics(0)
    seconds = []
    for _ in range(steps):
        start = time.perf_counter()
        model.train_on_batch(inputs, labels)
        seconds.append(time.perf_counter() - start)
    after = lms.get_statistics(0)
    result.write_text(json.dumps({"step_seconds": seconds,
                                  "swap_per_step": swapped(before, after) / steps,
                                  "learned_reclaims": after["num_learned_reclaims"]}))
    return 0


def subprocess_env(cap_mb: int, lms: bool, policy: str, prefetch: bool = False) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TF_LMS_")}
    env.update({"TF_LMS_CPU_DEVICE_MEMORY_MB": str(cap_mb), "TF_LMS_ENABLED": "1" if lms else "0",
                "TF_LMS_POLICY": policy, "TF_LMS_PREFETCH": "1" if prefetch else "0",
                "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": str(HERE.parent)})
    return env


def run_child(args: list[str], env: dict[str, str], label: str, timeout: float) -> None:
    done = run_probe_process([sys.executable, str(Path(__file__).resolve()), "--child", *args],
                             env=env, timeout=timeout, label=label)
    if done.returncode != 0:
        raise SystemExit(f"policy.py: {label} failed (exit {done.returncode}):\n"
                         f"{done.stderr[-2000:]}")


def replay_cases(name: str, path: Path, steps: int) -> list[tuple]:
    """Rows (model, fraction, MiB, policy, fits, swap/step after the first step, lower
    bound, peak, swap in the first step)."""
    from tensorflow_lms_allocator import replay, trace

    events = replay.normalize(trace.load(path))
    peak = replay.lower_bound(events, 0, 2 * MIB)
    rows = []
    for fraction in (2, 4):
        device = max(peak // fraction // (2 * MIB), 1) * 2 * MIB
        for policy in ("lru", "learned", "oracle", "belady"):
            result = replay.run(events, device, policy, steps)
            per_step = [s.copied for s in result.steps]
            swap = statistics.mean(per_step[1:])
            rows.append((name, f"1/{fraction}", device // MIB, policy, result.fits, swap,
                         result.lower_bound, peak, per_step[0]))
            print(f"  replayed {name} at 1/{fraction} ({device // MIB} MiB) with {policy}: "
                  + (f"{swap / MIB:,.0f} MiB swapped per step" if result.fits
                     else "does not fit"), flush=True)
    return rows


def ratios(rows: list[tuple]) -> tuple[list[dict[str, str]], dict[str, float]]:
    """Each row's swap over its case's oracle and Belady rows (learned and oracle
    rows only; "" where a side did not fit or moved nothing), and the worst:
    learned over each reference, and oracle over Belady.

    Example:
        >>> case = ("m", 2, 100)
        >>> rows = [(*case, p, True, s, 0, 0, 0)
        ...         for p, s in (("learned", 110), ("oracle", 105), ("belady", 100))]
        >>> {k: round(v, 3) for k, v in ratios(rows)[1].items()}
        {'oracle': 1.048, 'belady': 1.1, 'oracle/belady': 1.05}
    """
    worst = {"oracle": 0.0, "belady": 0.0, "oracle/belady": 0.0}
    per_row = []
    for name, fraction, mib, policy, fits, swap, *_ in rows:
        row = {"oracle": "", "belady": ""}
        for reference in row:
            if policy not in ("learned", "oracle") or policy == reference:
                continue
            ref = next(r for r in rows if r[:3] == (name, fraction, mib) and r[3] == reference)
            if fits and ref[4] and ref[5] > 0:
                row[reference] = f"{swap / ref[5]:.2f}"
                key = reference if policy == "learned" else "oracle/belady"
                worst[key] = max(worst[key], swap / ref[5])
        per_row.append(row)
    return per_row, worst


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--child"]:
        return child(argv[1:])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS + OTHER_MODELS)
    p.add_argument("--steps", type=int, default=4, help="recorded steps per model")
    p.add_argument("--train-steps", type=int, default=8)
    p.add_argument("--blocks", type=int, default=4,
                   help="blocks of --train-steps steps under each order in one process")
    p.add_argument("--skip-training", action="store_true")
    p.add_argument("--timeout", type=float, default=1800)
    args = p.parse_args(argv)
    if args.steps < 2 or args.train_steps < 2:
        p.error("--steps and --train-steps must be at least 2")
    if args.blocks < 1:
        p.error(f"--blocks {args.blocks}: at least 1")
    rows: list[tuple] = []
    with tempfile.TemporaryDirectory() as tmp:
        print("== Recording", flush=True)
        for name in args.models:
            path = Path(tmp) / f"{name}.lmstrace"
            run_child(["record", name, str(path), str(args.steps)],
                      subprocess_env(ROOMY_MB, True, "lru"), f"record {name}", args.timeout)
            print("== Replaying", name, flush=True)
            rows += replay_cases(name, path, args.steps)
    print(f"\n{'model':<12} {'device':>8} {'MiB':>6} {'policy':<8} {'swap MiB/step':>14} "
          f"{'first step':>11} {'lower bound MiB':>16} {'/oracle':>8} {'/belady':>8}")
    per_row, worst = ratios(rows)
    for (name, fraction, mib, policy, fits, swap, bound, _, first), ratio in zip(rows, per_row):
        print(f"{name:<12} {fraction:>8} {mib:>6} {policy:<8} "
              f"{(f'{swap / MIB:,.0f}' if fits else 'no fit'):>14} "
              f"{(f'{first / MIB:,.0f}' if fits else ''):>11} {bound / MIB:>16,.0f} "
              f"{ratio['oracle']:>8} {ratio['belady']:>8}")
    if not args.skip_training:
        resnet = [r for r in rows if r[0] == "resnet50"]
        peak = resnet[0][7] if resnet else 889 * MIB
        cap = max(peak // 2 // (2 * MIB), 1) * 2
        print(f"\n== Training ResNet-50 for real: {cap} MiB (1/2 of its peak) with LRU and "
              "learned, and uncapped without LMS", flush=True)
        runs = {}
        with tempfile.TemporaryDirectory() as tmp:
            for label, env in (("uncapped, no LMS", subprocess_env(ROOMY_MB, False, "lru")),
                               ("LRU", subprocess_env(cap, True, "lru")),
                               ("learned", subprocess_env(cap, True, "learned")),
                               ("learned + prefetch",
                                subprocess_env(cap, True, "learned", prefetch=True))):
                out = Path(tmp) / "result.json"
                run_child(["train", "resnet50", str(args.train_steps), str(out)], env,
                          f"train {label}", args.timeout)
                runs[label] = json.loads(out.read_text())
        base = statistics.median(runs["uncapped, no LMS"]["step_seconds"][1:])
        print(f"{'run':<22} {'s/step':>8} {'vs uncapped':>12} {'swap MiB/step':>14}")
        for label, r in runs.items():
            step = statistics.median(r["step_seconds"][1:])
            print(f"{label:<22} {step:>8.3f} {step / base:>12.2f} "
                  f"{r['swap_per_step'] / MIB:>14,.0f}")
        print(f"\n== ResNet-50 at {cap} MiB in one process, {args.blocks} blocks of "
              f"{args.train_steps} steps under each order in turn (the policy learning "
              "throughout)", flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "result.json"
            run_child(["alternate", "resnet50", str(args.blocks), str(args.train_steps),
                       str(out)], subprocess_env(cap, True, "learned"),
                      "train learned and LRU orders in turn", args.timeout)
            orders = json.loads(out.read_text())
        steps = {order: statistics.median(r["step_seconds"]) for order, r in orders.items()}
        for order, r in orders.items():
            print(f"{order + ' order':<22} {steps[order]:>8.3f} "
                  f"{'':>12} {statistics.median(r['swap_per_step']) / MIB:>14,.0f}")
        print(f"learned_vs_lru_step_in_one_process {steps['learned'] / steps['lru']:.3f}")
    print(f"oracle_vs_belady {worst['oracle/belady']:.3f}")
    print(f"swap_bytes_vs_oracle {worst['oracle']:.3f}")
    print(f"swap_bytes_vs_belady {worst['belady']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
