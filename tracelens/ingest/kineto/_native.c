/* tracelens.ingest.kineto._native: one chunk of Kineto `traceEvents` (a JSON array) -> columns, without a
 * Python object per event.
 *
 * `scan(buffer)` reads the chunk's text once and returns its columns (see `scan`'s docstring), or None when
 * the chunk holds anything outside the common typed case that the Python decoders (decode.py, columns.py)
 * handle with their own rules: a string where a number belongs, a float id, an exponent or more than 15
 * integer digits in a timestamp, an escaped or duplicated key, a JSON error... The caller then decodes the
 * chunk with msgspec as before, so a chunk's columns are the same whichever path made them (tested in
 * tests/unit/test_native_decoder.py against the Python path on every real trace the tests have).
 *
 * What it keeps, as the msgspec structs of decode.py do:
 * - complete events (`"ph": "X"`): cat, name, pid, tid, ts, dur and the args `External id`, `Sequence
 *   number`, `device`, `stream`, `correlation`; whether `Collective name` is there (not null); where the
 *   args object is in the text (the few collective rows are decoded by msgspec from it);
 * - `[memory]` instant events (`"ph": "i"` / `"I"`): ts and the args `Device Id`, `Bytes`, `Total
 *   Allocated`, `Total Reserved`;
 * - every other phase msgspec knows (decode._OTHER_PHASES) is skipped, its text checked as JSON only.
 * Timestamps are microsecond decimals made exact integer nanoseconds: three decimals exactly, a fourth
 * rounds half up (away from zero), later ones are ignored (columns.parse_us_to_ns_numpy's rule).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(_WIN32)
#include <process.h>
#define getpid _getpid
#else
#include <unistd.h>
#endif
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

typedef unsigned char u8;

/* ------------------------------------------------------------------------------------------ values */
enum { T_ABSENT = 0, T_NULL, T_TRUE, T_FALSE, T_INT, T_FRAC, T_EXP, T_STR, T_OBJ, T_ARR };
#define S_ESC 1    /* the string holds an escape */
#define S_NONASCII 2

typedef struct {
    int type;
    const u8 *a, *b; /* text of the value (a string without its quotes) */
    int sflags;
    int dup;
} Val;

typedef struct {
    const u8 *p, *e, *base;
    int depth;
} Cur;

#define FAIL (-1)
#define MAX_DEPTH 512

static inline void ws(Cur *c) {
    while (c->p < c->e && (*c->p == ' ' || *c->p == '\n' || *c->p == '\r' || *c->p == '\t')) c->p++;
}

static inline int hexd(u8 x) {
    return (x >= '0' && x <= '9') || (x >= 'a' && x <= 'f') || (x >= 'A' && x <= 'F');
}

/* A JSON string at c->p (the opening quote): its content span and flags; FAIL on a control character, a bad
 * escape or invalid UTF-8 (bytes msgspec may or may not accept: the Python path decides). */
static int scan_str(Cur *c, Val *v) {
    const u8 *p = c->p + 1, *e = c->e;
    int fl = 0;
    v->a = p;
    for (;;) {
        /* fast skip of plain ASCII: 16 bytes at a time to the first quote, backslash, control or non-ASCII
         * byte (a signed compare below 0x20 catches both of the latter) */
#if defined(__SSE2__)
        {
            const __m128i q = _mm_set1_epi8('"'), bs = _mm_set1_epi8('\\'), sp = _mm_set1_epi8(0x20);
            while (p + 16 <= e) {
                __m128i x = _mm_loadu_si128((const __m128i *)p);
                __m128i hit = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(x, q), _mm_cmpeq_epi8(x, bs)),
                                           _mm_cmplt_epi8(x, sp));
                int mask = _mm_movemask_epi8(hit);
                if (mask) {
                    p += __builtin_ctz((unsigned)mask);
                    goto special;
                }
                p += 16;
            }
        }
#endif
        while (p < e && *p >= 0x20 && *p != '"' && *p != '\\' && *p < 0x80) p++;
#if defined(__SSE2__)
    special:
#endif
        if (p >= e) return FAIL;
        u8 ch = *p;
        if (ch == '"') break;
        if (ch == '\\') {
            fl |= S_ESC;
            if (p + 1 >= e) return FAIL;
            u8 x = p[1];
            if (x == 'u') {
                if (p + 6 > e || !hexd(p[2]) || !hexd(p[3]) || !hexd(p[4]) || !hexd(p[5])) return FAIL;
                p += 6;
            } else if (x == '"' || x == '\\' || x == '/' || x == 'b' || x == 'f' || x == 'n' || x == 'r' ||
                       x == 't') {
                p += 2;
            } else {
                return FAIL;
            }
            continue;
        }
        if (ch < 0x20) return FAIL;
        /* UTF-8 sequence */
        fl |= S_NONASCII;
        int n;
        uint32_t cp;
        if (ch >= 0xC2 && ch <= 0xDF) { n = 1; cp = ch & 0x1F; }
        else if (ch >= 0xE0 && ch <= 0xEF) { n = 2; cp = ch & 0x0F; }
        else if (ch >= 0xF0 && ch <= 0xF4) { n = 3; cp = ch & 0x07; }
        else return FAIL;
        if (p + n >= e) return FAIL;
        for (int k = 1; k <= n; k++) {
            if ((p[k] & 0xC0) != 0x80) return FAIL;
            cp = (cp << 6) | (p[k] & 0x3F);
        }
        if ((n == 2 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) || (n == 3 && (cp < 0x10000 || cp > 0x10FFFF)))
            return FAIL;
        p += n + 1;
    }
    v->b = p;
    v->sflags = fl;
    v->type = T_STR;
    c->p = p + 1;
    return 0;
}

/* A JSON number at c->p: T_INT, T_FRAC or T_EXP with its span; FAIL when it is not JSON's grammar. */
static int scan_num(Cur *c, Val *v) {
    const u8 *p = c->p, *e = c->e;
    v->a = p;
    if (p < e && *p == '-') p++;
    if (p >= e) return FAIL;
    if (*p == '0') {
        p++;
    } else if (*p >= '1' && *p <= '9') {
        while (p < e && *p >= '0' && *p <= '9') p++;
    } else {
        return FAIL;
    }
    int t = T_INT;
    if (p < e && *p == '.') {
        p++;
        if (p >= e || !(*p >= '0' && *p <= '9')) return FAIL;
        while (p < e && *p >= '0' && *p <= '9') p++;
        t = T_FRAC;
    }
    if (p < e && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < e && (*p == '+' || *p == '-')) p++;
        if (p >= e || !(*p >= '0' && *p <= '9')) return FAIL;
        while (p < e && *p >= '0' && *p <= '9') p++;
        t = T_EXP;
    }
    v->b = p;
    v->type = t;
    c->p = p;
    return 0;
}

/* After a member of an object or array: 1 and the cursor on the next member after a comma, 0 after the
 * closing `close` (the container done), FAIL otherwise. */
static inline int next_member(Cur *c, u8 close) {
    ws(c);
    if (c->p >= c->e) return FAIL;
    if (*c->p == ',') {
        c->p++;
        ws(c);
        return 1;
    }
    if (*c->p == close) {
        c->p++;
        c->depth--;
        return 0;
    }
    return FAIL;
}

static int skip_value(Cur *c, Val *v);

static int skip_container(Cur *c, u8 close) {
    if (++c->depth > MAX_DEPTH) return FAIL;
    c->p++; /* { or [ */
    ws(c);
    if (c->p < c->e && *c->p == close) {
        c->p++;
        c->depth--;
        return 0;
    }
    Val tmp;
    for (;;) {
        if (close == '}') {
            if (c->p >= c->e || *c->p != '"' || scan_str(c, &tmp)) return FAIL;
            ws(c);
            if (c->p >= c->e || *c->p != ':') return FAIL;
            c->p++;
            ws(c);
        }
        if (skip_value(c, &tmp)) return FAIL;
        int more = next_member(c, close);
        if (more <= 0) return more;
    }
}

static int lit(Cur *c, const char *s, size_t n) {
    if ((size_t)(c->e - c->p) < n || memcmp(c->p, s, n) != 0) return FAIL;
    c->p += n;
    return 0;
}

/* Any JSON value at c->p (after whitespace): its type and span; containers are checked and skipped. */
static int skip_value(Cur *c, Val *v) {
    if (c->p >= c->e) return FAIL;
    u8 ch = *c->p;
    v->a = c->p;
    switch (ch) {
    case '"': return scan_str(c, v);
    case '{': v->type = T_OBJ; if (skip_container(c, '}')) return FAIL;
        break;
    case '[': v->type = T_ARR; if (skip_container(c, ']')) return FAIL;
        break;
    case 't': v->type = T_TRUE; if (lit(c, "true", 4)) return FAIL;
        break;
    case 'f': v->type = T_FALSE; if (lit(c, "false", 5)) return FAIL;
        break;
    case 'n': v->type = T_NULL; if (lit(c, "null", 4)) return FAIL;
        break;
    default:
        if (ch == '-' || (ch >= '0' && ch <= '9')) return scan_num(c, v);
        return FAIL;
    }
    v->b = c->p;
    return 0;
}

/* ------------------------------------------------------------------------------------------- keys */
enum {
    K_PH, K_CAT, K_NAME, K_PID, K_TID, K_TS, K_DUR, K_ARGS, NKEYS
};
enum {
    A_EXT, A_SEQNR, A_DEVICE, A_STREAM, A_CORR, A_COLL,  /* read for every complete event */
    A_PGNAME, A_PGDESC, A_PGRANKS, A_GSIZE, A_SEQ, A_INN, A_OUTN, A_DTYPE, A_SRC, A_DST, /* collectives */
    A_DIMS, A_ITYPE,                                      /* raw (any JSON value) */
    A_MDEV, A_MBYTES, A_MALLOC, A_MRES,                   /* [memory] */
    NARGS
};

#define KEQ(s) (n == sizeof(s) - 1 && memcmp(a, s, sizeof(s) - 1) == 0)

static int event_key(const u8 *a, size_t n) {
    switch (n) {
    case 2: if (KEQ("ph")) return K_PH; if (KEQ("ts")) return K_TS;
        break;
    case 3: if (KEQ("cat")) return K_CAT; if (KEQ("pid")) return K_PID; if (KEQ("tid")) return K_TID;
            if (KEQ("dur")) return K_DUR;
        break;
    case 4: if (KEQ("name")) return K_NAME; if (KEQ("args")) return K_ARGS;
        break;
    }
    return -1;
}

static int args_key(const u8 *a, size_t n) {
    switch (n) {
    case 3: if (KEQ("Seq")) return A_SEQ;
        break;
    case 5: if (KEQ("Bytes")) return A_MBYTES; if (KEQ("dtype")) return A_DTYPE;
        break;
    case 6: if (KEQ("device")) return A_DEVICE; if (KEQ("stream")) return A_STREAM;
        break;
    case 8: if (KEQ("Src Rank")) return A_SRC; if (KEQ("Dst Rank")) return A_DST;
        break;
    case 9: if (KEQ("Device Id")) return A_MDEV;
        break;
    case 10: if (KEQ("Group size")) return A_GSIZE; if (KEQ("Input Dims")) return A_DIMS;
             if (KEQ("Input type")) return A_ITYPE;
        break;
    case 11: if (KEQ("External id")) return A_EXT; if (KEQ("correlation")) return A_CORR;
        break;
    case 13: if (KEQ("In msg nelems")) return A_INN;
        break;
    case 14: if (KEQ("Out msg nelems")) return A_OUTN; if (KEQ("Total Reserved")) return A_MRES;
        break;
    case 15: if (KEQ("Sequence number")) return A_SEQNR; if (KEQ("Collective name")) return A_COLL;
             if (KEQ("Total Allocated")) return A_MALLOC;
        break;
    case 18: if (KEQ("Process Group Name")) return A_PGNAME;
        break;
    case 19: if (KEQ("Process Group Ranks")) return A_PGRANKS;
        break;
    case 25: if (KEQ("Process Group Description")) return A_PGDESC;
        break;
    }
    return -1;
}

/* An object of keys at c->p: the values of its known keys (kf: key text -> slot) into vals[], each slot's bit
 * set in *seen (a slot without its bit holds nothing: see SLOT), the others skipped; a known key's second
 * occurrence sets that slot's dup. An escaped key (it may spell a known one) FAILs, or, with `esc`, is skipped
 * with its value and noted in *esc. With `args` (an event: kf is event_key), an `args` object is read here,
 * once, with args_key (into args[] and *aseen, its escaped keys noted in *args_esc; vals[K_ARGS] holds its
 * span), not skipped and read again: the args are most of a kernel event's text. A complete or instant
 * event's args with an escaped key are left to the Python path; those of other phases are only checked as
 * JSON. FAIL on JSON errors. */
static int scan_object(Cur *c, Val *vals, int (*kf)(const u8 *, size_t), uint32_t *seen, int *esc, Val *args,
                       uint32_t *aseen, int *args_esc) {
    if (++c->depth > MAX_DEPTH) return FAIL;
    c->p++;
    ws(c);
    if (c->p < c->e && *c->p == '}') {
        c->p++;
        c->depth--;
        return 0;
    }
    Val key, tmp;
    for (;;) {
        if (c->p >= c->e || *c->p != '"' || scan_str(c, &key)) return FAIL;
        ws(c);
        if (c->p >= c->e || *c->p != ':') return FAIL;
        c->p++;
        ws(c);
        int k = -1;
        if (!(key.sflags & S_ESC))
            k = kf(key.a, (size_t)(key.b - key.a));
        else if (esc)
            *esc = 1;
        else
            return FAIL;
        if (k >= 0) {
            int dup = (*seen >> k) & 1;
            Val *v = &vals[k];
            if (args && k == K_ARGS && c->p < c->e && *c->p == '{') {
                v->a = c->p;
                if (scan_object(c, args, args_key, aseen, args_esc, NULL, NULL, NULL)) return FAIL;
                v->b = c->p;
                v->type = T_OBJ;
                v->sflags = 0;
            } else if (skip_value(c, v)) {
                return FAIL;
            }
            v->dup = dup;
            *seen |= 1u << k;
        } else if (skip_value(c, &tmp)) {
            return FAIL;
        }
        int more = next_member(c, '}');
        if (more <= 0) return more;
    }
}

static const Val ABSENT = {T_ABSENT, NULL, NULL, 0, 0};
/* Slot k of vals whose keys scan_object marked in seen: the value, or ABSENT. */
#define SLOT(vals, seen, k) (((seen) >> (k)) & 1 ? &(vals)[k] : &ABSENT)

/* ------------------------------------------------------------------------------------- conversions */
/* A JSON integer of at most 18 digits -> *out (an int64 without overflow). */
static int int_of(const Val *v, int64_t *out) {
    const u8 *p = v->a, *e = v->b;
    int neg = 0;
    if (*p == '-') { neg = 1; p++; }
    if (e - p > 18) return FAIL;
    int64_t x = 0;
    for (; p < e; p++) x = x * 10 + (*p - '0');
    *out = neg ? -x : x;
    return 0;
}

/* A microsecond JSON number (integer or fraction) -> exact ns; FAIL when the ns do not fit in an int64 (the
 * Python path marks those invalid). */
static int ns_of(const Val *v, int64_t *out) {
    const u8 *p = v->a, *e = v->b;
    int neg = 0;
    if (*p == '-') { neg = 1; p++; }
    const u8 *q = p;
    int64_t ip = 0;
    while (q < e && *q != '.') {
        if (q - p >= 16) return FAIL;
        ip = ip * 10 + (*q - '0');
        q++;
    }
    if (ip > INT64_MAX / 1000) return FAIL;
    int64_t frac = 0;
    int k = 0;
    if (q < e) { /* '.' */
        q++;
        for (; q < e && k < 3; q++, k++) frac = frac * 10 + (*q - '0');
        for (; k < 3; k++) frac *= 10;
        if (q < e && *q >= '5') frac += 1; /* the fourth decimal rounds half up */
    }
    int64_t x;
    if (__builtin_add_overflow(ip * 1000, frac, &x)) return FAIL;
    *out = neg ? -x : x;
    return 0;
}

/* ------------------------------------------------------------------------------ growable columns */
typedef struct {
    char *d;
    size_t item, n, cap;
} Col;

static int col_init(Col *c, size_t item, size_t cap) {
    c->item = item;
    c->n = 0;
    c->cap = cap ? cap : 16;
    c->d = (char *)malloc(c->cap * item);
    return c->d ? 0 : FAIL;
}

static inline int col_grow(Col *c) {
    size_t cap = c->cap * 2;
    char *d = (char *)realloc(c->d, cap * c->item);
    if (!d) return FAIL;
    c->d = d;
    c->cap = cap;
    return 0;
}

#define COL_PUSH(col, T, val)                                                                              \
    do {                                                                                                   \
        if ((col)->n == (col)->cap && col_grow(col)) goto nomem;                                           \
        ((T *)(col)->d)[(col)->n++] = (val);                                                               \
    } while (0)

static void col_free(Col *c) {
    free(c->d);
    c->d = NULL;
}

static PyObject *col_bytes(Col *c) { return PyBytes_FromStringAndSize(c->d, (Py_ssize_t)(c->n * c->item)); }

/* ------------------------------------------------------------------------ interned strings (per call) */
typedef struct {
    const u8 *a;
    size_t n;
    uint64_t h;
    int32_t idx;
} Slot;

typedef struct {
    Slot *s;
    size_t cap, used;
    PyObject *list; /* the distinct strings, in order of first appearance */
} Intern;

static int intern_init(Intern *t, size_t cap) {
    t->cap = cap;
    t->used = 0;
    t->s = (Slot *)calloc(cap, sizeof(Slot));
    t->list = PyList_New(0);
    return (t->s && t->list) ? 0 : FAIL;
}

static void intern_free(Intern *t) {
    free(t->s);
    t->s = NULL;
    Py_CLEAR(t->list);
}

/* Set once per process (PyInit__native) from the clock, the process id and where things were loaded (address
 * randomisation): names crafted to collide under one seed do not collide under another, so a trace cannot
 * make a chunk's interning quadratic. */
static uint64_t hash_seed = 1469598103934665603ULL;

static inline uint64_t hash_bytes(const u8 *a, size_t n) {
    uint64_t h = hash_seed ^ n;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, a + i, 8);
        h = (h ^ w) * 1099511628211ULL;
        h ^= h >> 29;
    }
    for (; i < n; i++) h = (h ^ a[i]) * 1099511628211ULL;
    return h ^ (h >> 32);
}

static int intern_grow(Intern *t) {
    size_t cap = t->cap * 2;
    Slot *s = (Slot *)calloc(cap, sizeof(Slot));
    if (!s) return FAIL;
    for (size_t i = 0; i < t->cap; i++) {
        if (!t->s[i].a) continue;
        size_t j = t->s[i].h & (cap - 1);
        while (s[j].a) j = (j + 1) & (cap - 1);
        s[j] = t->s[i];
    }
    free(t->s);
    t->s = s;
    t->cap = cap;
    return 0;
}

/* The index of string value v (no escapes) in t->list, added on first sight; -1 with a Python error set
 * (MemoryError), -2 when the text is not valid UTF-8 for Python. */
static int32_t intern(Intern *t, const Val *v) {
    const u8 *a = v->a;
    size_t n = (size_t)(v->b - v->a);
    uint64_t h = hash_bytes(a, n);
    size_t j = h & (t->cap - 1);
    while (t->s[j].a) {
        if (t->s[j].h == h && t->s[j].n == n && memcmp(t->s[j].a, a, n) == 0) return t->s[j].idx;
        j = (j + 1) & (t->cap - 1);
    }
    PyObject *str = (v->sflags & S_NONASCII) ? PyUnicode_DecodeUTF8((const char *)a, (Py_ssize_t)n, "strict")
                                             : PyUnicode_FromStringAndSize((const char *)a, (Py_ssize_t)n);
    if (!str) {
        if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
            PyErr_Clear();
            return -2;
        }
        return -1;
    }
    Py_ssize_t idx = PyList_GET_SIZE(t->list);
    int rc = PyList_Append(t->list, str);
    Py_DECREF(str);
    if (rc) return -1;
    t->s[j].a = a;
    t->s[j].n = n;
    t->s[j].h = h;
    t->s[j].idx = (int32_t)idx;
    if (++t->used * 2 > t->cap && intern_grow(t)) {
        PyErr_NoMemory();
        return -1;
    }
    return (int32_t)idx;
}

/* --------------------------------------------------------------------------------------------- scan */
/* Complete events' int64 columns, in this order (each with a validity byte column, but the args' span). */
enum { C_PID, C_TID, C_TS, C_DUR, C_EXT, C_SEQNR, C_DEVICE, C_STREAM, C_CORR, NVALID, C_ALO = NVALID, C_AHI, NI64 };
enum { M_TS, M_DEV, M_BYTES, M_ALLOC, M_RES, NMEM };

static const char PHASES_OTHER[] = "BEbnestfPONDMRCcSTFpVv()"; /* decode._OTHER_PHASES */

/* Strings found where an integer belongs (interned; the caller coerces each distinct one as the Python path
 * does: "0x1f" -> 31, "stream 7" -> null), and whether interning one failed with a Python error. */
typedef struct {
    Intern strs;
    int pyerr;
} Ctx;

#define OK_STR 2 /* validity byte of a value that is the index of a string in Ctx.strs */

/* A string field (str or null/absent): its index in t (-1 for null); 0, FAIL (left to the Python path: an
 * escape, invalid UTF-8, another type) or PYERR (a Python error is set). */
#define PYERR (-3)
static int str_field(Intern *t, const Val *v, int32_t *out) {
    *out = -1;
    if (v->type == T_ABSENT || v->type == T_NULL) return 0;
    if (v->type != T_STR || (v->sflags & S_ESC)) return FAIL;
    int32_t i = intern(t, v);
    if (i == -1) return PYERR;
    if (i == -2) return FAIL;
    *out = i;
    return 0;
}

/* An integer field (int, string or null/absent): value and validity; FAIL on any other type. */
static inline int int_field(Ctx *cx, const Val *v, int64_t *x, u8 *ok) {
    if (v->dup) return FAIL;
    if (v->type == T_INT) {
        if (int_of(v, x)) return FAIL;
        *ok = 1;
        return 0;
    }
    if (v->type == T_ABSENT || v->type == T_NULL) {
        *x = 0;
        *ok = 0;
        return 0;
    }
    if (v->type != T_STR || (v->sflags & S_ESC)) return FAIL;
    int32_t i = intern(&cx->strs, v);
    if (i < 0) {
        cx->pyerr = i == -1;
        return FAIL;
    }
    *x = i;
    *ok = OK_STR;
    return 0;
}

static inline int ns_field(const Val *v, int64_t *x, u8 *ok) {
    if (v->dup) return FAIL;
    if (v->type == T_ABSENT || v->type == T_NULL) {
        *x = 0;
        *ok = 0;
        return 0;
    }
    if ((v->type != T_INT && v->type != T_FRAC) || ns_of(v, x)) return FAIL;
    *ok = 1;
    return 0;
}

/* A collective key's value: a scalar or null (msgspec's `int | float | str | bool | None`). */
static inline int scalar_ok(const Val *v) {
    return !v->dup && v->type != T_OBJ && v->type != T_ARR;
}

/* A collective key's value as the Python object msgspec makes of it (`int | float | str | bool | None`): a
 * new reference; NULL with *bail set for a value left to the Python path, NULL alone on a Python error. */
static PyObject *py_scalar(const Val *v, int *bail) {
    switch (v->type) {
    case T_ABSENT:
    case T_NULL: Py_RETURN_NONE;
    case T_TRUE: Py_RETURN_TRUE;
    case T_FALSE: Py_RETURN_FALSE;
    case T_INT: {
        int64_t x;
        if (int_of(v, &x)) break;
        return PyLong_FromLongLong((long long)x);
    }
    case T_FRAC:
    case T_EXP: {
        char tmp[64];
        size_t n = (size_t)(v->b - v->a);
        if (n >= sizeof tmp) break;
        memcpy(tmp, v->a, n);
        tmp[n] = 0;
        char *end = NULL;
        double d = PyOS_string_to_double(tmp, &end, NULL);
        if (d == -1.0 && PyErr_Occurred()) return NULL;
        if (end != tmp + n || d > 1.7976931348623157e308 || d < -1.7976931348623157e308) break;
        return PyFloat_FromDouble(d);
    }
    case T_STR:
        if (v->sflags & S_ESC) break;
        if (v->sflags & S_NONASCII) {
            PyObject *o = PyUnicode_DecodeUTF8((const char *)v->a, (Py_ssize_t)(v->b - v->a), "strict");
            if (!o && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
                PyErr_Clear();
                break;
            }
            return o;
        }
        return PyUnicode_FromStringAndSize((const char *)v->a, (Py_ssize_t)(v->b - v->a));
    }
    *bail = 1;
    return NULL;
}

#define NCOLL (A_DST - A_COLL + 1) /* columns._COLL_FIELDS, in its order */

PyDoc_STRVAR(scan_doc,
"scan(chunk) -> tuple | None\n\n"
"The columns of one chunk of traceEvents (a buffer holding a JSON array of events), or None when the\n"
"chunk needs the Python decoders. The tuple: (n, cats, cat_idx, names, name_idx, ints, valid, coll, m,\n"
"mem_ints, mem_valid, stop, strs, crow, cvals): n complete events; cats / names the distinct strings (first appearance order) and\n"
"cat_idx / name_idx their int32 codes a row (-1: null); ints the int64 columns pid, tid, ts (ns), dur (ns),\n"
"External id, Sequence number, device, stream, correlation, args start, args end (11 x n, column after\n"
"column; args start -1 without args); valid the uint8 validity of the first nine (9 x n); coll a uint8 a\n"
"row, 1 where `Collective name` is not null; m [memory] events with mem_ints ts (ns), Device Id, Bytes,\n"
"Total Allocated, Total Reserved (5 x m) and mem_valid (5 x m); stop, the offset just after the array's\n"
"closing bracket (what follows is not read); strs, the strings found where an integer belongs: a validity\n"
"byte 2 marks a value that is an index into strs; crow, the rows (int64) whose args hold a collective's\n"
"keys, and a tuple of one list a key (columns._COLL_FIELDS' order) of their values as msgspec decodes\n"
"them. Offsets are into the buffer.");

static PyObject *scan(PyObject *self, PyObject *arg) {
    (void)self;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    PyObject *result = NULL;
    const u8 *base = (const u8 *)view.buf;
    Cur c = {base, base + view.len, base, 0};
    size_t est = (size_t)view.len / 256 + 16;
    Col ic[NI64], vc[NVALID], coll, cat_idx, name_idx, mc[NMEM], mv[NMEM];
    Intern cats = {0}, names = {0};
    Ctx cx = {{0}, 0};
    PyObject *cl[NCOLL] = {NULL};
    Col crow;
    int ok_cols = 1;
    for (int i = 0; i < NI64; i++) ok_cols &= !col_init(&ic[i], 8, est);
    for (int i = 0; i < NVALID; i++) ok_cols &= !col_init(&vc[i], 1, est);
    ok_cols &= !col_init(&coll, 1, est);
    ok_cols &= !col_init(&cat_idx, 4, est);
    ok_cols &= !col_init(&name_idx, 4, est);
    ok_cols &= !col_init(&crow, 8, 64);
    for (int i = 0; i < NCOLL; i++) ok_cols &= (cl[i] = PyList_New(0)) != NULL;
    for (int i = 0; i < NMEM; i++) {
        ok_cols &= !col_init(&mc[i], 8, 16);
        ok_cols &= !col_init(&mv[i], 1, 16);
    }
    if (!ok_cols || intern_init(&cats, 64) || intern_init(&names, 1024) || intern_init(&cx.strs, 64)) goto nomem;

    ws(&c);
    if (c.p >= c.e || *c.p != '[') goto bail;
    c.p++;
    ws(&c);
    if (c.p < c.e && *c.p == ']') {
        c.p++;
        goto end;
    }
    for (;;) {
        Val ev[NKEYS], ar[NARGS];
        uint32_t evs = 0, ars = 0;
        int args_esc = 0;
#define EV(k) SLOT(ev, evs, k)
#define AR(k) SLOT(ar, ars, k)
        if (c.p >= c.e || *c.p != '{') goto bail;
        if (scan_object(&c, ev, event_key, &evs, NULL, ar, &ars, &args_esc)) goto bail;
        const Val *ph = EV(K_PH);
        if (ph->type != T_STR || ph->dup || ph->sflags || ph->b - ph->a != 1) goto bail;
        u8 phc = *ph->a;
        if (phc == 'X') {
            if (EV(K_CAT)->dup || EV(K_NAME)->dup || EV(K_ARGS)->dup) goto bail;
            const Val *av = EV(K_ARGS);
            int64_t alo = -1, ahi = -1;
            if (av->type == T_OBJ) { /* (read by scan_object) */
                if (args_esc) goto bail;
                alo = av->a - base;
                ahi = av->b - base;
            } else if (av->type != T_ABSENT) {
                goto bail;
            }
            int64_t x[NVALID];
            u8 ok[NVALID];
            if (int_field(&cx, EV(K_PID), &x[C_PID], &ok[C_PID]) || int_field(&cx, EV(K_TID), &x[C_TID], &ok[C_TID]) ||
                ns_field(EV(K_TS), &x[C_TS], &ok[C_TS]) || ns_field(EV(K_DUR), &x[C_DUR], &ok[C_DUR]) ||
                int_field(&cx, AR(A_EXT), &x[C_EXT], &ok[C_EXT]) ||
                int_field(&cx, AR(A_SEQNR), &x[C_SEQNR], &ok[C_SEQNR]) ||
                int_field(&cx, AR(A_DEVICE), &x[C_DEVICE], &ok[C_DEVICE]) ||
                int_field(&cx, AR(A_STREAM), &x[C_STREAM], &ok[C_STREAM]) ||
                int_field(&cx, AR(A_CORR), &x[C_CORR], &ok[C_CORR]))
                goto bail;
            for (int k = A_COLL; k <= A_DST; k++)
                if (!scalar_ok(AR(k))) goto bail;
            /* Process Group Ranks may also be a list of ints (msgspec checks it): left to the Python path */
            if (AR(A_DIMS)->dup || AR(A_ITYPE)->dup) goto bail;
            int32_t ci, ni;
            int rc = str_field(&cats, EV(K_CAT), &ci);
            if (!rc) rc = str_field(&names, EV(K_NAME), &ni);
            if (rc == FAIL) goto bail;
            if (rc) goto error;
            for (int k = 0; k < NVALID; k++) {
                COL_PUSH(&ic[k], int64_t, x[k]);
                COL_PUSH(&vc[k], u8, ok[k]);
            }
            COL_PUSH(&ic[C_ALO], int64_t, alo);
            COL_PUSH(&ic[C_AHI], int64_t, ahi);
            COL_PUSH(&coll, u8, (u8)(AR(A_COLL)->type != T_ABSENT && AR(A_COLL)->type != T_NULL));
            {
                int carrier = 0; /* a row with a collective's keys: their values, as msgspec makes them */
                for (int k = A_COLL; k <= A_DST; k++) carrier |= AR(k)->type != T_ABSENT;
                if (carrier) {
                    COL_PUSH(&crow, int64_t, (int64_t)(ic[0].n - 1));
                    for (int k = 0; k < NCOLL; k++) {
                        int bail = 0;
                        PyObject *o = py_scalar(AR(A_COLL + k), &bail);
                        if (!o) {
                            if (bail) goto bail;
                            goto error;
                        }
                        int rc = PyList_Append(cl[k], o);
                        Py_DECREF(o);
                        if (rc) goto error;
                    }
                }
            }
            COL_PUSH(&cat_idx, int32_t, ci);
            COL_PUSH(&name_idx, int32_t, ni);
        } else if (phc == 'i' || phc == 'I') {
            const Val *nv = EV(K_NAME), *av = EV(K_ARGS);
            if (nv->dup || av->dup) goto bail;
            if (nv->type != T_STR && nv->type != T_ABSENT && nv->type != T_NULL) goto bail;
            if (av->type == T_OBJ) { /* (read by scan_object) */
                if (args_esc) goto bail;
            } else if (av->type != T_ABSENT) {
                goto bail;
            }
            int64_t x[NMEM];
            u8 ok[NMEM];
            if (ns_field(EV(K_TS), &x[M_TS], &ok[M_TS]) || int_field(&cx, AR(A_MDEV), &x[M_DEV], &ok[M_DEV]) ||
                int_field(&cx, AR(A_MBYTES), &x[M_BYTES], &ok[M_BYTES]) ||
                int_field(&cx, AR(A_MALLOC), &x[M_ALLOC], &ok[M_ALLOC]) ||
                int_field(&cx, AR(A_MRES), &x[M_RES], &ok[M_RES]))
                goto bail;
            if (nv->type == T_STR) {
                if (nv->sflags & S_ESC) goto bail; /* "[memory]" is never escaped: the Python path decides */
                if (nv->b - nv->a == 8 && memcmp(nv->a, "[memory]", 8) == 0) {
                    for (int k = 0; k < NMEM; k++) {
                        COL_PUSH(&mc[k], int64_t, x[k]);
                        COL_PUSH(&mv[k], u8, ok[k]);
                    }
                }
            }
        } else if (!memchr(PHASES_OTHER, phc, sizeof PHASES_OTHER - 1)) {
            goto bail;
        }
        ws(&c);
        if (c.p >= c.e) goto bail;
        if (*c.p == ',') {
            c.p++;
            ws(&c);
            continue;
        }
        if (*c.p == ']') {
            c.p++;
            break;
        }
        goto bail;
    }
end:
    {
        size_t n = ic[0].n, m = mc[0].n;
        /* column after column in one bytes object each */
        PyObject *ints = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(n * 8 * NI64));
        PyObject *valid = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(n * NVALID));
        PyObject *mints = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(m * 8 * NMEM));
        PyObject *mvalid = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(m * NMEM));
        PyObject *collb = col_bytes(&coll), *cib = col_bytes(&cat_idx), *nib = col_bytes(&name_idx);
        if (ints && valid && mints && mvalid && collb && cib && nib) {
            char *d = PyBytes_AS_STRING(ints);
            for (int k = 0; k < NI64; k++) memcpy(d + (size_t)k * n * 8, ic[k].d, n * 8);
            d = PyBytes_AS_STRING(valid);
            for (int k = 0; k < NVALID; k++) memcpy(d + (size_t)k * n, vc[k].d, n);
            d = PyBytes_AS_STRING(mints);
            for (int k = 0; k < NMEM; k++) memcpy(d + (size_t)k * m * 8, mc[k].d, m * 8);
            d = PyBytes_AS_STRING(mvalid);
            for (int k = 0; k < NMEM; k++) memcpy(d + (size_t)k * m, mv[k].d, m);
            PyObject *crowb = col_bytes(&crow);
            PyObject *cvals = PyTuple_New(NCOLL);
            if (crowb && cvals) {
                for (int k = 0; k < NCOLL; k++) {
                    Py_INCREF(cl[k]);
                    PyTuple_SET_ITEM(cvals, k, cl[k]);
                }
                result = Py_BuildValue("(nOOOOOOOnOOnOOO)", (Py_ssize_t)n, cats.list, cib, names.list, nib, ints,
                                       valid, collb, (Py_ssize_t)m, mints, mvalid, (Py_ssize_t)(c.p - base),
                                       cx.strs.list, crowb, cvals);
            }
            Py_XDECREF(crowb);
            Py_XDECREF(cvals);
        }
        Py_XDECREF(ints);
        Py_XDECREF(valid);
        Py_XDECREF(mints);
        Py_XDECREF(mvalid);
        Py_XDECREF(collb);
        Py_XDECREF(cib);
        Py_XDECREF(nib);
        goto done;
    }
bail:
    if (cx.pyerr) goto error;
    result = Py_None;
    Py_INCREF(result);
    goto done;
nomem:
    PyErr_NoMemory();
error:
    result = NULL;
done:
    for (int i = 0; i < NI64; i++) col_free(&ic[i]);
    for (int i = 0; i < NVALID; i++) col_free(&vc[i]);
    col_free(&coll);
    col_free(&cat_idx);
    col_free(&name_idx);
    for (int i = 0; i < NMEM; i++) {
        col_free(&mc[i]);
        col_free(&mv[i]);
    }
    intern_free(&cats);
    intern_free(&names);
    intern_free(&cx.strs);
    col_free(&crow);
    for (int i = 0; i < NCOLL; i++) Py_XDECREF(cl[i]);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_O, scan_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_native",
    "Compiled decoder of a chunk of Kineto traceEvents into columns (see tracelens.ingest.kineto.native).",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native(void) {
    PyObject *t = PyImport_ImportModule("time"), *ns = t ? PyObject_CallMethod(t, "perf_counter_ns", NULL) : NULL;
    uint64_t mix = ns ? (uint64_t)PyLong_AsUnsignedLongLongMask(ns) : 0;
    Py_XDECREF(ns);
    Py_XDECREF(t);
    PyErr_Clear();
    mix ^= (uint64_t)(uintptr_t)&hash_seed ^ ((uint64_t)getpid() << 32);
    for (int i = 0; i < 3; i++) mix = (mix ^ (mix >> 31)) * 0x9E3779B97F4A7C15ULL; /* spread the bits */
    hash_seed ^= mix;
    return PyModule_Create(&module);
}
