"""Every example the README and the commands' --help texts show runs as shown.

README examples are the `$ pipesched ...` lines of its code blocks (the lines the block
shows after one must be lines the command prints, in order; `| tail -N` after the command
keeps its last N lines) and the command of the setup line; a `$ cat FILE` line shows a file
that the examples after it read (the test writes the lines shown). Help examples are the
lines under "Examples:" in `pipesched COMMAND --help`. They run in order, in one folder, so
a later example may read a file an earlier one wrote.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from pipesched.cli import COMMANDS

README = Path(__file__).resolve().parent.parent / "README.md"
NEEDS_TORCH = {"run", "profile", "check"}


def readme_examples() -> list[tuple[str, str | None]]:
    """(command, the lines the README shows it printing, joined, or None)."""
    found = []
    for block in re.findall(r"```[a-z]*\n(.*?)```", README.read_text(encoding="utf-8"), re.S):
        lines = block.splitlines()
        for index, line in enumerate(lines):
            if line.startswith(("$ pipesched ", "$ cat ")):
                shown = []
                for rest in lines[index + 1:]:
                    if rest.startswith("$ "):
                        break
                    shown.append(rest)
                found.append((line[2:], "\n".join(shown) if shown else None))
            for match in re.finditer(r"\.venv/bin/(pipesched [^&\n]*)", line):
                found.append((match.group(1).strip(), None))
    return found


def help_examples() -> list[str]:
    from pipesched.cli import main

    examples = []
    for name in COMMANDS:
        import contextlib
        import io

        buffer = io.StringIO()
        with contextlib.redirect_stdout(buffer), contextlib.suppress(SystemExit):
            main([name, "--help"])
        text = buffer.getvalue()
        assert "Examples:" in text, f"`pipesched {name} --help` shows no example"
        after = text.split("Examples:", 1)[1].splitlines()
        examples += [line.strip() for line in after if line.strip().startswith("pipesched ")]
    return examples


EXAMPLES = [(command, output) for command, output in readme_examples()] + [(command, None) for command in help_examples()]


def test_the_readme_and_every_command_show_examples():
    assert len(readme_examples()) >= 2
    assert {shlex.split(command)[1] for command, _ in EXAMPLES if command.startswith("pipesched ")} >= set(COMMANDS)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("examples")


@pytest.mark.slow
@pytest.mark.parametrize(("command", "output"), EXAMPLES, ids=[command for command, _ in EXAMPLES])
def test_example_runs_as_shown(command, output, cli, folder, monkeypatch):
    words = shlex.split(command)
    if words[0] == "cat":  # a file the README shows: the examples after it read it
        (folder / words[1]).write_text((output or "") + "\n", encoding="utf-8")
        return
    tail = None
    if len(words) >= 4 and words[-3:-1] == ["|", "tail"]:
        tail, words = int(words[-1].lstrip("-")), words[:-3]
    assert "|" not in words and "#" not in words, f"{command}: an example is one pipesched command"
    if words[1] in NEEDS_TORCH:
        pytest.importorskip("torch")
    monkeypatch.chdir(folder)
    result = cli(*words[1:])
    assert result.code == 0, f"{command}: {result}"
    assert "Traceback" not in result.err
    if output is not None:  # the README's lines, in order, among the printed ones
        printed = iter(result.out.splitlines()[-tail:] if tail else result.out.splitlines())
        for line in output.splitlines():
            assert line in printed, f"{command}: the README shows {line!r}, which it does not print (in that order)"
