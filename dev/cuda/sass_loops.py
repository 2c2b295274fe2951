"""sass_loops.py: the loops of GPU kernels as the GPU runs them, read from their SASS.

    build/venv/bin/python dev/cuda/sass_loops.py FILE.sass REGEX [--all]

FILE.sass is cuobjdump -sass output (dev/cuda/sass_loops.sh makes it). For each function whose
mangled name matches REGEX, each loop (a branch back to an earlier address) that holds tensor-core
instructions (HMMA) is listed with every distinct path through one iteration: its instructions and
those of a few kinds that tell the paths apart and the costs (HMMA, MUFU: the exponentials,
LDSM: ldmatrix, FSEL: selects such as a mask's, LDGSTS: cp.async, LDL: spilled values read back).
A path follows forward branches both ways (a predicated one) and takes no inner loop's branch back,
so an inner loop's body counts once. Without --all, only the iterations that issue the most
cp.async (those that prefetch the next tile) are shown, the longest path of each mix. No GPU is needed: this counts instructions, it times nothing.
"""
import collections
import re
import sys

KINDS = ['HMMA', 'MUFU', 'LDSM', 'FSEL', 'LDGSTS', 'LDL']
INSTRUCTION = re.compile(r'/\*([0-9a-f]{4,})\*/\s+(@!?U?P[T0-9]+\s+)?([A-Z0-9_.]+)([^;]*);')


def parse(function_text):
    """[(address, predicated, opcode, operands)] of one function's listing"""
    return [(int(m.group(1), 16), bool(m.group(2)), m.group(3), m.group(4))
            for m in INSTRUCTION.finditer(function_text)]


def loop_paths(ins, head, end):
    """Counter of the paths from instruction head to end (the branch back): each path as a sorted
    tuple of (kind, count) with 'n' the instruction count"""
    at = {a: i for i, (a, _, _, _) in enumerate(ins)}

    def target(i):
        t = re.search(r'0x([0-9a-f]+)', ins[i][3])
        return at.get(int(t.group(1), 16)) if t else None

    memo = {}
    order = range(end, head - 1, -1)  # successors come later, so fill from the end back
    for i in order:
        op = ins[i][2]
        own = collections.Counter({'n': 1})
        for k in KINDS:
            if op.startswith(k):
                own[k] += 1
        paths = collections.Counter()
        if i == end:
            paths[tuple(sorted(own.items()))] += 1
        else:
            succ = []
            if op.startswith('BRA'):
                t = target(i)
                forward = t is not None and i < t <= end
                if forward:
                    succ.append(t)
                if ins[i][1] or not forward:  # predicated, or an inner loop's branch back
                    succ.append(i + 1)
            elif not (op.startswith('EXIT') or op.startswith('RET')):
                succ.append(i + 1)
            for s in succ:
                for key, count in memo[s].items():
                    d = collections.Counter(dict(key))
                    d.update(own)
                    paths[tuple(sorted(d.items()))] += count
        memo[i] = paths
    return memo[head]


def main():
    every = len(sys.argv) == 4 and sys.argv[3] == '--all'
    if len(sys.argv) not in (3, 4) or (len(sys.argv) == 4 and not every):
        sys.exit('usage: sass_loops.py FILE.sass REGEX [--all]')
    text = open(sys.argv[1]).read()
    pattern = re.compile(sys.argv[2])
    found = 0
    for chunk in re.split(r'\n\s*Function : ', text)[1:]:
        name = chunk.split('\n', 1)[0].strip()
        if not pattern.search(name):
            continue
        found += 1
        ins = parse(chunk)
        at = {a: i for i, (a, _, _, _) in enumerate(ins)}
        print(f'{name}: {len(ins)} instructions')
        for e, (a, _, op, operands) in enumerate(ins):
            t = re.search(r'0x([0-9a-f]+)', operands) if op.startswith('BRA') else None
            h = at.get(int(t.group(1), 16)) if t else None
            if h is None or h >= e or not any(o.startswith('HMMA') for _, _, o, _ in ins[h:e + 1]):
                continue
            paths = [dict(key) for key in loop_paths(ins, h, e)]
            print(f'  loop {ins[h][0]:#x}-{a:#x}: {e - h + 1} instructions, {len(paths)} distinct paths')
            if not every:  # the iterations that prefetch (most cp.async), the longest path of each mix
                most = max(d.get('LDGSTS', 0) for d in paths)
                longest = {}
                for d in paths:
                    mix = tuple(d.get(k, 0) for k in KINDS)
                    if d.get('LDGSTS', 0) == most and d['n'] > longest.get(mix, {'n': -1})['n']:
                        longest[mix] = d
                paths = list(longest.values())
            for d in sorted(paths, key=lambda d: (d.get('LDGSTS', 0), d['n'])):
                print(f"    {d['n']:5d} |", ' '.join(f'{k} {d.get(k, 0)}' for k in KINDS))
    if found == 0:
        sys.exit(f'no function matches {sys.argv[2]}')


if __name__ == '__main__':
    main()
