/*
 * kafka.c (capturer._fastrows): the Kafka sender's json format (one Debezium-like envelope per change, its
 * key and headers), Kafka's murmur2 partitioner hash and the confluent producer's loop over the messages.
 * Python-visible: kafka_json, murmur2, kafka_produce_each.
 */
#include "fastrows.h"

/* Kafka's murmur2 (the Java client's default partitioner), as senders/kafka/sender.py's Python murmur2 */
static uint32_t murmur2_raw(const unsigned char *d, Py_ssize_t len) {
    const uint32_t m = 0x5BD1E995;
    uint32_t h = 0x9747B28C ^ (uint32_t)len;
    Py_ssize_t n4 = len / 4;
    for (Py_ssize_t i = 0; i < n4; i++) {
        uint32_t k = (uint32_t)d[4 * i] | ((uint32_t)d[4 * i + 1] << 8) | ((uint32_t)d[4 * i + 2] << 16)
                     | ((uint32_t)d[4 * i + 3] << 24);
        k *= m;
        k ^= k >> 24;
        k *= m;
        h *= m;
        h ^= k;
    }
    Py_ssize_t tail = n4 * 4;
    switch (len & 3) {
    case 3: h ^= (uint32_t)d[tail + 2] << 16; /* fall through */
    case 2: h ^= (uint32_t)d[tail + 1] << 8; /* fall through */
    case 1: h ^= d[tail]; h *= m;
    }
    h ^= h >> 13;
    h *= m;
    h ^= h >> 15;
    return h;
}

PyObject *murmur2(PyObject *self, PyObject *arg) {
    Py_buffer v;
    if (PyObject_GetBuffer(arg, &v, PyBUF_SIMPLE) < 0) return NULL;
    uint32_t h = murmur2_raw(v.buf, v.len);
    PyBuffer_Release(&v);
    return PyLong_FromUnsignedLong(h);
}

/* ------------------------------------------------------------------------ */
/* The Kafka sender's json format: one Debezium-like envelope per event        */

static int put_bytes_obj(Buf *b, PyObject *o) {
    return buf_put(b, PyBytes_AS_STRING(o), PyBytes_GET_SIZE(o));
}

/* the message key: {"c":v,...} of the primary-key columns, compact, bytes as base64 (not listed);
   rendered in kb (the caller's, reused from key to key) */
static PyObject *kj_key(Buf *kb, PyObject *pk, PyObject *image, Enc *ek) {
    PyObject *out = NULL;
    kb->n = 0;
    if (buf_put(kb, "{", 1) < 0) goto done;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(pk); i++) {
        PyObject *c = PyTuple_GET_ITEM(pk, i);
        PyObject *v = PyDict_GetItemWithError(image, c); /* borrowed */
        if (!v && PyErr_Occurred()) goto done;
        Py_XINCREF(v);
        int bad = (i && buf_put(kb, ",", 1) < 0) || put_key(kb, c, ek) < 0 || buf_put(kb, ":", 1) < 0
                  || put_obj(kb, v ? v : Py_None, ek, NULL, 1, 0) < 0;
        Py_XDECREF(v);
        if (bad) goto done;
    }
    if (buf_put(kb, "}", 1) < 0) goto done;
    out = PyBytes_FromStringAndSize(kb->p, kb->n);
done:
    return out;
}

/* 1 if any primary-key column differs between the images (Python's !=), 0 if not, -1 on error */
static int kj_pk_changed(PyObject *pk, PyObject *before, PyObject *after) {
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(pk); i++) {
        PyObject *c = PyTuple_GET_ITEM(pk, i);
        PyObject *x = PyDict_GetItemWithError(before, c);
        if (!x && PyErr_Occurred()) return -1;
        PyObject *y = PyDict_GetItemWithError(after, c);
        if (!y && PyErr_Occurred()) return -1;
        Py_XINCREF(x);
        Py_XINCREF(y);
        PyObject *r = PyObject_RichCompare(x ? x : Py_None, y ? y : Py_None, Py_NE);
        Py_XDECREF(x);
        Py_XDECREF(y);
        if (!r) return -1;
        int t = PyObject_IsTrue(r);
        Py_DECREF(r);
        if (t) return t;
    }
    return 0;
}

/* piece(schema) of kafka_json: (topic, partitions >= 1, bytes, tuple of str, bytes) */
static int kafka_piece_valid(PyObject *made) {
    if (!PyTuple_Check(made) || PyTuple_GET_SIZE(made) != 5 || !PyUnicode_Check(PyTuple_GET_ITEM(made, 0))
        || !PyLong_Check(PyTuple_GET_ITEM(made, 1)) || !PyBytes_Check(PyTuple_GET_ITEM(made, 2))
        || !PyTuple_Check(PyTuple_GET_ITEM(made, 3)) || !PyBytes_Check(PyTuple_GET_ITEM(made, 4))) {
        PyErr_SetString(PyExc_RuntimeError, "piece(schema) must return (str, int, bytes, tuple, bytes)");
        return 0;
    }
    PyObject *pk = PyTuple_GET_ITEM(made, 3);
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(pk); k++)
        if (!PyUnicode_Check(PyTuple_GET_ITEM(pk, k))) {
            PyErr_SetString(PyExc_TypeError, "kafka_json: key columns must be str");
            return 0;
        }
    long parts = PyLong_AsLong(PyTuple_GET_ITEM(made, 1));
    if (parts < 1) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "kafka_json: partitions must be >= 1");
        return 0;
    }
    return 1;
}

/* kafka_json(changes, seq0, txn_rows, (head, mid, tail, tail_last, end), piece, fallback, (h_region, h_commit_ts),
 *            tombstones) -> [(topic, partition, key, value, headers), ...]
 * exactly what senders/kafka/messages.py's json_envelope, change_events and key_bytes and the sender's
 * partitioning give, message by message (a unit test compares them). piece(schema) -> (topic, partitions,
 * b'"db":..,"table":..,', pk names tuple, key bytes of a keyless table), called once per schema object. */
PyObject *kafka_json(PyObject *self, PyObject *args) {
    static PyObject *s_insert, *s_read, *s_delete, *h_seq, *h_op[4];
    static const char opc[4] = {'c', 'u', 'd', 'r'};
    PyObject *changes, *txnp, *piece, *fallback, *hbase;
    Py_ssize_t seq0, total;
    int tombstones;
    if (!PyArg_ParseTuple(args, "OnnO!OOO!p", &changes, &seq0, &total, &PyTuple_Type, &txnp, &piece, &fallback,
                          &PyTuple_Type, &hbase, &tombstones))
        return NULL;
    if (seq0 < 0 || total < 0 || PyTuple_GET_SIZE(txnp) != 5 || PyTuple_GET_SIZE(hbase) != 2) {
        PyErr_SetString(PyExc_ValueError, "kafka_json: bad arguments");
        return NULL;
    }
    for (int i = 0; i < 5; i++)
        if (!PyBytes_Check(PyTuple_GET_ITEM(txnp, i))) {
            PyErr_SetString(PyExc_TypeError, "kafka_json: the transaction's pieces must be bytes");
            return NULL;
        }
    if (!h_op[3]) { /* (each made once; a failure part-way is completed by the next call) */
        if ((!s_insert && !(s_insert = PyUnicode_InternFromString("insert")))
            || (!s_read && !(s_read = PyUnicode_InternFromString("read")))
            || (!s_delete && !(s_delete = PyUnicode_InternFromString("delete")))
            || (!h_seq && !(h_seq = PyUnicode_InternFromString("seq"))))
            return NULL;
        for (int i = 0; i < 4; i++)
            if (!h_op[i] && !(h_op[i] = Py_BuildValue("(sy#)", "op", &opc[i], (Py_ssize_t)1))) return NULL;
    }
    PyObject *head = PyTuple_GET_ITEM(txnp, 0), *mid = PyTuple_GET_ITEM(txnp, 1), *tail = PyTuple_GET_ITEM(txnp, 2),
             *tail_last = PyTuple_GET_ITEM(txnp, 3), *end = PyTuple_GET_ITEM(txnp, 4);
    PyObject *seq = PySequence_Fast(changes, "changes must be a sequence");
    if (!seq) return NULL;
    PyObject *cache = PyDict_New(), *b64 = PySet_New(NULL), *out = PyList_New(0);
    PyObject *last_schema = NULL, *last_pieces = NULL; /* the previous row's (the cache holds both) */
    Buf b = {NULL, 0, 0}, kb = {NULL, 0, 0};
    KeyCache kc; /* (the column names' texts, for both encodings: a key's text is the same in each) */
    memset(&kc, 0, sizeof kc);
    Enc e = {fallback, b64, ",", ":", 1, 1, NULL, &kc};
    Enc ek = {fallback, NULL, ",", ":", 1, 1, NULL, &kc};
    char num[64];
    if (!cache || !b64 || !out) goto fail;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
        PyObject *ch = PySequence_Fast_GET_ITEM(seq, i);
        Py_INCREF(ch);
        PyObject *schema = NULL, *op = NULL, *before = NULL, *after = NULL, *pieces, *seq_h = NULL;
        int rc = -1;
        if (change_fields(ch, &schema, &op, &before, &after) < 0) goto row_done;
        /* (a dict subclass may answer get() its own way: the Python path writes it) */
        if ((before != Py_None && !PyDict_CheckExact(before)) || (after != Py_None && !PyDict_CheckExact(after))
            || !PyUnicode_CheckExact(op)) {
            PyErr_SetString(PyExc_TypeError, "kafka_json: row images must be dicts and the op a str");
            goto row_done;
        }
        /* (the rows of a slice are mostly of one table: its pieces without a dict look-up) */
        if (schema == last_schema) pieces = last_pieces;
        else if (!(pieces = schema_piece(cache, schema, piece, kafka_piece_valid))) goto row_done;
        else { last_schema = schema; last_pieces = pieces; }
        PyObject *topic = PyTuple_GET_ITEM(pieces, 0), *dbtable = PyTuple_GET_ITEM(pieces, 2),
                 *pk = PyTuple_GET_ITEM(pieces, 3), *keyless = PyTuple_GET_ITEM(pieces, 4);
        long parts = PyLong_AsLong(PyTuple_GET_ITEM(pieces, 1));
        /* change_events: (op code index, key image) pairs */
        int ev[2], nev = 1;
        PyObject *img[2];
        if (PyUnicode_Compare(op, s_insert) == 0) { ev[0] = 0; img[0] = after; }
        else if (PyUnicode_Compare(op, s_read) == 0) { ev[0] = 3; img[0] = after; }
        else if (PyUnicode_Compare(op, s_delete) == 0) { ev[0] = 2; img[0] = before; }
        else {
            if (PyErr_Occurred()) goto row_done;
            int moved = 0;
            if (PyTuple_GET_SIZE(pk) && before != Py_None && after != Py_None) {
                moved = kj_pk_changed(pk, before, after);
                if (moved < 0) goto row_done;
            }
            if (moved) { ev[0] = 2; img[0] = before; ev[1] = 0; img[1] = after; nev = 2; }
            else { ev[0] = 1; img[0] = after; }
        }
        unsigned long long sq = (unsigned long long)seq0 + (unsigned long long)i;
        char *np = fmt_uint(num, sq, 1);
        {
            PyObject *sb = PyBytes_FromStringAndSize(num, np - num);
            if (!sb) goto row_done;
            seq_h = PyTuple_Pack(2, h_seq, sb);
            Py_DECREF(sb);
            if (!seq_h) goto row_done;
        }
        for (int k = 0; k < nev; k++) {
            int c = ev[k];
            PyObject *key = NULL, *value = NULL, *headers = NULL, *msg = NULL, *partobj = NULL;
            int ok = 0;
            if (PyTuple_GET_SIZE(pk) && img[k] != Py_None) {
                if (!(key = kj_key(&kb, pk, img[k], &ek))) goto ev_done;
            } else {
                key = Py_NewRef(Py_None);
            }
            PyObject *hk = key != Py_None ? key : keyless;
            uint32_t h = murmur2_raw((const unsigned char *)PyBytes_AS_STRING(hk), PyBytes_GET_SIZE(hk));
            if (!(partobj = PyLong_FromLong((long)((h & 0x7FFFFFFF) % (unsigned long)parts)))) goto ev_done;
            /* the envelope */
            b.n = 0;
            if (buf_put(&b, "{\"before\":", 10) < 0
                || put_obj(&b, (c == 1 || c == 2) ? before : Py_None, &e, NULL, 1, 1) < 0
                || buf_put(&b, ",\"after\":", 9) < 0
                || put_obj(&b, (c != 2) ? after : Py_None, &e, NULL, 1, 1) < 0)
                goto ev_done;
            char opbuf[10] = {',', '"', 'o', 'p', '"', ':', '"', opc[c], '"'};
            if (buf_put(&b, opbuf, 9) < 0 || put_bytes_obj(&b, head) < 0 || put_bytes_obj(&b, dbtable) < 0
                || put_bytes_obj(&b, mid) < 0 || buf_put(&b, num, np - num) < 0
                || put_bytes_obj(&b, sq + 1 == (unsigned long long)total ? tail_last : tail) < 0)
                goto ev_done;
            char *tp = fmt_uint(num + 32, sq + 1, 1);
            if (buf_put(&b, num + 32, tp - (num + 32)) < 0 || put_bytes_obj(&b, end) < 0
                || put_b64_keys(&b, b64, &e, ",\"b64\":", 7) < 0)
                goto ev_done;
            if (buf_put(&b, "}", 1) < 0 || !(value = PyBytes_FromStringAndSize(b.p, b.n))) goto ev_done;
            if (!(headers = PyList_New(4))) goto ev_done;
            for (int j = 0; j < 2; j++) PyList_SET_ITEM(headers, j, Py_NewRef(PyTuple_GET_ITEM(hbase, j)));
            PyList_SET_ITEM(headers, 2, Py_NewRef(seq_h));
            PyList_SET_ITEM(headers, 3, Py_NewRef(h_op[c]));
            if (!(msg = PyTuple_Pack(5, topic, partobj, key, value, headers)) || PyList_Append(out, msg) < 0) goto ev_done;
            if (c == 2 && tombstones && key != Py_None) {
                Py_DECREF(msg);
                if (!(msg = PyTuple_Pack(5, topic, partobj, key, Py_None, headers)) || PyList_Append(out, msg) < 0)
                    goto ev_done;
            }
            ok = 1;
        ev_done:
            Py_XDECREF(key);
            Py_XDECREF(value);
            Py_XDECREF(headers);
            Py_XDECREF(msg);
            Py_XDECREF(partobj);
            if (!ok) goto row_done;
        }
        rc = 0;
    row_done:
        Py_DECREF(ch);
        Py_XDECREF(schema);
        Py_XDECREF(op);
        Py_XDECREF(before);
        Py_XDECREF(after);
        Py_XDECREF(seq_h);
        if (rc < 0) goto fail;
    }
    PyMem_Free(b.p);
    PyMem_Free(kb.p);
    key_cache_clear(&kc);
    Py_DECREF(cache);
    Py_DECREF(b64);
    Py_DECREF(seq);
    return out;
fail:
    PyMem_Free(b.p);
    PyMem_Free(kb.p);
    key_cache_clear(&kc);
    Py_XDECREF(cache);
    Py_XDECREF(b64);
    Py_XDECREF(out);
    Py_DECREF(seq);
    return NULL;
}


/* kafka_produce_each(produce, messages, start) -> the index of the first message not produced: for each
 * (topic, partition, key, value, headers) of the list messages from start on, produce(topic, value, key,
 * partition, None, None, 0, headers) (a confluent-kafka Producer's produce, every argument positional),
 * as ConfluentClient.produce_all's loop does, without a Python loop. It stops at a message that produce
 * refuses with BufferError (the producer's queue is full; the exception cleared): the caller waits for
 * room, produces that one and calls again from the next. Any other exception is raised. */
PyObject *kafka_produce_each(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyList_Check(args[1]) || !PyLong_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "kafka_produce_each(produce, messages: list, start: int)");
        return NULL;
    }
    PyObject *produce = args[0], *msgs = args[1];
    Py_ssize_t i = PyLong_AsSsize_t(args[2]);
    if (i == -1 && PyErr_Occurred()) return NULL;
    if (i < 0) {
        PyErr_SetString(PyExc_ValueError, "kafka_produce_each: start must be >= 0");
        return NULL;
    }
    PyObject *zero = PyLong_FromLong(0);
    if (!zero) return NULL;
    /* (the size is read at each step: produce may run code that changes the list) */
    for (; i < PyList_GET_SIZE(msgs); i++) {
        PyObject *m = PyList_GET_ITEM(msgs, i);
        if (!PyTuple_Check(m) || PyTuple_GET_SIZE(m) != 5) {
            PyErr_SetString(PyExc_TypeError, "kafka_produce_each: a message is (topic, partition, key, value, headers)");
            Py_DECREF(zero);
            return NULL;
        }
        Py_INCREF(m);
        PyObject *call[8] = {PyTuple_GET_ITEM(m, 0), PyTuple_GET_ITEM(m, 3), PyTuple_GET_ITEM(m, 2),
                             PyTuple_GET_ITEM(m, 1), Py_None, Py_None, zero, PyTuple_GET_ITEM(m, 4)};
        PyObject *r = PyObject_Vectorcall(produce, call, 8, NULL);
        Py_DECREF(m);
        if (!r) {
            Py_DECREF(zero);
            if (!PyErr_ExceptionMatches(PyExc_BufferError)) return NULL;
            PyErr_Clear();
            return PyLong_FromSsize_t(i);
        }
        Py_DECREF(r);
    }
    Py_DECREF(zero);
    return PyLong_FromSsize_t(i);
}
