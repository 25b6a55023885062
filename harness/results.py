"""The run folder, the kit's file format: results/<run-id>/run.json + measurements.jsonl (one JSON object a line).

Every measurement is validated against schemas/result.schema.json, appended, flushed and fsynced before the
next one starts, so an interrupted run loses nothing it finished."""

from __future__ import annotations

import json
import os
import re
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness import KitError, schema

RUN_FILE = "run.json"
#: A run writes a few kB per measurement; refuse to start where even this much is not free.
MIN_FREE_BYTES = 16 << 20
MEASUREMENTS_FILE = "measurements.jsonl"
FORMAT_VERSION = 1


def new_run_id(manifest_name: str) -> str:
    return f"{manifest_name}-{datetime.now(UTC).strftime('%Y%m%d-%H%M%S')}"


class RunDir:
    """One run's folder."""

    def __init__(self, path: Path):
        self.path = Path(path)

    @property
    def run_file(self) -> Path:
        return self.path / RUN_FILE

    @property
    def measurements_file(self) -> Path:
        return self.path / MEASUREMENTS_FILE

    @property
    def run_id(self) -> str:
        return self.path.name

    # -- creating
    @classmethod
    def create(cls, results_dir: Path, run_id: str) -> RunDir:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", run_id):
            raise KitError(f"run id {run_id!r}: use letters, digits, '.', '_' and '-'")
        results_dir = Path(results_dir)
        try:
            results_dir.mkdir(parents=True, exist_ok=True)
            probe = results_dir / f".write-test-{os.getpid()}"
            probe.write_text("ok")
            probe.unlink()
        except OSError as e:
            raise KitError(f"results folder {results_dir} is not writable: {e.strerror or e}") from None
        free = shutil.disk_usage(results_dir).free
        if free < MIN_FREE_BYTES:
            raise KitError(f"results folder {results_dir} has {free / 1024:,.0f} kB free; a run needs at least "
                           f"{MIN_FREE_BYTES >> 20} MB: free some space or pass --results elsewhere")
        path = results_dir / run_id
        if path.exists():
            raise KitError(f"{path} exists already; resume it with `invoke run --resume {run_id}` or pick another id")
        path.mkdir()
        return cls(path)

    @classmethod
    def open(cls, path: Path) -> RunDir:
        """An existing run folder, or one line saying why it is not one."""
        path = Path(path)
        if not path.is_dir():
            raise KitError(f"{path}: no such run folder")
        if not (path / RUN_FILE).is_file():
            raise KitError(f"{path}: not a run folder (no {RUN_FILE})")
        return cls(path)

    # -- run.json
    def write_meta(self, meta: dict[str, Any]) -> None:
        schema.check("run", meta, str(self.run_file))
        tmp = self.run_file.with_suffix(".json.partial")
        tmp.write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n")
        os.replace(tmp, self.run_file)

    def read_meta(self) -> dict[str, Any]:
        try:
            meta = json.loads(self.run_file.read_text())
        except json.JSONDecodeError as e:
            raise KitError(f"{self.run_file}: not valid JSON (line {e.lineno}: {e.msg})") from None
        schema.check("run", meta, str(self.run_file))
        return meta

    def update_meta(self, **changes: Any) -> dict[str, Any]:
        meta = self.read_meta()
        meta.update(changes)
        meta["updated_at"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        self.write_meta(meta)
        return meta

    # -- measurements.jsonl
    def append(self, record: dict[str, Any]) -> None:
        """Validate one measurement and append it durably."""
        schema.check("result", record, f"{self.measurements_file} (new record {record.get('measurement_id')})")
        line = json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n"
        with open(self.measurements_file, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())

    def measurements(self, *, validate: bool = True) -> list[dict[str, Any]]:
        """All records; a torn last line (a crash mid-write) is ignored, any other bad line is an error."""
        if not self.measurements_file.exists():
            return []
        records = []
        lines = self.measurements_file.read_text(encoding="utf-8").split("\n")
        for i, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                if i >= len(lines) - 1:
                    continue  # torn final line: the measurement was not finished
                raise KitError(f"{self.measurements_file}: line {i}: not valid JSON ({e.msg})") from None
            if validate:
                schema.check("result", rec, f"{self.measurements_file}: line {i}")
            records.append(rec)
        return records

    def done_ids(self) -> set[str]:
        return {r["measurement_id"] for r in self.measurements()}
