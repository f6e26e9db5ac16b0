"""The tutorial's example: a parameter server holds var, and two workers
each add 1.0 to it five times, each through a session of its own task.

    PYTHONPATH=build/python /usr/bin/python3 examples/python/ps_workers.py
"""
import actorflow as af

cluster = af.train.LocalCluster({"ps": 1, "worker": 2})

with af.device("/job:ps/task:0"):
    var = af.Variable(0.0, name="var")
inc = var.assign_add(1.0)

ps = af.Session(cluster.target("ps", 0))
print("Parameter server: uninitialized before init:")
print("uninitialized: [%s]" % ", ".join(n.decode() for n in ps.run(af.report_uninitialized_variables())))
print("Parameter server: initializing variables...")
ps.run(af.global_variables_initializer())
print("initialized 1 variable")

workers = []
for i in range(2):
    sess = af.Session(cluster.target("worker", i))
    sess.wait_initialized(timeout=10)
    print("Worker %d: variables initialized" % i)
    workers.append(sess)

for _ in range(5):
    for i, sess in enumerate(workers):
        print("Worker %d: incrementing var" % i)
        print(sess.run(inc))

print("Parameter server: final value of var:")
print(ps.run(var))

for sess in workers + [ps]:
    sess.close()
cluster.stop()
