"""Decode steps found from the kernel stream alone: a pure function of kernel names (and, when
given, their times).

A decode loop launches the same sequence of kernels every token. Its period (kernels per step)
shows in the spacing of the kernels that run once per step (the embedding, the LM head, the
sampler): between two of their launches lie exactly one step's kernels. The search:

1. **Candidates.** For every kernel name seen at least ``MIN_STEPS`` times, the median spacing
   of its launches (in kernels) and the share of spacings within ``TOL`` (10 %) of it. A name
   whose spacings are regular (``REGULAR``) and whose launches cover a good part of the stream
   proposes a period.
2. **Nesting.** Layers repeat inside a step, and a step may repeat inside a larger cycle (a
   kernel every 16 tokens, a whole generation of fixed length). Start from the longest period;
   go down to a shorter one B when B's spacing stays regular *across* the longer period's
   boundaries (what the longer period adds is noise: less than 10 % of a step), or when a
   host gap opens before every B step (the token's sync: ``time_supported``). A layer's
   spacing breaks at every step boundary by the step's own kernels (LM head, sampler), and no
   host gap separates layers, so a step is never cut into layers.
3. **Phase.** Where a step begins: after the idle gap of the GPU that opens before every step
   (the host reads the token back): the place whose gap is the largest in the median step (a
   host thread that stalls between two launches leaves a larger gap elsewhere in some steps,
   never at the same place in most); else right after the kernels that precede the first
   regular run (the prefill).
4. **Cut.** A step begins ``lead`` kernels before each launch of the anchor; with the host
   gap, each boundary is settled within the tolerance by the kernel names around it (those of
   the consensus step's end before it, of its beginning from it), then by the gap. A step
   whose kernel names (as a multiset) match the consensus step at ``SIMILAR`` (90 %) or better
   is a decode step; what precedes a run of decode steps and matches nothing is its
   **prefill** (cut at the largest idle gap there, when times are given, so set-up kernels
   before it are not counted); a first step that matches but takes over ``PREFILL_RATIO`` ×
   the median decode step is a prefill too (a prefill with the decode kernels' names).

**CUDA graphs.** Every kernel of one CUDA-graph launch carries the launch's correlation id
(``launches``, when given). A step holds at least one whole graph launch, so a name launched
twice in one graph launch repeats *inside* a step (a layer of a graph-captured forward) and
proposes no period: a decode step that is one graph launch plus a few kernels is never cut into
its layers, even before three steps have run (then no loop shows yet).

**Graph-level trace.** A native program traced with ``--cuda-graph-trace graph`` shows each
CUDA-graph launch as one record (``GRAPH_KERNEL``) and none of its kernels, so a decode step
that is one graph launch may be a single entry, a period of 1 that no spacing proposes. When no
other loop shows, each launch of the graph begins a step: the consensus is the sequence seen
most often from one launch to the next (the launch and the few kernels around it).

**Confidence** = share of the steps in a run that match the consensus (decode steps among
decode and unmatched ones), times ``min(1, decode steps / 8)``: three clean steps are not yet a
loop. ``identical`` counts the decode steps whose name sequence is exactly the consensus.
Streams: each CUDA stream is searched on its own as well as all of them together (two loops
interleaved on two streams), and the cut with the most kernels in confident decode steps wins.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from ..store.records import GRAPH_KERNEL

MIN_STEPS = 3          # launches of a name before it proposes a period
TOL = 0.10             # spacing tolerance, share of the period
REGULAR = 0.8          # share of regular spacings for a period
COVERAGE = 0.3         # share of the stream a period's launches must span
UNIFORM = 0.6          # share of a period's segments alike (not two loops sharing a name)
SIMILAR = 0.9          # multiset similarity of a decode step to the consensus
VARYING = 0.75         # ... of a decode step that differs (counted apart, lowers confidence)
GAP_RATIO = 4.0        # a step's leading gap vs the median idle gap (time support)
PHASE_SHARE = 0.7      # share of steps whose largest gap sits at the same place
PREFILL_RATIO = 2.0    # a first step this much longer than the median decode step: prefill
MIN_CONFIDENCE = 0.6   # below this ("low"), a cut is not used for steps
FULL_STEPS = 8         # decode steps for full confidence
PREFILL, DECODE = "prefill", "decode"


@dataclass(frozen=True)
class Loop:
    """A decode loop: its consensus step and how to find its boundaries."""

    period: int                  # kernels per decode step
    anchor: str                  # a kernel launched once per step
    lead: int                    # kernels of a step before its anchor
    consensus: tuple[str, ...]   # the step's kernel names, in launch order
    time_supported: bool         # an idle gap opens before every step
    stream: int | None = None    # the CUDA stream searched (None: all together)

    def similarity(self, names: Sequence[str]) -> float:
        return similarity(names, self.consensus)


@dataclass
class Step:
    """Kernels ``first`` to ``end`` (exclusive) of the searched sequence."""

    first: int
    end: int
    phase: str
    identical: bool = False
    varying: bool = False    # a decode step whose kernels match the consensus less closely


@dataclass
class Cut:
    """The steps found in one kernel sequence, and how sure the cut is."""

    loop: Loop | None
    steps: list[Step] = field(default_factory=list)
    confidence: float = 0.0
    identical: int = 0          # decode steps whose names are exactly the consensus
    unmatched: int = 0          # steps inside runs that match nothing (not a prefill)
    indices: list[int] | None = None   # positions of the searched kernels in the input
    others: list[dict] = field(default_factory=list)   # loops found on other streams
    reason: str = ""

    @property
    def decode(self) -> int:
        return sum(1 for s in self.steps if s.phase == DECODE)

    @property
    def prefill(self) -> int:
        return sum(1 for s in self.steps if s.phase == PREFILL)

    @property
    def usable(self) -> bool:
        return self.loop is not None and self.confidence >= MIN_CONFIDENCE

    def label(self) -> str:
        """``high``, ``medium`` or ``low``."""
        c = self.confidence
        return "high" if c >= 0.9 else "medium" if c >= 0.6 else "low"

    def describe(self) -> dict:
        """What the snapshot's ``meta.auto_steps`` says about the cut."""
        lp = self.loop
        if lp is None:
            return {"found": False, "reason": self.reason}
        return {"found": True, "kernels_per_step": lp.period, "anchor": lp.anchor,
                "lead": lp.lead, "decode_steps": self.decode, "prefill_steps": self.prefill,
                "identical_steps": self.identical, "unmatched_steps": self.unmatched,
                "confidence": round(self.confidence, 3), "confidence_label": self.label(),
                "boundary": "host gap before each step" if lp.time_supported
                else "after the prefill's last kernel", "stream": lp.stream,
                "consensus": list(lp.consensus[:64]), "other_loops": self.others}


def similarity(a: Sequence[str], b: Sequence[str]) -> float:
    """Multiset overlap of two kernel-name sequences over the longer one's length (1: the same
    kernels, in any order; a kernel inserted or missing costs 1/len)."""
    if not a or not b:
        return 0.0
    ca, cb = Counter(a), Counter(b)
    common = sum(min(n, cb[k]) for k, n in ca.items())
    return common / max(len(a), len(b))


# ------------------------------------------------------------------------ search
@dataclass
class _Cand:
    name: int
    period: int
    tol: int
    regular: float
    pos: np.ndarray
    gaps: np.ndarray


IN_LAUNCH = 0.5         # share of a name's consecutive launches inside one graph launch


def _inside_one_launch(pos: np.ndarray, launches: np.ndarray | None) -> bool:
    """Most consecutive launches of a name belong to the same CUDA-graph launch (the same
    correlation id): the name repeats inside a step."""
    if launches is None or len(pos) < 2:
        return False
    lid = launches[pos]
    return float(np.mean(lid[1:] == lid[:-1])) >= IN_LAUNCH


def _candidates(ids: np.ndarray, launches: np.ndarray | None = None) -> list[_Cand]:
    n = len(ids)
    order = np.argsort(ids, kind="stable")
    sorted_ids = ids[order]
    cuts = np.flatnonzero(np.diff(sorted_ids)) + 1
    out = []
    for grp in np.split(order, cuts):
        if len(grp) < MIN_STEPS:
            continue
        pos = np.sort(grp)
        gaps = np.diff(pos)
        period = int(np.median(gaps))
        if period < 2:
            continue
        tol = int(TOL * period)  # 0 below 10 kernels: a 5-6-5-6 spacing is two loops, not one
        regular = float(np.mean(np.abs(gaps - period) <= tol))
        if regular >= REGULAR and len(pos) * period >= COVERAGE * n \
                and not _inside_one_launch(pos, launches):
            out.append(_Cand(int(ids[pos[0]]), period, tol, regular, pos, gaps))
    return out


def _groups(cands: list[_Cand]) -> list[_Cand]:
    """One candidate per period (periods within tolerance merged): the most regular, then the
    most launched."""
    best: list[_Cand] = []
    for c in sorted(cands, key=lambda c: (-c.period, -c.regular, -len(c.pos))):
        for i, b in enumerate(best):
            if abs(b.period - c.period) <= max(b.tol, c.tol):
                if (c.regular, len(c.pos)) > (b.regular, len(b.pos)):
                    best[i] = c
                break
        else:
            best.append(c)
    return sorted(best, key=lambda c: -c.period)


def _straddle_regular(b: _Cand, a: _Cand) -> bool:
    """B's spacing stays regular across A's launches (A adds noise to B's steps, no structure)."""
    idx = np.searchsorted(b.pos, a.pos, side="left")  # B gap j holds A launch when idx == j + 1
    j = idx - 1
    ok = (j >= 0) & (j < len(b.gaps))
    if not ok.any():
        return True
    g = b.gaps[j[ok]]
    return float(np.mean(np.abs(g - b.period) <= b.tol)) >= REGULAR


def _idle(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Idle time before each kernel, never negative; the first kernel's is taken as longer than
    any (the stream's start is a step boundary)."""
    idle = np.zeros(len(starts), dtype=np.int64)
    if len(starts):
        idle[0] = 1 << 60
    if len(starts) > 1:
        prev_end = np.maximum.accumulate(ends[:-1])
        idle[1:] = np.maximum(0, starts[1:] - prev_end)
    return idle


def _time_phase(c: _Cand, idle: np.ndarray | None) -> int | None:
    """Offset (from the anchor) of the kernel after the host gap, when such a gap opens before
    nearly every step; else None. Where most steps hold exactly the period's kernels, the gap
    is the offset whose idle time is the largest in the median step: a host that stalls now
    and then between two launches leaves a larger gap elsewhere in some steps, never at the
    same place in most. Otherwise (a stray kernel in most steps moves the offsets), the place
    of each step's largest gap, the most common one."""
    if idle is None or len(c.pos) < MIN_STEPS + 1:
        return None
    pos = c.pos
    regular = np.flatnonzero(np.abs(c.gaps - c.period) <= c.tol)
    if len(regular) < MIN_STEPS:
        return None
    exact = regular[c.gaps[regular] == c.period]
    if len(exact) >= MIN_STEPS and 2 * len(exact) >= len(regular):
        seg = idle[pos[exact][:, None] + 1 + np.arange(c.period)]   # steps x offsets
        positive = seg[seg > 0]
        base = float(np.median(positive)) if len(positive) else 0.0
        k = int(np.argmax(np.median(seg, axis=0)))
        opens = float(np.mean(seg[:, k] >= GAP_RATIO * max(base, 1.0)))
        return k + 1 if opens >= PHASE_SHARE else None
    offs, peaks, inside = [], [], []
    for j in regular:
        seg = idle[pos[j] + 1: pos[j + 1] + 1]
        k = int(np.argmax(seg))
        offs.append(k + 1)
        peaks.append(seg[k])
        inside.append(seg)
    gaps = np.concatenate(inside)          # the loop's own gaps, not those around it
    positive = gaps[gaps > 0]
    base = float(np.median(positive)) if len(positive) else 0.0
    mode, count = Counter(offs).most_common(1)[0]
    near = sum(1 for o in offs if abs(o - mode) <= c.tol)
    if near < PHASE_SHARE * len(offs) or float(np.median(peaks)) < GAP_RATIO * max(base, 1.0):
        return None
    return mode


def _uniform(ids: np.ndarray, c: _Cand) -> bool:
    """Most of the candidate's regular segments hold the same kernels (one loop, not two
    alternating ones that share a name)."""
    segs = [tuple(ids[c.pos[j]: c.pos[j + 1]].tolist())
            for j in range(len(c.gaps)) if abs(c.gaps[j] - c.period) <= c.tol]
    if not segs:
        return False
    mode = Counter(segs).most_common(1)[0][0]
    same = sum(1 for g in segs if g == mode or similarity(g, mode) >= SIMILAR)
    return same > UNIFORM * len(segs)


def _pick(ids: np.ndarray, groups: list[_Cand],
          idle: np.ndarray | None) -> tuple[_Cand, int | None] | None:
    """From the longest period down: a shorter one replaces it when a host gap opens before
    each of its steps, or (unless the longer one has such gaps and it has not) when its
    spacing stays regular across the longer one's boundaries."""
    groups = [g for g in groups if _uniform(ids, g)]
    if not groups:
        return None
    cur = groups[0]
    cur_phase = _time_phase(cur, idle)
    for b in groups[1:]:
        if cur.period < 1.8 * b.period:
            continue
        phase = _time_phase(b, idle)
        if phase is not None or (cur_phase is None and _straddle_regular(b, cur)):
            cur, cur_phase = b, phase
    return cur, cur_phase


def _consensus(ids: np.ndarray, c: _Cand) -> tuple[int, ...]:
    """The most common segment among the regular ones (a noisy step is one of a kind; the
    clean step repeats), starting at the anchor."""
    segs = Counter(tuple(ids[c.pos[j]: c.pos[j + 1]].tolist())
                   for j in range(len(c.gaps)) if abs(c.gaps[j] - c.period) <= c.tol)
    if not segs:
        return tuple(ids[c.pos[0]: c.pos[0] + c.period].tolist())
    return segs.most_common(1)[0][0]


def _align_lead(ids: np.ndarray, c: _Cand, seg: tuple[int, ...]) -> int:
    """Kernels of a step before its anchor, without times: the first regular run begins where
    the sequence starts repeating itself one period later (the first kernel of the first
    window of a period that equals the next one), near its first regular launch of the anchor.
    Kernels a prefill shares with the step's tail (a sampler) look periodic: the step then
    begins that many kernels early. With noise in every step no window repeats exactly, and the
    step begins at the anchor's first regular launch, less the kernels before it that repeat
    the consensus's tail."""
    p = len(seg)
    j0 = int(np.flatnonzero(np.abs(c.gaps - c.period) <= c.tol)[0])
    p0 = int(c.pos[j0])
    lo, hi = max(0, p0 - p), min(len(ids) - p, p0 + 2 * p)
    if hi - lo >= p:
        bad = (np.flatnonzero(ids[lo:hi] != ids[lo + p:hi + p]) + lo).tolist()
        for k, s in enumerate([lo] + [b + 1 for b in bad]):
            nxt = bad[k] if k < len(bad) else hi
            if nxt - s >= p:
                anchors = c.pos[c.pos >= s]
                if len(anchors):
                    return int(anchors[0] - s) % p
                break
    lead = 0
    while lead < p - 1 and p0 - lead - 1 >= 0 and ids[p0 - lead - 1] == seg[-lead - 1]:
        lead += 1
    return lead


def find_loop(names: Sequence[str], starts: Sequence[int] | None = None,
              ends: Sequence[int] | None = None, stream: int | None = None,
              launches: Sequence[int] | None = None) -> Loop | None:
    """The decode loop of one kernel sequence (launch order), or None. ``launches``: each
    kernel's launch (correlation) id; the kernels of one CUDA-graph launch share it."""
    if len(names) < 2 * MIN_STEPS:
        return None
    table: dict[str, int] = {}
    ids = np.fromiter((table.setdefault(n, len(table)) for n in names), dtype=np.int64,
                      count=len(names))
    lids = np.asarray(launches, dtype=np.int64) if launches is not None else None
    cands = _candidates(ids, lids)
    if not cands:
        return graph_loop(names, stream)
    idle = None
    if starts is not None and ends is not None:
        idle = _idle(np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64))
    picked = _pick(ids, _groups(cands), idle)
    if picked is None:
        return graph_loop(names, stream)
    c, offset = picked
    seg = _consensus(ids, c)
    period = len(seg)
    if offset is not None:
        lead = (period - offset) % period
    else:
        lead = _align_lead(ids, c, seg)
    step = seg[period - lead:] + seg[:period - lead] if lead else seg
    inv = {v: k for k, v in table.items()}
    return Loop(period, inv[c.name], lead, tuple(inv[i] for i in step), offset is not None,
                stream)


def graph_loop(names: Sequence[str], stream: int | None = None) -> Loop | None:
    """A step per graph launch (graph-level trace, see the module docstring), or None: the
    launches must repeat ``MIN_STEPS`` times and the sequence between two of them be the same
    in at least ``UNIFORM`` of the cases."""
    pos = [i for i, n in enumerate(names) if n == GRAPH_KERNEL]
    if len(pos) <= MIN_STEPS:
        return None
    segs = Counter(tuple(names[a:b]) for a, b in zip(pos, pos[1:]))
    seg, count = segs.most_common(1)[0]
    if count < MIN_STEPS or count < UNIFORM * (len(pos) - 1):
        return None
    return Loop(len(seg), GRAPH_KERNEL, 0, seg, False, stream)


# --------------------------------------------------------------------------- cut
def boundaries(names: Sequence[str], loop: Loop, idle: Sequence[int] | None = None,
               start: int = 0) -> list[int]:
    """Indices (≥ ``start``) where a step of ``loop`` begins: ``lead`` kernels before each
    launch of its anchor; when ``idle`` (the idle time before each kernel) is given and the loop
    is time-supported, the place within the tolerance where the kernel names around it agree
    best with the consensus step's end and beginning, and of those the one after the largest
    idle gap. The names come first: the host gap before a step is usually the largest, but a
    host thread that stalls between two of a step's first launches leaves the GPU idle inside
    the step, sometimes longer; the gap still settles where a stray kernel sits at the
    boundary (the names then fit as well before it as after it)."""
    tol = max(1, int(TOL * loop.period))
    out: list[int] = []
    last = start - 1
    for i in range(start, len(names)):
        if names[i] != loop.anchor:
            continue
        b = i - loop.lead
        if idle is not None and loop.time_supported:
            lo, hi = max(last + 1, b - tol, 0), min(len(names), b + tol + 1)
            if lo < hi and not (lo <= b < hi and idle[b] >= max(idle[lo:hi])
                                and _misfit(names, loop, b, tol) == 0):  # (nothing beats b)
                b = min(range(lo, hi), key=lambda c: (_misfit(names, loop, c, tol), -idle[c]))
        if b > last and b >= start:
            out.append(b)
            last = b
    return out


def _misfit(names: Sequence[str], loop: Loop, c: int, tol: int) -> int:
    """Kernels around index ``c`` whose names differ from the consensus step's, were a step to
    begin at ``c``: ``tol + 1`` (at least 3) kernels before it against the step's end and as
    many from it against its beginning; kernels outside ``names`` are not counted."""
    seq, p = loop.consensus, loop.period
    m = min(max(3, tol + 1), p)
    lo, hi = max(0, c - m), min(len(names), c + m)
    return sum(1 for j in range(lo, hi) if names[j] != seq[(j - c) % p])


def cut(names: Sequence[str], loop: Loop, starts: Sequence[int] | None = None,
        ends: Sequence[int] | None = None, after_decode: bool = False) -> Cut:
    """Steps of ``loop`` over one kernel sequence (see the module docstring).
    ``after_decode``: the sequence continues right after a decode step (a live cut goes on
    where it stopped), so its first step is not the first of a run and a long one is no
    prefill for that."""
    idle = None
    if starts is not None and ends is not None:
        idle = _idle(np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64))
    bounds = boundaries(names, loop, idle)
    result = Cut(loop)
    if not bounds:
        result.reason = "the loop's anchor kernel never ran"
        return result
    edges = bounds + [len(names)]
    steps: list[Step] = []
    pending = 0        # first kernel not in a step yet: the next run's prefill, if one follows
    p = loop.period
    for k in range(len(bounds)):
        a, b = edges[k], edges[k + 1]
        seg = names[a:b]
        sim = loop.similarity(seg)
        if sim >= SIMILAR:
            steps.extend(_prefill(pending, a, idle))
            steps.append(Step(a, b, DECODE, tuple(seg) == loop.consensus))
            pending = b
        elif len(seg) > p and loop.similarity(seg[:p]) >= SIMILAR:
            # a decode step, then something else (a new prefill, the program's end)
            steps.extend(_prefill(pending, a, idle))
            steps.append(Step(a, a + p, DECODE, tuple(seg[:p]) == loop.consensus))
            pending = a + p
        elif sim >= VARYING and pending == a and steps and steps[-1].phase == DECODE:
            # a decode step with some other kernels than the consensus's (counted)
            steps.append(Step(a, b, DECODE, varying=True))
            pending = b
        # else: matches nothing; stays pending (a prefill if a decode step follows)
    _prefill_by_time(steps, starts, ends, after_decode)
    result.steps = steps
    dec = [s for s in steps if s.phase == DECODE]
    result.identical = sum(1 for s in dec if s.identical)
    result.unmatched = sum(1 for s in dec if s.varying)
    similar = len(dec) - result.unmatched
    if similar > 0:
        result.confidence = similar / len(dec) * min(1.0, similar / FULL_STEPS)
    else:
        result.reason = "no step matched the loop's consensus"
    return result


def _prefill(a: int, b: int, idle: np.ndarray | None) -> list[Step]:
    """Kernels ``a``..``b`` before a run of decode steps, as its prefill: from the largest idle
    gap on when times are given and that gap stands out (set-up kernels before it are no step)."""
    if b <= a:
        return []
    if idle is not None and b - a > 2:
        inner = idle[a + 1:b]
        k = a + 1 + int(np.argmax(inner))
        if idle[k] > GAP_RATIO * max(1.0, float(np.median(inner))):
            a = k
    return [Step(a, b, PREFILL)]


def _prefill_by_time(steps: list[Step], starts, ends, after_decode: bool = False) -> None:
    """A step that takes over PREFILL_RATIO × the median decode step is a prefill when it is
    the first step (of a run: not after a decode step), or a decode step whose kernels differ
    from the consensus: a prefill that launches (some of) the decode kernels' names."""
    if starts is None or ends is None:
        return
    dec = [s for s in steps if s.phase == DECODE and not s.varying]
    if len(dec) < MIN_STEPS:
        return
    med = float(np.median([int(ends[s.end - 1]) - int(starts[s.first]) for s in dec]))
    for i, s in enumerate(steps):
        if s.phase != DECODE or not ((i == 0 and not after_decode) or s.varying) or med <= 0:
            continue
        if int(ends[s.end - 1]) - int(starts[s.first]) > PREFILL_RATIO * med:
            s.phase = PREFILL
            s.varying = False


def unexplained_pauses(starts: Sequence[int] | None, ends: Sequence[int] | None,
                       c: Cut) -> bool:
    """The GPU pauses now and then (idle ``GAP_RATIO`` × its median idle time and more) in a
    stream whose loop was found without a host gap before its steps, and those pauses sit at
    fewer than ``PHASE_SHARE`` of its step boundaries: the loop may be a layer of a longer step
    whose host gaps have not repeated three times yet (a forward launched kernel by kernel, 28
    layers of 19 kernels, a pause once a token). A live search waits for more kernels."""
    if c.loop is None or c.loop.time_supported or starts is None or ends is None:
        return False
    idle = _idle(np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64))
    if c.indices is not None:
        idle = idle[np.asarray(c.indices, dtype=np.int64)]
    dec = [s.first for s in c.steps if s.phase == DECODE]
    if len(idle) < 3 or len(dec) < MIN_STEPS:
        return False
    inner = idle[dec[0] + 1:]
    positive = inner[inner > 0]
    if not len(positive):
        return False
    thr = GAP_RATIO * max(1.0, float(np.median(positive)))
    if not (inner >= thr).any():
        return False
    at_bounds = float(np.mean(idle[np.asarray(dec[1:] or dec, dtype=np.int64)] >= thr))
    return at_bounds < PHASE_SHARE


# ---------------------------------------------------------------------- streams
def detect(names: Sequence[str], starts: Sequence[int] | None = None,
           ends: Sequence[int] | None = None, streams: Sequence[int] | None = None,
           launches: Sequence[int] | None = None) -> Cut:
    """The best decode-loop cut of a kernel stream (kernels in start order): every stream on
    its own and all together; the cut with the most kernels in decode steps, among those of
    at least ``MIN_CONFIDENCE``, wins (else the most confident). ``Cut.indices`` maps its steps'
    kernel indices back to the input. ``launches``: each kernel's launch (correlation) id, the
    same for every kernel of one CUDA-graph launch (see the module docstring)."""
    n = len(names)
    subsets: list[tuple[int | None, list[int] | None]] = [(None, None)]
    if streams is not None:
        by: dict[int, list[int]] = defaultdict(list)
        for i, s in enumerate(streams):
            by[int(s)].append(i)
        if len(by) > 1:
            subsets += [(s, idx) for s, idx in by.items() if len(idx) >= 2 * MIN_STEPS]
    cuts: list[Cut] = []
    for stream, idx in subsets:
        if idx is None:
            nm, st, en, la = names, starts, ends, launches
        else:
            nm = [names[i] for i in idx]
            st = [starts[i] for i in idx] if starts is not None else None
            en = [ends[i] for i in idx] if ends is not None else None
            la = [launches[i] for i in idx] if launches is not None else None
        loop = find_loop(nm, st, en, stream, la)
        loops = [loop] if loop is not None else []
        if loop is not None and loop.anchor != GRAPH_KERNEL:
            loops.append(graph_loop(nm, stream))
        for lp in loops:
            if lp is None:
                continue
            c = cut(nm, lp, st, en)
            c.indices = idx
            cuts.append(c)
    if not cuts:
        return Cut(None, reason=f"no kernel sequence repeats in {n} kernels")

    def kernels_in_decode(c: Cut) -> int:
        return sum(s.end - s.first for s in c.steps if s.phase == DECODE)

    usable = [c for c in cuts if c.usable]
    # graph-level trace: a graph launched once a step, over and over, is the decode loop (its
    # launches are single entries, so fewer "kernels" than a prompt's eager forwards)
    graphs = [c for c in usable if c.loop.anchor == GRAPH_KERNEL and c.decode >= FULL_STEPS]
    usable = graphs or usable
    best = max(usable or cuts, key=lambda c: (kernels_in_decode(c), c.confidence)
               if usable else (c.confidence, kernels_in_decode(c)))
    best.others = [{"stream": c.loop.stream, "kernels_per_step": c.loop.period,
                    "decode_steps": c.decode, "confidence": round(c.confidence, 3)}
                   for c in cuts if c is not best and c.usable and c.loop.stream is not None
                   and c.loop.stream != best.loop.stream][:4]
    return best
