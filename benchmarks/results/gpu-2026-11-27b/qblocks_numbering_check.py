"""The query-block numbering of qblocks.patch (mla_sm90_narrow._program with BLOCK_Q > 1) as Python:
on 20,000 random ragged batches (query lengths 0 to 40, padding rows past query_start_loc[-1]),
every (sequence, block) is covered by exactly one program of the T // BLOCK_Q + B + 1, and where
every sequence has one block the working programs are the first B + 1. CPU only:

    python3 qblocks_numbering_check.py
"""
import random
def program(pid, qsl, T, BQ):
    B = len(qsl) - 1
    seq, k = pid, 0
    e = pid - B - 1
    if e >= 0:
        lo, hi = 0, B
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if qsl[mid] // BQ <= e: lo = mid
            else: hi = mid - 1
        seq = lo; k = e - qsl[lo] // BQ + 1
    q_start = qsl[seq]
    q_end = qsl[seq + 1] if seq < B else T
    q_len = q_end - q_start
    qb = k * BQ
    return None if qb >= q_len else (seq, qb)
rng = random.Random(0)
for trial in range(20000):
    BQ = rng.choice([2, 3, 4, 8, 16])
    B = rng.randint(1, 12)
    lens = [rng.choice([0, 1, BQ - 1, BQ, BQ + 1, rng.randint(0, 40)]) for _ in range(B)]
    qsl = [0]
    for l in lens: qsl.append(qsl[-1] + l)
    T = qsl[-1] + rng.choice([0, 0, 1, rng.randint(0, 20)])
    X = T // BQ + B + 1
    got = {}
    for pid in range(X):
        r = program(pid, qsl, T, BQ)
        if r is not None:
            assert r not in got, (r, pid, got[r])
            got[r] = pid
    want = set()
    for s in range(B + 1):
        q0 = qsl[s]; q1 = qsl[s + 1] if s < B else T
        for qb in range(0, q1 - q0, BQ): want.add((s, qb))
    assert set(got) == want, (qsl, T, BQ, set(got) ^ want)
    # decode-like: every sequence one block -> working pids are 0..B-1 (plus B for padding)
    if all(0 < l <= BQ for l in lens) and T - qsl[-1] <= BQ:
        assert all(pid <= B for pid in got.values())
print("ok")
