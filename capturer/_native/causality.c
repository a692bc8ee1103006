/*
 * causality.c (capturer._fastrows): the MySQL sender's per-row placing (senders/mysql/causality.py is the
 * specification; tests/unit/test_fuzz_causality.py compares the two).
 * Python-visible: conflict_keys, causality_place, stable_hash, place_txns (a batch's transactions placed
 * as senders/mysql/sender.py _send places their changes one by one).
 *
 * conflict_keys gives exactly the strings of the Python conflict_keys: ints, bytes and strings are folded
 * here, a Decimal by decimal.c's text, a naive datetime and a date as str() writes them; any other value (a
 * float, an aware datetime, a time, a bool, a subclass) goes through the Python _canon.
 * ASCII is folded in C (casefold = lower; NFKD leaves ASCII alone and it has no combining marks). Other
 * characters of the Basic Multilingual Plane are folded one by one through a table filled from the
 * Python fold_char(c) (NFKD of c.casefold() without its combining marks), so the folding of Unicode is
 * Python's own: _canon's fold is the concatenation of its characters' folds, since casefold maps each
 * character alone, NFKD decomposes each character alone and only reorders combining marks, which are
 * dropped. A string with a character beyond the BMP goes to _canon whole.
 */
#include "fastrows.h"
#include <datetime.h>

FR_DATETIME_IMPORT(fr_causality_datetime)

/* u's text appended as UTF-8 (lone surrogates kept, as "surrogatepass" writes them); *ascii cleared when
   it is not ASCII */
static int put_text(Buf *b, PyObject *u, int *ascii) {
    if (PyUnicode_IS_ASCII(u)) return buf_put(b, (const char *)PyUnicode_DATA(u), PyUnicode_GET_LENGTH(u));
    *ascii = 0;
    Py_ssize_t n;
    const char *s = PyUnicode_AsUTF8AndSize(u, &n);
    if (s) return buf_put(b, s, n);
    PyErr_Clear();
    PyObject *enc = PyUnicode_AsEncodedString(u, "utf-8", "surrogatepass");
    if (!enc) return -1;
    int rc = buf_put(b, PyBytes_AS_STRING(enc), PyBytes_GET_SIZE(enc));
    Py_DECREF(enc);
    return rc;
}

/* fold_char(chr(cp)) of a BMP character, a new reference; the table of folds already made belongs to one
   fold_char (another one empties it) */
static PyObject **fold_table;
static PyObject *fold_owner;

static PyObject *fold_of(PyObject *fold, Py_UCS4 cp) {
    if (fold_owner != fold) {
        if (fold_table)
            for (int i = 0; i < 65536; i++) Py_CLEAR(fold_table[i]);
        Py_INCREF(fold);
        Py_XSETREF(fold_owner, fold);
    }
    if (!fold_table && !(fold_table = PyMem_Calloc(65536, sizeof(PyObject *)))) {
        PyErr_NoMemory();
        return NULL;
    }
    if (fold_table[cp]) return Py_NewRef(fold_table[cp]);
    PyObject *c = PyUnicode_FromOrdinal(cp);
    if (!c) return NULL;
    PyObject *r = PyObject_CallOneArg(fold, c);
    Py_DECREF(c);
    if (!r) return NULL;
    if (!PyUnicode_CheckExact(r)) {
        Py_DECREF(r);
        PyErr_SetString(PyExc_TypeError, "fold_char must return str");
        return NULL;
    }
    if (fold_owner == fold && !fold_table[cp]) fold_table[cp] = Py_NewRef(r);  /* (unless the call changed them) */
    return r;
}

/* "s:" + the fold of a str of kind 1 or 2 (every character in the BMP) */
static int put_folded(Buf *b, PyObject *v, PyObject *fold, int *ascii) {
    int kind = PyUnicode_KIND(v);
    const void *data = PyUnicode_DATA(v);
    Py_ssize_t n = PyUnicode_GET_LENGTH(v);
    while (n > 0 && PyUnicode_READ(kind, data, n - 1) == ' ') n--;  /* rstrip(" ") */
    if (buf_put(b, "s:", 2) < 0) return -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        if (c < 128) {
            if (buf_grow(b, 1) < 0) return -1;
            b->p[b->n++] = (char)(c >= 'A' && c <= 'Z' ? c + 32 : c);
            continue;
        }
        PyObject *f = fold_of(fold, c);
        if (!f) return -1;
        int rc = put_text(b, f, ascii);
        Py_DECREF(f);
        if (rc < 0) return -1;
    }
    return 0;
}

/* _canon(v) appended: 0 = done, -1 = error */
static int put_canon(Buf *b, PyObject *v, PyObject *canon, PyObject *fold, int *ascii) {
    if (PyLong_CheckExact(v)) {
        if (buf_put(b, "int:", 4) < 0) return -1;
        return put_int(b, v);
    }
    if (PyBytes_CheckExact(v) || PyByteArray_CheckExact(v)) {
        static const char hex[] = "0123456789abcdef";
        const unsigned char *s = (const unsigned char *)(PyBytes_Check(v) ? PyBytes_AS_STRING(v) : PyByteArray_AS_STRING(v));
        Py_ssize_t n = PyBytes_Check(v) ? PyBytes_GET_SIZE(v) : PyByteArray_GET_SIZE(v);
        if (buf_grow(b, 2 * n + 2) < 0) return -1;
        b->p[b->n++] = 'b';
        b->p[b->n++] = ':';
        for (Py_ssize_t i = 0; i < n; i++) {
            b->p[b->n++] = hex[s[i] >> 4];
            b->p[b->n++] = hex[s[i] & 15];
        }
        return 0;
    }
    if (PyUnicode_CheckExact(v) && PyUnicode_IS_ASCII(v)) {
        const unsigned char *s = (const unsigned char *)PyUnicode_DATA(v);
        Py_ssize_t n = PyUnicode_GET_LENGTH(v);
        while (n > 0 && s[n - 1] == ' ') n--;  /* rstrip(" ") */
        if (buf_grow(b, n + 2) < 0) return -1;
        b->p[b->n++] = 's';
        b->p[b->n++] = ':';
        for (Py_ssize_t i = 0; i < n; i++) {
            unsigned char c = s[i];
            b->p[b->n++] = (char)(c >= 'A' && c <= 'Z' ? c + 32 : c);
        }
        return 0;
    }
    if (fold != Py_None && PyUnicode_CheckExact(v) && PyUnicode_KIND(v) != PyUnicode_4BYTE_KIND)
        return put_folded(b, v, fold, ascii);
    char t[DEC_TEXT_CAP];
    Py_ssize_t tn = dec_chars(v, DEC_STR, t, sizeof(t)); /* a Decimal: "Decimal:" + str(v) (decimal.c) */
    if (tn > 0) return buf_put(b, "Decimal:", 8) < 0 || buf_put(b, t, tn) < 0 ? -1 : 0;
    /* a naive datetime or a date (a partitioned table's key: (id, created)): "datetime:" / "date:" + str(v) */
    int dtm = PyDateTime_CheckExact(v) && !((PyDateTime_DateTime *)v)->hastzinfo;
    if (dtm || PyDate_CheckExact(v)) {
        char *p = t;
        memcpy(p, dtm ? "datetime:" : "date:", dtm ? 9 : 5);
        p += dtm ? 9 : 5;
        p = fmt_uint(p, (unsigned)PyDateTime_GET_YEAR(v), 4);
        *p++ = '-';
        p = fmt_uint(p, (unsigned)PyDateTime_GET_MONTH(v), 2);
        *p++ = '-';
        p = fmt_uint(p, (unsigned)PyDateTime_GET_DAY(v), 2);
        if (dtm) {
            *p++ = ' ';
            p = fmt_uint(p, (unsigned)PyDateTime_DATE_GET_HOUR(v), 2);
            *p++ = ':';
            p = fmt_uint(p, (unsigned)PyDateTime_DATE_GET_MINUTE(v), 2);
            *p++ = ':';
            p = fmt_uint(p, (unsigned)PyDateTime_DATE_GET_SECOND(v), 2);
            int us = PyDateTime_DATE_GET_MICROSECOND(v);
            if (us) {
                *p++ = '.';
                p = fmt_uint(p, (unsigned)us, 6);
            }
        }
        return buf_put(b, t, p - t);
    }
    PyObject *r = PyObject_CallOneArg(canon, v);
    if (!r) return -1;
    if (!PyUnicode_Check(r)) {
        Py_DECREF(r);
        PyErr_SetString(PyExc_TypeError, "_canon must return str");
        return -1;
    }
    int rc = put_text(b, r, ascii);
    Py_DECREF(r);
    return rc;
}

static PyObject *buf_text(Buf *b, int ascii) {
    if (!ascii) return PyUnicode_DecodeUTF8(b->p, b->n, "surrogatepass");
    PyObject *u = PyUnicode_New(b->n, 127);
    if (u) memcpy(PyUnicode_DATA(u), b->p, b->n);
    return u;
}

/* head + the canon of image's values of cols ("\x1f" between), appended to keys; none when one is NULL
   (missing or None). 0 = done, -1 = error */
static int one_key(PyObject *keys, Buf *b, PyObject *head, PyObject *cols, PyObject *image, PyObject *canon,
                   PyObject *fold) {
    Py_ssize_t nc = PyTuple_GET_SIZE(cols);
    for (Py_ssize_t i = 0; i < nc; i++) {  /* NULLs never collide in a unique index */
        PyObject *v = PyDict_GetItemWithError(image, PyTuple_GET_ITEM(cols, i));
        if (!v) return PyErr_Occurred() ? -1 : 0;
        if (v == Py_None) return 0;
    }
    int ascii = 1;
    b->n = 0;
    if (put_text(b, head, &ascii) < 0) return -1;
    for (Py_ssize_t i = 0; i < nc; i++) {
        PyObject *v = PyDict_GetItemWithError(image, PyTuple_GET_ITEM(cols, i));
        if (!v) {
            if (!PyErr_Occurred())  /* canon() of a value before took it away */
                PyErr_SetString(PyExc_RuntimeError, "row image changed while its keys were made");
            return -1;
        }
        Py_INCREF(v);
        int rc = (i && buf_put(b, "\x1f", 1) < 0) ? -1 : put_canon(b, v, canon, fold, &ascii);
        Py_DECREF(v);
        if (rc < 0) return -1;
    }
    PyObject *k = buf_text(b, ascii);
    if (!k) return -1;
    int rc = PyList_Append(keys, k);
    Py_DECREF(k);
    return rc;
}

static PyObject *S_get_schema, *S_get_before, *S_get_after, *S_star, *S_primary;

/* conflict_keys((plans, plan, canon, spec, fold_char), ch, db, table) -> [key]: the spec's conflict_keys(ch,
   db, table); plans: the spec's plan cache ((id(schema), db, table) -> (schema, prefix, indexes)),
   plan(schema, db, table) -> (prefix, indexes) on a miss (indexes: [(head, (column, ...))]); canon: the
   spec's _canon for the values folded in Python; spec(ch, db, table) for an image that is not a plain
   dict; fold_char(c): a non-ASCII character's fold (None: every non-ASCII string to canon) */
PyObject *conflict_keys(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 || !PyTuple_Check(args[0]) || PyTuple_GET_SIZE(args[0]) != 5) {
        PyErr_SetString(PyExc_TypeError, "conflict_keys((plans, plan, canon, spec, fold_char), ch, db, table)");
        return NULL;
    }
    PyObject *plans = PyTuple_GET_ITEM(args[0], 0), *plan = PyTuple_GET_ITEM(args[0], 1);
    PyObject *canon = PyTuple_GET_ITEM(args[0], 2), *spec = PyTuple_GET_ITEM(args[0], 3);
    PyObject *fold = PyTuple_GET_ITEM(args[0], 4);
    PyObject *ch = args[1], *db = args[2], *table = args[3];
    if (!PyDict_Check(plans)) {
        PyErr_SetString(PyExc_TypeError, "plans must be a dict");
        return NULL;
    }
    if ((!S_get_schema && !(S_get_schema = PyUnicode_InternFromString("schema")))
        || (!S_get_before && !(S_get_before = PyUnicode_InternFromString("before")))
        || (!S_get_after && !(S_get_after = PyUnicode_InternFromString("after")))
        || (!S_star && !(S_star = PyUnicode_InternFromString("|*")))
        || (!S_primary && !(S_primary = PyUnicode_InternFromString("|PRIMARY|"))))
        return NULL;
    PyObject *schema = NULL, *before = NULL, *after = NULL, *made = NULL, *keys = NULL, *prefix, *indexes;
    Buf b = {0};
    if (!(schema = PyObject_GetAttr(ch, S_get_schema))) goto fail;
    PyObject *id = PyLong_FromVoidPtr(schema);
    if (!id) goto fail;
    PyObject *ck = PyTuple_Pack(3, id, db, table);
    Py_DECREF(id);
    if (!ck) goto fail;
    PyObject *hit = PyDict_GetItemWithError(plans, ck); /* borrowed */
    Py_DECREF(ck);
    if (hit && PyTuple_Check(hit) && PyTuple_GET_SIZE(hit) == 3 && PyTuple_GET_ITEM(hit, 0) == schema) {
        prefix = PyTuple_GET_ITEM(hit, 1);
        indexes = PyTuple_GET_ITEM(hit, 2);
        made = Py_NewRef(hit);  /* held: canon() may run Python code */
    } else {
        if (PyErr_Occurred()) goto fail;
        PyObject *pargs[3] = {schema, db, table};
        if (!(made = PyObject_Vectorcall(plan, pargs, 3, NULL))) goto fail;
        if (!PyTuple_Check(made) || PyTuple_GET_SIZE(made) != 2) {
            PyErr_SetString(PyExc_TypeError, "plan() must return (prefix, indexes)");
            goto fail;
        }
        prefix = PyTuple_GET_ITEM(made, 0);
        indexes = PyTuple_GET_ITEM(made, 1);
    }
    if (!PyUnicode_Check(prefix) || !PyList_Check(indexes)) {
        PyErr_SetString(PyExc_TypeError, "a plan is (str, list)");
        goto fail;
    }
    Py_ssize_t ni = PyList_GET_SIZE(indexes);
    for (Py_ssize_t j = 0; j < ni; j++) {
        PyObject *ix = PyList_GET_ITEM(indexes, j);
        if (!PyTuple_Check(ix) || PyTuple_GET_SIZE(ix) != 2 || !PyUnicode_Check(PyTuple_GET_ITEM(ix, 0))
            || !PyTuple_Check(PyTuple_GET_ITEM(ix, 1))) {
            PyErr_SetString(PyExc_TypeError, "an index of a plan is (str, tuple)");
            goto fail;
        }
    }
    if (!(keys = PyList_New(0))) goto fail;
    if (ni) {
        if (!(before = PyObject_GetAttr(ch, S_get_before)) || !(after = PyObject_GetAttr(ch, S_get_after))) goto fail;
        if ((before != Py_None && !PyDict_CheckExact(before)) || (after != Py_None && !PyDict_CheckExact(after))) {
            Py_CLEAR(keys);
            PyObject *sargs[3] = {ch, db, table};
            keys = PyObject_Vectorcall(spec, sargs, 3, NULL);
            goto done;
        }
        PyObject *images[2] = {before, after};
        /* the plan puts a primary key first, its head ending in "|PRIMARY|" */
        int rc = PyUnicode_Tailmatch(PyTuple_GET_ITEM(PyList_GET_ITEM(indexes, 0), 0), S_primary, 0,
                                     PY_SSIZE_T_MAX, 1);
        if (rc < 0) goto fail;
        int nopk = !rc, starred = 0;
        for (int m = 0; m < 2; m++) {
            if (images[m] == Py_None) continue;
            Py_ssize_t n = PyList_GET_SIZE(keys);
            for (Py_ssize_t j = 0; j < ni; j++) {
                PyObject *ix = PyList_GET_ITEM(indexes, j);
                if (one_key(keys, &b, PyTuple_GET_ITEM(ix, 0), PyTuple_GET_ITEM(ix, 1), images[m], canon, fold) < 0)
                    goto fail;
            }
            if (nopk && !starred && PyList_GET_SIZE(keys) == n) {
                /* a row of a table without a primary key whose unique keys are all NULL in this image: the
                   table-wide key names it (the spec's conflict_keys) */
                PyObject *k = PyUnicode_Concat(prefix, S_star);
                if (!k || PyList_Append(keys, k) < 0) {
                    Py_XDECREF(k);
                    goto fail;
                }
                Py_DECREF(k);
                starred = 1;
            }
        }
    }
    if (PyList_GET_SIZE(keys) == 0) {
        PyObject *k = PyUnicode_Concat(prefix, S_star);
        if (!k || PyList_Append(keys, k) < 0) {
            Py_XDECREF(k);
            goto fail;
        }
        Py_DECREF(k);
    }
    goto done;
fail:
    Py_CLEAR(keys);
done:
    PyMem_Free(b.p);
    Py_XDECREF(schema);
    Py_XDECREF(before);
    Py_XDECREF(after);
    Py_XDECREF(made);
    return keys;
}

/* causality_place(relations, keys) -> group or None: Causality.place of the spec on its relations dict */
PyObject *causality_place(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyDict_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "causality_place(relations: dict, keys)");
        return NULL;
    }
    PyObject *rel = args[0];
    PyObject *seq = PySequence_Fast(args[1], "keys must be a sequence");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **ks = PySequence_Fast_ITEMS(seq);
    PyObject *group = NULL;
    if (n == 1) {  /* most changes: one primary key */
        PyObject *g = PyDict_GetItemWithError(rel, ks[0]);
        if (g) {
            group = Py_NewRef(g);
        } else if (!PyErr_Occurred() && PyDict_SetItem(rel, ks[0], ks[0]) == 0) {
            group = Py_NewRef(ks[0]);
        }
        Py_DECREF(seq);
        return group;
    }
    if (n == 0) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_IndexError, "list index out of range");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *g = PyDict_GetItemWithError(rel, ks[i]);
        if (!g) {
            if (PyErr_Occurred()) goto fail;
            continue;
        }
        if (!group) {
            group = Py_NewRef(g);
            continue;
        }
        int same = PyObject_RichCompareBool(g, group, Py_EQ);
        if (same < 0) goto fail;
        if (!same) {  /* the keys link two groups */
            Py_DECREF(group);
            Py_DECREF(seq);
            Py_RETURN_NONE;
        }
    }
    if (!group) group = Py_NewRef(ks[0]);
    for (Py_ssize_t i = 0; i < n; i++)
        if (PyDict_SetItem(rel, ks[i], group) < 0) goto fail;
    Py_DECREF(seq);
    return group;
fail:
    Py_XDECREF(group);
    Py_DECREF(seq);
    return NULL;
}

/* zlib's CRC-32 (reflected 0xEDB88320) */
static uint32_t crc_table[256];

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[i] = c;
    }
}

static uint32_t crc32_of(const unsigned char *p, Py_ssize_t n) {
    if (!crc_table[1]) crc_init();
    uint32_t c = 0xFFFFFFFFu;
    for (Py_ssize_t i = 0; i < n; i++) c = crc_table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

/* *out = zlib.crc32(key.encode("utf-8", "surrogatepass")) of a str: 0, or -1 with an exception */
static int hash_of(PyObject *key, uint32_t *out) {
    if (!PyUnicode_Check(key)) {
        PyErr_SetString(PyExc_TypeError, "stable_hash(key: str)");
        return -1;
    }
    if (PyUnicode_IS_ASCII(key)) {
        *out = crc32_of((const unsigned char *)PyUnicode_DATA(key), PyUnicode_GET_LENGTH(key));
        return 0;
    }
    Py_ssize_t n;
    const char *s = PyUnicode_AsUTF8AndSize(key, &n);
    if (s) {
        *out = crc32_of((const unsigned char *)s, n);
        return 0;
    }
    PyErr_Clear();
    PyObject *enc = PyUnicode_AsEncodedString(key, "utf-8", "surrogatepass");
    if (!enc) return -1;
    *out = crc32_of((const unsigned char *)PyBytes_AS_STRING(enc), PyBytes_GET_SIZE(enc));
    Py_DECREF(enc);
    return 0;
}

/* stable_hash(key: str) -> int: zlib.crc32(key.encode("utf-8", "surrogatepass")) */
PyObject *stable_hash(PyObject *self, PyObject *key) {
    uint32_t h;
    if (hash_of(key, &h) < 0) return NULL;
    return PyLong_FromUnsignedLong(h);
}

static PyObject *S_db, *S_table, *S_cur, *S_txns, *S_lanes, *S_counts, *S_ddl, *S_changes, *S_commit_ts, *S_region;

static int intern_names(void) {
    return ((S_get_schema || (S_get_schema = PyUnicode_InternFromString("schema")))
            && (S_db || (S_db = PyUnicode_InternFromString("db")))
            && (S_table || (S_table = PyUnicode_InternFromString("table")))
            && (S_cur || (S_cur = PyUnicode_InternFromString("_cur")))
            && (S_txns || (S_txns = PyUnicode_InternFromString("_txns")))
            && (S_lanes || (S_lanes = PyUnicode_InternFromString("lanes")))
            && (S_counts || (S_counts = PyUnicode_InternFromString("counts")))
            && (S_ddl || (S_ddl = PyUnicode_InternFromString("ddl")))
            && (S_changes || (S_changes = PyUnicode_InternFromString("changes")))
            && (S_commit_ts || (S_commit_ts = PyUnicode_InternFromString("commit_ts")))
            && (S_region || (S_region = PyUnicode_InternFromString("region")))) ? 0 : -1;
}

/* obj.<the slot of descriptor d> = v (a dataclass's slot: its member descriptor) */
static int set_slot(PyObject *d, PyObject *obj, PyObject *v) {
    descrsetfunc f = Py_TYPE(d)->tp_descr_set;
    if (!f) {
        PyErr_SetString(PyExc_TypeError, "place_txns: an Op field is not a settable descriptor");
        return -1;
    }
    return f(d, obj, v);
}

/* one place_txns call's state */
typedef struct {
    PyObject *kctx, *rel, *lanes, *tdb, *placer;
    PyTypeObject *optype;
    PyObject *d_ident, *d_ch, *d_db, *d_table, *d_pos;
    long n;
    int use_tdb;
    PyObject *lane_of[256];  /* lanes[w], held */
    /* the placer's: its entry being filled (cur, held; its end, exclusive, not written yet: end, -1 when
       written), its lists, its counts[w] (cnt, read once: loaded) and the lanes placed (lb, appended at
       the end) */
    PyObject *cur, *txns, *plan_lanes, *counts;
    Py_ssize_t end;
    Py_ssize_t cnt[256];
    unsigned char loaded[256];
    Buf lb;
} Run;

/* cur[4] = end (the entry's end, kept in run->end meanwhile) */
static int write_end(Run *r) {
    if (r->end < 0) return 0;
    PyObject *e = PyLong_FromSsize_t(r->end);
    if (!e || PyList_SetItem(r->cur, 4, e) < 0) return -1;
    r->end = -1;
    return 0;
}

/* Placer.add(ts, region, total, seq, w, 1) -> *pos; fresh: the first change placed of its transaction in
   this call (later ones continue its entry) */
static int placer_add(Run *r, PyObject *ts, PyObject *region, Py_ssize_t total, Py_ssize_t seq, int w, int fresh,
                      Py_ssize_t *pos) {
    if (fresh) {  /* the spec's test: cur[4] == seq and cur[0] == commit_ts and cur[1] == region */
        int same = 0;
        if (PyList_Check(r->cur) && PyList_GET_SIZE(r->cur) == 5) {
            if (r->end >= 0) {
                same = r->end == seq;
            } else {
                PyObject *s = PyLong_FromSsize_t(seq);
                if (!s) return -1;
                same = PyObject_RichCompareBool(PyList_GET_ITEM(r->cur, 4), s, Py_EQ);
                Py_DECREF(s);
            }
            if (same > 0) same = PyObject_RichCompareBool(PyList_GET_ITEM(r->cur, 0), ts, Py_EQ);
            if (same > 0) same = PyObject_RichCompareBool(PyList_GET_ITEM(r->cur, 1), region, Py_EQ);
            if (same < 0) return -1;
        } else if (r->cur != Py_None) {
            PyErr_SetString(PyExc_TypeError, "place_txns: a Placer's _cur is None or a list of 5");
            return -1;
        }
        if (!same) {
            if (write_end(r) < 0) return -1;
            PyObject *entry = Py_BuildValue("[OOnnn]", ts, region, total, seq, seq + 1);
            if (!entry) return -1;
            if (PyList_Append(r->txns, entry) < 0 || PyObject_SetAttr(r->placer, S_cur, entry) < 0) {
                Py_DECREF(entry);
                return -1;
            }
            Py_SETREF(r->cur, entry);
        }
    }
    r->end = seq + 1;
    if (w >= PyList_GET_SIZE(r->counts)) {
        PyErr_SetString(PyExc_IndexError, "list index out of range");
        return -1;
    }
    if (!r->loaded[w]) {
        r->cnt[w] = PyLong_AsSsize_t(PyList_GET_ITEM(r->counts, w));
        if (r->cnt[w] == -1 && PyErr_Occurred()) return -1;
        r->loaded[w] = 1;
    }
    char lane = (char)w;
    if (buf_put(&r->lb, &lane, 1) < 0) return -1;
    *pos = r->cnt[w]++;
    return 0;
}

/* _Phases.place of changes[*i], changes[*i + 1], ... of one transaction while *placed < limit, stopping
   before a change whose keys link two groups (*barrier = 1). 0, or -1 with an exception */
static int place_changes(Run *r, PyObject *changes, PyObject *ts, PyObject *region, Py_ssize_t *i,
                         Py_ssize_t *placed, Py_ssize_t limit, int *barrier) {
    PyObject *ch = NULL, *schema = NULL, *db = NULL, *table = NULL, *keys = NULL, *group = NULL, *op = NULL;
    Py_ssize_t total = PySequence_Fast_GET_SIZE(changes);
    int fresh = 1, rc = -1;
    while (*i < PySequence_Fast_GET_SIZE(changes) && *placed < limit) {
        ch = Py_NewRef(PySequence_Fast_GET_ITEM(changes, *i));
        if (!(schema = PyObject_GetAttr(ch, S_get_schema))) goto done;
        if (!(db = r->use_tdb ? Py_NewRef(r->tdb) : PyObject_GetAttr(schema, S_db))) goto done;
        if (!(table = PyObject_GetAttr(schema, S_table))) goto done;
        PyObject *kargs[4] = {r->kctx, ch, db, table};
        if (!(keys = conflict_keys(NULL, kargs, 4))) goto done;
        PyObject *pargs[2] = {r->rel, keys};
        if (!(group = causality_place(NULL, pargs, 2))) goto done;
        if (group == Py_None) {  /* the keys link two groups: a barrier first */
            *barrier = 1;
            break;
        }
        uint32_t h;
        if (hash_of(group, &h) < 0) goto done;
        int w = (int)(h % (uint32_t)r->n);
        if (!r->lane_of[w]) {  /* lanes.setdefault(w, []) */
            PyObject *wk = PyLong_FromLong(w);
            if (!wk) goto done;
            PyObject *l = PyDict_GetItemWithError(r->lanes, wk);
            if (l) {
                r->lane_of[w] = Py_NewRef(l);
            } else if (!PyErr_Occurred() && (l = PyList_New(0)) != NULL) {
                r->lane_of[w] = l;
                if (PyDict_SetItem(r->lanes, wk, l) < 0) l = NULL;
            }
            Py_DECREF(wk);
            if (!l) goto done;
            if (!PyList_Check(l)) {
                PyErr_SetString(PyExc_TypeError, "place_txns: a lane is a list");
                goto done;
            }
        }
        Py_ssize_t pos = -1;
        if (r->placer != Py_None && placer_add(r, ts, region, total, *i, w, fresh, &pos) < 0) goto done;
        fresh = 0;
        /* Op((ts, region, i), ch, db, table), pos */
        PyObject *seq = PyLong_FromSsize_t(*i);
        if (!seq) goto done;
        PyObject *ident = PyTuple_Pack(3, ts, region, seq);
        Py_DECREF(seq);
        if (!ident) goto done;
        PyObject_GC_UnTrack(ident);  /* (an int, a str, an int) */
        if (!(op = r->optype->tp_alloc(r->optype, 0))) {
            Py_DECREF(ident);
            goto done;
        }
        int src = set_slot(r->d_ident, op, ident);
        Py_DECREF(ident);
        if (src < 0 || set_slot(r->d_ch, op, ch) < 0 || set_slot(r->d_db, op, db) < 0
            || set_slot(r->d_table, op, table) < 0)
            goto done;
        PyObject *p = PyLong_FromSsize_t(pos);
        if (!p) goto done;
        src = set_slot(r->d_pos, op, p);
        Py_DECREF(p);
        if (src < 0) goto done;
        PyObject *unit = PyList_New(1);
        if (!unit) goto done;
        /* the Op, its identity and its unit live until the phase is applied, a few per row: the collector
           need not walk them (nothing they hold refers back to them: they cannot be in a cycle) */
        if (PyObject_IS_GC(op) && PyObject_GC_IsTracked(op)) PyObject_GC_UnTrack(op);
        PyObject_GC_UnTrack(unit);
        PyList_SET_ITEM(unit, 0, op);  /* (stolen) */
        op = NULL;
        src = PyList_Append(r->lane_of[w], unit);
        Py_DECREF(unit);
        if (src < 0) goto done;
        Py_CLEAR(ch);
        Py_CLEAR(schema);
        Py_CLEAR(db);
        Py_CLEAR(table);
        Py_CLEAR(keys);
        Py_CLEAR(group);
        ++*placed;
        ++*i;
    }
    rc = 0;
done:
    Py_XDECREF(ch);
    Py_XDECREF(schema);
    Py_XDECREF(db);
    Py_XDECREF(table);
    Py_XDECREF(keys);
    Py_XDECREF(group);
    Py_XDECREF(op);
    return rc;
}

/* place_txns((keys_ctx, Op, (ident, ch, db, table, pos descriptors)), relations, lanes, n, placer, batch, ti,
   i, placed, limit, target_db) -> (ti, i, placed, barrier, whole)

   senders/mysql/sender.py _send's placing of the transactions batch[ti], batch[ti + 1], ... (from change i
   of the first), each change as _place_each and _Phases.place place it: its Op((commit_ts, region, seq),
   ch, target_db or schema.db, schema.table), its conflict keys (conflict_keys with keys_ctx), its group
   (causality_place on relations), its lane stable_hash(group) % n, the unit [op] appended to lanes[lane]
   (a dict of lists), and with a placer (a senders.mysql.position.Placer, or None) Placer.add(commit_ts,
   region, len(changes), seq, lane, 1) made on the placer's _cur, _txns, lanes and counts, op.pos its result.
   Returns (the next change to place: ti, i; placed; barrier; whole): before a change whose keys link two
   groups (nothing of it placed: barrier true; the caller flushes and calls again), when placed reached
   limit (before a change, or after a transaction's last: the caller flushes), at a transaction of a DDL or
   whose changes are not a list or tuple (the caller's Python path places it), or at the batch's end;
   whole: the index of the last transaction whose changes are all placed by this call, or -1. */
PyObject *place_txns(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 11 || !PyTuple_Check(args[0]) || PyTuple_GET_SIZE(args[0]) != 3 || !PyDict_Check(args[1])
        || !PyDict_Check(args[2]) || !PyList_Check(args[5])) {
        PyErr_SetString(PyExc_TypeError, "place_txns((keys_ctx, Op, descriptors), relations: dict, lanes: dict, n, "
                        "placer, batch: list, ti, i, placed, limit, target_db)");
        return NULL;
    }
    Run r;
    memset(&r, 0, sizeof r);
    r.end = -1;
    r.kctx = PyTuple_GET_ITEM(args[0], 0);
    PyObject *optype = PyTuple_GET_ITEM(args[0], 1), *descrs = PyTuple_GET_ITEM(args[0], 2);
    if (!PyType_Check(optype) || !PyTuple_Check(descrs) || PyTuple_GET_SIZE(descrs) != 5) {
        PyErr_SetString(PyExc_TypeError, "place_txns: (keys_ctx, Op type, 5 field descriptors)");
        return NULL;
    }
    if (intern_names() < 0) return NULL;
    r.optype = (PyTypeObject *)optype;
    r.d_ident = PyTuple_GET_ITEM(descrs, 0);
    r.d_ch = PyTuple_GET_ITEM(descrs, 1);
    r.d_db = PyTuple_GET_ITEM(descrs, 2);
    r.d_table = PyTuple_GET_ITEM(descrs, 3);
    r.d_pos = PyTuple_GET_ITEM(descrs, 4);
    r.rel = args[1];
    r.lanes = args[2];
    r.placer = args[4];
    r.tdb = args[10];
    PyObject *batch = args[5];
    r.n = PyLong_AsLong(args[3]);
    if (r.n == -1 && PyErr_Occurred()) return NULL;
    if (r.n < 1 || r.n > 256) {
        PyErr_SetString(PyExc_ValueError, "place_txns: n must be 1..256");
        return NULL;
    }
    Py_ssize_t ti = PyLong_AsSsize_t(args[6]), i = PyLong_AsSsize_t(args[7]);
    Py_ssize_t placed = PyLong_AsSsize_t(args[8]), limit = PyLong_AsSsize_t(args[9]);
    if (PyErr_Occurred()) return NULL;
    if ((r.use_tdb = PyObject_IsTrue(r.tdb)) < 0) return NULL;
    PyObject *result = NULL, *txn = NULL, *ddl = NULL, *changes = NULL, *ts = NULL, *region = NULL;
    Py_ssize_t whole = -1;
    int barrier = 0;
    Py_INCREF(batch);  /* (held, its items read by index with its size checked each time) */
    if (r.placer != Py_None) {
        if (!(r.cur = PyObject_GetAttr(r.placer, S_cur)) || !(r.txns = PyObject_GetAttr(r.placer, S_txns))
            || !(r.plan_lanes = PyObject_GetAttr(r.placer, S_lanes))
            || !(r.counts = PyObject_GetAttr(r.placer, S_counts)))
            goto fail;
        if (!PyList_Check(r.txns) || !PyByteArray_Check(r.plan_lanes) || !PyList_Check(r.counts)) {
            PyErr_SetString(PyExc_TypeError, "place_txns: a Placer has _txns: list, lanes: bytearray, counts: list");
            goto fail;
        }
    }
    for (; ti < PyList_GET_SIZE(batch); ti++, i = 0) {
        if (placed >= limit) break;  /* (after a transaction's last change: the caller flushes) */
        txn = Py_NewRef(PyList_GET_ITEM(batch, ti));
        if (!(ddl = PyObject_GetAttr(txn, S_ddl)) || !(changes = PyObject_GetAttr(txn, S_changes))) goto fail;
        if (ddl != Py_None || !(PyTuple_CheckExact(changes) || PyList_CheckExact(changes))) break;  /* Python's */
        if (!(ts = PyObject_GetAttr(txn, S_commit_ts)) || !(region = PyObject_GetAttr(txn, S_region))) goto fail;
        if (place_changes(&r, changes, ts, region, &i, &placed, limit, &barrier) < 0) goto fail;
        if (barrier || i < PySequence_Fast_GET_SIZE(changes)) break;  /* (a barrier, or full mid-transaction) */
        whole = ti;
        Py_CLEAR(txn);
        Py_CLEAR(ddl);
        Py_CLEAR(changes);
        Py_CLEAR(ts);
        Py_CLEAR(region);
    }
    if (r.placer != Py_None) {  /* the placer's state: its entry's end, its counts, its lanes */
        if (write_end(&r) < 0) goto fail;
        for (int w = 0; w < 256; w++) {
            if (!r.loaded[w]) continue;
            PyObject *c = PyLong_FromSsize_t(r.cnt[w]);
            if (!c || PyList_SetItem(r.counts, w, c) < 0) goto fail;
        }
        if (r.lb.n) {
            Py_ssize_t at = PyByteArray_GET_SIZE(r.plan_lanes);
            if (PyByteArray_Resize(r.plan_lanes, at + r.lb.n) < 0) goto fail;
            memcpy(PyByteArray_AS_STRING(r.plan_lanes) + at, r.lb.p, r.lb.n);
        }
    }
    result = Py_BuildValue("(nnnOn)", ti, i, placed, barrier ? Py_True : Py_False, whole);
fail:
    Py_XDECREF(txn);
    Py_XDECREF(ddl);
    Py_XDECREF(changes);
    Py_XDECREF(ts);
    Py_XDECREF(region);
    for (int w = 0; w < 256; w++) Py_XDECREF(r.lane_of[w]);
    PyMem_Free(r.lb.p);
    Py_XDECREF(r.cur);
    Py_XDECREF(r.txns);
    Py_XDECREF(r.plan_lanes);
    Py_XDECREF(r.counts);
    Py_DECREF(batch);
    return result;
}

/* manifest_txns(txns) -> (bytes, regions) or None: the "txns" array of senders/mysql/position.py
   Manifest.encode as json.dumps writes it (separators "," and ":") and its "regions" list, for txns given as
   (commit_ts, region, total, lo, hi) sequences (lists or tuples) of exact ints and a str region: each
   [commit_ts - the one before (0 first), the region's index in regions (in order of first use), total, lo,
   hi]; None (the Python path) for anything else (an int past 64 bits, a bool, another type). */
PyObject *manifest_txns(PyObject *self, PyObject *txns) {
    if (!PyList_Check(txns)) Py_RETURN_NONE;
    PyObject *index = PyDict_New(), *regions = PyList_New(0), *out = NULL;
    Buf b = {0};
    if (!index || !regions || buf_put(&b, "[", 1) < 0) goto done;
    long long prev = 0;
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(txns); k++) {
        PyObject *t = PyList_GET_ITEM(txns, k);
        if (!(PyList_Check(t) || PyTuple_Check(t)) || PySequence_Fast_GET_SIZE(t) != 5) goto python;
        PyObject **f = PySequence_Fast_ITEMS(t);
        long long v[5];
        for (int j = 0; j < 5; j++) {
            if (j == 1) continue;
            if (!PyLong_CheckExact(f[j])) goto python;
            int over = 0;
            v[j] = PyLong_AsLongLongAndOverflow(f[j], &over);
            if (over) goto python;
            if (v[j] == -1 && PyErr_Occurred()) goto done;
        }
        if (!PyUnicode_CheckExact(f[1])) goto python;
        PyObject *at = PyDict_GetItemWithError(index, f[1]);
        if (at) {
            v[1] = PyLong_AsLongLong(at);
        } else {
            if (PyErr_Occurred()) goto done;
            v[1] = PyList_GET_SIZE(regions);
            PyObject *n = PyLong_FromLongLong(v[1]);
            if (!n || PyDict_SetItem(index, f[1], n) < 0 || PyList_Append(regions, f[1]) < 0) {
                Py_XDECREF(n);
                goto done;
            }
            Py_DECREF(n);
        }
        long long ts = v[0];
        if (__builtin_ssubll_overflow(ts, prev, &v[0])) goto python;
        prev = ts;
        if (buf_grow(&b, 5 * 21 + 8) < 0) goto done;
        b.n += sprintf(b.p + b.n, "%s[%lld,%lld,%lld,%lld,%lld]", k ? "," : "", v[0], v[1], v[2], v[3], v[4]);
    }
    if (buf_put(&b, "]", 1) < 0) goto done;
    PyObject *bytes = PyBytes_FromStringAndSize(b.p, b.n);
    if (bytes) {
        out = PyTuple_Pack(2, bytes, regions);
        Py_DECREF(bytes);
    }
    goto done;
python:
    out = Py_NewRef(Py_None);
done:
    PyMem_Free(b.p);
    Py_XDECREF(index);
    Py_XDECREF(regions);
    return out;
}
