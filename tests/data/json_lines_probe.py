# What tests/test_one_home.py must flag as JSON-lines I/O (lines ending in "io") and let through.
import json
import os
from pathlib import Path


def reads(path: Path, handle, text: str) -> list:
    rows = [json.loads(line) for line in text.splitlines()]  # io
    with open(path, "rb") as log:
        for raw in log:
            rows.append(json.loads(raw))  # io
    while chunk := handle.readline():
        rows.append(json.loads(chunk))  # io
    for line in handle:
        rows.append(json.loads(line))  # io
    return rows


def appends(path: Path, line: bytes) -> None:
    with open(path, "a") as log:  # io
        log.write("{}\n")
    with path.open(mode="ab") as log:  # io
        log.write(line)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)  # io
    os.close(fd)


def lets_through(path: Path, rows: list[str]) -> tuple:
    document = json.loads(path.read_text())  # one JSON document, not lines
    decoded = [json.loads(row) for row in rows]  # values in memory, not a file's lines
    for name in sorted(os.listdir(path)):
        document[name] = json.loads((path / name).read_bytes())
    with open(path, "w") as handle:
        handle.write(json.dumps(document))
    with path.open("rb") as handle:
        data = handle.read()
    return decoded, data
