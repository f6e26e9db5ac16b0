#!/usr/bin/python3
"""Reads back the TensorBoard event files under a logdir, as TensorBoard
would, sharing no code with actorflow's writer (summary/event_file.cpp): its
own TFRecord reader and CRC-32C, and the Event messages of summary/event.proto
compiled for Python by protoc (python3-protobuf). The tests (tests/
test_tensorboard.cpp) run it and check what it prints.

Usage: tensorboard_reader.py PROTO_PY_DIR LOGDIR

Prints, for each run folder (relative to LOGDIR) and each of its event files
in name order (the order TensorBoard reads them):
  file RUN NAME RECORDS
  scalar RUN FILE_INDEX STEP TAG VALUE
  histo RUN FILE_INDEX STEP TAG NUM MIN MAX SUM BUCKET_TOTAL
  start RUN FILE_INDEX STEP          (a SessionLog START)
Exits 1 with a line on stderr at the first bad record: a length or data CRC
that does not match, a file cut short, a first record that is not
file_version "brain.Event:2", an event that does not parse."""
import os
import struct
import sys


def crc32c_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


TABLE = crc32c_table()


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc = TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked(crc):
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def records(path):
    with open(path, 'rb') as f:
        data = f.read()
    at = 0
    while at < len(data):
        if len(data) - at < 12:
            raise ValueError(f'{path}: a record header cut short at byte {at}')
        header = data[at:at + 8]
        (length,) = struct.unpack('<Q', header)
        (length_crc,) = struct.unpack('<I', data[at + 8:at + 12])
        if masked(crc32c(header)) != length_crc:
            raise ValueError(f'{path}: the length CRC of the record at byte {at} does not match')
        body = data[at + 12:at + 12 + length]
        if len(body) != length or len(data) < at + 16 + length:
            raise ValueError(f'{path}: the record at byte {at} is cut short')
        (data_crc,) = struct.unpack('<I', data[at + 12 + length:at + 16 + length])
        if masked(crc32c(body)) != data_crc:
            raise ValueError(f'{path}: the data CRC of the record at byte {at} does not match')
        yield body
        at += 16 + length


def main():
    if crc32c(b'123456789') != 0xE3069283:  # the check value of CRC-32C
        raise ValueError("the reader's own CRC-32C is wrong")
    proto_dir, logdir = sys.argv[1], sys.argv[2]
    sys.path.insert(0, proto_dir)
    try:
        from summary import event_pb2  # generated at build time by protoc --python_out
    except ImportError as e:
        raise ValueError(f'cannot import summary/event_pb2.py from {proto_dir} ({e}): pass the '
                         'build folder\'s summary_py, made by the build (`cmake --build BUILD`, '
                         'or its target actorflow-summary-py), with python3-protobuf installed')

    runs = []
    for base, _, names in os.walk(logdir):
        files = sorted(n for n in names if 'tfevents' in n)
        if files:
            runs.append((os.path.relpath(base, logdir), [os.path.join(base, n) for n in files]))
    for run, files in sorted(runs):
        for index, path in enumerate(files):
            count = 0
            for body in records(path):
                event = event_pb2.Event()
                event.ParseFromString(body)
                if count == 0 and event.file_version != 'brain.Event:2':
                    raise ValueError(f'{path}: the first record is not file_version brain.Event:2')
                count += 1
                what = event.WhichOneof('what')
                if what == 'summary':
                    for v in event.summary.value:
                        kind = v.WhichOneof('value')
                        if kind == 'simple_value':
                            print(f'scalar {run} {index} {event.step} {v.tag} {v.simple_value!r}')
                        elif kind == 'histo':
                            h = v.histo
                            if len(h.bucket) != len(h.bucket_limit):
                                raise ValueError(f'{path}: {v.tag} has {len(h.bucket)} buckets '
                                                 f'and {len(h.bucket_limit)} limits')
                            print(f'histo {run} {index} {event.step} {v.tag} {h.num!r} {h.min!r} '
                                  f'{h.max!r} {h.sum!r} {sum(h.bucket)!r}')
                elif what == 'session_log' and event.session_log.status == event_pb2.SessionLog.START:
                    print(f'start {run} {index} {event.step}')
            print(f'file {run} {os.path.basename(path)} {count}')


if __name__ == '__main__':
    try:
        main()
    except Exception as e:  # ValueError above, protobuf's DecodeError
        print(f'tensorboard_reader: {e}', file=sys.stderr)
        sys.exit(1)
