"""The tutorial's first example (one machine, one device), as its Python
is written: the parameters on /cpu:0, the arithmetic on /gpu:0 (soft
placement runs it on the CPU where there is no GPU).

    PYTHONPATH=build/python /usr/bin/python3 examples/python/single_device.py
"""
import actorflow as af

with af.device("/cpu:0"):
    w = af.get_variable("w", (2, 2), af.float32, initializer=af.constant_initializer(2))
    b = af.get_variable("b", (2, 2), af.float32, initializer=af.constant_initializer(5))

with af.device("/gpu:0"):
    addwb = w + b
    mutwb = w * b

ini = af.initialize_all_variables()
with af.Session() as sess:
    sess.run(ini)
    print("initialized %d variables" % len(af.global_variables()))
    np1, np2 = sess.run([addwb, mutwb])
    print("addwb =")
    print(np1)
    print("mutwb =")
    print(np2)
