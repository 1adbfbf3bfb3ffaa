"""Shared test fixtures.

Golden files live in tests/golden/. Regenerate them with ``pytest --update-golden`` and
review the diff; never edit expected output by hand to make a test pass.
"""

from __future__ import annotations

from pathlib import Path

import pytest

GOLDEN_DIR = Path(__file__).parent / "golden"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", help="rewrite tests/golden/ files from current output")


class Golden:
    def __init__(self, update: bool) -> None:
        self.update = update

    def check(self, name: str, text: str) -> None:
        """Assert ``text`` equals tests/golden/<name> (or rewrite it with --update-golden)."""
        path = GOLDEN_DIR / name
        if self.update:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            return
        assert path.exists(), f"golden file {path.name} is missing; create it with pytest --update-golden and review it"
        assert text == path.read_text(encoding="utf-8"), f"output differs from golden file {path.name}"


@pytest.fixture
def golden(request: pytest.FixtureRequest) -> Golden:
    return Golden(request.config.getoption("--update-golden"))


class CliResult:
    def __init__(self, code: int, out: str, err: str) -> None:
        self.code, self.out, self.err = code, out, err

    def __repr__(self) -> str:
        return f"CliResult(code={self.code}, out={self.out[:200]!r}, err={self.err[:200]!r})"


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]):
    """Run the `pipesched` command in-process: ``cli("show", "1f1b") -> CliResult``."""
    from pipesched.cli import main

    def run(*argv: str) -> CliResult:
        capsys.readouterr()
        try:
            main(list(argv))
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return run
