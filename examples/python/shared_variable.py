"""The tutorial's shared variable: two servers of one cluster ("local", two
tasks), a session on each; a variable of one name is one variable.

    PYTHONPATH=build/python /usr/bin/python3 examples/python/shared_variable.py
"""
import actorflow as af

cluster = af.train.LocalCluster({"local": 2})  # tf.train.Server("local", 0) and ("local", 1)

var = af.Variable(0.0, name="var")
sess1 = af.Session(cluster.target("local", 0))
sess2 = af.Session(cluster.target("local", 1))

sess1.run(af.global_variables_initializer())
print("Initial value of var in session 1:")
print(sess1.run(var))
sess2.run(af.global_variables_initializer())
print("Initial value of var in session 2:")
print(sess2.run(var))

print(sess1.run(var.assign_add(1.0)))
print("Incremented var in session 1")

print("Value of var in session 1:")
print(sess1.run(var))
print("Value of var in session 2:")
print(sess2.run(var))

# Placement: one variable on each task, read from the first session.
with af.device("/job:local/task:0"):
    var1 = af.Variable(0.0, name="var1")
with af.device("/job:local/task:1"):
    var2 = af.Variable(0.0, name="var2")
sess1.run(af.global_variables_initializer())
for v in (var1, var2):
    sess1.run(v)
    print(sess1.device_of(v))
    print("   " + v.name.split(":")[0])

sess1.close()
sess2.close()
cluster.stop()
