"""
test_tensorboard.py: the trainers' TensorBoard event file, read back with the tensorboard package's
own reader (its event file loader, which checks each record's CRC-32C), against log.jsonl.

    build/venv/bin/python tests/runs/test_tensorboard.py [TRAINER...]

For each TRAINER (./train_vla_cpu by default; `make test` adds the GPU trainer, under the CPU
emulation of CUDA where there is no GPU), a short run (the tiny preset on build/test/a.bin) writes
<out>/events.out.tfevents.train_vla: every scalar of every step is checked against the same step's
line in log.jsonl (loss, learning rate, gradient norm, step time, samples/s, epoch, the loader's
wait), each step once per tag, the file's first record naming the format. Then the resume: a run
that logged steps past its last checkpoint (step 5's), continued with -y 1, drops the records past
step 5 (said in one line) and holds every step once; a cut last record (a write killed halfway) is dropped with
its line; a record with a wrong CRC and everything after it too. The CRC-32C itself is checked
against the standard check value, and an evaluation's results (--eval-every with a cheap
--eval-cmd) land under eval/ in both files. Ends with `N passed, M failed`.
"""

import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "data"))
from checks import Checks  # noqa: E402

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
TRAINERS = [os.path.abspath(t) for t in sys.argv[1:]] or [os.path.join(ROOT, "train_vla_cpu")]
DATA = os.path.join(ROOT, "build", "test", "a.bin")
RUN = ["-i", DATA, "-p", "tiny", "-b", "2", "-t", "1", "--workers", "1"]
EVENTS = "events.out.tfevents.train_vla"

# log.jsonl key -> TensorBoard tag, and the relative difference the line's printed digits allow
# (relative, for %.8g and %.6g; plus half the last digit of %.3f)
TAGS = {"loss": ("train/loss", 1e-7, 0), "lr": ("train/lr", 1e-5, 0), "grad_norm": ("train/grad_norm", 1e-5, 0),
        "ms": ("train/step_ms", 1e-6, 5e-4), "samples_per_s": ("train/samples_per_s", 1e-6, 5e-4),
        "epoch": ("train/epoch", 1e-5, 0), "loader_wait_ms": ("train/loader_wait_ms", 1e-6, 5e-4)}
# where the trainer logs them (the GPU trainer: MFU on a GPU of known peak, memory)
OPTIONAL = {"mfu": ("train/mfu", 1e-6, 5e-6), "gpu_mem_gib": ("train/gpu_mem_gib", 1e-6, 5e-5)}


def crc32c(data):
    """CRC-32C, bit by bit (an implementation independent of the trainer's table)."""
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


def masked(crc):
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def records(path):
    """The file's records as (offset, bytes), framing and both CRCs checked here too."""
    out, blob, at = [], open(path, "rb").read(), 0
    while at < len(blob):
        (n,) = struct.unpack_from("<Q", blob, at)
        (len_crc,) = struct.unpack_from("<I", blob, at + 8)
        data = blob[at + 12:at + 12 + n]
        (data_crc,) = struct.unpack_from("<I", blob, at + 12 + n)
        if len_crc != masked(crc32c(blob[at:at + 8])) or data_crc != masked(crc32c(data)):
            raise ValueError(f"{path}: record at byte {at} fails its CRC")
        out.append((at, data))
        at += 16 + n
    return out


def read_events(path):
    """(file_version, {tag: [(step, value)]}) through tensorboard's own loader."""
    from tensorboard.backend.event_processing import event_file_loader
    version, scalars = None, {}
    for event in event_file_loader.EventFileLoader(path).Load():
        if event.HasField("file_version"):
            version = event.file_version
        for value in event.summary.value:
            # the loader turns simple_value summaries into scalar tensors (data_compat): read either
            v = value.simple_value if value.HasField("simple_value") else None
            if v is None and value.HasField("tensor"):
                from tensorboard.util import tensor_util
                v = float(tensor_util.make_ndarray(value.tensor))
            scalars.setdefault(value.tag, []).append((event.step, v))
    return version, scalars


def log_lines(path):
    steps, evals = {}, []
    for line in open(path):
        r = json.loads(line)
        if "eval" in r:
            evals.append(r)
        else:
            steps[r["step"]] = r
    return steps, evals


def train(out, *args):
    return subprocess.run([trainer, *RUN, "-o", out, *args], capture_output=True, text=True)


def same_as_log(check, out, what, steps_expected):
    version, scalars = read_events(os.path.join(out, EVENTS))
    steps, _ = log_lines(os.path.join(out, "log.jsonl"))
    check(version == "brain.Event:2", f"{what}: the first record names the format (brain.Event:2), got {version!r}")
    check(sorted(steps) == steps_expected, f"{what}: log.jsonl holds steps {steps_expected[0]}..{steps_expected[-1]}")
    logged = {k for r in steps.values() for k in r}
    checked = {**TAGS, **{k: v for k, v in OPTIONAL.items() if k in logged}}
    known = {tag for tag, _, _ in checked.values()}
    other = sorted(t for t in scalars if t.startswith("train/") and t not in known)
    check(not other, f"{what}: every train/ tag is one of log.jsonl's keys ({other or sorted(known)})")
    for key, (tag, rel, digit) in checked.items():
        got = scalars.get(tag, [])
        by_step = dict(got)
        once = len(by_step) == len(got) and sorted(by_step) == steps_expected
        bad = [s for s in steps_expected if s in by_step and key in steps[s] and
               abs(by_step[s] - steps[s][key]) > rel * abs(steps[s][key]) + digit + 1e-9]
        check(once and not bad, f"{what}: {tag}, each step once, equals log.jsonl's {key} "
              f"({len(got)} values{', differing at ' + str(bad[:3]) if bad else ''})")
    return scalars


trainer = None  # the one being checked


def main():
    global trainer
    check = Checks()
    check(crc32c(b"123456789") == 0xE3069283, "CRC-32C of '123456789' is the standard check value 0xe3069283")
    for trainer in TRAINERS:
        print(f"== {os.path.relpath(trainer, ROOT)}")
        check_trainer(check)
    check.finish()


def check_trainer(check):
    tmp = tempfile.mkdtemp()
    try:
        # a straight run: every scalar of every step, as log.jsonl has it
        out = os.path.join(tmp, "straight")
        r = train(out, "-n", "8", "-k", "4")
        check(r.returncode == 0, f"an 8-step run ends with exit 0 ({r.returncode}: {r.stdout[-300:]})")
        check(len(records(os.path.join(out, EVENTS))) > 8 * len(TAGS),
              "its event file's records pass their framing and CRC-32C checks here too")
        same_as_log(check, out, "an 8-step run", list(range(1, 9)))

        # a run that logged steps past its last checkpoint (a run killed after step 8, its checkpoint of step 5
        # the last one written): continued with -y 1, the records past step 5 are dropped, then written once
        out = os.path.join(tmp, "resumed")
        r = train(out, "-n", "8", "-k", "5")
        os.remove(os.path.join(out, "ckpt_00000008.bin"))
        before = read_events(os.path.join(out, EVENTS))[1].get("train/loss", [])
        check(r.returncode == 0 and [s for s, _ in before] == list(range(1, 9)),
              f"a run of 8 steps whose last checkpoint is step 5's wrote steps 1..8 ({len(before)})")
        r = train(out, "-y", "1", "-n", "9", "-k", "5")
        said = [ln for ln in r.stdout.splitlines() if EVENTS in ln and "dropped" in ln]
        check(r.returncode == 0 and len(said) == 1 and "past step 5" in said[0],
              f"-y 1 says in one line that it dropped the records past step 5 ({said})")
        same_as_log(check, out, "the resumed run", list(range(1, 10)))

        # a cut last record (a write killed halfway): dropped with its line, the rest kept
        path = os.path.join(out, EVENTS)
        good = os.path.getsize(path)
        last_at, last = records(path)[-1]
        with open(path, "ab") as f:  # the first bytes of a whole record: its header, part of its data
            f.write(open(path, "rb").read()[last_at:last_at + 12 + len(last) // 2])
        r = train(out, "-y", "1", "-n", "10", "-k", "5")
        said = [ln for ln in r.stdout.splitlines() if EVENTS in ln and "cut last record" in ln]
        check(r.returncode == 0 and len(said) == 1, f"a cut last record is dropped in one line ({said})")
        same_as_log(check, out, "after the cut record", list(range(1, 11)))
        check(os.path.getsize(path) > good, "the records before the cut one are kept, the next steps appended")

        # a record with a wrong CRC: it and everything after it dropped (TensorBoard stops there too)
        recs = records(path)
        at = recs[len(recs) // 2][0]
        blob = bytearray(open(path, "rb").read())
        blob[at + 14] ^= 0xFF
        open(path, "wb").write(bytes(blob))
        r = train(out, "-y", "1", "-n", "11", "-k", "5")
        said = [ln for ln in r.stdout.splitlines() if EVENTS in ln and "CRC-32C" in ln]
        check(r.returncode == 0 and len(said) == 1 and f"byte {at}" in said[0],
              f"a record failing its CRC is dropped with what follows, in one line naming its byte ({said})")
        try:
            records(path)
            ok = True
        except ValueError:
            ok = False
        check(ok, "the file is whole again: every record passes its CRC")

        # an evaluation's results: eval/<name> in TensorBoard and {"step": N, "eval": {...}} in log.jsonl
        out = os.path.join(tmp, "evaluated")
        cmd = "printf '{\"success_rate\": 0.%s, \"success_rate/easy\": 1}' {step} > {results}"
        r = train(out, "-n", "6", "-k", "0", "--eval-every", "3", "--eval-cmd", cmd)
        check(r.returncode == 0, f"a run with --eval-every 3 ends with exit 0 ({r.stdout[-300:]})")
        scalars = read_events(os.path.join(out, EVENTS))[1]
        check(scalars.get("eval/success_rate") == [(3, 0.3), (6, 0.6)] or
              [(s, round(v, 6)) for s, v in scalars.get("eval/success_rate", [])] == [(3, 0.3), (6, 0.6)],
              f"eval/success_rate holds steps 3 and 6's results ({scalars.get('eval/success_rate')})")
        check([s for s, _ in scalars.get("eval/success_rate/easy", [])] == [3, 6], "so does eval/success_rate/easy")
        _, evals = log_lines(os.path.join(out, "log.jsonl"))
        check([(e["step"], e["eval"]) for e in evals] ==
              [(3, {"success_rate": 0.3, "success_rate/easy": 1}), (6, {"success_rate": 0.6, "success_rate/easy": 1})],
              f"log.jsonl holds one eval line per evaluated step ({evals})")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
