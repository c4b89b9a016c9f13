"""``pipeline inspect``'s signals section, ``--plot`` and ``export`` of signal columns, on a
dataset made by ``pipeline run --annotate gopher`` from the test plays: what inspect prints
equals what pyarrow computes from the shards."""

from __future__ import annotations

import io
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from pipeline.output.signal_summary import SignalSample, plot, read_signals, sample_plan
from storage import ManifestError, ReplicaSet, read_manifest, shards_of

REPO = Path(__file__).resolve().parents[3]
MAGIC = b"\x89PNG\r\n\x1a\n"


def _cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pipeline", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def signal_ds(tmp_path_factory: pytest.TempPathFactory, corpus_dir: Path) -> str:
    """The plays and the messy file annotated by the Gopher rules: several shards, several
    row groups each, int64 and double signals."""
    out = tmp_path_factory.mktemp("signals") / "ds"
    proc = _cli("run", "--output", str(out), "--annotate", "gopher", "--workers", "2",
                "--files-per-partition", "1", "--row-group-tokens", "8192",
                "--dashboard-address", "127.0.0.1:0", "--no-progress",
                str(corpus_dir / "*.txt"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return str(out)


def _signals(ds: str) -> dict[str, dict[str, str]]:
    return read_manifest(ds).stats["signals"]


def _shard_columns(ds: str, columns: list[str]) -> pa.Table:
    """The columns of every shard, in the index's order, read by pyarrow."""
    m = read_manifest(ds)
    return pa.concat_tables([pq.read_table(Path(ds) / s.path, columns=columns)
                             for s in shards_of(ds, m)])


def _section(stdout: str) -> list[str]:
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("signals "))
    end = lines.index("config")
    return lines[start:end]


def _int(v: float) -> str:
    return f"{int(v):,}" if float(v).is_integer() else f"{v:,.1f}"


def test_text_section_lists_every_signal_with_values_from_the_shards(signal_ds: str) -> None:
    signals = _signals(signal_ds)
    assert len(signals) > 10 and {v["type"] for v in signals.values()} == {"int64", "double"}
    m = read_manifest(signal_ds)
    out = _cli("inspect", signal_ds)
    assert out.returncode == 0, out.stderr
    section = _section(out.stdout)
    assert section[0] == f"signals     {len(signals)} columns ({m.total_rows:,} documents)"
    table = _shard_columns(signal_ds, list(signals))
    assert len(section) == 1 + len(signals)
    for line, (column, info) in zip(section[1:], sorted(signals.items()), strict=True):
        words = line.split()
        assert words[:3] == [column, info["type"], info["step"]], line
        values = table.column(column).to_numpy()
        assert words[3::2] == ["min", "median", "max"], line
        got = [float(w.replace(",", "")) for w in words[4::2]]
        want = [values.min(), float(np.median(values)), values.max()]
        if info["type"] == "int64":
            assert words[4::2] == [_int(v) for v in want], line
        else:
            assert all(math.isclose(g, w, rel_tol=1e-3, abs_tol=1e-12)
                       for g, w in zip(got, want, strict=True)), (line, want)
    # the rest of the output is still there, in its order
    assert out.stdout.index("\nschema ") < out.stdout.index("\nsignals ") < out.stdout.index(
        "\nconfig") < out.stdout.index("\nversions")


def test_json_has_the_manifest_and_the_signals_from_the_shards(signal_ds: str) -> None:
    out = _cli("inspect", signal_ds, "--json")
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    report = d.pop("signals")
    assert d == json.loads((Path(signal_ds) / "manifest.json").read_text())
    m = read_manifest(signal_ds)
    assert report["documents"] == report["rows_read"] == m.total_rows
    assert report["sampled"] is False
    signals = _signals(signal_ds)
    assert set(report["columns"]) == set(signals)
    table = _shard_columns(signal_ds, list(signals))
    for column, s in report["columns"].items():
        values = table.column(column)
        lo_hi = pc.min_max(values).as_py()
        assert (s["type"], s["step"]) == (signals[column]["type"], signals[column]["step"])
        assert s["rows"] == m.total_rows and s["nulls"] == 0 and s["nans"] == 0
        assert s["min"] == lo_hi["min"] and s["max"] == lo_hi["max"], column
        assert s["median"] == pytest.approx(float(np.median(values.to_numpy())), rel=1e-12)


def test_a_sample_is_evenly_spaced_row_groups_read_by_their_signal_columns_only(
        signal_ds: str, monkeypatch: pytest.MonkeyPatch) -> None:
    m = read_manifest(signal_ds)
    shards = list(shards_of(signal_ds, m))
    names = list(_signals(signal_ds))
    limit = m.total_rows // 3
    reads: list[tuple[str, int | None, int | None]] = []
    get = ReplicaSet.get

    def recording_get(self: ReplicaSet, relative: str, sha256: str | None = None,
                      start: int | None = None, end: int | None = None) -> bytes:
        reads.append((relative, start, end))
        return get(self, relative, sha256, start, end)

    monkeypatch.setattr(ReplicaSet, "get", recording_get)
    sample = read_signals(ReplicaSet.from_urls([signal_ds]), m, limit)
    monkeypatch.undo()

    # the same rows as the plan's groups read with pyarrow from the shard files
    where = [(s, g) for s, shard in enumerate(shards) for g in range(len(shard.row_groups))]
    plan = sample_plan([shards[s].row_groups[g].rows for s, g in where], limit)
    assert sum(t for _, t in plan) == sample.rows == limit < m.total_rows
    sampled = sorted({where[i][0] for i, _ in plan})
    assert sampled[0] == 0 and sampled[-1] >= len(shards) - 2 and len(sampled) >= 3, (
        "the sample spans the dataset", sampled)
    expected = pa.concat_tables([
        pq.ParquetFile(Path(signal_ds) / shards[where[i][0]].path).read_row_group(
            where[i][1], columns=names).slice(0, take) for i, take in plan])
    for column in names:
        assert sample.columns[column].to_pylist() == expected.column(column).to_pylist()

    # only ranges: footers and signal column chunks, never a token chunk, never a whole shard
    by_path = {s.path: s for s in shards}
    shard_reads = [r for r in reads if r[0] in by_path]
    assert shard_reads and all(start is not None for _, start, _ in shard_reads)
    for path, start, end in shard_reads:
        for g in by_path[path].row_groups:
            assert end <= g.offset or start >= g.offset + g.length, "read a token chunk"
    read = sum(end - start for _, start, end in shard_reads)
    assert read < sum(s.bytes for s in shards) / 4

    out = _cli("inspect", signal_ds, "--signal-rows", str(limit))
    again = _cli("inspect", signal_ds, "--signal-rows", str(limit), "--json")
    assert out.returncode == again.returncode == 0, out.stderr + again.stderr
    section = _section(out.stdout)
    assert section[0].endswith(f"(from {limit:,} of {m.total_rows:,} documents)")
    report = json.loads(again.stdout)["signals"]
    assert report["sampled"] is True and report["rows_read"] == limit
    for column, s in report["columns"].items():
        lo_hi = pc.min_max(expected.column(column)).as_py()
        assert (s["min"], s["max"], s["rows"]) == (lo_hi["min"], lo_hi["max"], limit)
    assert _section(_cli("inspect", signal_ds, "--signal-rows", str(limit)).stdout) == section


def test_signal_rows_zero_reads_nothing_and_negative_is_an_error(signal_ds: str) -> None:
    out = _cli("inspect", signal_ds, "--signal-rows", "0")
    assert out.returncode == 0, out.stderr
    section = _section(out.stdout)
    assert "(from 0 of" in section[0]
    assert all(line.endswith("(not read)") for line in section[1:])
    bad = _cli("inspect", signal_ds, "--signal-rows", "-1")
    assert bad.returncode == 2 and bad.stderr.startswith("error: --signal-rows")


def test_a_signal_no_shard_has_reads_as_nulls(signal_ds: str, tmp_path: Path) -> None:
    """A manifest may list a column some shards lack (a user's step): those rows are
    nulls."""
    ds = tmp_path / "ds"
    shutil.copytree(signal_ds, ds, symlinks=True)
    manifest = json.loads((ds / "manifest.json").read_text())
    manifest["stats"]["signals"]["ghost.flag"] = {"type": "bool", "step": "ghost"}
    (ds / "manifest.json").write_text(json.dumps(manifest))
    out = _cli("inspect", str(ds))
    assert out.returncode == 0, out.stderr
    line = next(x for x in _section(out.stdout) if x.startswith("  ghost.flag "))
    assert line.split()[1:3] == ["bool", "ghost"]
    assert line.endswith(f"no values  nulls {manifest['totals']['rows']:,}")


def test_plot_writes_a_png_with_a_panel_per_signal(signal_ds: str, tmp_path: Path) -> None:
    png = tmp_path / "signals.png"
    out = _cli("inspect", signal_ds, "--plot", str(png))
    assert out.returncode == 0, out.stderr
    n = len(_signals(signal_ds))
    assert f"plot        {png} ({n} panels)" in out.stdout.splitlines()
    data = png.read_bytes()
    assert data.startswith(MAGIC) and len(data) > 50_000
    import matplotlib.image

    height, width = matplotlib.image.imread(io.BytesIO(data)).shape[:2]
    assert height > width > 1000, "a grid of 4 columns and more rows"

    # --json keeps stdout JSON: the plot's line goes to stderr
    png2 = tmp_path / "again.png"
    as_json = _cli("inspect", signal_ds, "--json", "--plot", str(png2))
    assert as_json.returncode == 0 and "signals" in json.loads(as_json.stdout)
    assert str(png2) in as_json.stderr and png2.read_bytes().startswith(MAGIC)


def test_plot_draws_bool_and_string_columns_and_names_the_extra(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    n = 500
    columns = {
        "t.flag": pa.chunked_array([pa.array([i % 3 == 0 for i in range(n)])]),
        "t.label": pa.chunked_array([pa.array([f"label{i % 13}" if i % 7 else None
                                               for i in range(n)])]),
        "t.count": pa.chunked_array([pa.array([i % 40 for i in range(n)], pa.int64())]),
        "t.score": pa.chunked_array([pa.array([math.sin(i) if i % 5 else None
                                               for i in range(n)], pa.float64())]),
        "t.none": pa.chunked_array([pa.nulls(n, pa.float64())]),
    }
    sample = SignalSample(columns, n, 2 * n,
                          {"t.flag": "bool", "t.label": "string", "t.count": "int64",
                           "t.score": "double", "t.none": "double"},
                          dict.fromkeys(columns, "t"))
    png = tmp_path / "p.png"
    assert plot(sample, str(png), "synthetic") == 5
    assert png.read_bytes().startswith(MAGIC) and png.stat().st_size > 10_000

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    with pytest.raises(ValueError, match=r"shardflow\[plot\]"):
        plot(sample, str(tmp_path / "q.png"), "synthetic")


def test_export_carries_the_signal_columns_with_their_types(signal_ds: str,
                                                            tmp_path: Path) -> None:
    signals = _signals(signal_ds)
    shards = _shard_columns(signal_ds, ["doc_id", *signals])
    out = _cli("export", signal_ds, str(tmp_path / "pl"), "--no-progress")
    assert out.returncode == 0, out.stderr
    parts = sorted((tmp_path / "pl").glob("part-*.parquet"))
    exported = pa.concat_tables([pq.read_table(p) for p in parts])
    assert exported.column_names[:2] == ["doc_id", "input_ids"]
    assert set(exported.column_names[2:]) == set(signals)
    assert len({pq.read_schema(p) for p in parts}) == 1, "every part has one schema"
    for column, info in signals.items():
        assert str(exported.schema.field(column).type) == {"int64": "int64",
                                                           "double": "double"}[info["type"]]
        assert exported.column(column).equals(shards.column(column)), column
    assert exported.column("doc_id").equals(shards.column("doc_id"))

    out = _cli("export", signal_ds, str(tmp_path / "js"), "--format", "jsonl", "--no-progress")
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for p in sorted((tmp_path / "js").glob("part-*.jsonl"))
            for line in p.read_text().splitlines()]
    for column in signals:
        assert [r[column] for r in rows] == shards.column(column).to_pylist(), column


def _shard(columns: dict[str, pa.Array]) -> bytes:
    ids = pa.array([np.arange(n, dtype="<u2").tobytes() for n in (1, 2, 3)], pa.binary())
    table = pa.table({"doc_id": pa.array(["a", "b", "c"]), "input_ids": ids, **columns})
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()


def test_export_gives_every_part_one_schema_with_nulls_for_missing_signals() -> None:
    from types import SimpleNamespace

    from pipeline.output.export import export_schema, list_batches

    first = _shard({"url": pa.array(["u1", "u2", "u3"]),
                    "s.count": pa.array([1, 2, 3], pa.int64())})
    second = _shard({"url": pa.array(["u4", None, "u6"]),
                     "s.label": pa.array(["x", "y", None])})
    manifest = SimpleNamespace(schema={"doc_id": "string", "input_ids": "binary<uint16le>",
                                       "url": "string", "s.count": "double",
                                       "s.label": "string"})
    schema = export_schema(manifest, pq.ParquetFile(io.BytesIO(first)).schema_arrow)
    assert schema.names == ["doc_id", "input_ids", "url", "s.count", "s.label"]
    assert schema.field("s.count").type == pa.float64(), "the manifest's type wins"
    one = pa.Table.from_batches(list(list_batches(first, "binary<uint16le>", schema)))
    two = pa.Table.from_batches(list(list_batches(second, "binary<uint16le>", schema)))
    assert one.schema == two.schema == schema
    assert one.column("s.count").to_pylist() == [1.0, 2.0, 3.0]
    assert one.column("s.label").to_pylist() == [None] * 3
    assert two.column("s.count").to_pylist() == [None] * 3
    assert two.column("s.label").to_pylist() == ["x", "y", None]
    assert two.column("input_ids").to_pylist() == [[0], [0, 1], [0, 1, 2]]

    stranger = _shard({"other.x": pa.array([1, 2, 3])})
    with pytest.raises(ManifestError, match="other.x"):
        list(list_batches(stranger, "binary<uint16le>", schema))


def test_a_dataset_without_signals_has_no_section(tiny_dataset: str, tmp_path: Path) -> None:
    out = _cli("inspect", tiny_dataset)
    assert out.returncode == 0, out.stderr
    assert not any(line.startswith("signals") for line in out.stdout.splitlines())
    as_json = _cli("inspect", tiny_dataset, "--json")
    assert as_json.stdout == (Path(tiny_dataset) / "manifest.json").read_text()
    png = tmp_path / "none.png"
    no_plot = _cli("inspect", tiny_dataset, "--plot", str(png))
    assert no_plot.returncode == 2 and not png.exists()
    assert no_plot.stderr.startswith("error: --plot: the dataset has no signal columns")
    assert no_plot.stderr.count("\n") == 1
