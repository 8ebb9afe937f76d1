"""LMS under tf.distribute.MultiWorkerMirroredStrategy: several worker processes.

Run without ``--worker-index``, this script is the launcher: it picks free
loopback ports, starts ``--workers`` copies of itself, each with its own
``TF_CONFIG`` (the cluster of all workers, and its own task index) and its own
device (the emulated device capped at ``--device-memory-mb``, or its GPU), and
prints their lines prefixed with ``[worker i]``. Each worker trains the same
convolutional classifier with a custom loop under the strategy: every step
computes gradients on its shard of the global batch, all-reduces them over
gRPC and applies them, so all workers hold the same weights after every step.
At the end each worker prints its LMS statistics and ``TRAINED: ...``, and the
launcher checks that the workers' weights agree.

On your own cluster, start the workers yourself: set ``TF_CONFIG`` on each
host as the launcher does here (``print_tf_config`` below shows it) and run
``python multi_worker.py --worker-index I`` there.

``--strict`` runs every worker with ``TF_LMS_STRICT=1``: each lists the
unpinned touches of evicted memory (the collectives' gRPC transfers read
tensors outside kernels; see docs/distribute.md).

Example:
    .venv/bin/python examples/multi_worker.py
    .venv/bin/python examples/multi_worker.py --workers 2 --steps 6 --device-memory-mb 48
    .venv/bin/python examples/multi_worker.py --no-lms        # out of memory, exit 3
    .venv/bin/python examples/multi_worker.py --strict        # report unpinned touches

Exit status: 0 when every worker trained, 3 when one ran out of memory, 2 on
bad arguments, 1 if the package is not built or a worker failed otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, Sequence

import _example_support as support  # before TensorFlow: it sets the LMS environment

CLASSES = 10


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = support.example_parser(
        "Train a Keras model with MultiWorkerMirroredStrategy over several worker "
        "processes on this machine, each with LMS.")
    parser.add_argument("--workers", type=int, default=2, help="worker processes")
    parser.add_argument("--steps", type=int, default=4, help="training steps")
    support.add_conv_arguments(parser, layers=16, batch_help="images per worker per step "
                               "(the global batch is this times --workers)")
    parser.add_argument("--seed", type=int, default=0, help="seed of weights and data")
    parser.add_argument("--strict", action="store_true",
                        help="run the workers with TF_LMS_STRICT=1 and list the unpinned "
                             "touches of evicted memory each one saw")
    # --stats-csv RUN.csv writes RUN.worker<I>.csv for each worker.
    parser.add_argument("--weights-out", type=Path, default=None,
                        help="directory for each worker's final weights "
                             "(worker<I>.npz), to compare runs")
    parser.add_argument("--deterministic", action="store_true",
                        help="one intra-op and one inter-op thread per worker, and op "
                             "determinism: runs give bit-identical weights")
    parser.add_argument("--results-json", type=Path, default=None,
                        help="the launcher writes every worker's result (losses, "
                             "statistics, weights digest, unpinned touches) here")
    # A worker (the launcher starts them; on a cluster, start them yourself).
    parser.add_argument("--worker-index", type=int, default=None,
                        help="run as this worker of the cluster in TF_CONFIG: its task "
                             "index, 0 to the cluster's workers - 1 (0 without TF_CONFIG)")
    parser.add_argument("--result", type=Path, default=None, help=argparse.SUPPRESS)
    args = support.parse_arguments(
        parser, argv, device_memory_mb=48,
        minimums=(("workers", 1), ("steps", 1), *support.CONV_MINIMUMS),
        output_files=("stats_csv", "results_json"))
    if args.weights_out is not None and args.weights_out.exists() \
            and not args.weights_out.is_dir():
        parser.error(f"--weights-out {args.weights_out}: is a file; name a directory")
    if args.worker_index is not None:
        check_worker_index(parser, args.worker_index, os.environ.get("TF_CONFIG"))
    return args


def check_worker_index(parser: argparse.ArgumentParser, index: int,
                       config_text: str | None) -> None:
    """Exits with a usage error unless `index` is a worker of the cluster in TF_CONFIG
    (`config_text`) and, when TF_CONFIG names this task's index, that index.

    Without TF_CONFIG, TensorFlow runs this process alone: one worker, index 0.

    Example:
        check_worker_index(parser, 5, None)
        # error: --worker-index 5: TF_CONFIG is not set, so this process is the
        # cluster's only worker (1 worker, index 0); ...
    """
    if not config_text:
        if index != 0:
            parser.error(f"--worker-index {index}: TF_CONFIG is not set, so this process is "
                         "the cluster's only worker (1 worker, index 0); set TF_CONFIG to the "
                         "cluster and this task, or leave out --worker-index to launch "
                         "--workers workers on this machine")
        return
    try:
        config = json.loads(config_text)
        workers = len(config["cluster"]["worker"])
        task_type, task_index = (config.get("task", {}).get(key) for key in ("type", "index"))
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        parser.error(f"TF_CONFIG is not a cluster of workers ({type(error).__name__}: "
                     f"{error}); it looks like {tf_config([2222, 2223], 0)}")
    if not 0 <= index < workers:
        parser.error(f"--worker-index {index}: TF_CONFIG's cluster has {workers} worker"
                     f"{'s' if workers != 1 else ''}, so the index is 0 to {workers - 1}")
    if task_type == "worker" and task_index != index:
        parser.error(f"--worker-index {index}: TF_CONFIG's task is worker index "
                     f"{task_index}; pass the same index")


# --------------------------------------------------------------------------
# The launcher.


def free_ports(count: int) -> list[int]:
    """Ports free on the loopback interface now (the workers bind them next)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def tf_config(ports: list[int], index: int) -> str:
    """The TF_CONFIG of worker `index` in a loopback cluster on `ports`."""
    return json.dumps({"cluster": {"worker": [f"127.0.0.1:{port}" for port in ports]},
                       "task": {"type": "worker", "index": index}})


def forward(stream: Any, prefix: str) -> None:
    for line in stream:
        print(f"{prefix} {line}", end="", flush=True)


def launch(args: argparse.Namespace, argv: Sequence[str]) -> int:
    ports = free_ports(args.workers)
    print(f"launching {args.workers} workers on 127.0.0.1 ports "
          f"{', '.join(map(str, ports))}", flush=True)
    with tempfile.TemporaryDirectory(prefix="multi-worker-") as tmp:
        processes, threads = [], []
        for index in range(args.workers):
            env = {**os.environ, "TF_CONFIG": tf_config(ports, index)}
            if args.strict:
                env["TF_LMS_STRICT"] = "1"
            command = [sys.executable, str(Path(__file__).resolve()), *argv,
                       "--worker-index", str(index),
                       "--result", str(Path(tmp) / f"worker{index}.json")]
            process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, text=True)
            thread = threading.Thread(target=forward,
                                      args=(process.stdout, f"[worker {index}]"))
            thread.start()
            processes.append(process)
            threads.append(thread)
        codes = [process.wait() for process in processes]
        for thread in threads:
            thread.join()
        results = [json.loads(path.read_text()) if path.exists() else None
                   for path in (Path(tmp) / f"worker{i}.json" for i in range(args.workers))]
    if args.results_json is not None:
        args.results_json.write_text(json.dumps(
            [{"exit": code, "result": result} for code, result in zip(codes, results)]))
    return summarize(codes, results)


def summarize(codes: list[int], results: list[dict | None]) -> int:
    """Prints one line per worker and whether their weights agree; the exit status."""
    print("\nworkers:")
    for index, (code, result) in enumerate(zip(codes, results)):
        if result is None:
            print(f"  worker {index}: exit {code}, no result")
            continue
        s = result["statistics"]
        touches = (f", {len(result['touches'])} unpinned touches"
                   if result["touches"] is not None else "")
        print(f"  worker {index}: exit {code}, {result['steps']} steps, loss "
              f"{result['losses'][-1] if result['losses'] else float('nan'):.4f}, "
              f"evicted {support.mib(s['bytes_reclaimed'])}, paged in "
              f"{support.mib(s['bytes_paged_in'])}, weights {result['weights_digest']}"
              f"{touches}")
    if any(code == support.EXIT_OUT_OF_MEMORY for code in codes):
        return support.EXIT_OUT_OF_MEMORY
    if any(codes) or any(result is None for result in results):
        return 1
    digests = {result["weights_digest"] for result in results if result}
    print("weights: " + ("the same on every worker" if len(digests) == 1 else
                         "DIFFER between workers"), flush=True)
    return 0 if len(digests) == 1 else 1


# --------------------------------------------------------------------------
# A worker.


def make_model(args: argparse.Namespace) -> Any:
    import keras

    inputs, x = support.conv_features(args.image_size, args.width, args.layers)
    return keras.Model(inputs, keras.layers.Dense(CLASSES)(x))


def worker_batches(args: argparse.Namespace, index: int) -> list[tuple[Any, Any]]:
    """This worker's shard of every global batch: its own `--batch-size` images."""
    import numpy as np

    rng = np.random.default_rng([args.seed, index])
    shape = (args.batch_size, args.image_size, args.image_size, 3)
    return [(rng.standard_normal(shape, dtype=np.float32),
             rng.integers(0, CLASSES, args.batch_size).astype(np.int32))
            for _ in range(args.steps)]


def weights_digest(weights: list[Any]) -> str:
    import hashlib

    digest = hashlib.sha256()
    for w in weights:
        digest.update(w.tobytes())
    return digest.hexdigest()[:16]


def run_worker(args: argparse.Namespace) -> int:
    if args.deterministic:
        os.environ["TF_NUM_INTEROP_THREADS"] = "1"
        os.environ["TF_NUM_INTRAOP_THREADS"] = "1"
    device, lms = support.set_up_lms(args)  # before TensorFlow
    import keras
    import numpy as np
    import tensorflow as tf

    if args.deterministic:
        tf.config.experimental.enable_op_determinism()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    workers = strategy.num_replicas_in_sync
    global_batch = args.batch_size * workers
    setting = (f"worker {args.worker_index} of {workers}, batch {args.batch_size} per worker, "
               f"{args.layers} convolutions of {args.width} channels, {device}")
    keras.utils.set_random_seed(args.seed)  # the same initial weights on every worker
    with strategy.scope():
        model = make_model(args)
        optimizer = keras.optimizers.SGD(0.01, momentum=0.9)
        optimizer.build(model.trainable_variables)  # its slots mirrored, before tracing
    loss_object = keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                             reduction="none")

    @tf.function
    def train_step(images: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        def replica_step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
            with tf.GradientTape() as tape:
                loss = tf.nn.compute_average_loss(loss_object(y, model(x, training=True)),
                                                  global_batch_size=global_batch)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        per_replica = strategy.run(replica_step, args=(images, labels))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    print(f"MultiWorkerMirroredStrategy, {model.count_params():,} parameters; {setting}",
          flush=True)
    reporter = support.StepReporter(lms, args.steps, args.stats_csv)
    losses: list[float] = []
    try:
        for step, (x, y) in enumerate(worker_batches(args, args.worker_index), start=1):
            reporter.start()
            losses.append(float(train_step(tf.constant(x), tf.constant(y))))
            reporter.finish(step, loss=f"{losses[-1]:8.4f}")
    except tf.errors.ResourceExhaustedError as error:
        return support.report_out_of_memory(args, error, support.where_it_stopped(reporter),
                                            setting, reporter)
    support.print_trained(setting, len(losses), reporter)
    weights = [np.asarray(w) for w in model.get_weights()]
    if args.weights_out is not None:
        args.weights_out.mkdir(parents=True, exist_ok=True)
        np.savez(args.weights_out / f"worker{args.worker_index}.npz", *weights)
    touches = None
    if os.environ.get("TF_LMS_STRICT") == "1":
        touches = [t.__dict__ for t in lms.unpinned_touches()]
        ops = sorted({t["op"] for t in touches})
        print(f"strict mode: {len(touches)} unpinned touches of evicted memory"
              + (f", by ops: {', '.join(ops)}" if ops else ""), flush=True)
    if args.result is not None:
        args.result.write_text(json.dumps({
            "steps": len(losses), "losses": losses, "weights_digest": weights_digest(weights),
            "statistics": lms.get_statistics(support.DEVICE), "touches": touches}))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.worker_index is None:
        return launch(args, argv)
    if args.stats_csv is not None:
        args.stats_csv = args.stats_csv.with_suffix(f".worker{args.worker_index}.csv")
    return run_worker(args)


if __name__ == "__main__":
    sys.exit(main())
