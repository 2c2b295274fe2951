"""
safetensors_format.py: the safetensors format's header, read and checked as the format requires;
the one reader of it that the project's Python shares (dev/smolvla.py's load_safetensors,
scripts/import_lerobot.py's safetensors_file), and the escaping of text from files in messages.

A file is an 8-byte little-endian header length N, N bytes of UTF-8 JSON, then the data section:

    {"NAME": {"dtype": "F32", "shape": [2, 3], "data_offsets": [BEGIN, END]}, ..., "__metadata__": {"k": "v"}}

What a file must be to be read (else ValueError, one line naming the file and the problem):
  - N at most 100,000,000 (the format's limit) and within the file; the header starts with "{"
    (trailing spaces, which writers pad it with, are JSON whitespace)
  - the header is a JSON object (no NaN or Infinity, no name twice in one object: two entries of
    one tensor would give readers that keep the first and readers that keep the last other weights)
  - __metadata__, where present, an object of strings
  - every tensor an object with dtype (one of DTYPE_BITS), shape (whole numbers 0 to 2^63 - 1) and
    data_offsets (two whole numbers, begin <= end); END - BEGIN is the shape's element count times
    the dtype's size, in Python's integers (no product wraps)
  - sorted by offset, the tensors lie end to end from 0 to the end of the file: none overlaps
    another (two names over the same bytes), and no byte of the data section belongs to none
No module but the standard library, so that every Python of the project can read it.
"""

import collections
import json
import os
import stat
import struct

MAX_HEADER = 100_000_000  # the format's own limit (safetensors' MAX_HEADER_SIZE)
MAX_DIM = 1 << 63  # a size torch and numpy hold (int64): [0, 2^64] holds no byte, yet no tensor has it
# the format's dtypes and their sizes in bits (F4 and the F6s pack elements below a byte)
DTYPE_BITS = {"BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "I16": 16, "U16": 16,
              "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "F64": 64, "I64": 64, "U64": 64,
              "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6}
CORRUPT = "the file is corrupt, download or save it again"
JSON_KINDS = {list: "list", str: "string", int: "number", float: "number", bool: "boolean", type(None): "null"}

# one tensor: its dtype name, shape, and where its bytes are (absolute offsets into the file)
Entry = collections.namedtuple("Entry", "dtype shape begin end")


# ----------------------------------------------------------------------------
# text from a file in a message


def _escape_char(ch):
    named = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
    if ch in named:
        return named[ch]
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def one_line(text):
    """text with every character that is not printable (newlines, other controls, bidirectional
    overrides, lone surrogates of undecodable file names) written as \\n, \\xNN, \\uNNNN: what a
    file holds can neither split a message into lines nor forge another `error:` line, and the
    message always encodes. Backslashes are left as they are (parts of a message may be escaped())."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else _escape_char(ch) for ch in text)


def escaped(text):
    """A name or value from a file, for a message: one_line's escapes, and a backslash as \\\\ so an
    escape in the message is told apart from the same characters in the name (vla/common.h's
    text_escaped)."""
    return one_line(str(text).replace("\\", "\\\\"))


def brief(value, limit=60):
    """A JSON value as a message quotes it: compact, ASCII, cut at limit characters."""
    try:
        text = json.dumps(value, separators=(", ", ": "))
    except (RecursionError, ValueError):
        text = "(a deeply nested value)"
    return text if len(text) <= limit else text[:limit] + "..."


# ----------------------------------------------------------------------------
# the header


class _Refusal(Exception):
    """Raised inside json.loads' hooks; becomes the reader's ValueError."""


def _unique_object(pairs):
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen = set()
        for key, _ in pairs:
            if key in seen:
                raise _Refusal(f'"{escaped(key)}" stands twice in one object of the header (a tensor or a field is '
                               "given once: readers would disagree on which holds)")
            seen.add(key)
    return obj


def _no_constant(name):
    raise _Refusal(f"the header holds {name}, which JSON does not have")


def _whole(x):
    return isinstance(x, int) and not isinstance(x, bool)


MAX_DEPTH = 64  # a tensor index nests 3 deep (metadata 2): far past that is refused before json parses it


def nesting_depth(text):
    """How deep the text's [ and { nest outside strings: found before json.loads, whose RecursionError
    would depend on how deep the caller's stack already is (and so would the message)."""
    depth = deepest = 0
    in_string = escape = False
    for ch in text:
        if in_string:
            if escape:
                escape = False
            elif ch == "\\":
                escape = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > MAX_DEPTH:
                    return deepest
        elif ch in "]}":
            depth -= 1
    return deepest


def parse_header(raw, size, where):
    """The header's bytes (raw: N bytes after the length) of a file of `size` bytes -> (name -> Entry
    in the header's order, __metadata__ or {}). where: the file, for the messages."""
    def refuse(problem):
        raise ValueError(f"{where}: {problem}: {CORRUPT}")

    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        refuse(f"the header is not UTF-8 (byte {e.start} of it)")
    if nesting_depth(text) > MAX_DEPTH:
        refuse("the header nests its JSON too deeply to be a tensor index")
    try:
        header = json.loads(text, object_pairs_hook=_unique_object, parse_constant=_no_constant)
    except _Refusal as e:
        refuse(str(e))
    except json.JSONDecodeError as e:
        refuse(f"the header is not JSON ({e.msg} at character {e.pos})")
    except RecursionError:
        refuse("the header nests its JSON too deeply to be a tensor index")
    except ValueError as e:  # an integer of thousands of digits
        refuse(f"the header cannot be parsed ({one_line(str(e))[:80]})")
    if not isinstance(header, dict):
        refuse(f"the header is a JSON {JSON_KINDS.get(type(header), 'value')}, not an object of tensors")
    if not text.startswith("{"):
        refuse("the header does not start with '{' (the format allows no whitespace before it)")
    base, data_size = 8 + len(raw), size - 8 - len(raw)
    entries, metadata = {}, {}
    for name, info in header.items():
        what = f"tensor {escaped(name)}"
        if name == "__metadata__":
            if not (isinstance(info, dict) and all(isinstance(v, str) for v in info.values())):
                refuse(f"__metadata__ is {brief(info)}, not an object of strings")
            metadata = info
            continue
        if not isinstance(info, dict):
            refuse(f"{what} is a JSON {JSON_KINDS.get(type(info), 'value')}, not an object")
        if "data_offsets" not in info or "dtype" not in info or "shape" not in info:
            refuse(f"{what} lacks dtype, shape or data_offsets")
        dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
            refuse(f"{what} has dtype {brief(dtype, 40)}, not one of the format's ({', '.join(DTYPE_BITS)})")
        if not (isinstance(shape, list) and all(_whole(d) and 0 <= d < MAX_DIM for d in shape)):
            refuse(f"{what} has shape {brief(shape)}, not a list of whole numbers from 0 to 2^63 - 1")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(_whole(x) for x in offsets)):
            refuse(f"{what} has data_offsets {brief(offsets)}, not two whole numbers")
        begin, end = offsets
        if not 0 <= begin <= end:
            refuse(f"{what} has data_offsets [{begin}, {end}], not 0 <= begin <= end")
        bits = DTYPE_BITS[dtype]
        for d in shape:  # Python's integers: a product past 2^64 stays what it is
            bits *= d
        if bits % 8 or end - begin != bits // 8:
            need = f"{bits // 8} bytes" if bits % 8 == 0 else f"{bits} bits, not whole bytes"
            refuse(f"{what} of dtype {dtype} and shape {brief(shape)} needs {need}, its data_offsets [{begin}, {end}] "
                   f"hold {end - begin}")
        entries[name] = Entry(dtype, tuple(shape), base + begin, base + end)
    # end to end over the data section, in the order of the offsets (empty tensors first where they
    # share a start with the next)
    at, last = 0, None
    for name, e in sorted(entries.items(), key=lambda kv: (kv[1].begin, kv[1].end)):
        begin, end = e.begin - base, e.end - base
        if begin < at:
            refuse(f"tensor {escaped(name)} [{begin}, {end}] overlaps tensor {escaped(last)} (which ends at {at}): two "
                   "tensors over the same bytes")
        if begin > at:
            whose = f"after tensor {escaped(last)}" if last is not None else "at the start of the data section"
            refuse(f"bytes {at} to {begin} {whose} belong to no tensor")
        at, last = end, name
    if at > data_size:
        refuse(f"tensor {escaped(last)} ends at byte {at} of a data section of {data_size} bytes: the file is cut "
               "short")
    if at < data_size:
        refuse(f"the last {data_size - at} bytes of the data section belong to no tensor")
    return entries, metadata


def read_index(path):
    """A safetensors file's tensors, checked as the format requires (the module's comment): (name
    -> Entry with absolute offsets, in the header's order; __metadata__ or {}). Raises ValueError,
    one line, for a file that is not the format's; OSError where it cannot be read."""
    with open_regular(path) as f:
        return index_of(f, path)


def index_of(f, path):
    """read_index of the file open as f (path names it in the messages): a reader that goes on to
    read the tensors from f reads the bytes of the file whose header was checked."""
    where = escaped(path)
    size = os.fstat(f.fileno()).st_size
    f.seek(0)
    head = f.read(8)
    if len(head) != 8:
        raise ValueError(f"{where}: {size} bytes, shorter than the 8-byte header length: {CORRUPT}")
    n, = struct.unpack("<Q", head)
    if n > MAX_HEADER:
        raise ValueError(f"{where}: a header length of {n} bytes, past the format's limit of {MAX_HEADER}: {CORRUPT}")
    if n > size - 8:
        raise ValueError(f"{where}: a header length of {n} bytes in a file of {size} (cut short?): {CORRUPT}")
    raw = f.read(n)
    if len(raw) != n:
        raise ValueError(f"{where}: the file shrank while it was read: {CORRUPT}")
    return parse_header(raw, size, where)


def open_regular(path):
    """path opened for reading as a binary file, refused (ValueError) unless it is a regular file:
    a FIFO would block the open, a folder or device is not a file of tensors."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{escaped(path)} is not a regular file: pass the safetensors file itself")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bytes(f, entry, path, name):
    """One tensor's bytes (a writable bytearray) from the open file f, refused (ValueError) if the
    file no longer holds them (it changed after its header was read)."""
    buf = bytearray(entry.end - entry.begin)
    view, got = memoryview(buf), 0
    f.seek(entry.begin)
    while got < len(buf):  # (one read returns at most 2 GiB on Linux)
        n = f.readinto(view[got:])
        if not n:
            break
        got += n
    if got != len(buf):
        raise ValueError(f"{escaped(path)}: tensor {escaped(name)}: the file shrank after its header was read: "
                         "read it again once it is written")
    return buf
