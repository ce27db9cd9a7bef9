"""Inference iterations: what vLLM, SGLang and ATOM annotate per engine step, and the iterations of an engine
trace without such annotations, found from its repeating work.

Inference engines do not call `ProfilerStep`: a trace of one is a single window to the step analysis. Each
engine step (one forward over the scheduled batch) is annotated instead (`record_function`), with its batch:

* vLLM: `execute_new_<n>_cached_<m>` (the worker's annotation: requests scheduled for the first time and
  requests continuing); with the detailed profiling of AMD's builds
  `execute_<tokens>_context_<n>(sq<t>sk<t>sqsq<s>sqsk<s>)_generation_<m>(sq..sk..sqsq..sqsk..)`, or
  `execute_context_<n>(<tokens>)_generation_<m>(<tokens>)`: n prefill ("context") and m decode
  ("generation") requests, their new tokens (sq), keys (sk) and the sums sq*sq and sq*sk over them;
* SGLang: `step[EXTEND bs=<n> toks=<t>]` (prefill), `step[DECODE bs=<n>]`, `step[MIXED bs=<n> ...]`, with
  `c_sq=`, `c_sk=`, `c_sqsq=`, `c_sqsk=`, `g_*=` and `c=` / `g=` (requests) in its detailed form;
* ATOM: `prefill[bs=<n> tok=<t> ...]`, `decode[bs=<n> tok=<t> ...]` (`bs=117/128`: 117 real, padded to 128);
* CUDA-graph capture, vLLM and SGLang alike: `capture_<tokens>_<mode>` (vLLM's mode is the cudagraph mode:
  FULL graphs serve uniform decode batches under its default FULL_AND_PIECEWISE, PIECEWISE the others;
  SGLang's DECODE / PREFILL / EXTEND / MIXED).

The formats are the ones AMD TraceLens' `annotation_utils` reads, and vLLM's `gpu_worker.annotate_profile`.
Each outermost such annotation is one iteration; one nested in it (SGLang's `step[...]` inside an `execute_`)
describes the same iteration and fills in what the outer one does not say. A trace without `ProfilerStep`
gets one step per iteration (`reader`: a `ProfilerStep#<i>` marker over each, so every analyzer sees steps);
a trace with `ProfilerStep` keeps its steps, and each step is described by the iterations it holds.

An engine trace (ops in the engines' namespaces) with neither: its iterations are the repeats of the launching
thread's top-level work (`repeating_windows`), phase unknown.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pyarrow as pa

#: Phases of an iteration (null: not stated).
PHASES = ("prefill", "decode", "mixed")

_VLLM_DETAILED = re.compile(
    r"^execute_(\d+)_context_(\d+)\(sq(\d+)sk(\d+)sqsq(\d+)sqsk(\d+)\)"
    r"_generation_(\d+)\(sq(\d+)sk(\d+)sqsq(\d+)sqsk(\d+)\)"
)
_VLLM_NATIVE = re.compile(r"^execute_context_(\d+)\((\d+)\)_generation_(\d+)\((\d+)\)")
_VLLM_UPSTREAM = re.compile(r"^execute_new_(\d+)_cached_(\d+)$")
_SGLANG = re.compile(r"^step\[(EXTEND|DECODE|MIXED|PREFILL)\b([^\]]*)\]")
_ATOM = re.compile(r"^(prefill|decode)\[(.*)\]$")
_CAPTURE = re.compile(r"^capture_(\d+)_([A-Za-z_]+)$")
_KV = re.compile(r"(\w+)=(\d+)")
#: Capture modes -> the phase of the batches the captured graph serves.
_CAPTURE_PHASE = {
    "decode": "decode",
    "full": "decode",
    "full_decode_only": "decode",
    "prefill": "prefill",
    "extend": "prefill",
    "mixed": "mixed",
    "mixed_prefill": "mixed",
    "piecewise": "mixed",
}


@dataclass
class Iteration:
    """One engine iteration as its annotation states it (None: not stated). `kind`: "iteration" (an
    engine step), "capture" (a CUDA-graph capture: work recorded, not run) or "repeat" (found from repeating
    work). Tokens are the new tokens the batch computes (sq); `c_*` the prefill requests', `g_*` the decode
    requests'."""

    name: str
    format: str  # the annotation format read: execute (vLLM), step (SGLang), atom, capture, repeat
    kind: str = "iteration"
    phase: str | None = None
    tokens: int | None = None
    prefill_tokens: int | None = None
    decode_tokens: int | None = None
    requests: int | None = None
    prefill_requests: int | None = None
    decode_requests: int | None = None
    c_sq: int | None = None
    c_sk: int | None = None
    c_sqsq: int | None = None
    c_sqsk: int | None = None
    g_sq: int | None = None
    g_sk: int | None = None
    g_sqsq: int | None = None
    g_sqsk: int | None = None

    def merged(self, inner: Iteration) -> Iteration:
        """This iteration with what a nested annotation of it says and this one does not."""
        a, b = asdict(self), asdict(inner)
        for k, v in b.items():
            if a.get(k) is None and v is not None:
                a[k] = v
        return Iteration(**a)


def _phase(prefill_requests: int | None, decode_requests: int | None) -> str | None:
    p, d = prefill_requests or 0, decode_requests or 0
    if prefill_requests is None and decode_requests is None:
        return None
    if p and d:
        return "mixed"
    return "prefill" if p else "decode" if d else None


def _sum(*vals: int | None) -> int | None:
    return None if any(v is None for v in vals) else sum(v for v in vals if v is not None)


def parse_iteration(name: str) -> Iteration | None:
    """The iteration an engine annotation names, or None when `name` is none of the formats above."""
    if not isinstance(name, str) or len(name) > 4096:
        return None
    m = _VLLM_DETAILED.match(name)
    if m:
        tok, nc, csq, csk, csqsq, csqsk, ng, gsq, gsk, gsqsq, gsqsk = map(int, m.groups())
        return Iteration(
            name, "execute", phase=_phase(nc, ng), tokens=tok, prefill_tokens=csq, decode_tokens=gsq,
            requests=nc + ng, prefill_requests=nc, decode_requests=ng, c_sq=csq, c_sk=csk, c_sqsq=csqsq,
            c_sqsk=csqsk, g_sq=gsq, g_sk=gsk, g_sqsq=gsqsq, g_sqsk=gsqsk,
        )  # fmt: skip
    m = _VLLM_NATIVE.match(name)
    if m:
        nc, ct, ng, gt = map(int, m.groups())
        return Iteration(
            name, "execute", phase=_phase(nc, ng), tokens=ct + gt, prefill_tokens=ct, decode_tokens=gt,
            requests=nc + ng, prefill_requests=nc, decode_requests=ng, c_sq=ct, g_sq=gt,
        )  # fmt: skip
    m = _VLLM_UPSTREAM.match(name)
    if m:  # requests only: a continuing ("cached") request may be a chunked prefill's next chunk
        new, cached = map(int, m.groups())
        phase = "mixed" if new and cached else "prefill" if new else "decode" if cached else None
        return Iteration(name, "execute", phase=phase, requests=new + cached)
    m = _SGLANG.match(name)
    if m:
        return _sglang(name, m.group(1), m.group(2))
    m = _ATOM.match(name)
    if m:
        return _atom(name, m.group(1), m.group(2))
    m = _CAPTURE.match(name)
    if m:
        tok, mode = int(m.group(1)), m.group(2).lower()
        # the mode, else its last word (vLLM puts a label before it: `capture_32_draft_FULL`)
        phase = _CAPTURE_PHASE.get(mode, _CAPTURE_PHASE.get(mode.rsplit("_", 1)[-1]))
        return Iteration(
            name, "capture", kind="capture", phase=phase, tokens=tok,
            prefill_tokens=tok if phase == "prefill" else 0 if phase == "decode" else None,
            decode_tokens=tok if phase == "decode" else 0 if phase == "prefill" else None,
        )  # fmt: skip
    return None


def _sglang(name: str, mode: str, body: str) -> Iteration:
    kv = {k: int(v) for k, v in _KV.findall(body)}
    bs, toks = kv.get("bs"), kv.get("toks")
    it = Iteration(name, "step", requests=bs)
    for side in ("c", "g"):
        for f in ("sq", "sk", "sqsq", "sqsk"):
            if f"{side}_{f}" in kv:
                setattr(it, f"{side}_{f}", kv[f"{side}_{f}"])
    if mode == "DECODE":
        it.phase, it.decode_requests, it.prefill_requests = "decode", bs, 0
        it.decode_tokens = it.g_sq if it.g_sq is not None else bs  # one token per request (more with MTP)
        it.prefill_tokens = 0
    elif mode in ("EXTEND", "PREFILL"):
        it.phase, it.prefill_requests, it.decode_requests = "prefill", bs, 0
        it.prefill_tokens = it.c_sq if it.c_sq is not None else toks
        it.decode_tokens = 0
    else:  # MIXED: c= / g= request counts when detailed
        it.phase = "mixed"
        it.prefill_requests, it.decode_requests = kv.get("c"), kv.get("g")
        it.prefill_tokens, it.decode_tokens = it.c_sq, it.g_sq
    it.tokens = _sum(it.prefill_tokens, it.decode_tokens)
    if it.tokens is None and toks is not None:
        it.tokens = toks
    return it


def _atom(name: str, phase: str, body: str) -> Iteration:
    bs = re.search(r"\bbs=(\d+)", body)
    tok = re.search(r"\btok=(\d+)", body)
    n = int(bs.group(1)) if bs else None
    t = int(tok.group(1)) if tok else None
    if phase == "prefill":
        return Iteration(
            name, "atom", phase="prefill", tokens=t, prefill_tokens=t, decode_tokens=0, requests=n,
            prefill_requests=n, decode_requests=0,
        )  # fmt: skip
    return Iteration(
        name, "atom", phase="decode", tokens=t, prefill_tokens=0, decode_tokens=t, requests=n,
        prefill_requests=0, decode_requests=n,
    )  # fmt: skip


# ------------------------------------------------------------------------------------------- in a trace
@dataclass
class Windows:
    """Iterations found in one rank's events: CPU-side windows [start, end) in the reader's relative ns, the
    thread (pid, tid) of each, and what each is."""

    start: np.ndarray
    end: np.ndarray
    pid: list[Any]
    tid: list[Any]
    iterations: list[Iteration]
    rows: np.ndarray  # the event row of each window's annotation (-1: none, a repeat)


def annotated_windows(
    kind: np.ndarray,
    names: pa.DictionaryArray,
    ts: np.ndarray,
    dur: np.ndarray,
    tid: np.ndarray,
    cpu: np.ndarray,
) -> Windows | None:
    """The outermost engine-iteration annotations (CPU side: `cpu`, the kinds user_annotation and cpu_op),
    in time order, each merged with the annotations nested in it on its thread; None when there are none."""
    d = names.dictionary.to_pylist()
    parsed = [parse_iteration(s) if isinstance(s, str) else None for s in d]
    if not any(p is not None for p in parsed):
        return None
    hit = np.array([p is not None for p in parsed] + [False], dtype=bool)
    idx = names.indices.fill_null(len(d)).to_numpy(zero_copy_only=False)
    rows = np.flatnonzero(hit[idx] & cpu)
    if not rows.size:
        return None
    order = np.lexsort((-dur[rows], ts[rows], tid[rows]))
    rows = rows[order]
    outer: list[int] = []
    its: list[Iteration] = []
    cur_end, cur_tid = None, None
    for r in rows.tolist():  # (one row per engine step: a few thousand at most)
        it = parsed[idx[r]]
        assert it is not None
        if cur_end is not None and tid[r] == cur_tid and ts[r] < cur_end:
            its[-1] = its[-1].merged(it)
            continue
        outer.append(r)
        its.append(it)
        cur_end, cur_tid = ts[r] + max(int(dur[r]), 0), tid[r]
    o = np.array(outer, dtype=np.int64)
    by_time = np.argsort(ts[o], kind="stable")
    o = o[by_time]
    return Windows(
        start=ts[o].astype(np.int64),
        end=(ts[o] + np.maximum(dur[o], 0)).astype(np.int64),
        pid=[None] * len(o),
        tid=tid[o].tolist(),
        iterations=[its[i] for i in by_time.tolist()],
        rows=o,
    )


# ------------------------------------------------------------------------------------------- repeating work
#: Namespaces of the ops only inference engines run (vLLM's `vllm::`, `_C::`, `_C_cache_ops::`, `_moe_C::`,
#: SGLang's `sglang::`, `sgl_kernel::`, FlashInfer's): an engine trace, whose repeats are its iterations.
ENGINE_OP = re.compile(
    r"^(vllm|_C|_C_cache_ops|_moe_C|_rocm_C|sglang|sgl_kernel|sglang_profiler|flashinfer)::"
)
#: A repeating unit must repeat at least this often (fewer is no evidence of a loop: a prefill and a decode)
#: and explain more than this share of the thread's top-level work (else it is a layer's pattern inside one
#: big forward, or noise).
MIN_REPEATS = 3
MIN_COVERAGE = 0.5


def find_period(codes: list[int], min_repeats: int = MIN_REPEATS) -> tuple[int, int, int] | None:
    """(period, start, repeats) of the repeating unit of a sequence that explains the most of it (the
    shortest such unit), or None. Candidate periods are the gaps between recurrences of the rarest label
    that recurs `min_repeats` times (every label of a period-p sequence recurs every p positions); each is
    verified by its longest p-aligned run."""
    n = len(codes)
    counts: dict[int, int] = {}
    for c in codes:
        counts[c] = counts.get(c, 0) + 1
    eligible = [(k, c) for c, k in counts.items() if k >= min_repeats]
    if not eligible:
        return None
    anchor = min(eligible)[1]
    pos = [i for i, c in enumerate(codes) if c == anchor]
    best: tuple[float, int, int, int] | None = None
    for p in sorted({b - a for a, b in zip(pos, pos[1:])}):
        if p * min_repeats > n:
            continue
        start, run, i = 0, 0, 0
        while i < n - p:
            if codes[i] != codes[i + p]:
                i += 1
                continue
            j = i
            while j < n - p and codes[j] == codes[j + p]:
                j += 1
            if j - i > run:
                start, run = i, j - i
            i = j + 1
        reps = (run + p) // p
        cover = reps * p / n
        if reps < min_repeats or cover <= MIN_COVERAGE:
            continue
        key = (-round(cover, 3), p, start, reps)
        if best is None or key < best:
            best = key
    if best is None:
        return None
    return best[1], best[2], best[3]


def repeating_windows(
    names: pa.DictionaryArray,
    ts: np.ndarray,
    dur: np.ndarray,
    tid: np.ndarray,
    top: np.ndarray,
    launch: np.ndarray,
) -> Windows | None:
    """Iterations of an engine trace without annotations: on the thread that launches the most device work,
    its top-level events (`top`: CPU ops and annotations, python frames left out) that launch any, as a
    sequence of names; the unit that repeats (find_period) is one iteration, each repeat a window from its
    first event's start to its last one's end. None when no unit repeats enough."""
    if not launch.any() or not top.any():
        return None
    lt = tid[launch]
    vals, cnt = np.unique(lt, return_counts=True)
    main = vals[np.argmax(cnt)]
    rows = np.flatnonzero(top & (tid == main))
    if rows.size < MIN_REPEATS:
        return None
    rows = rows[np.lexsort((-dur[rows], ts[rows]))]
    ends = ts[rows] + np.maximum(dur[rows], 0)
    # outermost only: an event starting before the running end of those before it is nested
    run_end = np.maximum.accumulate(np.r_[np.iinfo(np.int64).min, ends[:-1]])
    rows, ends = rows[ts[rows] >= run_end], ends[ts[rows] >= run_end]
    lts = np.sort(ts[launch & (tid == main)])
    has = np.searchsorted(lts, ends, side="left") > np.searchsorted(lts, ts[rows], side="left")
    rows, ends = rows[has], ends[has]
    if rows.size < MIN_REPEATS:
        return None
    idx = names.indices.fill_null(-1).to_numpy(zero_copy_only=False)
    codes = idx[rows].tolist()
    found = find_period(codes)
    if found is None:
        return None
    p, start, reps = found
    s = np.array([ts[rows[start + i * p]] for i in range(reps)], dtype=np.int64)
    e = np.array([ends[start + i * p : start + (i + 1) * p].max() for i in range(reps)], dtype=np.int64)
    return Windows(
        start=s,
        end=e,
        pid=[None] * reps,
        tid=[main] * reps,
        iterations=[Iteration(f"repeat {i}", "repeat", kind="repeat") for i in range(reps)],
        rows=np.full(reps, -1, dtype=np.int64),
    )


def is_engine_trace(names: pa.DictionaryArray) -> bool:
    """Whether any event name is an op of an inference engine's namespaces (ENGINE_OP)."""
    return any(isinstance(s, str) and ENGINE_OP.match(s) for s in names.dictionary.to_pylist())


def records(iterations: list[tuple[int | None, Iteration]]) -> list[dict[str, Any]]:
    """(step, iteration) pairs as the metadata's `iterations_json` records."""
    return [{"step": s, **asdict(it)} for s, it in iterations]
