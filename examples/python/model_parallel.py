"""Model parallelism (examples/model_parallel.af): layer 1 on /cpu:0,
layer 2 on /cpu:1; the activation crosses between them, and one step of
gradient descent goes back through both. model_parallel.af works the
numbers out by hand.

    PYTHONPATH=build/python /usr/bin/python3 examples/python/model_parallel.py
"""
import actorflow as af

cluster = af.train.LocalCluster({"local": 1})

x = af.constant([[1, 2]], af.float32)
with af.device("/cpu:0"):
    w1 = af.Variable([[1.0, -1.0], [1.0, 1.0]], name="w1")
    h = af.relu(x @ w1)
with af.device("/cpu:1"):
    w2 = af.Variable([[1.0], [2.0]], name="w2")
    out = h @ w2
    loss = af.reduce_sum(af.square(out - [[4.0]]))
dw1, dw2 = af.gradients(loss, [w1, w2])
step = af.group(w1.assign_sub(dw1 / 64), w2.assign_sub(dw2 / 64))

with af.Session(cluster.target("local", 0)) as sess:
    sess.run(af.global_variables_initializer())
    values = sess.run({"out": out, "loss": loss, "dw1": dw1, "dw2": dw2})
    print("out = %s" % values["out"])
    print("loss = %s" % values["loss"])
    print("dw1 =\n%s" % values["dw1"])
    print("dw2 =\n%s" % values["dw2"])
    sess.run(step)
    out_now, loss_now = sess.run((out, loss))
    print("out = %s" % out_now)
    print("loss = %s" % loss_now)
cluster.stop()
