/*
 * module.c (capturer._fastrows): the module init and its method table, every Python-visible name of the
 * C extension in one place; the code is in the other files of capturer/_native/ (one concern each, listed
 * in fastrows.h). Built by setup.py as the one extension capturer._fastrows; optional (the Python paths
 * are used where it is not built).
 */
#include "fastrows.h"
#include <datetime.h>

PyObject *Decimal = NULL;
PyObject *Epoch = NULL;

static PyMethodDef module_methods[] = {
    {"sql_literals", (PyCFunction)sql_literals, METH_VARARGS,
     "sql_literals(values, no_backslash_escapes, fallback) -> tuple of SQL literals as pymysql writes them;\n"
     "fallback(value) (pymysql's Connection.escape) for any other type"},
    {"sql_tuples", (PyCFunction)sql_tuples, METH_VARARGS,
     "sql_tuples(rows, cols, no_backslash_escapes, fallback) -> str: '(v, ...), (v, ...)', the values of cols\n"
     "of each row (a dict) as pymysql writes them; fallback(value) (Connection.escape) for any other type"},
    {"conflict_keys", (PyCFunction)(void (*)(void))conflict_keys, METH_FASTCALL,
     "conflict_keys((plans, plan, canon, spec), ch, db, table) -> [str]: the MySQL sender's conflict keys of a\n"
     "change, exactly senders.mysql.causality.conflict_keys_py's (canon: its _canon, for what C does not fold)"},
    {"causality_place", (PyCFunction)(void (*)(void))causality_place, METH_FASTCALL,
     "causality_place(relations, keys) -> group or None: senders.mysql.causality.CausalityPy.place on relations"},
    {"stable_hash", (PyCFunction)stable_hash, METH_O,
     "stable_hash(key: str) -> int: zlib.crc32(key.encode('utf-8', 'surrogatepass'))"},
    {"place_txns", (PyCFunction)(void (*)(void))place_txns, METH_FASTCALL,
     "place_txns((keys_ctx, Op, descriptors), relations, lanes, n, placer, batch, ti, i, placed, limit, target_db)\n"
     "-> (ti, i, placed, barrier, whole): the MySQL sender's _send placing of a batch's transactions' changes"},
    {"manifest_txns", (PyCFunction)manifest_txns, METH_O,
     "manifest_txns(txns) -> (bytes, regions) or None: the \"txns\" JSON array and \"regions\" of\n"
     "senders.mysql.position.Manifest.encode for (commit_ts, region, total, lo, hi) of exact ints and a str"},
    {"murmur2", (PyCFunction)murmur2, METH_O, "murmur2(data: bytes) -> int (Kafka's partitioner hash)"},
    {"baikal_plan", (PyCFunction)baikal_plan, METH_VARARGS,
     "baikal_plan(((field_id, name, kind), ...), known_field_ids, encoding) -> a BaikalDB row decoder"},
    {"pg_plan", (PyCFunction)pg_plan, METH_VARARGS,
     "pg_plan(((name, kind, parser), ...), Unrepresentable) -> a pgoutput tuple decoder for one relation"},
    {"json_lines", (PyCFunction)json_lines, METH_VARARGS,
     "json_lines(prefix, changes, piece, fallback, seq0, txn_rows) -> bytes: the file sender's JSON lines of\n"
     "changes (seq numbered from seq0), each ending in a newline; piece(schema) -> (bytes, bytes)"},
    {"kafka_json", (PyCFunction)kafka_json, METH_VARARGS,
     "kafka_json(changes, seq0, txn_rows, (head, mid, tail, tail_last, end), piece, fallback, (h_region, h_ts),\n"
     "tombstones) -> [(topic, partition, key, value, headers)]: the Kafka sender's json messages of changes"},
    {"kafka_produce_each", (PyCFunction)(void (*)(void))kafka_produce_each, METH_FASTCALL,
     "kafka_produce_each(produce, messages, start) -> the index of the first message not produced (BufferError):\n"
     "produce(topic, value, key, partition, None, None, 0, headers) of each (topic, partition, key, value, headers)"},
    {"kafka_unjson", (PyCFunction)kafka_unjson, METH_O,
     "kafka_unjson(value: bytes) -> (db, table, before, after, frozenset of base64 columns), or None for what it\n"
     "does not read (the Python path does): one message of the Kafka sender's json format, as the applier keeps it"},
    {"kafka_unrow", (PyCFunction)kafka_unrow, METH_VARARGS,
     "kafka_unrow(headers, value) -> ((commit_ts, region, 0), seq, op, (op, db, table, before, after, b64) or None)\n"
     "or None: a json row message's identity headers (the sender's order) and its value, or None for the Python path"},
    {"kafka_msgs", (PyCFunction)kafka_msgs, METH_VARARGS,
     "kafka_msgs(messages, Msg) -> [Msg] or None: confluent-kafka's consumed messages as the applier's Msg\n"
     "objects (each partition's last one with its Kafka timestamp), or None where one carries an error"},
    {"kafka_untype", (PyCFunction)kafka_untype, METH_VARARGS,
     "kafka_untype(image, ((column, f, catch), ...), b64) -> None: each str value of those columns not in b64\n"
     "becomes f(value) (kept where f raises catch), in place: the applier's typed values of a json row image"},
    {"dec_text", (PyCFunction)dec_text, METH_VARARGS,
     "dec_text(d, mode) -> str or None: a Decimal's text written without str() (mode 0: as str(), 1: as\n"
     "format(d, 'f'), 2: as the JSON writer writes it); None where the callers use str()"},
    {"dec_parse", (PyCFunction)dec_parse, METH_O,
     "dec_parse(text) -> Decimal or None: Decimal(text) made without parsing a str; None where the callers\n"
     "make Decimal(text)"},
    {"dec_fast", (PyCFunction)dec_fast, METH_NOARGS,
     "dec_fast() -> (texts written without str(), Decimals made without Decimal(text))"},
    {"json_dumps", (PyCFunction)json_dumps, METH_VARARGS,
     "json_dumps(obj, fallback, b64_keys=None, compact=False, as_bytes=False, rows=None) -> str (or its UTF-8\n"
     "bytes): json.dumps(obj, ensure_ascii=False, default=fallback) for row values; the columns of base64-encoded\n"
     "values in the row images (the dicts under obj's keys in rows) are added to b64_keys"},
    {"wire_rows", (PyCFunction)wire_rows, METH_VARARGS,
     "wire_rows(changes, sid_of, op_codes, fallback) -> bytes: the msgpack array of the changes as the wire format\n"
     "writes rows ([sid, op, before, after], an image as its values in column order when its keys are the columns)"},
    {"wire_unrows", (PyCFunction)wire_unrows, METH_VARARGS,
     "wire_unrows(rows, schemas, RowChange, ops) -> [RowChange]: the wire format's rows back (schemas: sid ->\n"
     "(schema, columns))"},
    {"row_changes", (PyCFunction)row_changes, METH_VARARGS,
     "row_changes(RowChange, schema, op, rows, kind) -> [RowChange]: a rows event's changes from the fast decoder's\n"
     "(image, after_or_None) pairs or images (kind 0 update, 1 insert, 2 delete); untracked by the collector where\n"
     "atomic"},
    {"row_change", (PyCFunction)(void (*)(void))row_change, METH_FASTCALL,
     "row_change(RowChange, schema, op, before, after) -> RowChange: one change, untracked by the collector where\n"
     "its images are atomic"},
    {"wire_ext", (PyCFunction)wire_ext, METH_VARARGS,
     "wire_ext(code, data): the wire format's extension values (the common ones in C)"},
    {"wire_setup", (PyCFunction)wire_setup, METH_VARARGS, "wire_setup(msgpack.ExtType, python_ext_hook)"},
    {"wire_unpack", (PyCFunction)wire_unpack, METH_O,
     "wire_unpack(data) -> the one msgpack value of data, as wire.unpackb reads it (extension values made in C)"},
    {"wire_pack", (PyCFunction)wire_pack, METH_VARARGS,
     "wire_pack(value, fallback) -> bytes: msgpack.packb(value, default=fallback, use_bin_type=True,\n"
     "unicode_errors='surrogatepass') for the wire format's values (ValueError past 64 levels of nesting)"},
    {"wire_unpack_item", (PyCFunction)wire_unpack_item, METH_VARARGS,
     "wire_unpack_item(data, schemas, RowChange, ops, max_rows) -> list or None: a backlog record's values as\n"
     "wire_unpack reads them, the rows of its \"t\"/\"c\" values made RowChange objects (wire_unrows'); None when a\n"
     "transaction holds more than max_rows rows (> 0)"},
    {"dict_rows", (PyCFunction)dict_rows, METH_VARARGS,
     "dict_rows(names, raw) -> [dict]: dict(zip(names, row)) for each tuple of raw (a snapshot chunk's rows)"},
    {"read_changes", (PyCFunction)read_changes, METH_VARARGS,
     "read_changes(rows, schema, RowChange, op) -> (RowChange(schema, op, None, row), ...) for each dict of rows"},
    {"arrow_columns", (PyCFunction)arrow_columns, METH_VARARGS,
     "arrow_columns(rows, [(key, kind, scale), ...]) -> [(null_count, validity, data, offsets) or None]: the Spark\n"
     "sender's Arrow buffers of each column (None: the Python path), senders/spark/sender.py lake_table"},
    {"lake_rows", (PyCFunction)lake_rows, METH_VARARGS,
     "lake_rows(changes, ts, region, by_table, Rows, ('i', 'u', 'd')) -> None: a transaction's changes appended\n"
     "to the Spark sender's per-table rows, as senders/spark/sender.py group_rows does"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moddef = {
    PyModuleDef_HEAD_INIT, "_fastrows", "Binlog rows-event decoder and row JSON encoder (C)", -1, module_methods,
};

PyMODINIT_FUNC PyInit__fastrows(void) {
    PyDateTime_IMPORT;
    if (!PyDateTimeAPI) return NULL;
    if (fr_mysql_rows_datetime() < 0 || fr_baikaldb_rows_datetime() < 0 || fr_pg_images_datetime() < 0
        || fr_json_datetime() < 0 || fr_wire_datetime() < 0 || fr_wire_read_datetime() < 0
        || fr_arrowcols_datetime() < 0 || fr_causality_datetime() < 0) return NULL;
    PyObject *decmod = PyImport_ImportModule("decimal");
    if (!decmod) return NULL;
    Decimal = PyObject_GetAttrString(decmod, "Decimal");
    Py_DECREF(decmod);
    if (!Decimal) return NULL;
    if (dec_setup() < 0) return NULL;
    Epoch = PyDateTime_FromDateAndTime(1970, 1, 1, 0, 0, 0, 0);
    if (!Epoch) return NULL;
    S_schema = PyUnicode_InternFromString("schema");
    S_op = PyUnicode_InternFromString("op");
    S_before = PyUnicode_InternFromString("before");
    S_after = PyUnicode_InternFromString("after");
    if (!S_schema || !S_op || !S_before || !S_after) return NULL;
    if (PyType_Ready(&PlanType) < 0) return NULL;
    if (PyType_Ready(&BPlanType) < 0) return NULL;
    if (PyType_Ready(&PgPlanType) < 0) return NULL;
    PyObject *m = PyModule_Create(&moddef);
    if (!m) return NULL;
    Py_INCREF(&PlanType);
    if (PyModule_AddObject(m, "Plan", (PyObject *)&PlanType) < 0) {
        Py_DECREF(&PlanType);
        Py_DECREF(m);
        return NULL;
    }
    PyModule_AddIntConstant(m, "VERSION", 3);
    return m;
}
