"""In-graph data parallelism (the tutorial's "one machine, several GPUs",
examples/towers.af): the parameters on /cpu:0, one tower per device
computing the gradient of its own batch, the mean of the towers' gradients
applied to the parameters. Linear regression y = x w from w = 0, so the
numbers can be checked by hand (towers.af works them out).

    PYTHONPATH=build/python /usr/bin/python3 examples/python/towers.py
"""
import actorflow as af

cluster = af.train.LocalCluster({"local": 1})

with af.device("/cpu:0"):
    w = af.get_variable("w", [2, 1], initializer=af.zeros_initializer())

batches = [([[1, 0], [0, 1]], [[2], [3]]),   # tower 0's examples and targets
           ([[1, 1], [2, 0]], [[5], [2]])]   # tower 1's
losses, grads = [], []
for i, (x, y) in enumerate(batches):
    with af.device("/cpu:%d" % i):
        loss = af.reduce_mean(af.square(af.constant(x, af.float32) @ w - af.constant(y, af.float32)))
        grad, = af.gradients(loss, [w])
    losses.append(loss)
    grads.append(grad)

with af.device("/cpu:0"):
    mean_grad = (grads[0] + grads[1]) / 2
    apply = w.assign_sub(0.5 * mean_grad)

with af.Session(cluster.target("local", 0)) as sess:
    sess.run(af.global_variables_initializer())
    loss0, loss1, g0, g1 = sess.run(losses + grads)
    print("loss0 = %s" % loss0)
    print("loss1 = %s" % loss1)
    print("g0 =\n%s" % g0)
    print("g1 =\n%s" % g1)
    print(sess.run(apply))
    print("w is on %s" % sess.device_of(w))
    loss0, loss1 = sess.run(losses)
    print("loss0 = %s" % loss0)
    print("loss1 = %s" % loss1)
cluster.stop()
