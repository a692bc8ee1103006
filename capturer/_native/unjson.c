/*
 * unjson.c (capturer._fastrows): the Kafka sender's json format read back, for the applier
 * (capturer/apply/regroup.py). One envelope (kafka.c's kafka_json writes them) -> what the
 * regrouping keeps of it: (db, table, before, after, b64 columns).
 * Python-visible: kafka_unjson, kafka_unrow (with the identity headers), kafka_untype (its typed values, once
 * the schema is known).
 *
 * Only the common shape is read here: an object holding "op", a "source" object whose "db" and "table"
 * are strings, row images that are null or objects of scalar values (strings, numbers, true, false,
 * null) and "b64", null or an array of strings. For anything else (a nested value in a row image, a
 * lone surrogate escape, a key given twice, a number or text JSON does not allow, an integer of more than
 * 640 digits, which int() may refuse, ...) the answer is None
 * and the caller reads the message with the Python path (orjson, else the json module), which is the
 * specification: tests/unit/test_fuzz_unjson.py checks that every answer given here is the Python one.
 */
#include "fastrows.h"

typedef struct {
    const unsigned char *p, *end;
} JP;

/* every function below: 1 read, 0 not the common shape (the caller falls back), -1 a Python error */

static void jp_ws(JP *j) {
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r')) j->p++;
}

static int jp_lit(JP *j, const char *w, Py_ssize_t n) {
    if (j->end - j->p < n || memcmp(j->p, w, n) != 0) return 0;
    j->p += n;
    return 1;
}

static int hex4(const unsigned char *s) {
    int v = 0;
    for (int i = 0; i < 4; i++) {
        int c = s[i], d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
        else return -1;
        v = v * 16 + d;
    }
    return v;
}

static void put_utf8(Buf *b, unsigned long cp) {
    char *o = b->p + b->n; /* (room for 4 bytes was made by the caller) */
    if (cp < 0x80) { o[0] = (char)cp; b->n += 1; }
    else if (cp < 0x800) { o[0] = (char)(0xC0 | (cp >> 6)); o[1] = (char)(0x80 | (cp & 0x3F)); b->n += 2; }
    else if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12)); o[1] = (char)(0x80 | ((cp >> 6) & 0x3F)); o[2] = (char)(0x80 | (cp & 0x3F));
        b->n += 3;
    } else {
        o[0] = (char)(0xF0 | (cp >> 18)); o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        o[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); o[3] = (char)(0x80 | (cp & 0x3F));
        b->n += 4;
    }
}

/* one escape (j->p after the backslash) into b; 0 for a lone surrogate or a bad escape */
static int jp_escape(JP *j, Buf *b) {
    static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
    if (j->p >= j->end) return 0;
    if (buf_grow(b, 4) < 0) return -1;
    const char *k = *j->p ? strchr(from, *j->p) : NULL;
    if (k) {
        b->p[b->n++] = to[k - from];
        j->p++;
        return 1;
    }
    if (*j->p != 'u' || j->end - j->p < 5) return 0;
    int cp = hex4(j->p + 1);
    if (cp < 0 || (cp >= 0xDC00 && cp <= 0xDFFF)) return 0;
    j->p += 5;
    if (cp >= 0xD800 && cp <= 0xDBFF) { /* a pair, or nothing */
        if (j->end - j->p < 6 || j->p[0] != '\\' || j->p[1] != 'u') return 0;
        int lo = hex4(j->p + 2);
        if (lo < 0xDC00 || lo > 0xDFFF) return 0;
        j->p += 6;
        put_utf8(b, 0x10000 + (((unsigned long)cp - 0xD800) << 10) + ((unsigned long)lo - 0xDC00));
        return 1;
    }
    put_utf8(b, (unsigned long)cp);
    return 1;
}

/* short ASCII keys (column names) made once: the same few come in every message */
#define KEY_SLOTS 512
static PyObject *key_cache[KEY_SLOTS];

static PyObject *cached_key(const unsigned char *s, Py_ssize_t n) {
    /* (a slot by length and two bytes: a key that meets another in its slot is made anew, and takes it) */
    size_t h = n ? ((size_t)n * 31u + (size_t)s[0] * 7u + (size_t)s[n - 1] + (size_t)s[n / 2] * 131u) : 0;
    PyObject **slot = &key_cache[h & (KEY_SLOTS - 1)];
    PyObject *k = *slot;
    if (k && PyUnicode_GET_LENGTH(k) == n && memcmp(PyUnicode_DATA(k), s, n) == 0) return Py_NewRef(k);
    k = PyUnicode_DecodeUTF8((const char *)s, n, "strict");
    if (k && PyUnicode_IS_COMPACT_ASCII(k)) Py_XSETREF(*slot, Py_NewRef(k));
    return k;
}

/* a string (j->p at its opening quote) -> str; key: the key cache may give it */
static int jp_string(JP *j, PyObject **out, int key) {
    const unsigned char *s = ++j->p;
    while (j->p < j->end && *j->p != '"' && *j->p != '\\' && *j->p >= 0x20) j->p++;
    if (j->p >= j->end || *j->p < 0x20) return 0;
    if (*j->p == '"') {
        Py_ssize_t n = j->p - s;
        j->p++;
        *out = key && n <= 40 ? cached_key(s, n) : PyUnicode_DecodeUTF8((const char *)s, n, "strict");
    } else { /* escapes: the text made in a buffer */
        Buf b = {NULL, 0, 0};
        int rc = 1;
        if (buf_put(&b, (const char *)s, j->p - s) < 0) return -1;
        while (rc == 1) {
            if (j->p >= j->end || *j->p < 0x20) { rc = 0; break; }
            if (*j->p == '"') break;
            if (*j->p == '\\') {
                j->p++;
                rc = jp_escape(j, &b);
            } else if (buf_put(&b, (const char *)j->p++, 1) < 0) {
                rc = -1;
            }
        }
        if (rc == 1) {
            j->p++;
            *out = PyUnicode_DecodeUTF8(b.p ? b.p : "", b.n, "strict");
        }
        PyMem_Free(b.p);
        if (rc != 1) return rc;
    }
    if (*out) return 1;
    if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) return -1;
    PyErr_Clear(); /* (not UTF-8: the Python path says what it makes of it) */
    return 0;
}

static const unsigned char *digits(const unsigned char *p, const unsigned char *end) {
    while (p < end && *p >= '0' && *p <= '9') p++;
    return p;
}

/* the end of the number at p as JSON writes it (NULL: not one, or an integer left to Python); *is_float: it
 * has a fraction or an exponent */
static const unsigned char *num_end(const unsigned char *p, const unsigned char *end, int *is_float) {
    *is_float = 0;
    if (p < end && *p == '-') p++;
    const unsigned char *d = p, *i;
    i = p = digits(p, end);
    if (p == d || (*d == '0' && p - d > 1)) return NULL;
    if (p < end && *p == '.') {
        const unsigned char *f = ++p;
        if ((p = digits(p, end)) == f) return NULL;
        *is_float = 1;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < end && (*p == '+' || *p == '-')) p++;
        const unsigned char *e = p;
        if ((p = digits(p, end)) == e) return NULL;
        *is_float = 1;
    }
    /* an integer of more digits than the least limit Python may set on int(text) (640,
     * sys.set_int_max_str_digits): the json module refuses it past the limit (ValueError), so the Python path
     * says whether it is one, also where it is only read past */
    if (!*is_float && i - d > 640) return NULL;
    return p;
}

/* a number: an int (Python's, any size) or a float (float(text), as the json module makes it) */
static int jp_number(JP *j, PyObject **out) {
    int is_float;
    const unsigned char *s = j->p, *p = num_end(s, j->end, &is_float), *d = s + (*s == '-');
    if (!p) return 0;
    j->p = p;
    if (!is_float && p - d <= 18) {
        long long v = 0;
        for (const unsigned char *q = d; q < p; q++) v = v * 10 + (*q - '0');
        *out = PyLong_FromLongLong(*s == '-' ? -v : v);
        return *out ? 1 : -1;
    }
    char small[64], *txt = p - s < 64 ? small : PyMem_Malloc(p - s + 1);
    if (!txt) { PyErr_NoMemory(); return -1; }
    memcpy(txt, s, p - s);
    txt[p - s] = 0;
    if (is_float) {
        double x = PyOS_string_to_double(txt, NULL, NULL);
        *out = (x == -1.0 && PyErr_Occurred()) ? NULL : PyFloat_FromDouble(x);
    } else {
        *out = PyLong_FromString(txt, NULL, 10);
    }
    if (txt != small) PyMem_Free(txt);
    return *out ? 1 : -1;
}

static int jp_scalar(JP *j, PyObject **out);

/* a value read past without making it: plain ASCII strings and numbers are only scanned */
static int jp_skip_scalar(JP *j) {
    if (j->p < j->end && *j->p == '"') {
        const unsigned char *q = j->p + 1;
        while (q < j->end && *q != '"' && *q != '\\' && *q >= 0x20 && *q < 0x80) q++;
        if (q < j->end && *q == '"') {
            j->p = q + 1;
            return 1;
        }
    } else if (j->p < j->end && (*j->p == '-' || (*j->p >= '0' && *j->p <= '9'))) {
        int is_float;
        const unsigned char *q = num_end(j->p, j->end, &is_float);
        if (!q) return 0;
        j->p = q;
        return 1;
    }
    PyObject *v = NULL; /* (text with escapes or beyond ASCII: made, so that it is checked as the Python path does) */
    int rc = jp_scalar(j, &v);
    Py_XDECREF(v);
    return rc;
}

/* a value that is not an object or an array */
static int jp_scalar(JP *j, PyObject **out) {
    if (j->p >= j->end) return 0;
    switch (*j->p) {
    case '"': return jp_string(j, out, 0);
    case 'n': if (!jp_lit(j, "null", 4)) return 0; *out = Py_NewRef(Py_None); return 1;
    case 't': if (!jp_lit(j, "true", 4)) return 0; *out = Py_NewRef(Py_True); return 1;
    case 'f': if (!jp_lit(j, "false", 5)) return 0; *out = Py_NewRef(Py_False); return 1;
    default:
        if (*j->p == '-' || (*j->p >= '0' && *j->p <= '9')) return jp_number(j, out);
        return 0;
    }
}

/* any value, read past (what the regrouping does not keep: ts_ms, the transaction block, ...) */
static int jp_skip(JP *j, int depth) {
    jp_ws(j);
    if (j->p >= j->end || depth > 64) return 0;
    if (*j->p == '{' || *j->p == '[') {
        unsigned char close = *j->p == '{' ? '}' : ']';
        int obj = close == '}', first = 1;
        j->p++;
        for (;;) {
            jp_ws(j);
            if (j->p < j->end && *j->p == close && first) { j->p++; return 1; }
            if (obj) {
                int rc = j->p < j->end && *j->p == '"' ? jp_skip_scalar(j) : 0;
                if (rc != 1) return rc;
                jp_ws(j);
                if (j->p >= j->end || *j->p++ != ':') return 0;
            }
            int rc = jp_skip(j, depth + 1);
            if (rc != 1) return rc;
            jp_ws(j);
            if (j->p < j->end && *j->p == ',') { j->p++; first = 0; continue; }
            if (j->p < j->end && *j->p == close) { j->p++; return 1; }
            return 0;
        }
    }
    return jp_skip_scalar(j);
}

/* the members of an object (j->p at '{'): each key and j->p at its value go to member(), which reads the
 * value; 1 when all were read */
typedef int (*MemberFn)(JP *j, PyObject *key, void *ctx);

static int jp_object(JP *j, MemberFn member, void *ctx) {
    j->p++;
    jp_ws(j);
    if (j->p < j->end && *j->p == '}') { j->p++; return 1; }
    for (;;) {
        PyObject *k = NULL;
        jp_ws(j);
        int rc = j->p < j->end && *j->p == '"' ? jp_string(j, &k, 1) : 0;
        if (rc != 1) return rc;
        jp_ws(j);
        if (j->p >= j->end || *j->p++ != ':') { Py_DECREF(k); return 0; }
        jp_ws(j);
        rc = member(j, k, ctx);
        Py_DECREF(k);
        if (rc != 1) return rc;
        jp_ws(j);
        if (j->p < j->end && *j->p == ',') { j->p++; continue; }
        if (j->p < j->end && *j->p == '}') { j->p++; return 1; }
        return 0;
    }
}

static int image_member(JP *j, PyObject *key, void *ctx) {
    PyObject *v = NULL;
    int rc = jp_scalar(j, &v);
    if (rc != 1) return rc;
    rc = PyDict_SetItem((PyObject *)ctx, key, v) < 0 ? -1 : 1;
    Py_DECREF(v);
    return rc;
}

/* a row image: null, or an object of scalars -> a dict */
static int jp_image(JP *j, PyObject **out) {
    if (j->p < j->end && *j->p == 'n') {
        if (!jp_lit(j, "null", 4)) return 0;
        *out = Py_NewRef(Py_None);
        return 1;
    }
    if (j->p >= j->end || *j->p != '{') return 0;
    PyObject *d = PyDict_New();
    if (!d) return -1;
    int rc = jp_object(j, image_member, d);
    if (rc != 1) { Py_DECREF(d); return rc; }
    *out = d;
    return 1;
}

/* what the envelope gives: [before, after, db, table, b64 list], and which top-level keys came */
typedef struct {
    PyObject *v[5];
    int seen_op, seen_src, seen_b64;
} Env;

static int source_member(JP *j, PyObject *key, void *ctx) {
    Env *e = ctx;
    int which = PyUnicode_CompareWithASCIIString(key, "db") == 0 ? 2
                : PyUnicode_CompareWithASCIIString(key, "table") == 0 ? 3 : -1;
    if (which < 0) return jp_skip(j, 1);
    if (e->v[which] || j->p >= j->end || *j->p != '"') return 0; /* twice, or not a string */
    return jp_string(j, &e->v[which], 0);
}

static int jp_b64(JP *j, PyObject **out) {
    if (j->p < j->end && *j->p == 'n') return jp_lit(j, "null", 4);
    if (j->p >= j->end || *j->p != '[') return 0;
    PyObject *l = *out = PyList_New(0);
    if (!l) return -1;
    j->p++;
    jp_ws(j);
    if (j->p < j->end && *j->p == ']') { j->p++; return 1; }
    for (;;) {
        PyObject *s = NULL;
        jp_ws(j);
        int rc = j->p < j->end && *j->p == '"' ? jp_string(j, &s, 1) : 0;
        if (rc != 1) return rc;
        rc = PyList_Append(l, s);
        Py_DECREF(s);
        if (rc < 0) return -1;
        jp_ws(j);
        if (j->p < j->end && *j->p == ',') { j->p++; continue; }
        if (j->p < j->end && *j->p == ']') { j->p++; return 1; }
        return 0;
    }
}

static int env_member(JP *j, PyObject *key, void *ctx) {
    Env *e = ctx;
    if (PyUnicode_CompareWithASCIIString(key, "before") == 0) return e->v[0] ? 0 : jp_image(j, &e->v[0]);
    if (PyUnicode_CompareWithASCIIString(key, "after") == 0) return e->v[1] ? 0 : jp_image(j, &e->v[1]);
    if (PyUnicode_CompareWithASCIIString(key, "source") == 0) {
        if (e->seen_src++ || j->p >= j->end || *j->p != '{') return 0;
        return jp_object(j, source_member, e);
    }
    if (PyUnicode_CompareWithASCIIString(key, "b64") == 0) {
        if (e->seen_b64++) return 0;
        return jp_b64(j, &e->v[4]);
    }
    if (PyUnicode_CompareWithASCIIString(key, "op") == 0 && e->seen_op++) return 0;
    return jp_skip(j, 1);
}

/* kafka_unjson(value: bytes) -> (db, table, before, after, frozenset of base64 columns) or None */
PyObject *kafka_unjson(PyObject *self, PyObject *arg) {
    Env e = {{NULL, NULL, NULL, NULL, NULL}, 0, 0, 0};
    PyObject *out = NULL, *b64 = NULL;
    if (!PyBytes_Check(arg)) Py_RETURN_NONE;
    JP j = {(const unsigned char *)PyBytes_AS_STRING(arg),
            (const unsigned char *)PyBytes_AS_STRING(arg) + PyBytes_GET_SIZE(arg)};
    jp_ws(&j);
    int rc = j.p < j.end && *j.p == '{' ? jp_object(&j, env_member, &e) : 0;
    if (rc == 1) {
        jp_ws(&j);
        /* (a row image missing is None, as d.get gives) */
        rc = j.p == j.end && e.seen_op && e.v[2] && e.v[3] ? 1 : 0;
    }
    if (rc == 1 && (b64 = PyFrozenSet_New(e.v[4])) != NULL)
        out = PyTuple_Pack(5, e.v[2], e.v[3], e.v[0] ? e.v[0] : Py_None, e.v[1] ? e.v[1] : Py_None, b64);
    for (int i = 0; i < 5; i++) Py_XDECREF(e.v[i]);
    Py_XDECREF(b64);
    if (rc < 0 || (rc == 1 && !out)) {
        Py_XDECREF(out);
        return NULL;
    }
    if (rc == 0) Py_RETURN_NONE;
    return out;
}

/* kafka_untype(image: dict, convs, b64) -> None: each column of convs ((column, f, catch), ...) whose value in
 * image is a str and that b64 (a set) does not hold becomes f(value), or stays the text where f raises catch
 * (an exception class): capturer/apply/regroup.py's _image over the typed columns, in place */
PyObject *kafka_untype(PyObject *self, PyObject *args) {
    PyObject *img, *convs, *b64;
    if (!PyArg_ParseTuple(args, "O!O!O", &PyDict_Type, &img, &PyTuple_Type, &convs, &b64)) return NULL;
    Py_ssize_t nb64 = PyObject_Size(b64);
    if (nb64 < 0) PyErr_Clear(); /* (no len(): asked with `in`, as the Python path does) */
    int check_b64 = nb64 != 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(convs); i++) {
        PyObject *cv = PyTuple_GET_ITEM(convs, i);
        if (!PyTuple_Check(cv) || PyTuple_GET_SIZE(cv) != 3) {
            PyErr_SetString(PyExc_TypeError, "kafka_untype: convs must hold (column, f, catch) tuples");
            return NULL;
        }
        PyObject *c = PyTuple_GET_ITEM(cv, 0);
        PyObject *v = PyDict_GetItemWithError(img, c); /* borrowed */
        if (!v) {
            if (PyErr_Occurred()) return NULL;
            continue;
        }
        if (!PyUnicode_Check(v)) continue;
        if (check_b64) {
            int in = PySequence_Contains(b64, c);
            if (in < 0) return NULL;
            if (in) continue;
        }
        PyObject *f = PyTuple_GET_ITEM(cv, 1), *made = NULL;
        if (f == Decimal && PyUnicode_IS_COMPACT_ASCII(v)) /* Decimal(v) without a str parsed (decimal.c) */
            made = dec_from_text((const char *)PyUnicode_DATA(v), PyUnicode_GET_LENGTH(v));
        if (!made && !PyErr_Occurred()) {
            Py_INCREF(v);
            made = PyObject_CallOneArg(f, v);
            Py_DECREF(v);
        }
        if (!made) {
            if (!PyErr_ExceptionMatches(PyTuple_GET_ITEM(cv, 2))) return NULL;
            PyErr_Clear(); /* (a text the type's parser refuses stays text) */
            continue;
        }
        int rc = PyDict_SetItem(img, c, made);
        Py_DECREF(made);
        if (rc < 0) return NULL;
    }
    Py_RETURN_NONE;
}

/* a header value of 1-18 ASCII digits -> its number; -1 for anything else (the Python path reads it) */
static long long small_uint(PyObject *b) {
    Py_ssize_t n = PyBytes_GET_SIZE(b);
    const char *s = PyBytes_AS_STRING(b);
    long long v = 0;
    if (n < 1 || n > 18) return -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return -1;
        v = v * 10 + (s[i] - '0');
    }
    return v;
}

/* header i is (name, bytes): its value in *val */
static int header_is(PyObject *h, const char *name, PyObject **val) {
    if (!PyTuple_Check(h) || PyTuple_GET_SIZE(h) != 2) return 0;
    PyObject *k = PyTuple_GET_ITEM(h, 0);
    if (!PyUnicode_Check(k) || PyUnicode_CompareWithASCIIString(k, name) != 0) return 0;
    *val = PyTuple_GET_ITEM(h, 1);
    return PyBytes_Check(*val);
}

static PyObject *utf8_or_none(PyObject *b) {
    PyObject *u = PyUnicode_DecodeUTF8(PyBytes_AS_STRING(b), PyBytes_GET_SIZE(b), "strict");
    if (!u && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
        PyErr_Clear();
        return Py_NewRef(Py_None);
    }
    return u;
}

/* kafka_unrow(headers, value) -> ((commit_ts, region, 0), seq, op, event or None) or None: a row message of
 * the json format with the sender's identity headers in its own order (region, commit_ts, seq, op), as
 * capturer/apply/regroup.py's _row reads them, and its value read by kafka_unjson (event: (op, db, table,
 * before, after, b64); None for a tombstone). None where either is not the common shape. */
PyObject *kafka_unrow(PyObject *self, PyObject *args) {
    static const char *names[4] = {"region", "commit_ts", "seq", "op"};
    PyObject *hs, *value, *v[4], *r = NULL, *region = NULL, *op = NULL, *out = NULL;
    if (!PyArg_ParseTuple(args, "OO", &hs, &value)) return NULL;
    if (!PyList_Check(hs) || PyList_GET_SIZE(hs) != 4) Py_RETURN_NONE;
    for (int i = 0; i < 4; i++)
        if (!header_is(PyList_GET_ITEM(hs, i), names[i], &v[i])) Py_RETURN_NONE;
    long long ts = small_uint(v[1]), seq = small_uint(v[2]);
    if (ts < 0 || seq < 0) Py_RETURN_NONE;
    if (value != Py_None) {
        if (!(r = kafka_unjson(self, value))) return NULL;
        if (r == Py_None) return r;
    }
    if (!(region = utf8_or_none(v[0])) || !(op = utf8_or_none(v[3]))) goto done;
    if (region == Py_None || op == Py_None) {
        out = Py_NewRef(Py_None);
        goto done;
    }
    if (r) { /* (op, db, table, before, after, b64) */
        PyObject *ev = PyTuple_New(6);
        if (!ev) goto done;
        PyTuple_SET_ITEM(ev, 0, Py_NewRef(op));
        for (int i = 0; i < 5; i++) PyTuple_SET_ITEM(ev, i + 1, Py_NewRef(PyTuple_GET_ITEM(r, i)));
        Py_SETREF(r, ev);
    }
    out = Py_BuildValue("((LOi)LOO)", ts, region, 0, seq, op, r ? r : Py_None);
done:
    Py_XDECREF(r);
    Py_XDECREF(region);
    Py_XDECREF(op);
    return out;
}

/* kafka_msgs(messages, Msg) -> [Msg] or None: confluent-kafka's consumed messages (consume()'s list) made the
 * applier's Msg objects (topic, partition, offset, key, value, headers or [], ts_ms 0; the last message of each
 * partition with its Kafka timestamp, ts_ms, where the message has one): ConfluentConsumer.poll's loop, one C
 * call a poll. None where a message carries an error (the Python loop reads that poll: it logs, skips or
 * raises). Each message is read through its own methods (error(), topic(), ...), as the Python loop reads it. */
static PyObject *s_error, *s_topic, *s_partition, *s_offset, *s_key, *s_value, *s_headers, *s_timestamp;
static PyObject *s_f_topic, *s_f_partition, *s_f_offset, *s_f_key, *s_f_value, *s_f_headers, *s_f_ts_ms;

static int msgs_names(void) {
    if (s_error) return 0;
#define IN(v, s) if (!(v = PyUnicode_InternFromString(s))) return -1;
    IN(s_error, "error") IN(s_topic, "topic") IN(s_partition, "partition") IN(s_offset, "offset")
    IN(s_key, "key") IN(s_value, "value") IN(s_headers, "headers") IN(s_timestamp, "timestamp")
    IN(s_f_topic, "topic") IN(s_f_partition, "partition") IN(s_f_offset, "offset") IN(s_f_key, "key")
    IN(s_f_value, "value") IN(s_f_headers, "headers") IN(s_f_ts_ms, "ts_ms")
#undef IN
    return 0;
}

PyObject *kafka_msgs(PyObject *self, PyObject *args) {
    PyObject *ms, *mtype;
    if (!PyArg_ParseTuple(args, "O!O!", &PyList_Type, &ms, &PyType_Type, &mtype)) return NULL;
    if (msgs_names() < 0) return NULL;
    PyTypeObject *tp = (PyTypeObject *)mtype;
    Py_ssize_t n = PyList_GET_SIZE(ms);
    for (Py_ssize_t i = 0; i < n; i++) {  /* an error anywhere: the Python loop reads the whole poll */
        PyObject *err = PyObject_CallMethodNoArgs(PyList_GET_ITEM(ms, i), s_error);
        if (!err) return NULL;
        int bad = err != Py_None;
        Py_DECREF(err);
        if (bad) Py_RETURN_NONE;
    }
    PyObject *out = PyList_New(n), *last = PyDict_New(), *empty = PyTuple_New(0), *zero = PyLong_FromLong(0);
    if (!out || !last || !empty || !zero) goto fail;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *m = PyList_GET_ITEM(ms, i);
        PyObject *v[6] = {NULL, NULL, NULL, NULL, NULL, NULL};
        PyObject *names[6] = {s_topic, s_partition, s_offset, s_key, s_value, s_headers};
        PyObject *fields[6] = {s_f_topic, s_f_partition, s_f_offset, s_f_key, s_f_value, s_f_headers};
        PyObject *o = NULL;
        int ok = 1;
        for (int k = 0; k < 6 && ok; k++) ok = (v[k] = PyObject_CallMethodNoArgs(m, names[k])) != NULL;
        if (ok && v[5] == Py_None) {
            Py_DECREF(v[5]);
            ok = (v[5] = PyList_New(0)) != NULL;
        }
        if (ok) ok = (o = tp->tp_new(tp, empty, NULL)) != NULL;
        for (int k = 0; k < 6 && ok; k++) ok = PyObject_SetAttr(o, fields[k], v[k]) == 0;
        if (ok) ok = PyObject_SetAttr(o, s_f_ts_ms, zero) == 0;
        PyObject *where = NULL;
        if (ok) ok = (where = PyTuple_Pack(2, v[0], v[1])) != NULL;
        if (ok) {
            PyObject *pair = PyTuple_Pack(2, o, m);
            ok = pair && PyDict_SetItem(last, where, pair) == 0;
            Py_XDECREF(pair);
        }
        Py_XDECREF(where);
        for (int k = 0; k < 6; k++) Py_XDECREF(v[k]);
        if (!ok) {
            Py_XDECREF(o);
            goto fail;
        }
        PyList_SET_ITEM(out, i, o);
    }
    /* the Kafka timestamp of each partition's last message (the status's lag in seconds) */
    Py_ssize_t pos = 0;
    PyObject *k_, *pair;
    while (PyDict_Next(last, &pos, &k_, &pair)) {
        PyObject *ts = PyObject_CallMethodNoArgs(PyTuple_GET_ITEM(pair, 1), s_timestamp);
        if (!ts) goto fail;
        int set = PyTuple_Check(ts) && PyTuple_GET_SIZE(ts) == 2;
        if (set) {
            int t = PyObject_IsTrue(PyTuple_GET_ITEM(ts, 0));
            if (t < 0) {
                Py_DECREF(ts);
                goto fail;
            }
            set = t;
        }
        int r = set ? PyObject_SetAttr(PyTuple_GET_ITEM(pair, 0), s_f_ts_ms, PyTuple_GET_ITEM(ts, 1)) : 0;
        Py_DECREF(ts);
        if (r < 0) goto fail;
    }
    Py_DECREF(last);
    Py_DECREF(empty);
    Py_DECREF(zero);
    return out;
fail:
    Py_XDECREF(out);
    Py_XDECREF(last);
    Py_XDECREF(empty);
    Py_XDECREF(zero);
    return NULL;
}
