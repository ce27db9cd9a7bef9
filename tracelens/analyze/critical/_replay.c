/* tracelens.analyze.critical._replay: the level loop of a dependency graph's replay (critical_replay.replay) in C.
 *
 * `levels(finish, entry, D, Q, e_src, lv, rs, sync)` does what the Python loop of `critical_replay.replay`
 * does, level after level, with the same float operations on the same operands in the same order, so every
 * value is the one the loop gives (tested against it in tests/unit/test_replay_native.py):
 *
 *   entry[a:m] = maximum.reduceat(finish[e_src[e0:e1]], rs[r0:r0 + m - a])
 *   finish[a:b] = maximum(entry[a:b] + D[a:b], Q[a:b])
 *   and for the level's sync terms (slot, x, x_end):
 *       S[a + slot] = Qs[a + slot] + finish[x] - x_end   (every one first, then)
 *       finish[a + slot] = maximum(finish[a + slot], S[a + slot])
 *
 * where (a, m, b, e0, e1, r0) is row i of `lv` (int64, six a level). NumPy's maximum propagates NaN: so does
 * `mx`. Arrays are read through the buffer protocol (float64, signed integers of any width; C-contiguous);
 * every index is checked, so a damaged plan (read from the cache) raises ValueError, never reads out of
 * bounds. The Python loop stays the reference and the fallback where this is not compiled.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    Py_buffer b;
    int held;
} Buf;

static void release(Buf *x) {
    if (x->held) PyBuffer_Release(&x->b);
    x->held = 0;
}

/* 1: a float64 array; 2: a signed integer array; 0: neither */
static int kind_of(const Py_buffer *b) {
    const char *f = b->format ? b->format : "B";
    if (*f == '<' || *f == '=' || *f == '@') f++;
    if (f[1] != 0) return 0;
    if (*f == 'd' && b->itemsize == 8) return 1;
    if ((*f == 'b' || *f == 'h' || *f == 'i' || *f == 'l' || *f == 'q') &&
        (b->itemsize == 1 || b->itemsize == 2 || b->itemsize == 4 || b->itemsize == 8))
        return 2;
    return 0;
}

static int get(PyObject *o, Buf *x, int kind, int writable, const char *name) {
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(o, &x->b, flags) < 0) return -1;
    x->held = 1;
    if (x->b.ndim > 1 || kind_of(&x->b) != kind) {
        PyErr_Format(PyExc_TypeError, "%s: expected a one-dimensional %s array", name,
                     kind == 1 ? "float64" : "signed integer");
        return -1;
    }
    return 0;
}

static inline Py_ssize_t len(const Buf *x) { return x->b.len / x->b.itemsize; }

static inline int64_t iat(const Buf *x, Py_ssize_t i) {
    switch (x->b.itemsize) {
        case 1: return ((const int8_t *)x->b.buf)[i];
        case 2: return ((const int16_t *)x->b.buf)[i];
        case 4: return ((const int32_t *)x->b.buf)[i];
        default: return ((const int64_t *)x->b.buf)[i];
    }
}

/* numpy.maximum of two float64: NaN when either is NaN */
static inline double mx(double a, double b) { return (a >= b || a != a) ? a : b; }

#define BAD(...) do { PyErr_Format(PyExc_ValueError, __VA_ARGS__); goto done; } while (0)

PyDoc_STRVAR(levels_doc,
             "levels(finish, entry, D, Q, e_src, lv, rs, sync) -> None\n\n"
             "The level loop of critical_replay.replay over the plan's level order (see the module source):\n"
             "fills `finish` and `entry` (float64, written in place). `lv`: int64 rows (a, m, b, e0, e1, r0)\n"
             "a level; `rs`: every level's reduceat starts, the level's at r0; `sync`: None, or (S, Qs,\n"
             "starts, slot, x, x_end) with `starts` (n_levels + 1) cutting the sync entries by level.");

static PyObject *levels(PyObject *self, PyObject *args) {
    PyObject *o_fin, *o_ent, *o_D, *o_Q, *o_src, *o_lv, *o_rs, *o_sync;
    Buf fin = {0}, ent = {0}, D = {0}, Q = {0}, src = {0}, lv = {0}, rs = {0};
    Buf S = {0}, Qs = {0}, ss = {0}, slot = {0}, xs = {0}, xe = {0};
    PyObject *ret = NULL;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOOOOOOO:levels", &o_fin, &o_ent, &o_D, &o_Q, &o_src, &o_lv, &o_rs, &o_sync))
        return NULL;
    if (get(o_fin, &fin, 1, 1, "finish") || get(o_ent, &ent, 1, 1, "entry") || get(o_D, &D, 1, 0, "D") ||
        get(o_Q, &Q, 1, 0, "Q") || get(o_src, &src, 2, 0, "e_src") || get(o_lv, &lv, 2, 0, "lv") ||
        get(o_rs, &rs, 2, 0, "rs"))
        goto done;
    int has_sync = o_sync != Py_None;
    if (has_sync) {
        PyObject *o[6];
        if (!PyArg_ParseTuple(o_sync, "OOOOOO:sync", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5])) goto done;
        if (get(o[0], &S, 1, 1, "S") || get(o[1], &Qs, 1, 0, "Qs") || get(o[2], &ss, 2, 0, "starts") ||
            get(o[3], &slot, 2, 0, "slot") || get(o[4], &xs, 2, 0, "x") || get(o[5], &xe, 1, 0, "x_end"))
            goto done;
    }
    const Py_ssize_t n = len(&fin), n_e = len(&src), n_rs = len(&rs), n_lv = len(&lv) / 6;
    if (len(&ent) != n || len(&D) != n || len(&Q) != n || lv.b.itemsize != 8 || len(&lv) % 6)
        BAD("levels: arrays of unequal lengths");
    if (has_sync && (len(&S) != n || len(&Qs) != n || len(&ss) != n_lv + 1 || len(&slot) != len(&xs) ||
                     len(&xe) != len(&xs)))
        BAD("levels: sync arrays of unequal lengths");
    double *f = (double *)fin.b.buf, *e = (double *)ent.b.buf;
    const double *d = (const double *)D.b.buf, *q = (const double *)Q.b.buf;
    const int64_t *L = (const int64_t *)lv.b.buf;
    const Py_ssize_t n_sync = has_sync ? len(&slot) : 0;
    for (Py_ssize_t i = 0; i < n_lv; i++) {
        const int64_t a = L[6 * i], m = L[6 * i + 1], b = L[6 * i + 2], e0 = L[6 * i + 3], e1 = L[6 * i + 4],
                      r0 = L[6 * i + 5];
        if (!(0 <= a && a <= m && m <= b && b <= n && 0 <= e0 && e0 <= e1 && e1 <= n_e && r0 >= 0 &&
              r0 + (m - a) <= n_rs))
            BAD("levels: level %zd out of bounds", i);
        const int64_t ne = e1 - e0;
        for (int64_t j = 0; j < m - a; j++) { /* maximum.reduceat over the level's in-edges */
            int64_t s = iat(&rs, r0 + j), t = j + 1 < m - a ? iat(&rs, r0 + j + 1) : ne;
            if (s < 0 || s >= ne || t > ne) BAD("levels: reduceat start out of bounds at level %zd", i);
            if (t <= s) t = s + 1; /* (reduceat: a start not below the next gives the element at it) */
            double acc = 0;
            for (int64_t k = s; k < t; k++) {
                int64_t u = iat(&src, e0 + k);
                if (u < 0 || u >= n) BAD("levels: edge source out of bounds at level %zd", i);
                acc = k == s ? f[u] : mx(acc, f[u]);
            }
            e[a + j] = acc;
        }
        for (int64_t j = a; j < b; j++) f[j] = mx(e[j] + d[j], q[j]);
        if (has_sync) {
            int64_t c0 = iat(&ss, i), c1 = iat(&ss, i + 1);
            if (c0 < 0 || c0 > c1 || c1 > n_sync) BAD("levels: sync entries out of bounds at level %zd", i);
            double *sv = (double *)S.b.buf;
            const double *qs = (const double *)Qs.b.buf, *xend = (const double *)xe.b.buf;
            for (int64_t c = c0; c < c1; c++) {
                int64_t sl = iat(&slot, c), x = iat(&xs, c);
                if (sl < 0 || sl >= b - a || x < 0 || x >= n) BAD("levels: sync entry out of bounds at level %zd", i);
                sv[a + sl] = qs[a + sl] + f[x] - xend[c];
            }
            for (int64_t c = c0; c < c1; c++) {
                int64_t sl = iat(&slot, c);
                f[a + sl] = mx(f[a + sl], sv[a + sl]);
            }
        }
    }
    ret = Py_None;
    Py_INCREF(ret);
done:
    release(&fin), release(&ent), release(&D), release(&Q), release(&src), release(&lv), release(&rs);
    release(&S), release(&Qs), release(&ss), release(&slot), release(&xs), release(&xe);
    return ret;
}

static PyMethodDef methods[] = {
    {"levels", levels, METH_VARARGS, levels_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_replay",
    "Compiled level loop of a dependency graph's replay (see tracelens.analyze.critical.critical_replay).",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__replay(void) { return PyModule_Create(&module); }
