"""Checks a run folder's TensorBoard event files against its metrics.csv, with TensorBoard's own
reader (PyPI `tensorboard`, pinned in scripts/setup.sh --tensorboard): every record's two CRC-32C
checksums verified, every event a valid `Event` message, every metrics.csv value (but the step) a
scalar of its column's name at its row's step (float32, as TensorBoard stores scalars), nothing
logged past the last row that a restart did not purge, the expected extra scalars present, each
image a PNG of the size its event states, and the run's settings (config.toml) as a text summary.

    python scripts/check_tensorboard.py RUN_DIR [--scalars penalty,learning_rate] [--images samples]
                                        [--steps-only seconds,images_per_s]

Exits 1 naming the first difference; prints a one-line summary otherwise.
"""
import argparse
import csv
import glob
import math
import os
import struct
import sys

from tensorboard.backend.event_processing import event_accumulator
from tensorboard.compat.proto import event_pb2
from tensorboard.compat.tensorflow_stub import pywrap_tensorflow, errors


def fail(message):
    print("check_tensorboard: " + message, file=sys.stderr)
    sys.exit(1)


def read_records(path):
    """Every record of an event file, each checksum verified (DataLossError otherwise)."""
    reader = pywrap_tensorflow.PyRecordReader_New(path)
    records = []
    while True:
        try:
            reader.GetNext()
        except errors.OutOfRangeError:
            return records
        except errors.DataLossError as e:
            fail("%s: %s" % (path, e))
        records.append(reader.record())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("run")
    parser.add_argument("--scalars", default="", help="tags expected besides metrics.csv's columns")
    parser.add_argument("--images", default="", help="image tags expected")
    parser.add_argument("--steps-only", default="",
                        help="columns whose steps are checked but not their values (timings of another run)")
    args = parser.parse_args()

    files = sorted(glob.glob(os.path.join(args.run, "events.out.tfevents.*")))
    if not files:
        fail("no event file in " + args.run)
    events = 0
    for path in files:
        records = read_records(path)
        if not records:
            fail(path + ": no records")
        first = event_pb2.Event.FromString(records[0])
        if first.file_version != "brain.Event:2":
            fail("%s: the first event is not the file version: %s" % (path, first))
        for r in records:
            event_pb2.Event.FromString(r)  # raises on a malformed message
        events += len(records)

    acc = event_accumulator.EventAccumulator(args.run, size_guidance={"scalars": 0, "images": 0, "tensors": 0})
    acc.Reload()
    tags = acc.Tags()
    with open(os.path.join(args.run, "metrics.csv")) as f:
        rows = list(csv.DictReader(f))
    if not rows:
        fail("metrics.csv has no rows")
    checked = 0
    for column in rows[0].keys():
        if column == "step":
            continue
        expected = {int(float(r["step"])): float(r[column]) for r in rows if r[column] != ""}
        if column not in tags["scalars"]:
            fail("no scalar %r (metrics.csv column)" % column)
        steps = [e.step for e in acc.Scalars(column)]
        if steps != sorted(expected):  # each step once: a resumed run's restart purged its orphans
            fail("scalar %r at steps %s, metrics.csv has %s" % (column, steps, sorted(expected)))
        logged = {e.step: e.value for e in acc.Scalars(column)}
        if column in args.steps_only.split(","):
            continue
        for step, want in expected.items():
            # metrics.csv keeps 9 significant digits, TensorBoard a float32: equal to a float32's ulp.
            want32 = struct.unpack("f", struct.pack("f", want))[0]
            got = logged[step]
            if not math.isclose(got, want32, rel_tol=2.5e-7, abs_tol=1e-30):
                fail("scalar %r at step %d is %r, metrics.csv says %r" % (column, step, got, want))
            checked += 1
    last = max(int(float(r["step"])) for r in rows)
    for tag in [t for t in args.scalars.split(",") if t]:
        if tag not in tags["scalars"]:
            fail("no scalar %r" % tag)
        steps = [e.step for e in acc.Scalars(tag)]
        if not steps or max(steps) > last or any(not math.isfinite(e.value) for e in acc.Scalars(tag)):
            fail("scalar %r: steps %s (the last row is step %d) or a value not finite" % (tag, steps, last))
    images = 0
    for tag in [t for t in args.images.split(",") if t]:
        if tag not in tags["images"]:
            fail("no image %r (images: %s)" % (tag, tags["images"]))
        for e in acc.Images(tag):
            png = e.encoded_image_string
            if png[:8] != b"\x89PNG\r\n\x1a\n":
                fail("image %r at step %d is not a PNG" % (tag, e.step))
            width, height = struct.unpack(">II", png[16:24])
            if (width, height) != (e.width, e.height):
                fail("image %r at step %d: the PNG is %dx%d, the event says %dx%d"
                     % (tag, e.step, width, height, e.width, e.height))
            images += 1
    # The run's settings as a text summary, each time a run started in the folder: the last one is
    # config.toml's text.
    config_path = os.path.join(args.run, "config.toml")
    if os.path.exists(config_path):
        if "config" not in tags.get("tensors", []):
            fail("no text summary 'config' though the run wrote config.toml")
        with open(config_path) as f:
            want = "```toml\n" + f.read() + "```"
        got = acc.Tensors("config")[-1].tensor_proto.string_val[0].decode()
        if got != want:
            fail("the 'config' text summary is not config.toml's text: %r" % got[:200])
    print("check_tensorboard: %s: %d files, %d events, %d metrics.csv values, %d images, settings: ok"
          % (args.run, len(files), events, checked, images))


if __name__ == "__main__":
    main()
