"""SQLite export: schema (tables, columns, enums) and the report SQL run here with sqlite3."""
from __future__ import annotations

import sqlite3
import statistics

import pytest

from tuiprof.errors import TuiprofError
from tuiprof.export import nsys_reports as nr
from tuiprof.export.nsys_format import to_csv
from tuiprof.export.nsys_sqlite import write_nsys_sqlite

from ._independent import parse_nsys_csv, round_half_away

# Columns each report reads (nsys 2025.3.1's report SQL), by table.
NEEDED = {
    "StringIds": {"id", "value"},
    "CUPTI_ACTIVITY_KIND_KERNEL": {"start", "end", "deviceId", "contextId", "greenContextId",
                                   "streamId", "correlationId", "globalPid", "demangledName",
                                   "shortName", "mangledName", "registersPerThread", "gridX",
                                   "gridY", "gridZ", "blockX", "blockY", "blockZ",
                                   "staticSharedMemory", "dynamicSharedMemory"},
    "CUPTI_ACTIVITY_KIND_MEMCPY": {"start", "end", "deviceId", "contextId", "greenContextId",
                                   "streamId", "correlationId", "bytes", "copyKind", "srcKind",
                                   "dstKind"},
    "CUPTI_ACTIVITY_KIND_MEMSET": {"start", "end", "deviceId", "contextId", "greenContextId",
                                   "streamId", "correlationId", "bytes", "value", "memKind"},
    "NVTX_EVENTS": {"start", "end", "eventType", "text", "textId", "domainId", "globalTid",
                    "endGlobalTid"},
    "TARGET_INFO_GPU": {"id", "name"},
    "ENUM_CUDA_MEMCPY_OPER": {"id", "name", "label"},
    "ENUM_CUDA_MEM_KIND": {"id", "name", "label"},
}


class _Median:
    def __init__(self):
        self.v = []

    def step(self, x):
        self.v.append(x)

    def finalize(self):
        return float(statistics.median(self.v)) if self.v else None


class _Stdev:
    def __init__(self):
        self.v = []

    def step(self, x):
        self.v.append(x)

    def finalize(self):
        return statistics.stdev(self.v) if len(self.v) > 1 else 0.0


@pytest.fixture(scope="module")
def db(tmp_path_factory, compiled_view):
    path = tmp_path_factory.mktemp("sq") / "tuiprof.sqlite"
    write_nsys_sqlite(compiled_view, path)
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    con.create_aggregate("median", 1, _Median)
    con.create_aggregate("stdev", 1, _Stdev)
    yield con
    con.close()


def test_tables_and_columns(db):
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert set(NEEDED) <= tables and "CUPTI_ACTIVITY_KIND_RUNTIME" in tables   # API records
    for table, cols in NEEDED.items():
        have = {r[1] for r in db.execute(f"PRAGMA table_info({table})")}
        assert cols <= have, (table, cols - have)


def test_an_empty_activity_table_is_left_out(no_api_view, tmp_path):
    with sqlite3.connect(write_nsys_sqlite(no_api_view, tmp_path / "x.sqlite")) as con:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert "CUPTI_ACTIVITY_KIND_KERNEL" in tables
    assert "CUPTI_ACTIVITY_KIND_RUNTIME" not in tables   # no API rows: left out, like nsys


def test_enum_values(db):
    memcpy = dict(db.execute("SELECT id, label FROM ENUM_CUDA_MEMCPY_OPER"))
    assert memcpy[1] == "Host-to-Device" and memcpy[2] == "Device-to-Host"
    assert memcpy[8] == "Device-to-Device" and memcpy[10] == "Peer-to-Peer" and memcpy[0] == "Unknown"
    names = dict(db.execute("SELECT id, name FROM ENUM_CUDA_MEMCPY_OPER"))
    assert names[1] == "CUDA_MEMCPY_KIND_HTOD"
    kinds = dict(db.execute("SELECT id, label FROM ENUM_CUDA_MEM_KIND"))
    assert kinds == {0: "Pageable", 1: "Pinned", 2: "Device", 3: "Array", 4: "Managed",
                     5: "Device Static", 6: "Managed Static", 7: "Unknown"}
    ev = dict(db.execute("SELECT id, label FROM ENUM_NSYS_EVENT_TYPE"))
    assert ev[59] == "NvtxPushPopRange" and ev[60] == "NvtxStartEndRange"
    assert {r[0] for r in db.execute("SELECT DISTINCT eventType FROM NVTX_EVENTS")} == {59}
    assert db.execute("SELECT name FROM TARGET_INFO_GPU WHERE id=0").fetchone()[0] == "NVIDIA H100 80GB HBM3"
    prod = dict(db.execute("SELECT name, value FROM META_DATA_EXPORT"))
    assert prod["EXPORT_PRODUCT_VERSION"].startswith("tuiprof ")


def test_string_ids_and_names(db, compiled_raw):
    n_k = db.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    bad = db.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k LEFT JOIN StringIds s "
                     "ON k.demangledName = s.id WHERE s.id IS NULL").fetchone()[0]
    assert bad == 0 and n_k == sum(1 for r in compiled_raw["records"] if r[0] == "K")
    raw_names = {r[1] for r in compiled_raw["records"] if r[0] == "K"}
    mangled = {r[0] for r in db.execute("SELECT DISTINCT s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k "
                                        "JOIN StringIds s ON k.mangledName = s.id")}
    assert mangled == raw_names
    short = {r[0] for r in db.execute("SELECT DISTINCT s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k "
                                      "JOIN StringIds s ON k.shortName = s.id")}
    assert "nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT" in short and all("(" not in s for s in short)


def _sql_time_rows(db, select_union: str) -> list[list[str]]:
    """Our own SQL with the same meaning as the nsys summaries (not NVIDIA's text)."""
    rows = db.execute(f"""
        WITH ops AS ({select_union}),
             g AS (SELECT name, sum(dur) AS total, count(*) AS n, avg(dur) AS a,
                          median(dur) AS med, min(dur) AS lo, max(dur) AS hi, stdev(dur) AS sd
                   FROM ops GROUP BY name)
        SELECT 100.0 * total / (SELECT sum(total) FROM g), total, n, a, med, lo, hi, sd, name
        FROM g ORDER BY total DESC, n, name""").fetchall()
    return [[str(round_half_away(p)), str(t), str(n), str(round_half_away(a)),
             str(round_half_away(m)), str(lo), str(hi), str(round_half_away(sd)), name]
            for p, t, n, a, m, lo, hi, sd, name in rows]


def test_kern_sum_sql_matches_window_csv(db, compiled_view):
    ours = parse_nsys_csv(to_csv(nr.build_reports(compiled_view, True, ["cuda_gpu_kern_sum"])[0]))[1]
    theirs = _sql_time_rows(db, "SELECT s.value AS name, k.end - k.start AS dur "
                                "FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s "
                                "ON k.demangledName = s.id")
    assert theirs == ours


def test_mem_time_sql_matches_window_csv(db, compiled_view):
    ours = parse_nsys_csv(to_csv(nr.build_reports(compiled_view, True, ["cuda_gpu_mem_time_sum"])[0]))[1]
    theirs = _sql_time_rows(db, """
        SELECT '[CUDA memcpy ' || e.label || ']' AS name, m.end - m.start AS dur
        FROM CUPTI_ACTIVITY_KIND_MEMCPY m JOIN ENUM_CUDA_MEMCPY_OPER e ON m.copyKind = e.id
        UNION ALL SELECT '[CUDA memset]', end - start FROM CUPTI_ACTIVITY_KIND_MEMSET""")
    assert sorted(theirs) == sorted(ours)
    sizes = dict(db.execute("""SELECT '[CUDA memcpy ' || e.label || ']', sum(bytes)
        FROM CUPTI_ACTIVITY_KIND_MEMCPY m JOIN ENUM_CUDA_MEMCPY_OPER e ON m.copyKind = e.id
        GROUP BY 1 UNION ALL SELECT '[CUDA memset]', sum(bytes) FROM CUPTI_ACTIVITY_KIND_MEMSET"""))
    size_rows = parse_nsys_csv(to_csv(nr.build_reports(compiled_view, True, ["cuda_gpu_mem_size_sum"])[0]))[1]
    assert {r[-1]: r[0] for r in size_rows} == {k: f"{v / 1e6:.3f}" for k, v in sizes.items()}


def test_nvtx_sql_matches_window_csv(db, compiled_view):
    ours = parse_nsys_csv(to_csv(nr.build_reports(compiled_view, True, ["nvtx_sum"])[0]))[1]
    theirs = _sql_time_rows(db, "SELECT ':' || coalesce(text, '') AS name, end - start AS dur "
                                "FROM NVTX_EVENTS WHERE eventType IN (59, 60)")
    assert [r[:8] + [r[8]] for r in theirs] == [r[:8] + [r[9]] for r in ours]


def test_trace_sql_matches_window_csv(db, compiled_view):
    ours = parse_nsys_csv(to_csv(nr.build_reports(compiled_view, True, ["cuda_gpu_trace"])[0]))[1]
    rows = db.execute("""
        SELECT k.start, k.end - k.start, k.gridX, k.blockX, k.registersPerThread, k.streamId,
               g.name || ' (' || k.deviceId || ')', s.value
        FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON k.demangledName = s.id
        JOIN TARGET_INFO_GPU g ON g.id = k.deviceId ORDER BY k.start""").fetchall()
    kern = [r for r in ours if r[3] != ""]
    assert len(kern) == len(rows)
    assert [(int(r[0]), int(r[1]), int(r[3]), int(r[6]), int(r[9]), int(r[19]), r[16], r[20])
            for r in kern] == [tuple(r) for r in rows]


def test_sqlite_needs_suffix_and_is_atomic(tmp_path, compiled_view, compiled_facts):
    with pytest.raises(TuiprofError, match=r"\.sqlite"):
        write_nsys_sqlite(compiled_view, tmp_path / "x.db")
    with pytest.raises(TuiprofError, match="cannot write"):
        write_nsys_sqlite(compiled_view, tmp_path / "missing" / "x.sqlite")
    assert list(tmp_path.iterdir()) == []
    p = write_nsys_sqlite(compiled_view, tmp_path / "x.sqlite")
    assert [q.name for q in tmp_path.iterdir()] == ["x.sqlite"]
    with sqlite3.connect(p) as con:
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        kernels = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
        assert kernels == compiled_facts.kernels
