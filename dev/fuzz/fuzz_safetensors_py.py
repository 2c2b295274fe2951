"""
fuzz_safetensors_py.py: the project's Python safetensors readers against mutated files, a seeded
loop (no coverage guidance: atheris is not among what `make setup` installs).

    build/venv/bin/python dev/fuzz/fuzz_safetensors_py.py --seconds 20      # what make test runs
    build/venv/bin/python dev/fuzz/fuzz_safetensors_py.py --cases 100000    # a fixed number of cases
    build/venv/bin/python dev/fuzz/fuzz_safetensors_py.py --replay build/fuzz/py_crashes/case_123.safetensors

The readers: dev/safetensors_format.py's read_index (the header checked as the format requires),
dev/smolvla.py's load_safetensors (the oracle's: every tensor as torch) and scripts/import_lerobot.py's
safetensors_file + read_float32 (the import's: every float tensor widened to float32). The seeds
are small files written by dev/smolvla.py's save_safetensors (every dtype the oracle reads, empty
tensors, __metadata__, an empty header). Case i of seed S is always the same input: 1 to 3
mutations of one seed, of its JSON (dtypes, shapes, data_offsets, names given twice, names with
control characters, __metadata__, nesting, NaN, long numbers, another kind of header) or of its
bytes (the length field, bit flips, cuts, bytes added, invalid UTF-8).

Each reader must either accept the file, and then every tensor lies inside the file and holds its
shape's bytes, the tensors lie end to end over the data section and no name stands twice, or
refuse it with one printable line (ValueError; the import's one-line refusal). The three must
agree: a file the shared reader refuses, the others refuse with its message. Anything else (an
IndexError, RecursionError, struct.error, OverflowError, ...) fails the run: the case's seed is
printed and the input kept in build/fuzz/py_crashes/. The last line is `N passed, M failed`.
"""

import argparse
import json
import os
import random
import shutil
import struct
import sys
import tempfile
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
for sub in ("dev", "data", "scripts"):
    sys.path.insert(0, os.path.join(ROOT, sub))
import torch  # noqa: E402

import import_lerobot  # noqa: E402  scripts/import_lerobot.py: the import's reader
import safetensors_format  # noqa: E402  dev/safetensors_format.py: the shared reader
import smolvla  # noqa: E402  dev/smolvla.py: the oracle's reader, and the seeds' writer
from checks import Checks  # noqa: E402

CRASHES = os.path.join(ROOT, "build", "fuzz", "py_crashes")
MAX_KEPT = 10  # failing inputs kept per run
# the shared reader's checks, by a phrase of each refusal (the tally says which the run reached)
REFUSALS = ["shorter than the 8-byte", "past the format's limit", "(cut short?)", "not UTF-8", "stands twice",
            "which JSON does not have", "not JSON", "nests its JSON", "cannot be parsed", "the header is a JSON",
            "does not start with", "__metadata__ is", "not an object", "lacks dtype", "has dtype", "has shape",
            "has data_offsets", "needs", "overlaps", "at the start of the data section", "belong to no tensor",
            "ends at byte"]


# ----------------------------------------------------------------------------
# seeds: (the header as a list of (name, value) pairs, the data section)


def seed_files():
    """The seeds, written by save_safetensors and read back as pairs and data."""
    g = torch.Generator().manual_seed(7)
    sets = [
        {"weight": torch.randn(3, 4, generator=g), "bias": torch.randn(4, generator=g)},
        {"a.bf16": torch.randn(2, 3, generator=g).to(torch.bfloat16), "b.f16": torch.randn(5, generator=g).half(),
         "c.f64": torch.randn(2, generator=g).double(), "d.i64": torch.arange(3), "e.u8": torch.arange(4).byte(),
         "f.bool": torch.tensor([True, False, True])},
        {"empty": torch.zeros(0), "none": torch.zeros(3, 0, dtype=torch.int32), "x": torch.ones(1, 1, 1)},
        {"observation.state.mean": torch.randn(3, generator=g), "observation.state.std": torch.rand(3, generator=g),
         "action.mean": torch.randn(2, generator=g), "action.std": torch.rand(2, generator=g)},
        {},
    ]
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for k, tensors in enumerate(sets):
            path = os.path.join(tmp, f"seed{k}.safetensors")
            smolvla.save_safetensors(path, tensors, metadata={"format": "pt", "seed": k} if k % 2 == 0 else None)
            with open(path, "rb") as f:
                blob = f.read()
            n, = struct.unpack("<Q", blob[:8])
            out.append((blob, json.loads(blob[8:8 + n], object_pairs_hook=Obj), blob[8 + n:]))
    return out


# ----------------------------------------------------------------------------
# the mutations


class Obj(list):
    """A JSON object as its (name, value) pairs, in order: a name may stand twice, as in a file."""


class Raw:
    """JSON text put into the header as it is (nesting, NaN, numbers JSON writers do not write)."""

    def __init__(self, text):
        self.text = text


def clone(value):
    if isinstance(value, Obj):
        return Obj((k, clone(v)) for k, v in value)
    return [clone(v) for v in value] if isinstance(value, list) else value


def dump(value):
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, Obj):
        return "{" + ",".join(json.dumps(k) + ":" + dump(v) for k, v in value) + "}"
    if isinstance(value, list):
        return "[" + ",".join(dump(v) for v in value) + "]"
    return json.dumps(value)


def serialize(pairs, data, rng):
    text = dump(pairs).encode()  # (json.dumps writes ASCII: a lone surrogate as its escape)
    if rng.random() < 0.7:
        text += b" " * (-len(text) % 8)  # as writers pad it
    return struct.pack("<Q", len(text)) + text + data


def tensors_of(pairs):
    if not isinstance(pairs, Obj):
        return []
    return [i for i, (k, v) in enumerate(pairs) if k != "__metadata__" and isinstance(v, Obj)]


def field(entry, key):
    for i, (k, _) in enumerate(entry):
        if k == key:
            return i
    return None


ODD_VALUES = [None, True, False, -1, 0, 1, 1.5, 2**31, 2**32, 2**63, 2**64, 2**64 + 7, "2", "", [], [[1]], {},
              Raw("NaN"), Raw("-Infinity"), Raw("1e400"), Raw("9" * 30), Raw("9" * 5000), Raw("-0")]
NAMES = ["a\nerror: forged", "tab\there", "\x00", "\x1b[31mred", "\u202eevil", "\\", "\\n", "", " ", "__metadata__",
         "日本", "x" * 300, "\ud800", "\udcff"]


def m_dtype(rng, pairs, data):
    t = pairs[rng.choice(tensors_of(pairs))][1]
    i = field(t, "dtype")
    value = rng.choice(list(safetensors_format.DTYPE_BITS) + ["F7", "f32", "F32 ", "U4", "C64"] + ODD_VALUES)
    if i is None:
        t.append(("dtype", value))
    else:
        t[i] = ("dtype", value)


def m_shape(rng, pairs, data):
    t = pairs[rng.choice(tensors_of(pairs))][1]
    i = field(t, "shape")
    if i is None:
        t.append(("shape", [1]))
        return
    shape = list(t[i][1]) if isinstance(t[i][1], list) else [1]
    op = rng.randrange(5)
    if op == 0 and shape:
        shape.pop(rng.randrange(len(shape)))
    elif op == 1:
        shape.insert(rng.randrange(len(shape) + 1), rng.choice([0, 1, 2, 3, 7, 2**20, 2**40, 2**64]))
    elif op == 2 and shape:
        shape[rng.randrange(len(shape))] = rng.choice(ODD_VALUES)
    elif op == 3 and shape:
        k = rng.randrange(len(shape))
        shape[k] = shape[k] + rng.choice([-2, -1, 1, 2]) if isinstance(shape[k], int) else 0
    else:
        shape = rng.choice(ODD_VALUES + [list(reversed(shape)), [s * 2 for s in shape if isinstance(s, int)]])
    t[i] = ("shape", shape)


def m_offsets(rng, pairs, data):
    idx = tensors_of(pairs)
    t = pairs[rng.choice(idx)][1]
    i = field(t, "data_offsets")
    if i is None:
        t.append(("data_offsets", [0, 0]))
        return
    off = list(t[i][1]) if isinstance(t[i][1], list) else [0, 0]
    op = rng.randrange(6)
    if op == 0 and len(off) == 2:
        off = [off[1], off[0]]
    elif op == 1 and off:
        k = rng.randrange(len(off))
        off[k] = off[k] + rng.choice([-8, -4, -2, -1, 1, 2, 4, 8]) if isinstance(off[k], int) else 0
    elif op == 2 and len(off) == 2 and all(isinstance(x, int) for x in off):
        d = rng.choice([-4, -2, 2, 4])
        off = [off[0] + d, off[1] + d]
    elif op == 3 and len(idx) > 1:  # over another tensor's bytes, the data cut to the last one's end
        other = pairs[rng.choice(idx)][1]
        j = field(other, "data_offsets")
        if j is not None:
            off = other[j][1]
            t[i] = ("data_offsets", off)
            ends = [o[1] for o in (dict(pairs[k][1]).get("data_offsets") for k in idx)
                    if isinstance(o, list) and len(o) == 2 and isinstance(o[1], int)]
            if ends and rng.random() < 0.5:
                del data[max(0, max(ends)):]
            return
    elif op == 4:
        off = rng.choice([[0], [0, 0, 0], [], [-1, 3], [2**64, 2**64 + 4], [0.0, 4.0], ["0", "4"], [True, 4],
                          [0, None], [0, 2**64 - 1]])
    else:
        off = rng.choice(ODD_VALUES)
    t[i] = ("data_offsets", off)


def m_relayout(rng, pairs, data):
    """The tensors laid end to end again, in a random order, from their (perhaps mutated) dtypes and
    shapes, the data section resized to match: a consistent file for the checks after the layout's."""
    idx = tensors_of(pairs)
    rng.shuffle(idx)
    at = 0
    for k in idx:
        t = pairs[k][1]
        info = dict(t)
        bits = safetensors_format.DTYPE_BITS.get(info.get("dtype")) if isinstance(info.get("dtype"), str) else None
        shape = info.get("shape")
        if bits is None or not isinstance(shape, list) or not all(isinstance(d, int) and 0 <= d < 64 for d in shape):
            continue
        for d in shape:
            bits *= d
        i = field(t, "data_offsets")
        if i is not None:
            t[i] = ("data_offsets", [at, at + bits // 8])
        at += bits // 8
    data[:] = bytes(rng.randrange(256) for _ in range(at)) if at < 4096 else bytes(at)


def m_fields(rng, pairs, data):
    t = pairs[rng.choice(tensors_of(pairs))][1]
    op = rng.randrange(3)
    if op == 0 and t:
        t.pop(rng.randrange(len(t)))
    elif op == 1 and t:  # a field twice, with another value
        k, v = t[rng.randrange(len(t))]
        t.insert(rng.randrange(len(t) + 1), (k, rng.choice(ODD_VALUES + [v])))
    else:
        t.append((rng.choice(["extra", "offsets", "dtype ", "Shape"]), rng.choice(ODD_VALUES)))


def m_names(rng, pairs, data):
    idx = tensors_of(pairs)
    op = rng.randrange(3)
    if op == 0:  # a tensor given twice, the same or over other bytes
        k = rng.choice(idx)
        pairs.insert(rng.randrange(len(pairs) + 1), (pairs[k][0], clone(pairs[k][1])))
    elif op == 1 and len(idx) > 1:
        a, b = rng.sample(idx, 2)
        pairs[a] = (pairs[b][0], pairs[a][1])
    else:
        k = rng.choice(idx)
        pairs[k] = (rng.choice(NAMES), pairs[k][1])


def m_metadata(rng, pairs, data):
    value = rng.choice([Obj([("k", "v")]), Obj([("k", 1)]), Obj([("k", Obj([("x", "y")]))]), "text", [], None,
                        Obj([("a", "\n")]), Obj([("k", "v"), ("k", "w")]), Obj()])
    i = field(pairs, "__metadata__")
    if i is None or rng.random() < 0.3:
        pairs.insert(rng.randrange(len(pairs) + 1), ("__metadata__", value))
    else:
        pairs[i] = ("__metadata__", value)


def m_nesting(rng, pairs, data):
    depth = rng.choice([2, 50, 900, 2000, 100000])
    value = Raw("[" * depth + "]" * depth) if rng.random() < 0.5 else Raw('{"a":' * depth + "1" + "}" * depth)
    t = pairs[rng.choice(tensors_of(pairs))][1]
    key = rng.choice(["shape", "data_offsets", "dtype", "extra"])
    i = field(t, key)
    if i is None:
        t.append((key, value))
    else:
        t[i] = (key, value)


def m_header_kind(rng, pairs, data):
    return rng.choice([Raw("[]"), Raw("[" + dump(pairs) + "]"), Raw('"text"'), Raw("1"), Raw("null"), Raw(""),
                       Raw(" " + dump(pairs)), Raw("\n" + dump(pairs)), Raw(dump(pairs) + " x"), Raw("{"),
                       Raw(dump(pairs)[:-1]), Raw("[" * 100000)])


JSON_MUTATIONS = [m_dtype, m_shape, m_offsets, m_relayout, m_fields, m_names, m_metadata, m_nesting, m_header_kind]


def header_length(blob):
    return struct.unpack("<Q", blob[:8])[0] if len(blob) >= 8 else 0


def b_length(rng, blob):
    n = header_length(blob)
    value = rng.choice([0, 1, 7, n - 1, n + 1, n + 8, len(blob) - 8, len(blob) - 7, 2**63, 2**64 - 1,
                        100_000_001, rng.randrange(2 * len(blob) + 1)])
    return struct.pack("<Q", min(max(0, value), 2**64 - 1)) + blob[8:]


def b_flip(rng, blob):
    n = header_length(blob)
    out = bytearray(blob)
    for _ in range(rng.randint(1, 4) if out else 0):
        k = rng.randrange(min(len(out), 8 + n + 1))
        out[k] ^= 1 << rng.randrange(8)
    return bytes(out)


def b_bytes(rng, blob):
    n = header_length(blob)
    k = rng.randrange(min(8, len(blob)), max(9, min(len(blob), 8 + n)))
    junk = rng.choice([b"\xff", b"\xc0\x80", b"\xef\xbb\xbf", b"\xed\xa0\x80", b"\x00", b'"', b",", b"}"])
    return blob[:k] + junk + blob[k:] if rng.random() < 0.5 else blob[:k] + blob[k + 1:]


def b_cut(rng, blob):
    return blob[:rng.randrange(len(blob) + 1)] if rng.random() < 0.7 else blob + bytes(rng.randint(1, 16))


BYTE_MUTATIONS = [b_length, b_flip, b_bytes, b_cut]


def make_case(seeds, case_seed):
    """The input of case case_seed: a seed, 1 to 3 mutations."""
    rng = random.Random(case_seed)
    _, pairs, data = seeds[rng.randrange(len(seeds))]
    pairs, data = clone(pairs), bytearray(data)
    kinds = []
    for _ in range(rng.randint(1, 3)):
        if rng.random() < 0.7 and tensors_of(pairs):
            m = rng.choice(JSON_MUTATIONS)
            kinds.append(m.__name__)
            got = m(rng, pairs, data)
            if got is not None:  # another header altogether: nothing more to do at the JSON level
                pairs = got
                break
    blob = serialize(pairs, bytes(data), rng)
    for _ in range(rng.randint(0, 2) if kinds else rng.randint(1, 2)):
        m = rng.choice(BYTE_MUTATIONS)
        kinds.append(m.__name__)
        blob = m(rng, blob)
    return blob, kinds


# ----------------------------------------------------------------------------
# the readers and what each must do


class Bad(Exception):
    """A reader broke its promise (accepted what it must refuse, or refused in more than a line)."""


def check_refusal(msg, reader):
    if not msg or msg != safetensors_format.one_line(msg):
        raise Bad(f"{reader} refused in a message that is not one printable line: {msg!r}")


def check_layout(blob, index):
    """An accepted file: each tensor inside the file with its shape's bytes, end to end over the data
    section, no name twice at the top of the header."""
    n, = struct.unpack("<Q", blob[:8])
    base = 8 + n
    at = base
    for name, e in sorted(index.items(), key=lambda kv: (kv[1].begin, kv[1].end)):
        bits = safetensors_format.DTYPE_BITS[e.dtype]
        for d in e.shape:
            bits *= d
        if not (base <= e.begin <= e.end <= len(blob)) or (e.end - e.begin) * 8 != bits:
            raise Bad(f"accepted tensor {name!r} [{e.begin}, {e.end}) of {e.dtype} {e.shape} in a file of {len(blob)}")
        if e.begin != at:
            raise Bad(f"accepted tensors that do not lie end to end (at {at}, {name!r} starts at {e.begin})")
        at = e.end
    if at != len(blob):
        raise Bad(f"accepted a file whose tensors end at {at} of {len(blob)} bytes")
    top = json.loads(blob[8:base].decode("utf-8"), object_pairs_hook=lambda p: p)
    names = [k for k, _ in top]
    if len(names) != len(set(names)):
        raise Bad("accepted a header that gives a name twice")


def read_shared(path, blob):
    index, _ = safetensors_format.read_index(path)
    check_layout(blob, index)
    return index


def read_oracle(path, blob, index):
    tensors = smolvla.load_safetensors(path)
    if set(tensors) != set(index):
        raise Bad(f"load_safetensors returned {sorted(tensors)[:4]}, the header holds {sorted(index)[:4]}")
    for name, t in tensors.items():
        e = index[name]
        if tuple(t.shape) != e.shape:
            raise Bad(f"load_safetensors gave {name!r} shape {tuple(t.shape)}, the header {e.shape}")
        if e.dtype != "BOOL" and t.numel() and t.reshape(-1).view(torch.uint8).numpy().tobytes() != blob[e.begin:e.end]:
            raise Bad(f"load_safetensors gave {name!r} other bytes than the file's")


def read_import(path, blob, index):
    with import_lerobot.safetensors_file(path) as (f, got):
        if got != index:
            raise Bad("the import's index differs from the shared reader's")
        for name, e in got.items():
            if e.dtype in import_lerobot.FLOAT_DTYPES:
                x = import_lerobot.read_float32(f, path, e, name)
                count = 1
                for d in e.shape:
                    count *= d
                if x.dtype != "float32" or x.size != count:
                    raise Bad(f"read_float32 gave {name!r} {x.size} values of {x.dtype}, its shape holds {count}")


def import_all(path):
    """The import's reader over every float tensor of the file."""
    with import_lerobot.safetensors_file(path) as (f, index):
        for name, e in index.items():
            if e.dtype in import_lerobot.FLOAT_DTYPES:
                import_lerobot.read_float32(f, path, e, name)


def run_case(path, blob):
    """Feeds one input to the three readers. Returns 'accepted' or 'refused'; raises Bad, or what a
    reader raised that it must not."""
    with open(path, "wb") as f:
        f.write(blob)
    try:
        index = read_shared(path, blob)
    except ValueError as e:
        msg = str(e)
        check_refusal(msg, "read_index")
        if "the file is corrupt" not in msg:
            raise Bad(f"read_index refused without saying the file is corrupt: {msg}")
        for reader, call, kind in (("load_safetensors", lambda: smolvla.load_safetensors(path), ValueError),
                                   ("the import", lambda: import_all(path), import_lerobot.UserError)):
            try:
                call()
            except kind as e2:
                if str(e2) != msg:
                    raise Bad(f"{reader} refused with {str(e2)!r}, the shared reader with {msg!r}")
                continue
            raise Bad(f"{reader} accepted a file the shared reader refuses ({msg})")
        return "refused"
    try:
        read_oracle(path, blob, index)
    except ValueError as e:  # only a dtype torch does not hold may be refused here
        check_refusal(str(e), "load_safetensors")
        if "which this oracle does not read" not in str(e):
            raise Bad(f"load_safetensors refused a file the shared reader accepts: {e}")
    try:
        read_import(path, blob, index)
    except import_lerobot.UserError as e:
        check_refusal(str(e), "the import")
        raise Bad(f"the import refused a file the shared reader accepts: {e}")
    return "accepted"


def keep(blob, case_seed):
    os.makedirs(CRASHES, exist_ok=True)
    path = os.path.join(CRASHES, f"case_{case_seed}.safetensors")
    with open(path, "wb") as f:
        f.write(blob)
    return path


def main():
    ap = argparse.ArgumentParser(description="the project's Python safetensors readers against mutated files")
    ap.add_argument("--seconds", type=float, default=20, help="how long to run (%(default)s)")
    ap.add_argument("--cases", type=int, default=0, help="stop after this many cases (0: --seconds alone)")
    ap.add_argument("--seed", type=int, default=1, help="the run's seed: case i is case_seed seed * 10^9 + i")
    ap.add_argument("--replay", metavar="FILE", help="feed one file (a kept input) and show what failed")
    args = ap.parse_args()
    torch.set_num_threads(1)
    check = Checks()
    tmp = tempfile.mkdtemp(prefix="fuzz_safetensors_py.", dir="/dev/shm" if os.access("/dev/shm", os.W_OK) else None)
    path = os.path.join(tmp, "input.safetensors")
    try:
        if args.replay:
            with open(args.replay, "rb") as f:
                blob = f.read()
            try:
                print(f"{args.replay}: {run_case(path, blob)}")
                check(True, f"{args.replay}: accepted or refused in one line by every reader")
            except Exception:  # the replay is for seeing it
                traceback.print_exc()
                check(False, f"{args.replay}: a reader failed (above)")
            check.finish()
        seeds = seed_files()
        bad = []
        for k, (blob, _, _) in enumerate(seeds):
            try:
                if run_case(path, blob) != "accepted":
                    bad.append(k)
            except Exception as e:  # a seed must read: anything else is a failure to show
                bad.append(f"{k}: {type(e).__name__}: {e}")
        check(not bad, f"the {len(seeds)} seeds (save_safetensors' files) are accepted by every reader"
              + (f"; not: {bad}" if bad else ""))
        counts = {"accepted": 0, "refused": 0}
        failures, kept, i = [], 0, 0
        refusals = dict.fromkeys(REFUSALS, 0)
        t0 = time.time()
        while (args.cases == 0 or i < args.cases) and time.time() - t0 < args.seconds:
            case_seed = args.seed * 10**9 + i
            i += 1
            blob, kinds = b"", ["(the mutation itself)"]
            try:
                blob, kinds = make_case(seeds, case_seed)
                outcome = run_case(path, blob)
                counts[outcome] += 1
                if outcome == "refused":
                    try:
                        safetensors_format.read_index(path)
                    except ValueError as e:  # which check refused it, for the tally
                        for phrase in REFUSALS:
                            if phrase in str(e):
                                refusals[phrase] += 1
                                break
            except Exception as e:  # a failure: say it, keep the input, go on
                failures.append(case_seed)
                where = traceback.extract_tb(e.__traceback__)[-1]
                saved = keep(blob, case_seed) if kept < MAX_KEPT else "(not kept: enough kept)"
                kept += 1
                print(f"FAIL case {case_seed} ({', '.join(kinds)}): {type(e).__name__}: "
                      f"{safetensors_format.one_line(str(e))[:300]} at {os.path.basename(where.filename)}:"
                      f"{where.lineno}; input {saved}; replay: {sys.argv[0]} --replay {saved}")
        secs = time.time() - t0
        print(f"  {i} cases in {secs:.1f} s ({i / max(secs, 1e-9):.0f} cases/s): {counts['accepted']} accepted, "
              f"{counts['refused']} refused in one line")
        print("  refused by: " + ", ".join(f"{k.strip()} {v}" for k, v in refusals.items() if v)
              + "; never: " + (", ".join(k.strip() for k, v in refusals.items() if not v) or "none"))
        check(not failures, f"{i} mutated files: each accepted with its tensors inside the file and of their "
              f"shapes, or refused in one line, by all three readers alike" +
              (f"; {len(failures)} failed (seeds {failures[:5]}, inputs in {CRASHES})" if failures else ""))
        check(counts["accepted"] > 0 and counts["refused"] > 0 or i < 100,
              f"the mutations reach both outcomes ({counts['accepted']} accepted, {counts['refused']} refused)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    check.finish()


if __name__ == "__main__":
    main()
