"""The history on disk: what goes in comes back, owner-only, bounded, and every file
that cannot be read is named instead of crashing the reader."""

from __future__ import annotations

import datetime as dt
import sqlite3
import stat
from pathlib import Path

import pytest

from accelmux.history.records import HISTORY_FORMAT, DaemonRun, DecisionRecord, RequestRecord
from accelmux.history.store import (
    HistoryError,
    HistoryWriter,
    day_file,
    history_files,
    list_runs,
    read_history,
)

DAY = 86_400.0
T0 = dt.datetime(2026, 3, 1, 12, tzinfo=dt.UTC).timestamp()


def run(name: str = "s1") -> DaemonRun:
    return DaemonRun(run=name, started_wall=T0, version="test", config="{}", spec="{}")


def request(i: int, name: str = "s1") -> RequestRecord:
    return RequestRecord(
        run=name,
        request_id=f"req-{i}",
        service="chat",
        replica="chat",
        cls="interactive",
        kind="chat",
        origin="http",
        t_arrived=float(i),
        prompt_tokens=10 + i,
        t_dispatched=i + 0.1,
        t_finished=i + 0.5,
        outcome="ok",
    )


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def write(directory: Path, rows: list[object], clock: Clock, **kw: int) -> HistoryWriter:
    writer = HistoryWriter(
        directory, days=kw.get("days", 7), max_bytes=kw.get("max_bytes", 1 << 30), clock=clock
    )
    writer.start_run(run())
    writer.write(rows)
    assert writer.flush()
    return writer


def test_rows_come_back_in_order_and_the_files_are_owner_only(tmp_path: Path) -> None:
    directory = tmp_path / "history"
    writer = write(directory, [request(2), request(1)], Clock(T0))
    writer.write([DecisionRecord("s1", 1.5, "unload", "chat", "ttl_expired")])
    writer.close()
    h = read_history(directory)
    assert h.run.run == "s1"
    assert [r.request_id for r in h.requests] == ["req-1", "req-2"]
    assert h.requests[0] == request(1)
    assert h.decisions[0].reason == "ttl_expired"
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    for path in directory.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


def test_committed_rows_survive_a_writer_that_never_closed(tmp_path: Path) -> None:
    """What a killed daemon leaves: committed batches, readable by another connection."""
    writer = write(tmp_path, [request(i) for i in range(50)], Clock(T0))
    h = read_history(tmp_path)  # the writer is still open: nothing was closed cleanly
    assert len(h.requests) == 50
    writer.close()


def test_old_days_are_deleted_and_the_run_is_written_into_each_new_file(tmp_path: Path) -> None:
    clock = Clock(T0)
    writer = write(tmp_path, [request(1)], clock, days=2)
    for day in (1, 2, 3):
        clock.t = T0 + day * DAY
        writer.write([request(10 + day)])
        assert writer.flush()
    writer.close()
    names = [p.name for p in history_files(tmp_path)]
    assert names == [day_file(tmp_path, dt.date(2026, 3, d)).name for d in (3, 4)]
    h = read_history(tmp_path)  # each file carries the run, so a lone day reads alone
    assert [r.request_id for r in h.requests] == ["req-12", "req-13"]


def test_over_the_size_kept_the_oldest_files_go_first_never_today(tmp_path: Path) -> None:
    clock = Clock(T0)
    writer = write(tmp_path, [request(i) for i in range(200)], clock, max_bytes=1)
    for day in (1, 2):
        clock.t = T0 + day * DAY
        writer.write([request(1000 + day)])
        assert writer.flush()
    writer.close()
    assert [p.name for p in history_files(tmp_path)] == [
        day_file(tmp_path, dt.date(2026, 3, 3)).name
    ]


def test_an_empty_or_missing_history_says_where_it_looked(tmp_path: Path) -> None:
    with pytest.raises(HistoryError, match=r"no history in .*run it for a while"):
        read_history(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(HistoryError, match=r"no history in"):
        read_history(tmp_path / "empty")


def _truncate(path: Path, keep: int) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:keep])


def test_a_truncated_file_is_named_and_skipped(tmp_path: Path) -> None:
    clock = Clock(T0)
    writer = write(tmp_path, [request(1)], clock)
    clock.t = T0 + DAY
    writer.write([request(2)])
    writer.close()
    first = history_files(tmp_path)[0]
    for suffix in ("-wal", "-shm"):
        (first.parent / (first.name + suffix)).unlink(missing_ok=True)
    _truncate(first, 100)
    h = read_history(tmp_path)
    assert [r.request_id for r in h.requests] == ["req-2"]
    assert any(first.name in p and "damaged" in p for p in h.problems), h.problems


def test_a_history_with_only_damaged_files_is_an_error_naming_them(tmp_path: Path) -> None:
    writer = write(tmp_path, [request(1)], Clock(T0))
    writer.close()
    path = history_files(tmp_path)[0]
    _truncate(path, 100)
    with pytest.raises(HistoryError, match=rf"no readable history.*{path.name}.*damaged"):
        read_history(tmp_path)


def test_a_history_from_an_older_version_says_so(tmp_path: Path) -> None:
    writer = write(tmp_path, [request(1)], Clock(T0))
    writer.close()
    path = history_files(tmp_path)[0]
    with sqlite3.connect(path) as conn:
        conn.execute(f"PRAGMA user_version = {HISTORY_FORMAT - 1}")
    with pytest.raises(HistoryError, match=r"older accelmux .*history format 0"):
        read_history(tmp_path)
    with sqlite3.connect(path) as conn:
        conn.execute(f"PRAGMA user_version = {HISTORY_FORMAT + 1}")
    with pytest.raises(HistoryError, match=r"newer accelmux"):
        list_runs(tmp_path)


def test_a_writer_never_appends_to_a_file_of_another_format(tmp_path: Path) -> None:
    writer = write(tmp_path, [request(1)], Clock(T0))
    writer.close()
    path = history_files(tmp_path)[0]
    with sqlite3.connect(path) as conn:
        conn.execute(f"PRAGMA user_version = {HISTORY_FORMAT + 1}")
    again = write(tmp_path, [request(2)], Clock(T0))
    again.close()
    assert again.dropped >= 1  # logged and dropped: the daemon goes on


def test_runs_are_listed_and_chosen_by_prefix(tmp_path: Path) -> None:
    writer = HistoryWriter(tmp_path, days=7, max_bytes=1 << 30, clock=Clock(T0))
    for name in ("run-a", "run-b"):
        writer.start_run(DaemonRun(name, T0 if name == "run-a" else T0 + 10, "t", "{}", "{}"))
        writer.write([request(1, name)])
    writer.close()
    runs, problems = list_runs(tmp_path)
    assert [s.run for s in runs] == ["run-a", "run-b"] and not problems
    assert read_history(tmp_path).run.run == "run-b"
    assert read_history(tmp_path, "run-a").run.run == "run-a"
    with pytest.raises(HistoryError, match=r"ambiguous"):
        read_history(tmp_path, "run")
    with pytest.raises(HistoryError, match=r"not found"):
        read_history(tmp_path, "other")
