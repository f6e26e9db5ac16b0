"""Between-graph replication, as TensorFlow's mnist_replica.py: one process
per task, each started with its --job_name and --task_index; the ps holds
the parameters, each worker builds its own copy of the graph and trains
them asynchronously; the chief (worker 0) initializes them and says the
held-out accuracy at the end. Softmax regression on the bundled UCI
digits (8x8 images; af.train.load_digits()).

    PS=127.0.0.1:2222 WORKERS=127.0.0.1:2223,127.0.0.1:2224
    python3 mnist_replica.py --ps_hosts=$PS --worker_hosts=$WORKERS --job_name=ps --task_index=0 &
    python3 mnist_replica.py --ps_hosts=$PS --worker_hosts=$WORKERS --job_name=worker --task_index=0 &
    python3 mnist_replica.py --ps_hosts=$PS --worker_hosts=$WORKERS --job_name=worker --task_index=1

(with PYTHONPATH=build/python and /usr/bin/python3, as docs/python.md says).
Unlike TF's ps, which joined forever, the ps here stops once every worker
has said it is done (a counter on the ps), so that every process exits 0.
"""
import argparse
import sys
import time

import numpy as np

import actorflow as af


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ps_hosts", required=True, help="comma-separated host:port")
    p.add_argument("--worker_hosts", required=True, help="comma-separated host:port")
    p.add_argument("--job_name", required=True, choices=["ps", "worker"])
    p.add_argument("--task_index", type=int, default=0)
    p.add_argument("--train_steps", type=int, default=300, help="steps of each worker")
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--learning_rate", type=float, default=0.5)
    p.add_argument("--timeout", type=float, default=120.0,
                   help="seconds a task waits for the others (initialization, the workers' end)")
    return p.parse_args()


def model(cluster, task_index):
    """The graph every worker builds, placed as TF's mnist_replica.py places
    it: each variable on the next ps task, round robin, the step on this
    worker."""
    with af.device(af.train.replica_device_setter(
            worker_device="/job:worker/task:%d" % task_index, cluster=cluster)):
        weights = af.get_variable("softmax/w", [64, 10], initializer=af.zeros_initializer())
        bias = af.get_variable("softmax/b", [10], initializer=af.zeros_initializer())
        global_step = af.get_variable("global_step", [], initializer=af.zeros_initializer())
        with af.device("/job:ps/task:0"):  # where run_ps reads it
            workers_done = af.get_variable("workers_done", [], initializer=af.zeros_initializer())
        x = af.placeholder(af.float32, [None, 64], name="x")
        labels = af.placeholder(af.int32, [None], name="labels")
        logits = x @ weights + bias
        loss = af.reduce_mean(af.nn.sparse_softmax_cross_entropy_with_logits(labels=labels,
                                                                           logits=logits))
    return dict(weights=weights, bias=bias, global_step=global_step, workers_done=workers_done,
                x=x, labels=labels, logits=logits, loss=loss)


def until_reachable(what, timeout):
    """what() once every task it needs listens: the processes start in any
    order, so the first call may find the ps not up yet (TF's session
    retried its connection the same way)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return what()
        except af.errors.UnavailableError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def run_ps(cluster, server, num_workers, timeout):
    # The ps's own session reads the workers' counter (TF's ps only joined).
    with af.device("/job:ps/task:0"):
        workers_done = af.get_variable("workers_done", [], initializer=af.zeros_initializer())
    with af.Session(server.target) as sess:
        sess.wait_initialized(timeout=timeout, var_list=[workers_done])
        deadline = time.monotonic() + timeout
        while sess.run(workers_done) < num_workers:
            if time.monotonic() > deadline:
                print("ps: the workers did not finish within %.0f s" % timeout, file=sys.stderr)
                return 1
            time.sleep(0.1)
    print("ps: every worker is done; stopping")
    return 0


def run_worker(args, cluster, server, num_workers):
    xs, ys = af.train.load_digits()
    train_x, train_y = xs[:1500], ys[:1500]
    test_x, test_y = xs[1500:], ys[1500:]
    m = model(cluster, args.task_index)
    opt = af.train.GradientDescentOptimizer(args.learning_rate)
    train_op = af.group(opt.minimize(m["loss"]), m["global_step"].assign_add(1.0))
    is_chief = args.task_index == 0
    with af.Session(server.target) as sess:
        if is_chief:
            until_reachable(lambda: sess.run(af.global_variables_initializer()), args.timeout)
            print("worker 0 (chief): initialized the variables")
        else:
            until_reachable(lambda: sess.wait_initialized(timeout=args.timeout), args.timeout)
            print("worker %d: the chief initialized the variables" % args.task_index)
        # Each worker its own shard of a seeded order of the examples.
        rng = np.random.default_rng(1000 + args.task_index)
        began = time.monotonic()
        for step in range(args.train_steps):
            at = rng.integers(0, len(train_x) - args.batch_size)
            sess.run(train_op, feed_dict={m["x"]: train_x[at:at + args.batch_size],
                                          m["labels"]: train_y[at:at + args.batch_size]})
        seconds = time.monotonic() - began
        loss = float(sess.run(m["loss"], feed_dict={m["x"]: train_x, m["labels"]: train_y}))
        print("worker %d: done after %d steps in %.2f s, training loss %.4f, global step %d"
              % (args.task_index, args.train_steps, seconds, loss, sess.run(m["global_step"])))
        if is_chief:
            logits = sess.run(m["logits"], feed_dict={m["x"]: test_x})
            accuracy = float(np.mean(np.argmax(logits, axis=1) == test_y))
            print("test accuracy %.4f (%d examples)" % (accuracy, len(test_y)))
        sess.run(m["workers_done"].assign_add(1.0))
    return 0


def main():
    args = parse_args()
    cluster = af.train.ClusterSpec({"ps": args.ps_hosts.split(","),
                                    "worker": args.worker_hosts.split(",")})
    server = af.train.Server(cluster, args.job_name, args.task_index)
    num_workers = cluster.num_tasks("worker")
    try:
        if args.job_name == "ps":
            return run_ps(cluster, server, num_workers, args.timeout)
        return run_worker(args, cluster, server, num_workers)
    finally:
        server.stop()
        server.join()


if __name__ == "__main__":
    sys.exit(main())
